"""Beam search with T5X's semantics (`t5x.decoding.beam_search`), as an engine decode loop.

`beam_step` is the one implementation of a beam-search step: from the log-softmax of every live
beam's next-token logits it selects the new live and finished beams exactly as T5X's loop body
does (top 2K candidates of the flattened [K * V] scores, forced prompt tokens, EOS candidates to
the finished set scored with T5X's brevity penalty ((5 + length) / 6) ** alpha, the K best
finished kept, sorted ascending: the best last). `beam_search` calls the target once per step
and feeds `beam_step`; `speculative_beam_search` replays `beam_step` on the target's log-probs
of a draft's tree.

`beam_search` runs T5X's loop condition: its rows step together until the batch stops, at the
length limit (or after `max_decode_step` steps where that is > 0, T5X's cap), once no row's live
beams can beat its worst finished one (T5X's `search_terminated`), or once no row's best live
beam's log-prob passes `min_log_prob` (T5X's, default -1e7: only filler beams are left).
`speculative_beam_search`'s rows advance at their own pace, so each row stops by itself
(`continues`); for alpha >= 0 (checked) the steps T5X runs past a row's termination never change
that row's finished set, so every row's output is still T5X's, except where a row has no
finished beam and only filler live beams (log-probs below -1e7), which finite logits within 1e7
of each other never produce. A `min_log_prob` above T5X's default would make that rule's
batch-wide stop matter, so that loop takes only the default.

`initial_index [B]` (T5X's prefilled prompts): row b starts at position initial_index[b], its
cache holding the positions before it and `inputs` its prompt up to and including that position
(as in T5X, which takes a prompt's last non-zero token as its end: nothing is forced after it);
the brevity penalty counts the prompt, and `max_decode_step` counts steps from the row's start.
T5X runs every row of a batch L - min(initial_index) steps, so a row with a longer prompt goes
on past position L, scoring tokens its output then cuts (T5X's beam_search NOTE); here every row
stops at position L, where its buffer and its model's cache end. A batch whose rows share one
initial_index gets T5X's output, as does each row T5X's search terminates before position L;
otherwise each row gets what T5X gives it alone.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import contract
from spec_decode.engine import decode_rows
from spec_decode.engine import loops

# T5X's stand-in for -inf in beam scores (`t5x.decoding.NEG_INF`), and min_log_prob's default.
NEG_INF = np.array(-1.0e7)
DEFAULT_MIN_LOG_PROB = float(NEG_INF)


@flax.struct.dataclass
class BeamState:
  """The beams of B examples, K beams each; every beam of a row is at that row's position."""
  index: jax.Array  # [B] position of the live beams' last token
  live_log_probs: jax.Array  # [B, K], ascending
  live_seqs: jax.Array  # [B, K, S]
  finished_scores: jax.Array  # [B, K], ascending
  finished_seqs: jax.Array  # [B, K, S]
  finished_flags: jax.Array  # [B, K] bool: the slot holds a finished decode


@flax.struct.dataclass
class BeamProblem:
  """Per-example constants of one beam search."""
  forced: jax.Array  # [B, S] forced token per position, 0 where free
  start: jax.Array  # [B] the position each row starts from (its initial_index, or 0)
  max_decode_len: int = flax.struct.field(pytree_node=False)
  eos_id: int = flax.struct.field(pytree_node=False)
  alpha: float = flax.struct.field(pytree_node=False)
  max_decode_step: int = flax.struct.field(pytree_node=False, default=-1)  # <= 0: no cap


def brevity_penalty(alpha: float, length: Any) -> jax.Array:
  """T5X's length normalizer ((5 + length) / 6) ** alpha."""
  return jnp.power((5.0 + length) / 6.0, alpha)


def check_beam_settings(alpha: float = 0.6, max_decode_step: int = -1,
                        min_log_prob: float = DEFAULT_MIN_LOG_PROB,
                        max_decode_len: int | None = None, **_: Any) -> None:
  """ValueError for a brevity alpha, step cap, min_log_prob or decode length beam search
  cannot run with."""
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
    raise ValueError(f"alpha (the brevity penalty's exponent) must be a number >= 0, got "
                     f"{alpha!r}")
  if max_decode_len is not None and (isinstance(max_decode_len, bool) or
                                     not isinstance(max_decode_len, int) or max_decode_len < 1):
    raise ValueError(f"max_decode_len must be an integer >= 1 or None (the inputs' length), "
                     f"got {max_decode_len!r}")
  if isinstance(max_decode_step, bool) or not isinstance(max_decode_step, int):
    raise ValueError(f"max_decode_step must be an integer (<= 0: no cap), got "
                     f"{max_decode_step!r}")
  if isinstance(min_log_prob, bool) or not isinstance(min_log_prob, (int, float)) or (
      min_log_prob != min_log_prob):
    raise ValueError(f"min_log_prob must be a number, got {min_log_prob!r}")


def validate(inputs: jax.Array, eos_id: int, num_decodes: int, initial_index: Any,
             max_decode_len: int | None = None) -> jax.Array:
  """ValueError for arguments no beam search takes; else the inputs cut to T5X's
  `max_decode_len` (the decode's length, None: the inputs' own)."""
  if initial_index is not None and np.shape(initial_index) != inputs.shape[:1]:
    raise ValueError(f"initial_index must be one position per example ({inputs.shape[0]}), "
                     f"got shape {np.shape(initial_index)}")
  if inputs.ndim != 2:
    raise ValueError(f"inputs must be [batch, max_decode_len], got shape {inputs.shape}")
  if int(eos_id) != eos_id or eos_id < 0:
    raise ValueError(f"eos_id must be a non-negative integer, got {eos_id!r}")
  if isinstance(num_decodes, bool) or int(num_decodes) != num_decodes or num_decodes < 1:
    raise ValueError(f"num_decodes (the beam size) must be an integer >= 1, got "
                     f"{num_decodes!r}")
  if max_decode_len is None:
    return inputs
  if max_decode_len > inputs.shape[1]:
    raise ValueError(f"max_decode_len ({max_decode_len}) is past the inputs' length "
                     f"{inputs.shape[1]}, which the model's caches are built for")
  return inputs[:, :max_decode_len]


def init(inputs: jax.Array, num_beams: int, eos_id: int, alpha: float, scratch: int, *,
         max_decode_step: int = -1,
         initial_index: jax.Array | None = None) -> tuple[BeamProblem, BeamState]:
  """The problem and the starting beams: one live beam (BOS, or the prompt up to
  `initial_index`) and K - 1 fillers per row. The buffers hold positions 0..L plus `scratch`
  columns a multi-token call may read past L."""
  inputs = jnp.asarray(inputs, jnp.int32)
  batch_size, max_decode_len = inputs.shape
  length = max_decode_len + 1 + scratch
  prompts = jnp.pad(inputs, ((0, 0), (0, 1 + scratch)))
  if initial_index is None:
    start = jnp.zeros((batch_size,), jnp.int32)
    forced, live_seqs = prompts.at[:, 0].set(0), jnp.zeros((batch_size, length), jnp.int32)
  else:  # the prompt is the row's beam already; nothing is forced after it
    start = jnp.asarray(initial_index, jnp.int32)
    live_seqs = jnp.where(jnp.arange(length) <= start[:, None], prompts, 0)
    forced = jnp.zeros_like(prompts)
  live_log_probs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (num_beams - 1), jnp.float32),
                            (batch_size, 1))
  live_seqs = jnp.broadcast_to(live_seqs[:, None], (batch_size, num_beams, length))
  # Finished slots start as the prompt too: T5X puts it before every decode it returns.
  state = BeamState(
      index=start, live_log_probs=live_log_probs, live_seqs=live_seqs,
      finished_scores=jnp.full((batch_size, num_beams), NEG_INF, jnp.float32),
      finished_seqs=live_seqs, finished_flags=jnp.zeros((batch_size, num_beams), bool))
  return BeamProblem(forced, start, max_decode_len, eos_id, alpha, max_decode_step), state


def _row_stops(problem: BeamProblem, state: BeamState,
               min_log_prob: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per row [B] bool: (within its length limit and step cap, its search terminated, its best
  live beam's log-prob below min_log_prob after its first step), T5X's loop condition's parts."""
  min_brevity_penalty = brevity_penalty(problem.alpha, problem.max_decode_len + 1)
  best_live = state.live_log_probs[:, -1] / min_brevity_penalty
  worst_finished = jnp.where(state.finished_flags,
                             jnp.min(state.finished_scores, axis=1, keepdims=True), NEG_INF)
  terminated = jnp.all(worst_finished > best_live[:, None], axis=1)
  below_min_log_prob = ((best_live < min_log_prob / min_brevity_penalty)
                        & (state.index > problem.start))
  within_limit = state.index < problem.max_decode_len
  if problem.max_decode_step > 0:
    within_limit &= state.index - problem.start < problem.max_decode_step
  return within_limit, terminated, below_min_log_prob


def continues(problem: BeamProblem, state: BeamState) -> jax.Array:
  """[B] bool: the row takes another step (T5X's loop condition, per row)."""
  within_limit, terminated, below_min_log_prob = _row_stops(problem, state,
                                                            DEFAULT_MIN_LOG_PROB)
  return within_limit & ~terminated & ~below_min_log_prob


def batch_continues(problem: BeamProblem, state: BeamState, min_log_prob: float) -> jax.Array:
  """Scalar bool: the batch takes another step (T5X's loop condition)."""
  within_limit, terminated, below_min_log_prob = _row_stops(problem, state, min_log_prob)
  return jnp.any(within_limit) & ~jnp.all(terminated) & ~jnp.all(below_min_log_prob)


def _gather(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x[b, indices[b, j], ...] for x [B, M, ...], indices [B, N]."""
  return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def _top(scores: jax.Array, k: int) -> jax.Array:
  """Indices of the k largest scores [B, M] per row, ascending (T5X flips lax.top_k)."""
  return jnp.flip(jax.lax.top_k(scores, k)[1], axis=1)


def beam_step(problem: BeamProblem, state: BeamState, log_probs: jax.Array,
              active: jax.Array) -> tuple[BeamState, jax.Array]:
  """One beam-search step of the `active [B]` rows from `log_probs [B, K, V]`, the
  log-softmax of each live beam's next-token logits. Returns the new state (inactive rows
  unchanged) and each new live beam's parent [B, K] (the identity for inactive rows)."""
  batch_size, num_beams, vocab_size = log_probs.shape
  num_candidates = 2 * num_beams
  index = state.index
  scores = (log_probs + state.live_log_probs[:, :, None]).reshape(batch_size, -1)
  top_scores, top_indices = jax.lax.top_k(scores, num_candidates)
  forced = jnp.take_along_axis(problem.forced, (index + 1)[:, None], axis=1)  # [B, 1]
  out_of_prompt = forced == 0
  # Inside a prompt T5X keeps one beam (log-prob reset to 0) and fillers, all on the forced token.
  inside_prompt = jnp.where(jnp.arange(num_candidates) == 0, 0.0, NEG_INF).astype(
      top_scores.dtype)
  top_scores = jnp.where(out_of_prompt, top_scores, inside_prompt[None])
  tokens = jnp.where(out_of_prompt, top_indices % vocab_size, forced)
  parents = top_indices // vocab_size
  positions = jnp.arange(state.live_seqs.shape[2])
  top_seqs = jnp.where(positions == (index + 1)[:, None, None], tokens[:, :, None],
                       _gather(state.live_seqs, parents))
  newly_finished = tokens == problem.eos_id
  live_scores = top_scores + newly_finished * NEG_INF
  live = _top(live_scores, num_beams)
  finished_scores = top_scores / brevity_penalty(problem.alpha, (index + 1)[:, None])
  finished_scores = finished_scores + (~newly_finished) * NEG_INF
  all_scores = jnp.concatenate([state.finished_scores, finished_scores], axis=1)
  best = _top(all_scores, num_beams)
  new = BeamState(
      index=index + 1, live_log_probs=_gather(live_scores, live),
      live_seqs=_gather(top_seqs, live), finished_scores=_gather(all_scores, best),
      finished_seqs=_gather(jnp.concatenate([state.finished_seqs, top_seqs], axis=1), best),
      finished_flags=_gather(
          jnp.concatenate([state.finished_flags, newly_finished], axis=1), best))
  keep = lambda new_x, old_x: jnp.where(
      active.reshape((batch_size,) + (1,) * (old_x.ndim - 1)), new_x, old_x)
  identity = jnp.broadcast_to(jnp.arange(num_beams), (batch_size, num_beams))
  return (jax.tree_util.tree_map(keep, new, state),
          keep(_gather(parents, live), identity))


def gather_cache(cache: Any, parents: jax.Array, source_beams: int | None = None) -> Any:
  """Each beam's row of every cache leaf with the batch leading ([B * S, ...], S =
  `source_beams`, default K) taken from its parent [B, K]: those leaves become [B * K, ...]
  (batch-free leaves are left as they are, `contract.map_rows`)."""
  batch_size, num_beams = parents.shape
  source_beams = num_beams if source_beams is None else source_beams
  rows = (jnp.arange(batch_size)[:, None] * source_beams + parents).reshape(-1)
  return contract.map_rows(lambda x: jnp.take(x, rows, axis=0), cache)


def results(problem: BeamProblem, state: BeamState) -> tuple[jax.Array, jax.Array]:
  """(decodes [B, K, L], scores [B, K]), ascending: the finished beams, or the live ones for a
  row that finished none (T5X's fallback)."""
  any_finished = jnp.any(state.finished_flags, axis=1)
  seqs = jnp.where(any_finished[:, None, None], state.finished_seqs, state.live_seqs)
  scores = jnp.where(any_finished[:, None], state.finished_scores, state.live_log_probs)
  return seqs[:, :, 1:problem.max_decode_len + 1], scores


def flat(x: jax.Array) -> jax.Array:
  """[B, K, ...] -> [B * K, ...]: beams as the model's rows."""
  return x.reshape((-1,) + x.shape[2:])


@loops.register("beam_search", uses_draft=False, check_settings=check_beam_settings)
def beam_search(inputs: jax.Array, cache: Any, tokens_to_logits: contract.TokensToLogits,
                eos_id: int, decode_rng: jax.Array | None = None, num_decodes: int = 4,
                alpha: float = 0.6, max_decode_len: int | None = None,
                max_decode_step: int = -1, min_log_prob: float = DEFAULT_MIN_LOG_PROB,
                initial_index: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """T5X's beam search, num_decodes beams, one target call per step (all beams of all rows),
  the rows stepping together until T5X's loop condition stops the batch.

  Returns (decodes [B, num_decodes, L], scores [B, num_decodes]): T5X's beam_search output,
  sorted ascending (the best last); L is `max_decode_len` where given (T5X's: at most the
  inputs' length). `decode_rng` is unused, as in T5X.
  """
  del decode_rng
  check_beam_settings(alpha, max_decode_step, min_log_prob, max_decode_len)
  inputs = validate(inputs, eos_id, num_decodes, initial_index, max_decode_len)
  problem, state = init(inputs, num_decodes, eos_id, alpha, scratch=0,
                        max_decode_step=max_decode_step, initial_index=initial_index)

  def step(carry):
    state, cache = carry
    active, _, _ = _row_stops(problem, state, min_log_prob)  # all rows within their limits
    index = jnp.repeat(state.index, num_decodes)
    seqs = flat(state.live_seqs)
    logits, cache = tokens_to_logits(contract.DecodingState(
        cur_index=index, cur_token=jnp.take_along_axis(seqs, index[:, None], axis=1),
        sequences=seqs, cache=cache))
    log_probs = jax.nn.log_softmax(logits[:, 0].astype(jnp.float32))
    state, parents = beam_step(problem, state,
                               log_probs.reshape(state.live_log_probs.shape + (-1,)), active)
    return state, gather_cache(cache, parents)

  cache = decode_rows.expand(cache, num_decodes)
  state, _ = jax.lax.while_loop(
      lambda carry: batch_continues(problem, carry[0], min_log_prob), step, (state, cache))
  return results(problem, state)
