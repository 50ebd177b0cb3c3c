"""Verification rules: how drafted tokens are accepted and what the target emits next.

A rule is a pure function

    rule(draft_tokens [B, G], draft_probs [B, G, V], target_probs [B, G+1, V],
         num_drafted [B]) -> Verdict

where `draft_probs[:, i]` is the distribution token `draft_tokens[:, i]` was drawn from,
`target_probs[:, i]` is the target's distribution at the same position (the last one is the
position after the block), and only the first `num_drafted[b] <= G` drafts of row b count
(adaptive drafting; fixed-gamma decoders pass G). All distributions are the ones produced by
`sampling.logits_to_probs`, i.e. after temperature/top-k/top-p.

A `Verdict` is the exact law of the outcome, not a sample of it:
  num_accepted_probs [B, G+1]    P(the first n drafts are accepted), n = 0..G
  next_token_probs   [B, G+1, V] the distribution of the token emitted after n accepted drafts
`sample_verdict` draws `(num_accepted [B], next_token [B])` from it. Keeping the law explicit lets
the tests compute the emitted distribution exactly and lets every rule share one sampler.

Rules in `EXACT_RULES` are lossless: the emitted tokens are distributed exactly as the target's.
`register_rule(name, rule, exact=...)` adds a rule; the exactness test suite runs on every exact one.
`LOSSY_RULES` are never the default and are reported as lossy wherever they are used.
"""

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.engine import sampling


@flax.struct.dataclass
class Verdict:
  num_accepted_probs: jax.Array  # [B, G+1]
  next_token_probs: jax.Array  # [B, G+1, V]


Rule = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], Verdict]


def _prob_of(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]


def _normalize_or(weights: jax.Array, fallback: jax.Array) -> jax.Array:
  """Normalizes `weights [..., V]`; rows with no mass (p == q numerically) take `fallback`.

  An empty residual is only reached with probability zero, so any fallback keeps exactness;
  the target distribution is the natural one and avoids NaN.
  """
  total = jnp.sum(weights, axis=-1, keepdims=True)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), fallback)


def _likelihood_ratios(draft_tokens, draft_probs, target_probs, num_drafted):
  """p(x)/q(x) for each draft [B, G]; 0 where p(x) = 0 or the draft does not count."""
  gamma = draft_tokens.shape[1]
  p_x = _prob_of(target_probs[:, :gamma], draft_tokens)
  q_x = _prob_of(draft_probs, draft_tokens)
  ratio = jnp.where(p_x > 0, p_x / q_x, 0.0)
  return jnp.where(jnp.arange(gamma) < num_drafted[:, None], ratio, 0.0)


def _with_bonus(residuals: jax.Array, target_probs: jax.Array,
                num_drafted: jax.Array) -> jax.Array:
  """Next-token laws [B, G+1, V]: the residual after n < num_drafted acceptances, the target
  itself after all num_drafted drafts were accepted (the bonus token)."""
  residuals = jnp.concatenate([residuals, target_probs[:, -1:]], axis=1)
  is_bonus = jnp.arange(residuals.shape[1]) == num_drafted[:, None]
  return jnp.where(is_bonus[..., None], target_probs, residuals)


def token_rule(draft_tokens, draft_probs, target_probs, num_drafted) -> Verdict:
  """Leviathan et al. (2023), Algorithm 1: accept x_i with prob. min(1, p_i(x_i)/q_i(x_i)) until
  the first rejection, then emit from norm(max(0, p_i - q_i)); after all drafts, from p_{G+1}."""
  accept = jnp.minimum(1.0, _likelihood_ratios(draft_tokens, draft_probs, target_probs,
                                               num_drafted))
  ones = jnp.ones_like(accept[:, :1])
  all_accepted_up_to = jnp.cumprod(jnp.concatenate([ones, accept], axis=1), axis=1)
  rejected_next = jnp.concatenate([1.0 - accept, ones], axis=1)
  gamma = draft_tokens.shape[1]
  residuals = _normalize_or(jnp.maximum(target_probs[:, :gamma] - draft_probs, 0.0),
                            target_probs[:, :gamma])
  return Verdict(all_accepted_up_to * rejected_next,
                 _with_bonus(residuals, target_probs, num_drafted))


def block_rule(draft_tokens, draft_probs, target_probs, num_drafted) -> Verdict:
  """Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025, Algorithm 2).

  With weights w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i)/q_i(x_i)) and residual masses
  r_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0), position i is accepted with probability
  h_i = r_i / (r_i + 1 - w_i) (h_G = w_G, h_0 = 1), the accepted length is the largest i whose
  independent coin says yes, and the next token comes from norm(max(w_tau p - q, 0)) at tau+1
  (or from p_{G+1} when every draft is kept). Never accepts fewer tokens in expectation than
  `token_rule`, and is equally lossless.
  """
  gamma = draft_tokens.shape[1]
  ratios = _likelihood_ratios(draft_tokens, draft_probs, target_probs, num_drafted)
  weights = [jnp.ones_like(ratios[:, 0])]
  for i in range(gamma):
    weights.append(jnp.minimum(1.0, weights[-1] * ratios[:, i]))
  weights = jnp.stack(weights, axis=1)  # [B, G+1]: w_0 .. w_G
  # Index i holds position i+1 (after i accepted drafts): w_i p_{i+1} - q_{i+1}.
  unnormalized = jnp.maximum(weights[:, :gamma, None] * target_probs[:, :gamma] - draft_probs,
                             0.0)
  residual_mass = jnp.sum(unnormalized, axis=-1)  # r_0 .. r_{G-1}
  denominator = residual_mass + (1.0 - weights[:, :gamma])  # exactly r_i when w_i = 1
  keep_prob = jnp.where(denominator > 0, residual_mass / jnp.where(denominator > 0, denominator,
                                                                    1.0), 1.0)
  positions = jnp.arange(gamma + 1)
  keep_prob = jnp.concatenate([keep_prob, weights[:, gamma:]], axis=1)  # h_0 .. h_G
  keep_prob = jnp.where(positions == num_drafted[:, None], weights, keep_prob)
  keep_prob = jnp.where(positions > num_drafted[:, None], 0.0, keep_prob)
  keep_prob = keep_prob.at[:, 0].set(1.0)
  # P(tau = i) = h_i * prod_{j > i} (1 - h_j).
  later_all_fail = jnp.cumprod((1.0 - keep_prob)[:, ::-1], axis=1)[:, ::-1]
  later_all_fail = jnp.concatenate([later_all_fail[:, 1:], jnp.ones_like(keep_prob[:, :1])],
                                   axis=1)
  residuals = _normalize_or(unnormalized, target_probs[:, :gamma])
  return Verdict(keep_prob * later_all_fail, _with_bonus(residuals, target_probs, num_drafted))


def lenient_rule(draft_tokens, draft_probs, target_probs, num_drafted,
                 lenience: float = 0.5) -> Verdict:
  """LOSSY. The paper's lenience (Leviathan et al., 2023, Appendix A.5): accept with
  min(1, p/(l q)) and correct from norm(max(0, p - l q)); l = 1 is `token_rule`, smaller l accepts
  more and no longer samples the target's distribution."""
  return token_rule(draft_tokens, lenience * draft_probs, target_probs, num_drafted)


EXACT_RULES: dict[str, Rule] = {"token": token_rule, "block": block_rule}
LOSSY_RULES: dict[str, Rule] = {"lenient": lenient_rule}


def register_rule(name: str, rule: Rule, *, exact: bool) -> None:
  """Makes `rule` available as `speculative_sample(..., verifier=name)`."""
  if name in EXACT_RULES or name in LOSSY_RULES:
    raise ValueError(f"a verification rule named {name!r} is already registered")
  (EXACT_RULES if exact else LOSSY_RULES)[name] = rule


def get_rule(name: str) -> Rule:
  rules = {**EXACT_RULES, **LOSSY_RULES}
  if name not in rules:
    raise ValueError(f"verifier must be one of {sorted(rules)}, got {name!r}")
  return rules[name]


def sample_verdict(rng: jax.Array, verdict: Verdict) -> tuple[jax.Array, jax.Array]:
  """Draws (num_accepted [B] in 0..G, next_token [B]) from the verdict's law."""
  batch_size = verdict.num_accepted_probs.shape[0]
  return draw_verdict(jax.random.uniform(rng, (batch_size, 2)), verdict)


def draw_verdict(uniforms: jax.Array, verdict: Verdict) -> tuple[jax.Array, jax.Array]:
  """`sample_verdict` given its two independent uniforms per row, `uniforms [B, 2]`."""
  num_accepted = sampling.sample_from_uniform(uniforms[:, 0], verdict.num_accepted_probs)
  next_token_probs = jnp.take_along_axis(
      verdict.next_token_probs, num_accepted[:, None, None], axis=1)[:, 0]
  return num_accepted, sampling.sample_from_uniform(uniforms[:, 1], next_token_probs)


def compare_tokens(draft_tokens: jax.Array, target_tokens: jax.Array,
                   num_drafted: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Greedy verification: (num_accepted [B], next_token [B]) when every q and p is a point mass,
  the drafts `draft_tokens [B, G]` and the target's tokens `target_tokens [B, G+1]` (its argmax
  at each position of the block and the one after it).

  This is the point mass that every registered rule's `Verdict` puts all its law on there: a
  draft is accepted exactly when it is the target's token, and the token emitted after the
  first mismatch (or after all num_drafted drafts) is the target's (tests/test_verify.py checks
  each registered rule against it). Comparing tokens skips building [B, G+1, V] laws.
  """
  gamma = draft_tokens.shape[1]
  matches = ((draft_tokens == target_tokens[:, :gamma])
             & (jnp.arange(gamma) < num_drafted[:, None]))
  num_accepted = jnp.sum(jnp.cumprod(matches, axis=1), axis=1).astype(jnp.int32)
  next_token = jnp.take_along_axis(target_tokens, num_accepted[:, None], axis=1)[:, 0]
  return num_accepted, next_token


def verify(rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
           target_probs: jax.Array, num_drafted: jax.Array | None = None,
           rule: str | Rule = "token") -> tuple[jax.Array, jax.Array]:
  """Verifies a drafted block: returns (num_accepted [B], next_token [B])."""
  if num_drafted is None:
    num_drafted = jnp.full(draft_tokens.shape[:1], draft_tokens.shape[1], jnp.int32)
  rule = get_rule(rule) if isinstance(rule, str) else rule
  return sample_verdict(rng, rule(draft_tokens, draft_probs, target_probs, num_drafted))


def acceptance_rates(draft_probs: jax.Array, target_probs: jax.Array) -> jax.Array:
  """beta = sum_x min(p(x), q(x)) per position [B, G]: the paper's per-token acceptance rate,
  whose mean is alpha."""
  return jnp.sum(jnp.minimum(draft_probs, target_probs[:, :draft_probs.shape[1]]), axis=-1)
