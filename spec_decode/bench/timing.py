"""How the benchmark times things.

  interleave(runs, repetitions)   decoders timed in alternation on the same inputs (A B C A B C
                                  ...) after one untimed warm-up each, so drift hits all alike.
  summarize(outputs)              tokens/s (median, min, max, spread) and the speculative
                                  counters' totals of a list of `RunOutput`s.
  call_sequence_seconds(...)      seconds of a sequence of cached decoder calls, in one jitted
                                  loop (c, v and an iteration's calls come from it);
  step_seconds(...)               the same for one model's call alone.
  copy_bandwidth(...)             the machine's copy bandwidth (the physical limit's reference).
Every compiled function runs once before it is timed; a timed call ends at
`jax.block_until_ready`; timings are medians of repetitions.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.bench.decoders import RunOutput
from spec_decode.bench.pairs import Model
from spec_decode.engine import decoding
from spec_decode.t5 import network


def interleave(runs: Mapping[str, Callable[[int], RunOutput]], repetitions: int
               ) -> dict[str, list[RunOutput]]:
  """Runs each callable once untimed (compilation, warm-up), then `repetitions` rounds of
  A B C ... A B C ...; each callable gets the round index (its inputs and rng)."""
  for run in runs.values():
    run(0)
  outputs: dict[str, list[RunOutput]] = {label: [] for label in runs}
  for repetition in range(repetitions):
    for label, run in runs.items():
      outputs[label].append(run(repetition))
  return outputs


def summarize(outputs: Sequence[RunOutput]) -> dict[str, Any]:
  """tokens/s of whole calls (median, min, max, relative spread), total tokens and seconds; for
  our decoders also the total seconds of the decoding loops alone and total tokens / those; for
  a speculative decoder also alpha, accepted and generated tokens per target call."""
  rates = [out.tokens / out.seconds for out in outputs]
  median = statistics.median(rates)
  summary: dict[str, Any] = {
      "tokens_per_s": median,
      "tokens_per_s_min": min(rates),
      "tokens_per_s_max": max(rates),
      "relative_spread": (max(rates) - min(rates)) / median,
      "tokens_per_s_all": rates,
      "tokens": sum(out.tokens for out in outputs),
      "seconds": sum(out.seconds for out in outputs),
  }
  if all(out.decode_seconds is not None for out in outputs):
    # Totals, not a median: the counters the predictions use are totals too.
    summary["decode_seconds"] = sum(out.decode_seconds for out in outputs)
    summary["decode_tokens_per_s"] = summary["tokens"] / summary["decode_seconds"]
  if outputs[0].stats is not None:
    total = {name: sum(out.stats[name] for out in outputs)
             for name in decoding.SpeculativeStats.counter_names()}
    calls = max(total["target_calls"], 1.0)
    summary.update(
        alpha=total["acceptance_sum"] / max(total["verified_positions"], 1.0),
        accepted_per_target_call=total["accepted_tokens"] / calls,
        tokens_per_target_call=total["generated_tokens"] / calls,
        draft_calls_per_target_call=total["draft_calls"] / calls,
        accepted_over_drafted=total["accepted_tokens"] / max(total["drafted_tokens"], 1.0),
        counters=total)
  return summary


def _median_seconds(run: Callable[[], Any], repetitions: int, divisor: int = 1) -> float:
  """Median seconds of `repetitions` calls of `run` (after one untimed call), each / divisor."""
  run()
  timings = []
  for _ in range(repetitions):
    start = time.perf_counter()
    run()
    timings.append((time.perf_counter() - start) / divisor)
  return statistics.median(timings)


def call_sequence_seconds(calls: Sequence[tuple[Model, int]], batch_size: int,
                          input_length: int, cache_length: int, loops: int, repetitions: int,
                          compiler_options: Mapping[str, Any]) -> float:
  """Median seconds of one pass through `calls`: cached decoder calls, each (model, number of
  tokens fed per row), made in that order.

  Timed as one jitted `fori_loop` of `loops` passes, divided by `loops`: the engine makes its
  calls inside a `while_loop` too, so no per-call dispatch is counted. Every call's logits feed
  a running max, so none is optimized away. Each model's cache has `init_decode_cache`'s shapes
  but zero keys and values (every input position unmasked): the cost of a call does not depend
  on them, and running the encoder would cost one more compilation per timing.
  """
  encoder_tokens = jnp.ones((batch_size, input_length), jnp.int32)
  models = list({id(model): model for model, _ in calls}.values())
  caches = []
  for model in models:
    shapes = jax.eval_shape(
        functools.partial(network.init_decode_cache, model.module, max_decode_len=cache_length),
        model.params, encoder_tokens)
    cache = jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)
    cache["encoder_mask"] = jnp.ones_like(cache["encoder_mask"])
    caches.append(cache)
  slot = {id(model): i for i, model in enumerate(models)}
  sequences = jnp.zeros((batch_size, cache_length), jnp.int32)
  num_starts = max(cache_length - max(num_tokens for _, num_tokens in calls), 1)

  @functools.partial(jax.jit, compiler_options=dict(compiler_options))
  def run_calls(params, caches):
    tokens_to_logits = [network.make_tokens_to_logits(model.module, model_params)
                        for model, model_params in zip(models, params)]

    def one_pass(i, carry):
      caches, running_max = list(carry[0]), carry[1]
      for model, num_tokens in calls:
        state = decoding.DecodingState(
            cur_index=jnp.full((batch_size,), i % num_starts, jnp.int32),
            cur_token=jnp.full((batch_size, num_tokens), 3 + i % 5, jnp.int32),
            sequences=sequences, cache=caches[slot[id(model)]])
        logits, caches[slot[id(model)]] = tokens_to_logits[slot[id(model)]](state)
        running_max = jnp.maximum(running_max, jnp.max(logits))
      return caches, running_max

    return jax.lax.fori_loop(0, loops, one_pass, (caches, jnp.float32(-jnp.inf)))[1]

  params = [model.params for model in models]
  return _median_seconds(lambda: jax.block_until_ready(run_calls(params, caches)), repetitions,
                         divisor=loops)


def step_seconds(model: Model, batch_size: int, num_tokens: int, input_length: int,
                 cache_length: int, calls: int, repetitions: int,
                 compiler_options: Mapping[str, Any]) -> float:
  """Median seconds of one cached decoder call feeding `num_tokens` tokens per row, alone
  (`call_sequence_seconds` of `calls` repeated calls)."""
  return call_sequence_seconds([(model, num_tokens)], batch_size, input_length, cache_length,
                               calls, repetitions, compiler_options)


def copy_bandwidth(mib: int, repetitions: int, compiler_options: Mapping[str, Any]
                   ) -> dict[str, float]:
  """The machine's copy bandwidth: bytes moved per second (read + write, as STREAM counts a
  copy) over a `mib` MiB float32 array, median of `repetitions`, measured two ways — a jitted
  elementwise pass writing into its donated input, and numpy's `copyto` into a preallocated
  array — the higher one being the reference. Both write into memory already touched: a fresh
  output buffer would time the kernel's page faults instead (several times slower)."""
  size = mib * 2**20 // 4
  scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0,
                  compiler_options=dict(compiler_options))
  buffer = [jnp.ones((size,), jnp.float32)]

  def xla_pass():
    buffer[0] = jax.block_until_ready(scale(buffer[0]))

  source = np.ones((size,), np.float32)
  destination = np.empty_like(source)
  moved = 2 * size * 4
  result = {"array_bytes": size * 4,
            "xla_bytes_per_s": moved / _median_seconds(xla_pass, repetitions),
            "numpy_bytes_per_s": moved / _median_seconds(
                lambda: np.copyto(destination, source), repetitions)}
  result["bytes_per_s"] = max(result["xla_bytes_per_s"], result["numpy_bytes_per_s"])
  return result
