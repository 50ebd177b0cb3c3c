"""One decode call's problem and the per-row bookkeeping both samplers share.

`setup` turns a call's inputs and settings into a `Problem` (per-row constants: forced tokens,
length limits, the sampling law) and the starting `Rows`; `commit` appends a block of tokens
to each row; `finish` cuts the buffer into T5X's outputs. `temperature_sample`
(`spec_decode.engine.decoding`) commits one token per step, `speculative_sample`
(`spec_decode.engine.speculative_sampling`) a verified block; the conventions they share are
written down in `spec_decode.engine.decoding`.
"""

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import contract
from spec_decode.engine import sampling

# T5X's temperature_sample takes these as data: one compiled decoder serves every value.
SAMPLING_DATA = ("temperature", "topk", "topp", "max_decode_steps")


@flax.struct.dataclass
class Rows:
  """Per-row progress shared by both decoders."""
  index: jax.Array  # [N] position of the last committed token
  done: jax.Array  # [N] bool: EOS emitted or length limit reached
  sequences: jax.Array  # [N, S] token buffer; positions > index hold scratch (drafts)
  log_prob: jax.Array  # [N] float32


@flax.struct.dataclass
class Problem:
  """Per-row constants of one decode call."""
  forced: jax.Array  # [N, S] forced token per position, 0 where free
  end: jax.Array  # [N] last position a row may write
  eos_id: int = flax.struct.field(pytree_node=False)
  sampling_args: tuple[Any, Any, Any]  # temperature ([N] per row, or one), topk, topp: data
  rescale_log_probs: bool = flax.struct.field(pytree_node=False, default=True)
  max_decode_len: int = flax.struct.field(pytree_node=False, default=0)  # L
  logit_callback: Any = flax.struct.field(pytree_node=False, default=None)  # LogitCallback

  @property
  def greedy(self) -> bool:
    """Every distribution sampled is a point mass: tokens are read by `greedy_tokens`, nothing
    is drawn."""
    return sampling.is_greedy(self.sampling_args[0])


def _validate(inputs, eos_id, num_decodes, **sampling_settings):
  if inputs.ndim != 2:
    raise ValueError(f"inputs must be [batch, max_decode_len], got shape {inputs.shape}")
  for name in ("temperature", "max_decode_steps"):
    if np.shape(sampling_settings[name]) not in ((), inputs.shape[:1]):
      raise ValueError(f"{name} must be a number or one per example ({inputs.shape[0]}), got "
                       f"shape {np.shape(sampling_settings[name])}")
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


def expand(tree: Any, num_decodes: int) -> Any:
  """Repeats every leaf num_decodes times along its leading (batch) axis, a cache's batch-free
  leaves excepted (`contract.map_rows`)."""
  if num_decodes == 1:
    return tree
  return contract.map_rows(lambda x: jnp.repeat(x, num_decodes, axis=0), tree)


def setup(inputs: jax.Array, *, eos_id: int, num_decodes: int, initial_index: Any,
          temperature: Any, topk: Any, topp: Any, max_decode_steps: Any,
          max_decode_steps_hard_limit: int | None, rescale_log_probs: bool,
          logit_callback_fn: "LogitCallback | None", block_size: int) -> tuple[Problem, Rows]:
  """Checks a sampler's arguments (ValueError naming the bad one), then builds the expanded
  problem constants and the starting rows.

  The buffer has `block_size` scratch columns past position L so a block written at any
  position <= L stays in bounds.
  """
  _validate(inputs, eos_id, num_decodes, temperature=temperature, topk=topk, topp=topp,
            max_decode_steps=max_decode_steps,
            max_decode_steps_hard_limit=max_decode_steps_hard_limit,
            rescale_log_probs=rescale_log_probs, logit_callback_fn=logit_callback_fn)
  max_decode_steps = _capped(max_decode_steps, max_decode_steps_hard_limit)
  sampling_args = (temperature, topk, topp)
  inputs = expand(jnp.asarray(inputs, jnp.int32), num_decodes)
  if np.ndim(sampling_args[0]) == 1:  # one temperature per example: per row
    sampling_args = (expand(jnp.asarray(sampling_args[0], jnp.float32), num_decodes),
                     *sampling_args[1:])
  num_rows, max_decode_len = inputs.shape
  sequences = jnp.pad(inputs, ((0, 0), (0, 1 + block_size)))
  forced = sequences.at[:, 0].set(0)
  positions = jnp.arange(sequences.shape[1])
  if initial_index is None:
    index = jnp.zeros((num_rows,), jnp.int32)
  else:
    index = expand(jnp.asarray(initial_index, jnp.int32), num_decodes)
  end = jnp.full((num_rows,), max_decode_len, jnp.int32)
  if max_decode_steps is not None:
    if np.ndim(max_decode_steps) == 1:  # one per example: per row
      max_decode_steps = expand(jnp.asarray(max_decode_steps, jnp.int32), num_decodes)
    prompt_end = jnp.maximum(jnp.max(jnp.where(forced > 0, positions, 0), axis=1), index)
    end = jnp.minimum(end, prompt_end + max_decode_steps)
  rows = Rows(index=index, done=index >= end, sequences=sequences,
              log_prob=jnp.zeros((num_rows,), jnp.float32))
  return Problem(forced, end, eos_id, sampling_args, rescale_log_probs, max_decode_len,
                 logit_callback_fn), rows


def gather(buffer: jax.Array, positions: jax.Array) -> jax.Array:
  """buffer[n, positions[n, j]] for buffer [N, S], positions [N, C]."""
  return jnp.take_along_axis(buffer, positions, axis=1)


def scatter(buffer: jax.Array, positions: jax.Array, values: jax.Array) -> jax.Array:
  """buffer[n, positions[n, j]] = values[n, j]. Written per row (vmap) so that a batch-sharded
  buffer is updated where its rows live, with no cross-device traffic."""
  return jax.vmap(lambda row, where, new: row.at[where].set(new))(buffer, positions, values)


@flax.struct.dataclass
class LogitCallbackState:
  """What T5X's `logit_callback_fn(logits, state)` is given with the logits [N, V] of one
  position: the fields of T5X's `SamplingLoopState` that describe the prefix those logits
  condition on, by T5X's names and in its shapes (N: the B * num_decodes rows, each example's
  num_decodes rows adjacent, as T5X orders them). Its loop bookkeeping (step, ended, rng,
  log_prob) is not given: a speculative iteration scores several positions in one step."""
  cur_index: jax.Array  # [N] position of the prefix's last token; the logits are for the next
  sequences: jax.Array  # [N, L + 2] the prefix up to cur_index, then the prompt's forced tokens
  cur_token: jax.Array  # [N, 1] the token at cur_index
  cache: Any  # the target's cache as given to the call that scored the position, or None


# T5X's LogitCallbackFn: (logits [N, V], state) -> logits [N, V].
LogitCallback = Callable[[jax.Array, LogitCallbackState], jax.Array]


def through_logit_callback(problem: Problem, logits: jax.Array, *, sequences: jax.Array,
                           index: jax.Array, cache: Any = None) -> jax.Array:
  """`logits [N, C, V]` of positions index + 1 .. index + C, each offset c's slice
  `logits[:, c]` through the logit callback with the state of the prefix up to index + c as
  `sequences [N, S]` holds it (the committed tokens, then any drafts); unchanged without a
  callback. The slice is of the logits as the model returned them, unconverted: a NumPy
  array's is a view, which a callback may write into, as T5X's loop allows."""
  if problem.logit_callback is None:
    return logits
  width = problem.max_decode_len + 2  # T5X's buffer: two scratch columns past position L
  called = []
  for offset in range(logits.shape[1]):
    cur_index = index + offset
    after_prefix = jnp.arange(width)[None] > cur_index[:, None]
    state = LogitCallbackState(
        cur_index=cur_index, cur_token=gather(sequences, cur_index[:, None]), cache=cache,
        sequences=jnp.where(after_prefix, problem.forced[:, :width], sequences[:, :width]))
    called.append(problem.logit_callback(logits[:, offset], state))
  return jnp.stack(called, axis=1)


def target_probs(problem: Problem, logits: jax.Array, positions: jax.Array) -> jax.Array:
  """The sampled distribution for the tokens at `positions [N, C]` from `logits [N, C, V]`.
  A forced position becomes a point mass on an id of the vocabulary standing in for its forced
  token, which may lie outside it (T5X copies any id through): the laws there only need to
  agree that the position is certain, and `with_forced` writes the forced id itself."""
  probs = sampling.logits_to_probs(logits, *problem.sampling_args)
  forced = gather(problem.forced, positions)
  stand_in = jnp.minimum(forced, logits.shape[-1] - 1)
  forced_one_hot = jax.nn.one_hot(stand_in, logits.shape[-1], dtype=probs.dtype)
  return jnp.where((forced > 0)[..., None], forced_one_hot, probs)


def with_forced(problem: Problem, tokens: jax.Array, positions: jax.Array) -> jax.Array:
  """`tokens [N, C]` for `positions [N, C]`, the forced token wherever one is forced."""
  forced = gather(problem.forced, positions)
  return jnp.where(forced > 0, forced, tokens)


def greedy_tokens(problem: Problem, logits: jax.Array, positions: jax.Array) -> jax.Array:
  """The token of each point mass `target_probs` gives at a greedy temperature: the forced
  token at a forced position, else the argmax of `logits [N, C, V]` (ties to the lowest id)."""
  return with_forced(problem, sampling.first_argmax(logits), positions)


def commit(problem: Problem, rows: Rows, candidates: jax.Array, num_candidates: jax.Array,
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
  sampled = gather(problem.forced, positions) == 0
  eos = keep & sampled & (candidates == problem.eos_id)
  keep &= (jnp.cumsum(eos, axis=1) - eos) == 0  # nothing after the first EOS
  hit_eos = jnp.any(eos & keep, axis=1)
  num_committed = jnp.sum(keep, axis=1).astype(jnp.int32)
  sequences = scatter(rows.sequences, positions,
                       jnp.where(keep, candidates, gather(rows.sequences, positions)))
  scored = jnp.where(sampled, candidates, 0)  # a forced id may lie outside the vocabulary
  if problem.rescale_log_probs:
    token_log_probs = sampling.law_log_prob_of(logits, scored, *problem.sampling_args)
  else:
    token_log_probs = sampling.log_softmax_of(logits, scored)
  log_prob = rows.log_prob + jnp.sum(jnp.where(keep & sampled, token_log_probs, 0.0), axis=1)
  index = rows.index + num_committed
  done = rows.done | hit_eos | (index >= problem.end)
  return Rows(index, done, sequences, log_prob), num_committed


def finish(rows: Rows, max_decode_len: int, batch_size: int, num_decodes: int,
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
