"""The simulated_table2 suite, SIMULATED: the rows of the paper's Table 2 (`paper.TABLE2`) on a
random-weight T5.1.1 target and draft, each draft accepted by an i.i.d. coin at the row's alpha
(`simulated.simulated_acceptance_rule`); per row the measured speedup against Theorem 3.8 with
the measured c and v, and the paper's own speedup beside it. Every result is labelled SIMULATED.
"""

from __future__ import annotations

import functools
from typing import Any

from spec_decode.bench import paper
from spec_decode.bench.config import SimulatedTable2Config
from spec_decode.bench.decoders import Variant
from spec_decode.bench.simulated import SIMULATED
from spec_decode.bench.theory import compare_with_theory, model_call_share
from spec_decode.bench.timing import interleave, summarize
from spec_decode.bench.workspace import Workspace


def simulated_table2_suite(workspace: Workspace, config: SimulatedTable2Config
                           ) -> dict[str, Any]:
  """Per Table 2 row: the baseline and the SIMULATED coin decoder at the row's alpha, gamma and
  temperature, measured speedup against the formula with the measured c and v."""
  unknown = [row for row in config.rows if row not in paper.TABLE2]
  if unknown:
    raise ValueError(f"unknown Table 2 rows {unknown}; choose from {sorted(paper.TABLE2)}")
  pair, decoders = workspace.pair("simulated"), workspace.decoders("simulated")
  rows = []
  for name in config.rows:
    row = paper.TABLE2[name]
    temperature, gamma, alpha = row.temperature, row.gamma, row.alpha
    costs = workspace.costs("simulated", config.batch_size, gamma)
    baseline, coin = Variant(temperature), Variant(temperature, gamma, simulated_alpha=alpha)
    outputs = interleave(
        {label: functools.partial(decoders.run, variant, batch_size=config.batch_size)
         for label, variant in (("baseline", baseline), ("coin", coin))}, config.repetitions)
    base, spec = summarize(outputs["baseline"]), summarize(outputs["coin"])
    base["model_call_share"] = model_call_share(base, costs, config.batch_size)
    theory = compare_with_theory(spec, base, costs, alpha, gamma, config.batch_size)
    spec["model_call_share"] = theory.pop("model_call_share")
    rows.append({
        "row": name, "label": f"{SIMULATED} {row.task} M_q={row.draft} T={temperature:g}",
        "simulated": True, "task": row.task, "paper_draft": row.draft,
        "temperature": temperature, "gamma": gamma, "forced_alpha": alpha,
        "paper_speedup": row.speedup, "batch_size": config.batch_size,
        "baseline": base, "speculative": spec, **theory,
        "expected_tokens_per_target_call": (1 - alpha ** (gamma + 1)) / (1 - alpha),
        "speedup": spec["tokens_per_s"] / base["tokens_per_s"]})
  return {"simulated": True,
          "note": (f"{SIMULATED}: random weights; every draft is accepted by an i.i.d. coin of "
                   "probability alpha (bench.simulated_acceptance_rule), not by p and q; the "
                   "draft model is the same for every row"),
          "pair": pair.describe(), "repetitions": config.repetitions, "rows": rows}
