"""Decoders: the autoregressive baseline and exact speculative sampling.

Both are pure functions over flax dataclass loop states, each one `jax.lax.while_loop` that the
caller jits (the models in `spec_decode.models` jit them with the parameters as arguments). No
host round-trip happens per token; prompts and rngs are data, so they never cause a recompile.

## Models
Models enter through the model contract (`spec_decode.engine.contract`; `DecodingState` and
`TokensToLogits` are re-exported here). `speculative_sample` calls the target with
k = gamma + 1 (one parallel verification per iteration), the draft with k = 2 once per
iteration (the catch-up call below, asking for one fed token's logits) and k = 1 otherwise.
A draft's logits may hold -inf: a row whose logits are all -inf proposes NOTHING at that position
(`lookup.NGramLookup` where no n-gram matches), and a row with exactly one finite logit is a
deterministic proposal (q is the point mass there), which the stats count as a lookup draft.

## Conventions (T5X's `t5x/decoding.py`)
`inputs [B, L]` are decoder inputs: position 0 is BOS (0); a non-zero token at position t >= 1 is
forced (a prompt), zero means "sample". The output `decodes [B, num_decodes, L]` holds the
tokens of positions 1..L; after EOS (or beyond its length limit) a row holds PAD 0.
Forced ids are copied through whatever their value, ids outside the vocabulary included, greedy
and sampled alike; the model is fed them as they are.
`log_probs [B, num_decodes]` sums, over the sampled, non-forced tokens up to and including EOS,
their log-probability under the law sampled (`rescale_log_probs=True`, T5X's default: the
tempered distribution renormalized over what top-k/top-p keep, so 0 per token when greedy), or
under the model's own log-softmax (`rescale_log_probs=False`: temperature 1, no truncation).
The num_decodes samples of each example are sorted by log_prob, ascending (the best is last),
as in T5X.
`initial_index [B]`: rows start at that position; the caches must already hold positions
< initial_index (a prefill) and `inputs` holds the prompt up to and including initial_index.
`max_decode_steps`: each row samples at most that many positions past its prompt, and at most
`max_decode_steps_hard_limit` (a Python int, T5X's static bound on a traced max_decode_steps).
Unlike T5X, whose `topk=1` default silently means greedy, `topk` defaults to 0 (no truncation);
greedy decoding is `temperature=0`.

## How speculative sampling keeps the target's distribution
Each iteration of `speculative_sample`, for every row independently at its own position i
(the position of its last committed token):
1. the draft proposes x_1..x_m from q, m <= gamma chosen by a drafting policy (fixed m = gamma
   by default; see `spec_decode.engine.drafting`): a k = 2 catch-up call at positions i-1, i (after a
   fully accepted block the draft has never seen x_m; otherwise it rewrites an entry it already
   holds) asking for the logits of position i alone, then k = 1 calls;
2. the target scores [seq[i], x_1..x_gamma] in ONE call (k = gamma + 1) giving p_1..p_{gamma+1};
3. a verification rule from `spec_decode.engine.verify` turns (x, q, p, m) into the number of
   accepted drafts n and the next token; the row commits n + 1 tokens (cut at EOS or its length limit)
   and both caches roll back to the new position on the next call.
A draft may also stop a row by proposing nothing (all -inf logits), at any offset, the first
included: the row then has m = the offset drafts (m = 0: the iteration emits one token of the
target, the bonus from p_1 of the same single call). This stays exact for the reason the drafting
policies do: whether a row goes on depends only on its prefix, its drafts so far and the draft's
own randomness, never on the target's p or the verifier's coins, so m is fixed before
verification, and every exact rule's law is the target's given any such m (the verifier is told
m and weighs only those drafts; p_{m+1} conditions only on positions <= i + m). A deterministic
proposal x has q = one-hot(x): the token rule accepts it with p(x) and otherwise emits from
norm(p with x removed), which is p again; greedy, it is kept exactly when x is the target's argmax.
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
import numpy as np

from spec_decode.engine import contract
from spec_decode.engine import drafting
from spec_decode.engine import loops
from spec_decode.engine import sampling
from spec_decode.engine import verify
# The contract's types, which every loop's signature names, re-exported for loops' authors.
from spec_decode.engine.contract import DecodingState, TokensToLogits
from spec_decode.engine.stats import SpeculativeStats


@flax.struct.dataclass
class Rows:
  """Per-row progress shared by both decoders."""
  index: jax.Array  # [N] position of the last committed token
  done: jax.Array  # [N] bool: EOS emitted or length limit reached
  sequences: jax.Array  # [N, S] token buffer; positions > index hold scratch (drafts)
  log_prob: jax.Array  # [N] float32


@flax.struct.dataclass
class _Problem:
  """Per-row constants of one decode call."""
  forced: jax.Array  # [N, S] forced token per position, 0 where free
  end: jax.Array  # [N] last position a row may write
  eos_id: int = flax.struct.field(pytree_node=False)
  sampling_args: tuple[Any, Any, Any]  # temperature ([N] per row, or one), topk, topp: data
  rescale_log_probs: bool = flax.struct.field(pytree_node=False, default=True)

  @property
  def greedy(self) -> bool:
    """Every distribution sampled is a point mass: tokens are read by `_greedy_tokens`, nothing
    is drawn."""
    return sampling.is_greedy(self.sampling_args[0])


@flax.struct.dataclass
class SamplingLoopState:
  rows: Rows
  cache: Any
  iteration: jax.Array  # int32 scalar: which row of the decode's uniforms this step draws with


@flax.struct.dataclass
class SpeculativeLoopState:
  rows: Rows
  cache: Any
  draft_cache: Any
  stats: SpeculativeStats
  iteration: jax.Array  # int32 scalar (see SamplingLoopState)


def _validate(inputs, eos_id, num_decodes, **sampling_settings):
  if inputs.ndim != 2:
    raise ValueError(f"inputs must be [batch, max_decode_len], got shape {inputs.shape}")
  if np.shape(sampling_settings["temperature"]) not in ((), inputs.shape[:1]):
    raise ValueError(f"temperature must be a number or one per example ({inputs.shape[0]}), "
                     f"got shape {np.shape(sampling_settings['temperature'])}")
  if int(eos_id) != eos_id or eos_id < 0:
    raise ValueError(f"eos_id must be a non-negative integer, got {eos_id!r}")
  if int(num_decodes) != num_decodes or num_decodes < 1:
    raise ValueError(f"num_decodes must be an integer >= 1, got {num_decodes!r}")
  sampling.check_settings(**sampling_settings)


def _capped(max_decode_steps: Any, hard_limit: int | None) -> Any:
  """max_decode_steps within its hard limit (T5X's: a limit of None or 0 is none)."""
  if max_decode_steps is None or not hard_limit:
    return max_decode_steps
  return jnp.minimum(max_decode_steps, hard_limit)


def _expand(tree: Any, num_decodes: int) -> Any:
  """Repeats every leaf num_decodes times along its leading (batch) axis."""
  if num_decodes == 1:
    return tree
  return jax.tree_util.tree_map(lambda x: jnp.repeat(x, num_decodes, axis=0), tree)


def _setup(inputs, initial_index, num_decodes, max_decode_steps, eos_id, sampling_args,
           rescale_log_probs, block_size):
  """Builds the expanded problem constants and the starting rows.

  The buffer has `block_size` scratch columns past position L so a block written at any
  position <= L stays in bounds.
  """
  inputs = _expand(jnp.asarray(inputs, jnp.int32), num_decodes)
  if np.ndim(sampling_args[0]) == 1:  # one temperature per example: per row
    sampling_args = (_expand(jnp.asarray(sampling_args[0], jnp.float32), num_decodes),
                     *sampling_args[1:])
  num_rows, max_decode_len = inputs.shape
  sequences = jnp.pad(inputs, ((0, 0), (0, 1 + block_size)))
  forced = sequences.at[:, 0].set(0)
  positions = jnp.arange(sequences.shape[1])
  if initial_index is None:
    index = jnp.zeros((num_rows,), jnp.int32)
  else:
    index = _expand(jnp.asarray(initial_index, jnp.int32), num_decodes)
  end = jnp.full((num_rows,), max_decode_len, jnp.int32)
  if max_decode_steps is not None:
    prompt_end = jnp.maximum(jnp.max(jnp.where(forced > 0, positions, 0), axis=1), index)
    end = jnp.minimum(end, prompt_end + max_decode_steps)
  rows = Rows(index=index, done=index >= end, sequences=sequences,
              log_prob=jnp.zeros((num_rows,), jnp.float32))
  return _Problem(forced, end, eos_id, sampling_args, rescale_log_probs), rows


def _gather(buffer: jax.Array, positions: jax.Array) -> jax.Array:
  """buffer[n, positions[n, j]] for buffer [N, S], positions [N, C]."""
  return jnp.take_along_axis(buffer, positions, axis=1)


def _scatter(buffer: jax.Array, positions: jax.Array, values: jax.Array) -> jax.Array:
  """buffer[n, positions[n, j]] = values[n, j]. Written per row (vmap) so that a batch-sharded
  buffer is updated where its rows live, with no cross-device traffic."""
  return jax.vmap(lambda row, where, new: row.at[where].set(new))(buffer, positions, values)


def _target_probs(problem: _Problem, logits: jax.Array, positions: jax.Array) -> jax.Array:
  """The sampled distribution for the tokens at `positions [N, C]` from `logits [N, C, V]`.
  A forced position becomes a point mass on an id of the vocabulary standing in for its forced
  token, which may lie outside it (T5X copies any id through): the laws there only need to
  agree that the position is certain, and `_with_forced` writes the forced id itself."""
  probs = sampling.logits_to_probs(logits, *problem.sampling_args)
  forced = _gather(problem.forced, positions)
  stand_in = jnp.minimum(forced, logits.shape[-1] - 1)
  forced_one_hot = jax.nn.one_hot(stand_in, logits.shape[-1], dtype=probs.dtype)
  return jnp.where((forced > 0)[..., None], forced_one_hot, probs)


def _with_forced(problem: _Problem, tokens: jax.Array, positions: jax.Array) -> jax.Array:
  """`tokens [N, C]` for `positions [N, C]`, the forced token wherever one is forced."""
  forced = _gather(problem.forced, positions)
  return jnp.where(forced > 0, forced, tokens)


def _greedy_tokens(problem: _Problem, logits: jax.Array, positions: jax.Array) -> jax.Array:
  """The token of each point mass `_target_probs` gives at a greedy temperature: the forced
  token at a forced position, else the argmax of `logits [N, C, V]` (ties to the lowest id)."""
  return _with_forced(problem, sampling.first_argmax(logits), positions)


def _commit(problem: _Problem, rows: Rows, candidates: jax.Array, num_candidates: jax.Array,
            logits: jax.Array) -> tuple[Rows, jax.Array]:
  """Appends the first num_candidates[n] of `candidates [N, C]` after each row's last token.

  `logits [N, C, V]` are the target's logits that predicted each candidate (for log_prob).
  The block is cut after the first sampled EOS and at the row's length limit; finished rows do
  not change. Returns the new rows and the number of tokens each row committed [N].
  """
  block = jnp.arange(candidates.shape[1])
  positions = rows.index[:, None] + 1 + block
  keep = (block < num_candidates[:, None]) & (positions <= problem.end[:, None])
  keep &= ~rows.done[:, None]
  sampled = _gather(problem.forced, positions) == 0
  eos = keep & sampled & (candidates == problem.eos_id)
  keep &= (jnp.cumsum(eos, axis=1) - eos) == 0  # nothing after the first EOS
  hit_eos = jnp.any(eos & keep, axis=1)
  num_committed = jnp.sum(keep, axis=1).astype(jnp.int32)
  sequences = _scatter(rows.sequences, positions,
                       jnp.where(keep, candidates, _gather(rows.sequences, positions)))
  scored = jnp.where(sampled, candidates, 0)  # a forced id may lie outside the vocabulary
  if problem.rescale_log_probs:
    token_log_probs = sampling.law_log_prob_of(logits, scored, *problem.sampling_args)
  else:
    token_log_probs = sampling.log_softmax_of(logits, scored)
  log_prob = rows.log_prob + jnp.sum(jnp.where(keep & sampled, token_log_probs, 0.0), axis=1)
  index = rows.index + num_committed
  done = rows.done | hit_eos | (index >= problem.end)
  return Rows(index, done, sequences, log_prob), num_committed


def _finish(rows: Rows, max_decode_len: int, batch_size: int, num_decodes: int,
            per_row: Any = None):
  """Cuts the buffer to decodes [B, num_decodes, L] (PAD past each row's end) and sorts each
  example's decodes by log_prob, ascending; `per_row` leaves [N] are reshaped and sorted alike."""
  positions = jnp.arange(1, max_decode_len + 1)
  decodes = jnp.where(positions[None] <= rows.index[:, None],
                      rows.sequences[:, 1:max_decode_len + 1], 0)
  unflatten = lambda x: x.reshape((batch_size, num_decodes) + x.shape[1:])
  decodes, log_prob, per_row = jax.tree_util.tree_map(
      unflatten, (decodes, rows.log_prob, per_row))
  order = jnp.argsort(log_prob, axis=1)
  sort = lambda x: jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)),
                                       axis=1)
  return jax.tree_util.tree_map(sort, (decodes, log_prob, per_row))


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


# T5X's temperature_sample takes these as data: one compiled decoder serves every value.
SAMPLING_DATA = ("temperature", "topk", "topp", "max_decode_steps")


@loops.register("temperature_sample", uses_draft=False, check_settings=sampling.check_settings,
                data_settings=SAMPLING_DATA)
def temperature_sample(inputs: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                       eos_id: int, decode_rng: jax.Array | None = None,
                       num_decodes: int = 1, temperature: float = 1.0, topk: int = 0,
                       topp: float = 0.0, initial_index: jax.Array | None = None,
                       max_decode_steps: int | None = None,
                       max_decode_steps_hard_limit: int | None = None,
                       rescale_log_probs: bool = True) -> tuple[jax.Array, jax.Array]:
  """Autoregressive sampling, one target call per token: the baseline.

  Returns (decodes [B, num_decodes, L] int32, log_probs [B, num_decodes] float32; see the
  conventions above for what log_probs sums).
  """
  _validate(inputs, eos_id, num_decodes, temperature=temperature, topk=topk, topp=topp,
            max_decode_steps=max_decode_steps,
            max_decode_steps_hard_limit=max_decode_steps_hard_limit,
            rescale_log_probs=rescale_log_probs)
  batch_size, max_decode_len = inputs.shape
  problem, rows = _setup(inputs, initial_index, num_decodes,
                         _capped(max_decode_steps, max_decode_steps_hard_limit), eos_id,
                         (temperature, topk, topp), rescale_log_probs, block_size=1)
  # [S, N, 1]: at most one iteration per buffer position (sequences [N, S]).
  uniforms = None if problem.greedy else sampling.decode_uniforms(
      decode_rng, *rows.sequences.shape, 1)

  def step(state: SamplingLoopState) -> SamplingLoopState:
    step_uniforms = sampling.iteration_uniforms(uniforms, state.iteration)
    index = state.rows.index
    logits, cache = tokens_to_logits(DecodingState(
        cur_index=index, cur_token=_gather(state.rows.sequences, index[:, None]),
        sequences=state.rows.sequences, cache=state.cache))
    positions = index[:, None] + 1
    if problem.greedy:
      token = _greedy_tokens(problem, logits, positions)
    else:
      token = _with_forced(problem, sampling.sample_from_uniform(
          step_uniforms, _target_probs(problem, logits, positions)), positions)
    rows, _ = _commit(problem, state.rows, token, jnp.ones_like(index), logits)
    return SamplingLoopState(rows, cache, state.iteration + 1)

  final = jax.lax.while_loop(lambda s: ~jnp.all(s.rows.done), step,
                             SamplingLoopState(rows, _expand(cache, num_decodes), jnp.int32(0)))
  decodes, log_probs, _ = _finish(final.rows, max_decode_len, batch_size, num_decodes)
  return decodes, log_probs


def _vocab_size(tokens_to_logits: TokensToLogits, cache: Any, sequences: jax.Array) -> int:
  """The model's vocabulary size from an abstract call (traced, never compiled or run)."""
  num_rows = sequences.shape[0]
  state = DecodingState(jnp.zeros((num_rows,), jnp.int32), jnp.zeros((num_rows, 1), jnp.int32),
                        sequences, cache)
  return jax.eval_shape(tokens_to_logits, state)[0].shape[-1]


@loops.register("speculative_sample", uses_draft=True,
                check_settings=check_speculative_settings, stats=SpeculativeStats,
                data_settings=SAMPLING_DATA)
def speculative_sample(inputs: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                       eos_id: int, *, draft_cache: Any, draft_tokens_to_logits: TokensToLogits,
                       gamma: int, decode_rng: jax.Array | None = None, num_decodes: int = 1,
                       temperature: float = 1.0, topk: int = 0, topp: float = 0.0,
                       initial_index: jax.Array | None = None,
                       max_decode_steps: int | None = None,
                       max_decode_steps_hard_limit: int | None = None,
                       rescale_log_probs: bool = True,
                       verifier: str | verify.Rule = "token",
                       draft_policy: str | drafting.Policy = "fixed"
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
  _validate(inputs, eos_id, num_decodes, temperature=temperature, topk=topk, topp=topp,
            max_decode_steps=max_decode_steps,
            max_decode_steps_hard_limit=max_decode_steps_hard_limit,
            rescale_log_probs=rescale_log_probs)
  check_speculative_settings(gamma, verifier, draft_policy)
  rule = verify.get_rule(verifier) if isinstance(verifier, str) else verifier
  policy = drafting.get_policy(draft_policy) if isinstance(draft_policy, str) else draft_policy
  batch_size, max_decode_len = inputs.shape
  problem, rows = _setup(inputs, initial_index, num_decodes,
                         _capped(max_decode_steps, max_decode_steps_hard_limit), eos_id,
                         (temperature, topk, topp), rescale_log_probs, block_size=gamma + 1)
  cache, draft_cache = _expand((cache, draft_cache), num_decodes)
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
  decodes, log_probs, stats = _finish(final.rows, max_decode_len, batch_size, num_decodes,
                                      final.stats)
  return decodes, log_probs, stats


def _draft(problem: _Problem, draft_tokens_to_logits: TokensToLogits, *, rows: Rows,
           stats: SpeculativeStats, draft_cache: Any, policy: drafting.Policy, gamma: int,
           uniforms: jax.Array | None):
  """Proposes up to gamma tokens per row after its position i.

  The first call feeds positions (i-1, i) — the catch-up — except at i = 0, where it feeds
  (0, 1) and reads the logits of position 0 (position 1 is scratch, overwritten before it is
  read). Each further call feeds the previous draft. The policy may stop rows early, and a draft
  stops a row by proposing nothing (all -inf logits, before its token is counted); the loop
  ends when no row drafts any more. `uniforms [N, G]`: the draw at each offset; None at a
  greedy temperature (every q a point mass: its token is read, no law is kept). Returns
  (draft_tokens [N, G], draft_probs [N, G, V] (None when greedy), num_drafted [N], number of
  draft calls (scalar), sequences with the drafts written at i+1.., draft_cache,
  is_point [N, G]: which drafts were deterministic proposals).
  """
  index = rows.index
  start = jnp.maximum(index - 1, 0)
  window = start[:, None] + jnp.arange(2)
  logits, draft_cache = contract.logits_of_one(draft_tokens_to_logits, DecodingState(
      start, _gather(rows.sequences, window), rows.sequences, draft_cache), index - start)
  num_rows, vocab_size = logits.shape
  greedy = uniforms is None

  def propose(carry):
    """Samples the draft at block offset `offset` and asks the policy whether to go on."""
    (offset, logits, sequences, draft_cache, tokens, probs, still_drafting, num_drafted,
     is_point) = carry
    position = index + 1 + offset
    finite = jnp.sum(logits > -jnp.inf, axis=-1)
    forced = _gather(problem.forced, position[:, None])[:, 0] > 0
    proposes = (finite > 0) | forced  # a forced token is always proposed (q is its one-hot)
    q = _target_probs(problem, logits[:, None], position[:, None])[:, 0]
    q = jnp.where(proposes[:, None], q, 0.0)  # no proposal: no law (softmax of -inf is NaN)
    if greedy:
      token = _greedy_tokens(problem, logits[:, None], position[:, None])[:, 0]
    else:
      # The verifier weighs the drawn id (a forced id's stand-in); the draft reads the forced id.
      token = sampling.sample_from_uniform(uniforms[:, offset], q)
      probs = probs.at[:, offset].set(q)
    sequences = _scatter(sequences, position[:, None],
                         _with_forced(problem, token[:, None], position[:, None]))
    still_drafting &= proposes
    num_drafted = num_drafted + still_drafting
    is_point = is_point.at[:, offset].set(still_drafting & (finite == 1))
    still_drafting &= policy(offset, q, stats) & (offset + 1 < gamma)
    return (offset + 1, logits, sequences, draft_cache, tokens.at[:, offset].set(token), probs,
            still_drafting, num_drafted, is_point)

  def feed_and_propose(carry):
    offset, _, sequences, draft_cache = carry[:4]
    position = index + offset  # the previous draft's, as written (a forced id itself)
    logits, draft_cache = draft_tokens_to_logits(DecodingState(
        position, _gather(sequences, position[:, None]), sequences, draft_cache))
    return propose((offset, logits[:, 0], sequences, draft_cache) + carry[4:])

  probs = None if greedy else jnp.zeros((num_rows, gamma, vocab_size), jnp.float32)
  carry = propose((jnp.int32(0), logits, rows.sequences, draft_cache,
                   jnp.zeros((num_rows, gamma), jnp.int32), probs,
                   jnp.ones((num_rows,), bool), jnp.zeros((num_rows,), jnp.int32),
                   jnp.zeros((num_rows, gamma), bool)))
  carry = jax.lax.while_loop(lambda c: jnp.any(c[6]), feed_and_propose, carry)
  num_calls, _, sequences, draft_cache, tokens, probs, _, num_drafted, is_point = carry
  return tokens, probs, num_drafted, num_calls, sequences, draft_cache, is_point


def _speculative_step(problem: _Problem, tokens_to_logits: TokensToLogits,
                      draft_tokens_to_logits: TokensToLogits, state: SpeculativeLoopState, *,
                      rule: verify.Rule, policy: drafting.Policy, gamma: int,
                      decode_uniforms: jax.Array | None) -> SpeculativeLoopState:
  """One iteration; `decode_uniforms` None: greedy verification by comparing tokens."""
  rows = state.rows
  compare_tokens = decode_uniforms is None
  uniforms = sampling.iteration_uniforms(decode_uniforms, state.iteration)
  (draft_tokens, draft_probs, num_drafted, num_draft_calls, sequences, draft_cache,
   is_point) = _draft(
      problem, draft_tokens_to_logits, rows=rows, stats=state.stats,
      draft_cache=state.draft_cache, policy=policy, gamma=gamma,
      uniforms=None if compare_tokens else uniforms[:, :gamma])

  block = rows.index[:, None] + jnp.arange(gamma + 1)
  logits, cache = tokens_to_logits(DecodingState(
      rows.index, _gather(sequences, block), sequences, state.cache))
  if compare_tokens:
    target_tokens = _greedy_tokens(problem, logits, block + 1)
    num_accepted, next_token = verify.compare_tokens(draft_tokens, target_tokens, num_drafted)
    rates = (draft_tokens == target_tokens[:, :gamma]).astype(jnp.float32)
  else:
    target_probs = _target_probs(problem, logits, block + 1)
    # Drawn even when every law is a point mass: a rule passed as a function may randomize its
    # verdict (the bench's SIMULATED coin does).
    num_accepted, next_token = verify.draw_verdict(
        uniforms[:, gamma:], rule(draft_tokens, draft_probs, target_probs, num_drafted))
    rates = verify.acceptance_rates(draft_probs, target_probs)

  offsets = jnp.arange(gamma + 1)
  candidates = _with_forced(problem, jnp.where(offsets == num_accepted[:, None],
                                               next_token[:, None],
                                               jnp.pad(draft_tokens, ((0, 0), (0, 1)))),
                            block + 1)
  committed, num_committed = _commit(problem, dataclasses.replace(rows, sequences=sequences),
                                     candidates, num_accepted + 1, logits)

  active = ~rows.done
  # Drafts the verifier weighed and whose position the row kept: up to the first rejection,
  # never past EOS or the length limit; forced positions (alpha 1 by construction) do not count.
  # Only the row's own num_drafted offsets: after m < gamma drafts all accepted, the bonus token
  # at offset m was never drafted (draft_probs there are zeros, or a proposal made only because
  # other rows kept drafting, which the verifier ignored).
  verified = offsets[:gamma] < jnp.minimum(num_drafted, num_committed)[:, None]
  verified &= _gather(problem.forced, block[:, 1:]) == 0
  count = lambda x: jnp.where(active, x, 0).astype(jnp.int32)
  kept = jnp.minimum(num_accepted, num_committed)
  stats = state.stats
  stats = SpeculativeStats(
      target_calls=stats.target_calls + count(1),
      draft_calls=stats.draft_calls + count(num_draft_calls),
      drafted_tokens=stats.drafted_tokens + count(num_drafted),
      accepted_tokens=stats.accepted_tokens + kept,
      lookup_drafted_tokens=stats.lookup_drafted_tokens + count(jnp.sum(is_point, axis=1)),
      lookup_accepted_tokens=stats.lookup_accepted_tokens + jnp.sum(
          is_point & (offsets[:gamma] < kept[:, None]), axis=1).astype(jnp.int32),
      generated_tokens=stats.generated_tokens + num_committed,
      acceptance_sum=stats.acceptance_sum + jnp.sum(jnp.where(verified, rates, 0.0), axis=1),
      verified_positions=stats.verified_positions + jnp.sum(verified, axis=1).astype(jnp.int32))
  return SpeculativeLoopState(committed, cache, draft_cache, stats, state.iteration + 1)
