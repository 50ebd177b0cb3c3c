"""How the benchmark times things.

  interleave(runs, repetitions)   decoders timed in alternation on the same inputs (A B C A B C
                                  ...) after one untimed warm-up each, so drift hits all alike.
  summarize(outputs)              tokens/s (median, min, max, spread) and the speculative
                                  counters' totals of a list of `RunOutput`s.
  call_sequence_seconds(...)      seconds of a sequence of cached decoder calls, in one jitted
                                  loop (c, v and an iteration's calls come from it);
  step_seconds(...)               the same for one model's call alone.
  copy_bandwidth(...)             the machine's copy bandwidth (the physical limit's reference).
  read_bandwidth(...)             the machine's read bandwidth (what a decode step's weights
                                  stream at best: verify_cost's roofline).
  matmul_throughput(...)          float32 FLOP/s of a compute-bound matmul (the roofline's
                                  price of the extra rows of a k-token call).
Every compiled function runs once before it is timed; a timed call ends at
`jax.block_until_ready`; timings are medians of repetitions.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.runtime import call_costs
from spec_decode.runtime import platforms
from spec_decode.bench.decoders import RunOutput
from spec_decode.bench.pairs import Model
from spec_decode.engine import decoding


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
  a loop with stats its counters' totals and their ratios (`engine.stats`: alpha and tokens
  per target call, or beam steps per target call and coverage by depth), and draft calls per
  target call; for speculative sampling also accepted tokens per target call and per draft."""
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
  stats_class = outputs[0].stats_class
  if stats_class is not None:
    total = {name: np.sum([out.stats[name] for out in outputs], axis=0).tolist()
             for name in stats_class.counter_names()}
    summary.update({name: np.asarray(value).tolist()
                    for name, value in stats_class.ratios(total).items()}, counters=total)
    summary["draft_calls_per_target_call"] = total["draft_calls"] / max(total["target_calls"], 1)
    if stats_class is decoding.SpeculativeStats:
      calls = max(total["target_calls"], 1.0)
      summary.update(
          accepted_per_target_call=total["accepted_tokens"] / calls,
          accepted_over_drafted=total["accepted_tokens"] / max(total["drafted_tokens"], 1.0))
  return summary


def call_sequence_seconds(calls: Sequence[tuple[Any, ...]], batch_size: int,
                          input_length: int, cache_length: int, loops: int, repetitions: int,
                          compiler_options: Mapping[str, Any]) -> float:
  """`call_costs.call_sequence_seconds` of the bench's models: median seconds of one pass
  through `calls`, each (model, number of tokens fed per row[, one_logits]) as in
  `call_costs.Call`, made in that order."""
  return call_costs.call_sequence_seconds(
      [call_costs.Call(model.module, model.params, *rest) for model, *rest in calls],
      batch_size, input_length, cache_length, loops, repetitions, compiler_options)


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
            "xla_bytes_per_s": moved / call_costs.median_seconds(xla_pass, repetitions),
            "numpy_bytes_per_s": moved / call_costs.median_seconds(
                lambda: np.copyto(destination, source), repetitions)}
  result["bytes_per_s"] = max(result["xla_bytes_per_s"], result["numpy_bytes_per_s"])
  return result


def read_bandwidth(mib: int, repetitions: int, compiler_options: Mapping[str, Any]
                   ) -> dict[str, float]:
  """Bytes read per second over a `mib` MiB float32 array (median of `repetitions`), three
  ways, the highest being the reference (a decode step's weights cannot stream faster):
  a jitted sum of it as rows of 1024 ('xla_sum', compiled as the decoders are), a jitted
  matrix-vector product of it as a [n, 1024] matrix ('xla_matvec': what a 1-token call does
  to each weight matrix, multithreaded, all in one array) and numpy's sum ('numpy_sum')."""
  size = mib * 2**20 // 4
  options = platforms.Platform.default().merged(compiler_options)
  matrix = jnp.ones((size // 1024, 1024), jnp.float32)
  vector = jnp.ones((1024,), jnp.float32)
  row_sums = jax.jit(lambda m: jnp.sum(m, axis=1), compiler_options=options)
  matvec = jax.jit(lambda m, v: m @ v, compiler_options=options)
  source = np.ones((size,), np.float32)
  nbytes = size * 4
  result = {"array_bytes": nbytes,
            "xla_sum_bytes_per_s": nbytes / call_costs.median_seconds(
                lambda: jax.block_until_ready(row_sums(matrix)), repetitions),
            "xla_matvec_bytes_per_s": nbytes / call_costs.median_seconds(
                lambda: jax.block_until_ready(matvec(matrix, vector)), repetitions),
            "numpy_sum_bytes_per_s": nbytes / call_costs.median_seconds(
                lambda: np.add.reduce(source), repetitions)}
  result["bytes_per_s"] = max(value for key, value in result.items()
                              if key.endswith("bytes_per_s"))
  return result


def matmul_throughput(rows: int, size: int, repetitions: int,
                      compiler_options: Mapping[str, Any]) -> dict[str, float]:
  """float32 FLOP/s of a jitted [rows, size] x [size, size] matmul (compiled as the decoders
  are; with rows in the hundreds and size ~1-2k: compute-bound, operands in cache), median of
  `repetitions` (each timing a loop of 8 products)."""
  products = 8

  @functools.partial(jax.jit,
                     compiler_options=platforms.Platform.default().merged(compiler_options))
  def chain(x, w):
    return jax.lax.fori_loop(0, products, lambda _, x: (x @ w) * (1.0 / size), x)

  x = jnp.ones((rows, size), jnp.float32)
  w = jnp.ones((size, size), jnp.float32)
  seconds = call_costs.median_seconds(lambda: jax.block_until_ready(chain(x, w)), repetitions,
                                      divisor=products)
  return {"rows": rows, "size": size, "flops_per_s": 2.0 * rows * size * size / seconds}
