"""Exact speculative sampling: `speculative_sample`, with `temperature_sample`'s law.

It follows the conventions of `spec_decode.engine.decoding` (inputs, outputs, log_probs) and
shares its problem setup and row bookkeeping (`spec_decode.engine.decode_rows`). Each iteration
calls the target with k = gamma + 1 (one parallel verification), the draft with k = 2 once (the
catch-up call below, asking for one fed token's logits) and k = 1 otherwise. A draft's logits
may hold -inf: a row whose logits are all -inf proposes NOTHING at that position
(`lookup.NGramLookup` where no n-gram matches), and a row with exactly one finite logit is a
deterministic proposal (q is the point mass there), which the stats count as a lookup draft.

## How speculative sampling keeps the target's distribution
Each iteration of `speculative_sample`, for every row independently at its own position i
(the position of its last committed token):
1. the draft proposes x_1..x_m from q, m <= gamma chosen by a drafting policy (fixed m = gamma
   by default; see `spec_decode.engine.drafting`): a k = 2 catch-up call at positions i-1, i
   (after a fully accepted block the draft has never seen x_m; otherwise it rewrites an entry
   it already holds) asking for the logits of position i alone, then k = 1 calls;
2. the target scores [seq[i], x_1..x_gamma] in ONE call (k = gamma + 1) giving p_1..p_{gamma+1};
3. a verification rule from `spec_decode.engine.verify` turns (x, q, p, m) into the number of
   accepted drafts n and the next token; the row commits n + 1 tokens (cut at EOS or its
   length limit) and both caches roll back to the new position on the next call.
A draft may also stop a row by proposing nothing (all -inf logits), at any offset, the first
included: the row then has m = the offset drafts (m = 0: the iteration emits one token of the
target, the bonus from p_1 of the same single call). This stays exact for the reason the drafting
policies do: whether a row goes on depends only on history, never on this iteration's
verification: its prefix, its drafts so far, the draft's own randomness, and what earlier
iterations recorded (an adaptive policy reads the row's running stats, which past target
probabilities and past verdicts made), never this iteration's p or coins. So m is fixed before
this verification, independent of its coins given the prefix, and every exact rule's law is the
target's given any such m (the verifier is told m and weighs only those drafts; p_{m+1}
conditions only on positions <= i + m); each iteration being exact given its prefix, so is the
whole sequence. A deterministic
proposal x has q = one-hot(x): the token rule accepts it with p(x) and otherwise emits from
norm(p with x removed), which is p again; greedy, it is kept exactly when x is the target's argmax.
A logit callback (`logit_callback_fn`, see `spec_decode.engine.decoding`) is part of the
target's law: p_{j} is the target's logits of position i + j through the callback, given the
state of the prefix up to i + j - 1 (the committed tokens, then x_1..x_{j-1}), which is what
`temperature_sample` gives it had it sampled that prefix; q is the draft's own.
Forced prompt tokens are exact by construction: at a forced position both p and q become the
same point mass (on the forced token, or an id standing in for one outside the vocabulary), so
it is always drafted, always accepted, and the forced token is always emitted.
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.engine import contract
from spec_decode.engine import decode_rows
from spec_decode.engine import drafting
from spec_decode.engine import loops
from spec_decode.engine import sampling
from spec_decode.engine import verify
from spec_decode.engine.contract import DecodingState, TokensToLogits
from spec_decode.engine.stats import SpeculativeStats


@flax.struct.dataclass
class SpeculativeLoopState:
  rows: decode_rows.Rows
  cache: Any
  draft_cache: Any
  stats: SpeculativeStats
  iteration: jax.Array  # int32 scalar: which row of the decode's uniforms this step draws with


def check_speculative_settings(gamma: int | None = None,
                               verifier: str | verify.Rule = "token",
                               draft_policy: str | drafting.Policy = "fixed",
                               **sampling_settings: Any) -> None:
  """ValueError for a gamma, verifier, drafting policy or sampling setting
  `speculative_sample` cannot run with."""
  if gamma is None:
    raise ValueError("gamma is not set (drafts per target call, an integer >= 1)")
  if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 1:
    raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
  if isinstance(verifier, str):
    verify.get_rule(verifier)
  if isinstance(draft_policy, str):
    drafting.get_policy(draft_policy)
  sampling.check_settings(**sampling_settings)


def _vocab_size(tokens_to_logits: TokensToLogits, cache: Any, sequences: jax.Array) -> int:
  """The model's vocabulary size from an abstract call (traced, never compiled or run)."""
  num_rows = sequences.shape[0]
  state = DecodingState(jnp.zeros((num_rows,), jnp.int32), jnp.zeros((num_rows, 1), jnp.int32),
                        sequences, cache)
  return jax.eval_shape(tokens_to_logits, state)[0].shape[-1]


@loops.register("speculative_sample", uses_draft=True,
                check_settings=check_speculative_settings, stats=SpeculativeStats,
                data_settings=decode_rows.SAMPLING_DATA)
def speculative_sample(inputs: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                       eos_id: int, *, draft_cache: Any, draft_tokens_to_logits: TokensToLogits,
                       gamma: int, decode_rng: jax.Array | None = None, num_decodes: int = 1,
                       temperature: float = 1.0, topk: int = 0, topp: float = 0.0,
                       initial_index: jax.Array | None = None,
                       max_decode_steps: int | None = None,
                       max_decode_steps_hard_limit: int | None = None,
                       rescale_log_probs: bool = True,
                       verifier: str | verify.Rule = "token",
                       draft_policy: str | drafting.Policy = "fixed",
                       logit_callback_fn: decode_rows.LogitCallback | None = None
                       ) -> tuple[jax.Array, jax.Array, SpeculativeStats]:
  """Speculative sampling (Leviathan et al., 2023): same law as `temperature_sample`.

  `verifier` names a rule of `spec_decode.engine.verify` ('token', the paper's; 'block'; lossy rules
  such as 'lenient' are opt-in) or is a rule function with the same signature. `draft_policy`
  names a policy of `spec_decode.engine.drafting` ('fixed': always gamma drafts; 'expected_speedup',
  'confidence': adaptive, at most gamma) or is such a function. Returns (decodes [B, num_decodes,
  L], log_probs [B, num_decodes], stats: SpeculativeStats with [B, num_decodes] fields).

  log_probs are `temperature_sample`'s: the log-probability of the emitted (sampled, non-forced)
  tokens under the law being sampled, the target's (tempered and truncated with
  `rescale_log_probs`, its raw log-softmax without), read from the target's verification call.
  The draft changes how a sample is drawn, never its law, so it enters no score: a decode scores
  what the same tokens score under `temperature_sample`.
  """
  check_speculative_settings(gamma, verifier, draft_policy)
  rule = verify.get_rule(verifier) if isinstance(verifier, str) else verifier
  policy = drafting.get_policy(draft_policy) if isinstance(draft_policy, str) else draft_policy
  problem, rows = decode_rows.setup(
      inputs, eos_id=eos_id, num_decodes=num_decodes, initial_index=initial_index,
      temperature=temperature, topk=topk, topp=topp, max_decode_steps=max_decode_steps,
      max_decode_steps_hard_limit=max_decode_steps_hard_limit,
      rescale_log_probs=rescale_log_probs, logit_callback_fn=logit_callback_fn,
      block_size=gamma + 1)
  batch_size, max_decode_len = inputs.shape
  cache, draft_cache = decode_rows.expand((cache, draft_cache), num_decodes)
  target_vocab = _vocab_size(tokens_to_logits, cache, rows.sequences)
  draft_vocab = _vocab_size(draft_tokens_to_logits, draft_cache, rows.sequences)
  if target_vocab != draft_vocab:
    raise ValueError(f"target and draft vocabulary sizes differ: target logits have "
                     f"{target_vocab} entries, draft logits {draft_vocab}")
  # Greedy with a registered rule: verification compares tokens (`verify.compare_tokens`).
  # Otherwise each iteration draws gamma drafts, then the verdict's two uniforms.
  compare_tokens = problem.greedy and isinstance(verifier, str)
  uniforms = None if compare_tokens else sampling.decode_uniforms(
      decode_rng, *rows.sequences.shape, gamma + 2)
  step = functools.partial(_speculative_step, problem, tokens_to_logits,
                           draft_tokens_to_logits, rule=rule, policy=policy, gamma=gamma,
                           decode_uniforms=uniforms)
  initial = SpeculativeLoopState(rows, cache, draft_cache,
                                 SpeculativeStats.zeros(rows.index.shape[0]), jnp.int32(0))
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.rows.done), step, initial)
  decodes, log_probs, stats = decode_rows.finish(final.rows, max_decode_len, batch_size,
                                                 num_decodes, final.stats)
  return decodes, log_probs, stats


@flax.struct.dataclass
class DraftLoopState:
  """The draft loop of one iteration: after it ends, the drafts and what they cost."""
  offset: jax.Array  # int32 scalar: the block offset proposed next = draft calls made so far
  logits: jax.Array  # [N, V] the draft's logits for position i + 1 + offset
  sequences: jax.Array  # [N, S] the rows' buffer with the drafts written at i + 1..
  draft_cache: Any
  tokens: jax.Array  # [N, G] int32: the draft proposed at each offset
  probs: jax.Array | None  # [N, G, V] the law q each was drawn from; None when greedy
  still_drafting: jax.Array  # [N] bool
  num_drafted: jax.Array  # [N] int32
  is_point: jax.Array  # [N, G] bool: which drafts were deterministic proposals


def _draft(problem: decode_rows.Problem, draft_tokens_to_logits: TokensToLogits, *,
           rows: decode_rows.Rows, stats: SpeculativeStats, draft_cache: Any,
           policy: drafting.Policy, gamma: int, uniforms: jax.Array | None) -> DraftLoopState:
  """Proposes up to gamma tokens per row after its position i.

  The first call feeds positions (i-1, i) — the catch-up — except at i = 0, where it feeds
  (0, 1) and reads the logits of position 0 (position 1 is scratch, overwritten before it is
  read). Each further call feeds the previous draft. Finished rows do not draft, the policy may
  stop rows early, and a draft stops a row by proposing nothing (all -inf logits, before its
  token is counted); the loop ends when no row drafts any more. `uniforms [N, G]`: the draw at each offset; None at a
  greedy temperature (every q a point mass: its token is read, no law is kept). Returns the
  final loop state: its `offset` is then the number of draft calls made.
  """
  index = rows.index
  start = jnp.maximum(index - 1, 0)
  window = start[:, None] + jnp.arange(2)
  logits, draft_cache = contract.logits_of_one(draft_tokens_to_logits, DecodingState(
      start, decode_rows.gather(rows.sequences, window), rows.sequences, draft_cache),
      index - start)
  num_rows, vocab_size = logits.shape
  greedy = uniforms is None

  def propose(state: DraftLoopState) -> DraftLoopState:
    """Samples the draft at block offset `state.offset` and asks the policy whether to go on."""
    offset, logits = state.offset, state.logits
    position = (index + 1 + offset)[:, None]
    finite = jnp.sum(logits > -jnp.inf, axis=-1)
    forced = decode_rows.gather(problem.forced, position)[:, 0] > 0
    proposes = (finite > 0) | forced  # a forced token is always proposed (q is its one-hot)
    q = decode_rows.target_probs(problem, logits[:, None], position)[:, 0]
    q = jnp.where(proposes[:, None], q, 0.0)  # no proposal: no law (softmax of -inf is NaN)
    probs = state.probs
    if greedy:
      token = decode_rows.greedy_tokens(problem, logits[:, None], position)[:, 0]
    else:
      # The verifier weighs the drawn id (a forced id's stand-in); the draft reads the forced id.
      token = sampling.sample_from_uniform(uniforms[:, offset], q)
      probs = probs.at[:, offset].set(q)
    sequences = decode_rows.scatter(state.sequences, position,
                                    decode_rows.with_forced(problem, token[:, None], position))
    still_drafting = state.still_drafting & proposes
    is_point = state.is_point.at[:, offset].set(still_drafting & (finite == 1))
    return dataclasses.replace(
        state, offset=offset + 1, sequences=sequences, tokens=state.tokens.at[:, offset].set(token),
        probs=probs, num_drafted=state.num_drafted + still_drafting, is_point=is_point,
        still_drafting=still_drafting & policy(offset, q, stats) & (offset + 1 < gamma))

  def feed_and_propose(state: DraftLoopState) -> DraftLoopState:
    position = index + state.offset  # the previous draft's, as written (a forced id itself)
    logits, draft_cache = draft_tokens_to_logits(DecodingState(
        position, decode_rows.gather(state.sequences, position[:, None]), state.sequences,
        state.draft_cache))
    return propose(dataclasses.replace(state, logits=logits[:, 0], draft_cache=draft_cache))

  first = propose(DraftLoopState(
      offset=jnp.int32(0), logits=logits, sequences=rows.sequences, draft_cache=draft_cache,
      tokens=jnp.zeros((num_rows, gamma), jnp.int32),
      probs=None if greedy else jnp.zeros((num_rows, gamma, vocab_size), jnp.float32),
      # A finished row drafts nothing: it would keep the loop going for the rows still decoding.
      still_drafting=~rows.done, num_drafted=jnp.zeros((num_rows,), jnp.int32),
      is_point=jnp.zeros((num_rows, gamma), bool)))
  return jax.lax.while_loop(lambda state: jnp.any(state.still_drafting), feed_and_propose,
                            first)


def _speculative_step(problem: decode_rows.Problem, tokens_to_logits: TokensToLogits,
                      draft_tokens_to_logits: TokensToLogits, state: SpeculativeLoopState, *,
                      rule: verify.Rule, policy: drafting.Policy, gamma: int,
                      decode_uniforms: jax.Array | None) -> SpeculativeLoopState:
  """One iteration; `decode_uniforms` None: greedy verification by comparing tokens."""
  rows = state.rows
  compare_tokens = decode_uniforms is None
  uniforms = sampling.iteration_uniforms(decode_uniforms, state.iteration)
  drafts = _draft(problem, draft_tokens_to_logits, rows=rows, stats=state.stats,
                  draft_cache=state.draft_cache, policy=policy, gamma=gamma,
                  uniforms=None if compare_tokens else uniforms[:, :gamma])
  draft_tokens, draft_probs, num_drafted = drafts.tokens, drafts.probs, drafts.num_drafted

  block = rows.index[:, None] + jnp.arange(gamma + 1)
  logits, cache = tokens_to_logits(DecodingState(
      rows.index, decode_rows.gather(drafts.sequences, block), drafts.sequences, state.cache))
  logits = decode_rows.through_logit_callback(problem, logits, sequences=drafts.sequences,
                                              index=rows.index)
  if compare_tokens:
    target_tokens = decode_rows.greedy_tokens(problem, logits, block + 1)
    num_accepted, next_token = verify.compare_tokens(draft_tokens, target_tokens, num_drafted)
    rates = (draft_tokens == target_tokens[:, :gamma]).astype(jnp.float32)
  else:
    target_probs = decode_rows.target_probs(problem, logits, block + 1)
    # Drawn even when every law is a point mass: a rule passed as a function may randomize its
    # verdict (the bench's SIMULATED coin does).
    num_accepted, next_token = verify.draw_verdict(
        uniforms[:, gamma:], rule(draft_tokens, draft_probs, target_probs, num_drafted))
    rates = verify.acceptance_rates(draft_probs, target_probs)

  offsets = jnp.arange(gamma + 1)
  candidates = decode_rows.with_forced(
      problem, jnp.where(offsets == num_accepted[:, None], next_token[:, None],
                         jnp.pad(draft_tokens, ((0, 0), (0, 1)))), block + 1)
  committed, num_committed = decode_rows.commit(
      problem, dataclasses.replace(rows, sequences=drafts.sequences), candidates,
      num_accepted + 1, logits)

  active = ~rows.done
  # Drafts the verifier weighed and whose position the row kept: up to the first rejection,
  # never past EOS or the length limit; forced positions (alpha 1 by construction) do not count.
  # Only the row's own num_drafted offsets: after m < gamma drafts all accepted, the bonus token
  # at offset m was never drafted (draft_probs there are zeros, or a proposal made only because
  # other rows kept drafting, which the verifier ignored).
  verified = offsets[:gamma] < jnp.minimum(num_drafted, num_committed)[:, None]
  verified &= decode_rows.gather(problem.forced, block[:, 1:]) == 0
  count = lambda x: jnp.where(active, x, 0).astype(jnp.int32)
  kept = jnp.minimum(num_accepted, num_committed)
  stats = state.stats
  stats = SpeculativeStats(
      target_calls=stats.target_calls + count(1),
      draft_calls=stats.draft_calls + count(drafts.offset),
      drafted_tokens=stats.drafted_tokens + count(num_drafted),
      accepted_tokens=stats.accepted_tokens + kept,
      lookup_drafted_tokens=stats.lookup_drafted_tokens + count(jnp.sum(drafts.is_point, axis=1)),
      lookup_accepted_tokens=stats.lookup_accepted_tokens + jnp.sum(
          drafts.is_point & (offsets[:gamma] < kept[:, None]), axis=1).astype(jnp.int32),
      generated_tokens=stats.generated_tokens + num_committed,
      acceptance_sum=stats.acceptance_sum + jnp.sum(jnp.where(verified, rates, 0.0), axis=1),
      verified_positions=stats.verified_positions + jnp.sum(verified, axis=1).astype(jnp.int32))
  return SpeculativeLoopState(committed, cache, drafts.draft_cache, stats, state.iteration + 1)
