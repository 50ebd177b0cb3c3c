"""What model calls cost on this machine: the c and v of the paper's Theorem 3.8, measured.

`call_sequence_seconds(calls, batch_size, input_length, cache_length, loops, repetitions)`:
median seconds of one pass through `calls`, a sequence of `Call`s, (module, params, num_tokens
[, one_logits]) cached decoder calls (`network.make_tokens_to_logits`, feeding `num_tokens`
tokens per row; with `one_logits`, asking for the last fed token's logits alone, as the draft's
catch-up call does) made in that order. Timed as one jitted `fori_loop` of `loops` passes
divided by `loops`: the engine makes its calls inside a `while_loop` too, so no per-call
dispatch is counted. Every call's
logits feed a running max, so none is optimized away. Each cache has `init_decode_cache`'s
shapes with zero keys and values (every input position unmasked): a call's cost does not depend
on them, and running the encoder would cost one more compilation.

`compile_call_sequence(...)` returns the compiled loop itself, and
`interleaved_call_seconds({label: calls}, ...)` times several sequences in alternation (A B A B
...), the way to measure a ratio on a shared machine.

`verification_costs(target, draft, gamma, ...)` -> {'c': draft 1-token call / target 1-token
call, 'v': target (gamma+1)-token call / target 1-token call}, each model timed alone.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from spec_decode.runtime import platforms
from spec_decode.engine import decoding
from spec_decode.t5 import cpu_kernels, network

class Call(NamedTuple):
  """One cached decoder call of the sequence timed."""
  module: network.Network
  params: Any
  num_tokens: int  # tokens fed per row
  one_logits: bool = False  # asks for the last fed token's logits alone (`logits_index`)


def compile_call_sequence(calls: Sequence[Call], batch_size: int, input_length: int,
                          cache_length: int, loops: int,
                          compiler_options: Mapping[str, Any] | None = None,
                          xla_defaults: bool = False) -> Callable[[], Any]:
  """A callable running `loops` passes through `calls` once (compiled on its first call) and
  waiting for the result (see the module docstring). Compiled as the decoders are on the
  default platform (`platforms.Platform.default()`: its products, and its compiler options
  `merged(compiler_options, xla_defaults)`); with `xla_defaults`, traced with XLA's dots in
  place of `cpu_kernels`' (what XLA alone would do)."""
  encoder_tokens = jnp.ones((batch_size, input_length), jnp.int32)
  calls = [Call(*call) for call in calls]
  platform = platforms.Platform.default()
  models = list({id(call.params): (platform.module(call.module), call.params)
                 for call in calls}.values())
  slot = {id(params): i for i, (_, params) in enumerate(models)}
  caches = []
  for module, params in models:
    shapes = jax.eval_shape(functools.partial(network.init_decode_cache, module,
                                              max_decode_len=cache_length),
                            params, encoder_tokens)
    cache = jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)
    if "encoder_mask" in cache:  # an encoder-decoder's; a language model's cache has none
      cache["encoder_mask"] = jnp.ones_like(cache["encoder_mask"])
    caches.append(cache)
  sequences = jnp.zeros((batch_size, cache_length), jnp.int32)
  num_starts = max(cache_length - max(call.num_tokens for call in calls), 1)
  order = [(slot[id(call.params)], call.num_tokens, call.one_logits) for call in calls]

  @functools.partial(jax.jit,
                     compiler_options=platform.merged(compiler_options, xla_defaults))
  def run_calls(all_params, caches):
    tokens_to_logits = [network.make_tokens_to_logits(module, params)
                        for (module, _), params in zip(models, all_params)]

    def one_pass(i, carry):
      caches, running_max = list(carry[0]), carry[1]
      for model_slot, num_tokens, one_logits in order:
        state = decoding.DecodingState(
            cur_index=jnp.full((batch_size,), i % num_starts, jnp.int32),
            cur_token=jnp.full((batch_size, num_tokens), 3 + i % 5, jnp.int32),
            sequences=sequences, cache=caches[model_slot],
            logits_index=(jnp.full((batch_size,), num_tokens - 1, jnp.int32) if one_logits
                          else None))
        logits, caches[model_slot] = tokens_to_logits[model_slot](state)
        running_max = jnp.maximum(running_max, jnp.max(logits))
      return caches, running_max

    return jax.lax.fori_loop(0, loops, one_pass, (caches, jnp.float32(-jnp.inf)))[1]

  all_params = [params for _, params in models]

  def run():
    with cpu_kernels.xla_dots() if xla_defaults else contextlib.nullcontext():
      return jax.block_until_ready(run_calls(all_params, caches))

  return run


def call_sequence_seconds(calls: Sequence[Call], batch_size: int, input_length: int,
                          cache_length: int, loops: int, repetitions: int,
                          compiler_options: Mapping[str, Any] | None = None,
                          xla_defaults: bool = False) -> float:
  """Median seconds of one pass through `calls` (see the module docstring)."""
  return median_seconds(
      compile_call_sequence(calls, batch_size, input_length, cache_length, loops,
                            compiler_options, xla_defaults), repetitions, divisor=loops)


def interleaved_call_seconds(sequences: Mapping[str, Sequence[Call]], batch_size: int,
                             input_length: int, cache_length: int, loops: int,
                             repetitions: int,
                             compiler_options: Mapping[str, Any] | None = None,
                             xla_defaults: Mapping[str, bool] | None = None
                             ) -> dict[str, dict[str, Any]]:
  """Per label, seconds of one pass through its calls, the sequences timed in alternation
  (A B C A B C ...) after one untimed run each, so that load drift on a shared machine hits
  all alike: {'median_s', 'all_s'}. Ratios of medians taken here are the ones to trust.
  `xla_defaults[label]` compiles that label's sequence with XLA's defaults only."""
  xla_defaults = xla_defaults or {}
  runs = {label: compile_call_sequence(calls, batch_size, input_length, cache_length, loops,
                                       compiler_options, xla_defaults.get(label, False))
          for label, calls in sequences.items()}
  for run in runs.values():
    run()
  timings: dict[str, list[float]] = {label: [] for label in runs}
  for _ in range(repetitions):
    for label, run in runs.items():
      start = time.perf_counter()
      run()
      timings[label].append((time.perf_counter() - start) / loops)
  return {label: {"median_s": statistics.median(values), "all_s": values}
          for label, values in timings.items()}


def median_seconds(run: Callable[[], Any], repetitions: int, divisor: int = 1) -> float:
  """Median seconds of `repetitions` calls of `run` (after one untimed call: compilation and a
  first run's one-off costs), each divided by `divisor`."""
  run()
  timings = []
  for _ in range(repetitions):
    start = time.perf_counter()
    run()
    timings.append((time.perf_counter() - start) / divisor)
  return statistics.median(timings)


def verification_costs(target: tuple[network.Network, Any],
                       draft: tuple[network.Network, Any], gamma: int, batch_size: int,
                       input_length: int, cache_length: int, loops: int = 16,
                       repetitions: int = 5) -> dict[str, float]:
  """{'c', 'v', and the three calls' seconds} (see the module docstring)."""
  seconds = {
      name: call_sequence_seconds([(*model, num_tokens)], batch_size, input_length,
                                  cache_length, loops, repetitions)
      for name, model, num_tokens in (("target_1", target, 1),
                                      ("target_verify", target, gamma + 1),
                                      ("draft_1", draft, 1))}
  return {"c": seconds["draft_1"] / seconds["target_1"],
          "v": seconds["target_verify"] / seconds["target_1"],
          **{f"{name}_seconds": value for name, value in seconds.items()}}
