"""Per-position divergences between a target's and a draft's next-token distributions, for
training a draft to agree with its target (DistillSpec, Zhou et al., 2024).

p is the target's distribution, q the draft's, both softmax(logits / temperature) over the
last axis. Per position (every function maps logits [..., V] to [...]):
  forward_kl   KL(p || q) = sum p (log p - log q)            (mode-covering)
  reverse_kl   KL(q || p) = sum q (log q - log p)            (mode-seeking)
  jsd          beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q
               (generalized Jensen-Shannon; divided by beta it tends to KL(p || q) as beta -> 0,
               divided by 1 - beta to KL(q || p) as beta -> 1)
  tv           total variation 0.5 sum |p - q|
and the metric `alpha` = sum min(p, q) = 1 - tv: the probability that speculative sampling at
`temperature` accepts the draft's token at that position (Leviathan et al., 2023), so a draft
trained on `tv` maximizes its acceptance rate directly. `alpha_sums` gives the expected
acceptance at the two temperatures drafts are usually run at, whatever the trained one: at T=1
(sum min(p, q) of the untempered distributions) and at T=0 (greedy decoding accepts the draft's
token iff the two argmaxes agree: 1 there, else 0).

`weighted_sums(name, target_logits, draft_logits, weights, ...)` sums a divergence and alpha
over the positions of a batch weighted by the target-token weights (`decoder_loss_weights`:
padding contributes nothing). Terms with a zero probability are 0 (0 log 0 = 0) with finite
gradients, whatever the other distribution. Bad settings (an unknown divergence, beta outside
(0, 1) or given to another divergence than 'jsd' (`resolve_beta`), temperature <= 0) are a
one-line ValueError.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def _plogp_ratio(log_p: jax.Array, log_r: jax.Array) -> jax.Array:
  """sum p (log p - log r) over the last axis, with 0 where p == 0 and no NaN gradient there."""
  p = jnp.exp(log_p)
  positive = p > 0
  # Both branches are evaluated under jnp.where: keep the unselected one finite too.
  difference = jnp.where(positive, log_p - jnp.where(positive, log_r, 0.0), 0.0)
  return jnp.sum(p * difference, axis=-1)


def forward_kl(log_p: jax.Array, log_q: jax.Array, beta: float) -> jax.Array:
  del beta
  return _plogp_ratio(log_p, log_q)


def reverse_kl(log_p: jax.Array, log_q: jax.Array, beta: float) -> jax.Array:
  del beta
  return _plogp_ratio(log_q, log_p)


def jsd(log_p: jax.Array, log_q: jax.Array, beta: float) -> jax.Array:
  log_m = jnp.logaddexp(jnp.log(beta) + log_p, jnp.log1p(-beta) + log_q)
  return beta * _plogp_ratio(log_p, log_m) + (1.0 - beta) * _plogp_ratio(log_q, log_m)


def total_variation(log_p: jax.Array, log_q: jax.Array, beta: float) -> jax.Array:
  del beta
  return 0.5 * jnp.sum(jnp.abs(jnp.exp(log_p) - jnp.exp(log_q)), axis=-1)


def alpha(log_p: jax.Array, log_q: jax.Array) -> jax.Array:
  """sum min(p, q): the acceptance probability of the draft's token at each position."""
  return jnp.sum(jnp.minimum(jnp.exp(log_p), jnp.exp(log_q)), axis=-1)


Divergence = Callable[[jax.Array, jax.Array, float], jax.Array]
# The registry: a divergence by its name (gin and the command lines name them so).
DIVERGENCES: dict[str, Divergence] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": jsd,
    "tv": total_variation,
}


DEFAULT_BETA = 0.5


def resolve_beta(name: str, beta: float | None) -> float:
  """The beta a divergence runs with: the one given (the 'jsd' divergence's alone: a ValueError
  for another, where it could not take effect), else DEFAULT_BETA."""
  if beta is not None and name != "jsd":
    raise ValueError(f"beta is the 'jsd' divergence's; it cannot take effect with {name!r}")
  return DEFAULT_BETA if beta is None else beta


def check(name: str, beta: float, temperature: float) -> None:
  """One-line ValueError for a divergence, beta or temperature that cannot be computed."""
  if name not in DIVERGENCES:
    raise ValueError(f"unknown divergence {name!r}; known: {', '.join(sorted(DIVERGENCES))}")
  if not 0.0 < beta < 1.0:
    raise ValueError(f"beta must be in (0, 1), got {beta}")
  if not temperature > 0.0:
    raise ValueError(f"the divergence temperature must be > 0, got {temperature}")


def log_probs(logits: jax.Array, temperature: float) -> jax.Array:
  """log softmax(logits / temperature) in float32."""
  return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


def per_position(name: str, target_logits: jax.Array, draft_logits: jax.Array, *,
                 temperature: float = 1.0, beta: float = DEFAULT_BETA) -> jax.Array:
  """The divergence `name` between target and draft at each position: logits [..., V] -> [...]."""
  check(name, beta, temperature)
  return DIVERGENCES[name](log_probs(target_logits, temperature),
                           log_probs(draft_logits, temperature), beta)


def weighted_sums(name: str, target_logits: jax.Array, draft_logits: jax.Array,
                  weights: jax.Array, *, temperature: float = 1.0,
                  beta: float = DEFAULT_BETA) -> dict[str, jax.Array]:
  """{'divergence_sum', 'alpha_sum', 'num_tokens'} over positions [B, L] weighted by `weights`
  (logits [B, L, V]); the loss of a batch is divergence_sum / num_tokens."""
  check(name, beta, temperature)
  log_p = log_probs(target_logits, temperature)
  log_q = log_probs(draft_logits, temperature)
  weights = weights.astype(jnp.float32)
  return {"divergence_sum": jnp.sum(DIVERGENCES[name](log_p, log_q, beta) * weights),
          "alpha_sum": jnp.sum(jax.lax.stop_gradient(alpha(log_p, log_q)) * weights),
          "num_tokens": jnp.sum(weights)}


def alpha_sums(target_logits: jax.Array, draft_logits: jax.Array,
               weights: jax.Array) -> dict[str, jax.Array]:
  """{'alpha_t0_sum', 'alpha_t1_sum'}: the expected acceptance at temperature 0 (the argmaxes
  agree) and at temperature 1, summed over positions [B, L] weighted by `weights` (logits
  [B, L, V]); divided by weighted_sums' num_tokens they are the rates. No gradient."""
  target_logits = jax.lax.stop_gradient(target_logits)
  draft_logits = jax.lax.stop_gradient(draft_logits)
  weights = weights.astype(jnp.float32)
  agree = jnp.argmax(target_logits, axis=-1) == jnp.argmax(draft_logits, axis=-1)
  return {"alpha_t0_sum": jnp.sum(agree * weights),
          "alpha_t1_sum": jnp.sum(alpha(log_probs(target_logits, 1.0),
                                        log_probs(draft_logits, 1.0)) * weights)}
