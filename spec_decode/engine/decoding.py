"""Decoders: the autoregressive baseline, and the conventions every sampler follows.

`temperature_sample` (here) and `speculative_sample` (`spec_decode.engine.speculative_sampling`,
re-exported here with its settings check) are pure functions over flax dataclass loop states,
each one `jax.lax.while_loop` that the caller jits (the models in `spec_decode.models` jit them
with the parameters as arguments). No host round-trip happens per token; prompts and rngs are
data, so they never cause a recompile.

## Models
Models enter through the model contract (`spec_decode.engine.contract`; `DecodingState` and
`TokensToLogits` are re-exported here). `temperature_sample` calls the target with k = 1 once
per token; `speculative_sample`'s calls are described in its module.

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
`max_decode_steps` (a number, or one per example [B], as T5X takes it; traced or not): each
row samples at most that many positions past its prompt, and at most
`max_decode_steps_hard_limit` (a Python int, T5X's static bound on a traced max_decode_steps).
`temperature` is a number or one per example [B]; `topk` and `topp` are numbers, one for the
whole batch as in T5X, and both non-zero are refused as T5X refuses them (`sampling`).
`logit_callback_fn(logits [N, V], state) -> logits` (T5X's): every scored position's target
logits pass through it before temperature, top-k and top-p, and the law sampled and scored is
the one of the logits it returns. Its `logits` are position c's slice `logits[:, c]` of the
array the target's call returned, unconverted, as T5X's loop hands its callback what the model
returned: of a NumPy array, a NumPy view that a callback may write into in place
(`speculative_sample`'s verification call returns k positions' logits in one array, each
callback given its position's slice). `state` is a `LogitCallbackState`: T5X's `cur_index`,
`sequences` [N, L + 2] and `cur_token` of the prefix the logits condition on, as T5X's loop
state has them at that prefix (the prefix, then the prompt's forced tokens, then 0), and `cache`
(`temperature_sample`: the cache given to that step's call, as in T5X; `speculative_sample`:
None, one call scoring several positions). A callback that is a function of the prefix (not of
the cache, nor of how often it is called) gives both samplers T5X's law; `speculative_sample`
calls it at each verified position, drafts included, and leaves the draft's logits alone.
Unlike T5X, whose `topk=1` default silently means greedy, `topk` defaults to 0 (no truncation);
greedy decoding is `temperature=0`.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.engine import decode_rows
from spec_decode.engine import loops
from spec_decode.engine import sampling
# What other modules and users read from here: the contract's types, which every loop's
# signature names, the speculative loop with its settings check and stats, the settings T5X
# takes as data and the logit callback's types.
from spec_decode.engine.contract import DecodingState, TokensToLogits
from spec_decode.engine.decode_rows import SAMPLING_DATA, LogitCallback, LogitCallbackState
from spec_decode.engine.speculative_sampling import (SpeculativeLoopState,
                                                     check_speculative_settings,
                                                     speculative_sample)
from spec_decode.engine.stats import SpeculativeStats


@flax.struct.dataclass
class SamplingLoopState:
  rows: decode_rows.Rows
  cache: Any
  iteration: jax.Array  # int32 scalar: which row of the decode's uniforms this step draws with


@loops.register("temperature_sample", uses_draft=False, check_settings=sampling.check_settings,
                data_settings=SAMPLING_DATA)
def temperature_sample(inputs: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                       eos_id: int, decode_rng: jax.Array | None = None,
                       num_decodes: int = 1, temperature: float = 1.0, topk: int = 0,
                       topp: float = 0.0, initial_index: jax.Array | None = None,
                       max_decode_steps: int | None = None,
                       max_decode_steps_hard_limit: int | None = None,
                       rescale_log_probs: bool = True,
                       logit_callback_fn: LogitCallback | None = None
                       ) -> tuple[jax.Array, jax.Array]:
  """Autoregressive sampling, one target call per token: the baseline.

  Returns (decodes [B, num_decodes, L] int32, log_probs [B, num_decodes] float32; see the
  conventions above for what log_probs sums, and for `logit_callback_fn`).
  """
  problem, rows = decode_rows.setup(
      inputs, eos_id=eos_id, num_decodes=num_decodes, initial_index=initial_index,
      temperature=temperature, topk=topk, topp=topp, max_decode_steps=max_decode_steps,
      max_decode_steps_hard_limit=max_decode_steps_hard_limit,
      rescale_log_probs=rescale_log_probs, logit_callback_fn=logit_callback_fn, block_size=1)
  batch_size, max_decode_len = inputs.shape
  # [S, N, 1]: at most one iteration per buffer position (sequences [N, S]).
  uniforms = None if problem.greedy else sampling.decode_uniforms(
      decode_rng, *rows.sequences.shape, 1)

  def step(state: SamplingLoopState) -> SamplingLoopState:
    step_uniforms = sampling.iteration_uniforms(uniforms, state.iteration)
    index = state.rows.index
    logits, cache = tokens_to_logits(DecodingState(
        cur_index=index, cur_token=decode_rows.gather(state.rows.sequences, index[:, None]),
        sequences=state.rows.sequences, cache=state.cache))
    logits = decode_rows.through_logit_callback(problem, logits, sequences=state.rows.sequences,
                                                index=index, cache=state.cache)
    positions = index[:, None] + 1
    if problem.greedy:
      token = decode_rows.greedy_tokens(problem, logits, positions)
    else:
      token = decode_rows.with_forced(problem, sampling.sample_from_uniform(
          step_uniforms, decode_rows.target_probs(problem, logits, positions)), positions)
    rows, _ = decode_rows.commit(problem, state.rows, token, jnp.ones_like(index), logits)
    return SamplingLoopState(rows, cache, state.iteration + 1)

  initial = SamplingLoopState(rows, decode_rows.expand(cache, num_decodes), jnp.int32(0))
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.rows.done), step, initial)
  decodes, log_probs, _ = decode_rows.finish(final.rows, max_decode_len, batch_size, num_decodes)
  return decodes, log_probs
