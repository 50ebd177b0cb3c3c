"""The engine_cost suite: the engine's own cost per iteration of the speculative loop (and per
step of the baseline), apart from the model calls, on each target pair of `EngineCostConfig`.

Per (pair, temperature, gamma), at batch 1: the kernels one iteration executes outside and
inside the model calls (`bench.kernels`, from the compiled loop), the loop's seconds per
iteration (interleaved repetitions, the decoding loop alone), the seconds of the iteration's
model calls made alone in the engine's order (`Workspace.costs`' iteration_calls_s), and the
engine's share: 1 - model seconds / iteration seconds. The baseline's row is the same for one
step (one 1-token target call).
"""

from __future__ import annotations

import functools
from typing import Any

from spec_decode.bench import kernels
from spec_decode.bench.config import EngineCostConfig
from spec_decode.bench.decoders import Variant
from spec_decode.bench.timing import interleave, summarize
from spec_decode.bench.workspace import Workspace


def _kernels(workspace: Workspace, which: str, variant: Variant,
             draft_loop_iterations: float) -> kernels.Count:
  compiled = workspace.decoders(which).lower_loop(variant, 0, 1).compile()
  return kernels.loop_kernels(compiled.as_text()).kernels(draft_loop_iterations)


def engine_cost_suite(workspace: Workspace, config: EngineCostConfig) -> dict[str, Any]:
  """{pair: [per temperature: {'baseline': row, 'speculative': [row per gamma]}]}, each row with
  kernels (engine, model) per iteration, seconds per iteration, model seconds and engine share."""
  report = {}
  for which in config.targets:
    decoders = workspace.decoders(which)
    groups = []
    for temperature in config.temperatures:
      variants = [Variant(temperature)] + [Variant(temperature, g) for g in config.gammas]
      outputs = interleave({v.label: functools.partial(decoders.run, v, batch_size=1)
                            for v in variants}, config.repetitions)
      baseline = summarize(outputs[variants[0].label])
      step_s = baseline["decode_seconds"] / baseline["tokens"]
      model_s = workspace.step(which, "target", 1, 1)
      count = _kernels(workspace, which, variants[0], 0.0)
      group = {"temperature": temperature, "baseline": {
          "engine_kernels": count.engine, "model_kernels": count.model, "seconds": step_s,
          "model_seconds": model_s, "engine_share": 1.0 - model_s / step_s}, "speculative": []}
      for variant in variants[1:]:
        summary = summarize(outputs[variant.label])
        counters = summary["counters"]
        iterations = counters["target_calls"]
        seconds = summary["decode_seconds"] / iterations
        model_s = workspace.costs(which, 1, variant.gamma)["iteration_calls_s"]
        # The draft's loop runs once per draft call after the catch-up call in the body.
        count = _kernels(workspace, which, variant, counters["draft_calls"] / iterations - 1)
        group["speculative"].append({
            "gamma": variant.gamma, "engine_kernels": count.engine,
            "model_kernels": count.model, "seconds": seconds, "model_seconds": model_s,
            "engine_share": 1.0 - model_s / seconds,
            "tokens_per_target_call": summary["tokens_per_target_call"],
            "speedup": summary["decode_tokens_per_s"] / baseline["decode_tokens_per_s"]})
      groups.append(group)
    report[which] = groups
  return report
