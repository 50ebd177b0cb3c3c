"""Side by side timing of `spec_decode.infer`'s decoder and its baseline (TIMING_ROUNDS).

The decoding passes time each batch once, all of the decoder's batches and then all of the
baseline's, so their ratio moves with whatever else the machine did meanwhile (+-15% from run to
run on a shared 2-core CPU at the demo's size, where a pass takes 0.4 s). `side_by_side` times
the compiled calls again, interleaved: `rounds` rounds, each calling every decoder on batch 0,
then every decoder on batch 1, and so on; each (decoder, batch) keeps its fastest call, and a
decoder's seconds are the sum over its batches. Both decoders see the same moments of the
machine, and the fastest of several calls leaves out what merely interrupted one.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import jax

# A decoder's compiled call and the arguments of batch i (placed before the clock starts).
TimedCall = tuple[Callable[..., Any], Callable[[int], tuple[Any, ...]]]


def after_the_command_line(bindings: Sequence[str]) -> dict[str, Any]:
  """`infer`'s timing arguments after the command line's `bindings` ('NAME = VALUE'). Rounds
  time the decoder beside the baseline, so a config's rounds (the demo's 5) belong to its
  baseline: where the command line turns the baseline off and asks for no rounds itself, they
  are off too ({'timing_rounds': 0}). Rounds without a baseline from one source (both on the
  command line, or both in the gin files) stay `infer`'s error: they could not take effect."""
  given = {name.strip().rsplit(".", 1)[-1].lower(): value.strip()
           for name, _, value in (binding.partition("=") for binding in bindings)}
  if "timing_rounds" in given or given.get("compare_with_baseline") != "False":
    return {}
  return {"timing_rounds": 0}


def side_by_side(calls: Mapping[str, TimedCall], num_batches: int, rounds: int,
                 stopped: Callable[[], bool] = lambda: False) -> dict[str, float] | None:
  """{name: seconds}: the sum over batches of each batch's fastest call in `rounds`
  interleaved rounds (see the module docstring); None as soon as `stopped()` (asked after each
  batch's calls) says to stop."""
  fastest = {name: [float("inf")] * num_batches for name in calls}
  for _ in range(rounds):
    for i in range(num_batches):
      for name, (compiled, arguments) in calls.items():
        args = arguments(i)
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        fastest[name][i] = min(fastest[name][i], time.perf_counter() - start)
      if stopped():
        return None
  return {name: sum(seconds) for name, seconds in fastest.items()}
