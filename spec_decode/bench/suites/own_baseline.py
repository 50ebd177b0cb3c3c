"""The own_baseline suite: the pair of `PairConfig` (the shipped demo pair when its files exist,
else random weights), `decoding.temperature_sample` vs `decoding.speculative_sample` per
temperature and batch size, timed in interleaved repetitions on the same inputs.

Per group it records alpha, c and v from single cached decoder calls, and the decoding loops'
speedup against the paper's prediction and two refinements of it (`theory.compare_with_theory`).
At the comparison batch sizes it also times a fixed-gamma sweep, the block verifier and the
adaptive drafting policies ('expected_speedup' with the measured c and v bound, 'confidence'),
and each decoder's tokens/s relative to the best fixed gamma.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from spec_decode.bench.config import OwnBaselineConfig
from spec_decode.bench.decoders import Variant
from spec_decode.bench.theory import compare_with_theory, model_call_share
from spec_decode.bench.timing import interleave, summarize
from spec_decode.bench.workspace import Workspace


def _group_variants(config: OwnBaselineConfig, gamma: int, temperature: float, compared: bool,
                    max_costs: dict[str, float] | None) -> list[Variant]:
  """Baseline first, then the pair's speculative decoder, then (when compared) the rest of the
  fixed-gamma sweep, the block verifier at gamma and the adaptive policies up to the largest
  swept gamma ('expected_speedup' with that gamma's measured c and v bound)."""
  variants = [Variant(temperature), Variant(temperature, gamma)]
  if compared:
    max_gamma = max(config.sweep_gammas)
    variants += [Variant(temperature, g) for g in config.sweep_gammas if g != gamma]
    variants += [
        Variant(temperature, gamma, verifier="block"),
        Variant(temperature, max_gamma, draft_policy="expected_speedup", policy_bindings=(
            ("max_gamma", max_gamma), ("cost_ratio", max_costs["c"]),
            ("verify_cost", max_costs["v"]))),
        Variant(temperature, max_gamma, draft_policy="confidence")]
  return variants


def own_baseline_suite(workspace: Workspace, config: OwnBaselineConfig) -> dict[str, Any]:
  """Per (temperature, batch size) group: the baseline and the speculative decoders, timed
  interleaved on the same inputs; for the paper's setting also c, v, the predicted speedup and
  measured / predicted; at comparison batch sizes the best fixed gamma and every decoder's
  tokens/s relative to it."""
  pair, decoders = workspace.pair("pair"), workspace.decoders("pair")
  gamma = workspace.configs["pair"].gamma
  groups = []
  for temperature in config.temperatures:
    for batch_size in config.batch_sizes:
      compared = batch_size in config.comparison_batch_sizes
      max_costs = (workspace.costs("pair", batch_size, max(config.sweep_gammas))
                   if compared else None)
      variants = _group_variants(config, gamma, temperature, compared, max_costs)
      outputs = interleave({v.label: functools.partial(decoders.run, v, batch_size=batch_size)
                            for v in variants}, config.repetitions)
      baseline = summarize(outputs["baseline"])
      rows = {}
      for variant in variants[1:]:
        row = summarize(outputs[variant.label])
        row["variant"] = dataclasses.asdict(variant)
        row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        if variant.is_paper_setting:
          row.update(compare_with_theory(
              row, baseline, workspace.costs("pair", batch_size, variant.gamma), row["alpha"],
              variant.gamma, batch_size))
        rows[variant.label] = row
      baseline["model_call_share"] = model_call_share(
          baseline, workspace.costs("pair", batch_size, gamma), batch_size)
      group = {"temperature": temperature, "batch_size": batch_size, "gamma": gamma,
               "baseline": baseline, "speculative": rows[variants[1].label], "variants": rows}
      if compared:
        fixed = [v.label for v in variants[1:] if v.is_paper_setting]
        best = max(fixed, key=lambda label: rows[label]["tokens_per_s"])
        group["best_fixed"] = best
        group["tokens_per_s_over_best_fixed"] = {
            label: row["tokens_per_s"] / rows[best]["tokens_per_s"] for label, row in rows.items()}
      groups.append(group)
  return {"pair": pair.describe(), "repetitions": config.repetitions, "groups": groups}
