"""The reading of a run's compiled programs (`programs.Program`): memory against the plan's
formula and the chip's HBM, call costs as v(k) and c, Theorem 3.8's prediction from them.

Two estimates of a call's time, each labelled where it is printed, neither a measurement:
  * 'XLA': `optimal_seconds`, XLA's own cost model; used only where it is positive (XLA:TPU
    gives negative values for some programs, which no reading can use);
  * 'roofline': max(flops / peak bf16 FLOP/s, argument bytes / HBM bandwidth) per chip, with
    the chip's published peaks (`topologies.Chip`): a call reads every parameter and its cache
    once from HBM, and cannot beat that or its flops on that chip.
Why the argument bytes and not XLA's 'bytes accessed': XLA:TPU streams each weight from HBM into
the chip's alternate memory (memory space S(3) in the compiled HLO) as four async
slices, and its cost analysis charges every slice the whole weight, then the consuming
matrix product the prefetched copy again: a T5.1.1-XXL call on 4 v4 chips "accesses" 10.9 GiB
for 2.7 GiB of arguments. That is accounting, not a copy: no buffer of the weights' size is
written (the temporaries are 0.05 GiB).
v(k) = time of a k-token target call / time of a 1-token call; c = time of a 1-token draft call
/ time of a 1-token target call (the paper's c and, where v = 1, its Theorem 3.8).

A third time, fitted rather than bound: the roofline plus one fixed latency for each operation
the call runs in sequence (`programs.Program.sequential_ops`): at batch 1 a small draft's
kernels are too short to reach either peak, and a deep one (T5-large, 24 layers) runs many of
them. `fit_op_latency` fits that one latency to measured speedups (`CallCosts` per row),
`leave_one_out` checks it on rows it was not fitted on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spec_decode import plan
from spec_decode.aot import programs
from spec_decode.aot import topologies
from spec_decode.engine import drafting


@dataclasses.dataclass(frozen=True)
class CallCosts:
  """What the fixed-latency cost model needs of one row: its alpha and gamma, the measured
  speedup to fit (0 where there is none), and (roofline seconds, sequential operations) of the
  target's 1-token call, its (gamma + 1)-token call and the draft's 1-token call (as
  `programs.roofline_seconds` and `programs.Program.sequential_ops` give them). The count beside
  each roofline may be any that pays one fixed latency each: operations in sequence, or 1 for
  a fixed cost per call (a launch, a loop iteration)."""
  name: str
  alpha: float
  gamma: int
  speedup: float
  target: tuple[float, int]
  verify: tuple[float, int]
  draft: tuple[float, int]

  def predicted_speedup(self, op_latency: float) -> float:
    """Theorem 3.8 with each call's time its roofline plus `op_latency` per operation."""
    seconds = lambda call: call[0] + call[1] * op_latency
    one = seconds(self.target)
    return float(drafting.expected_tokens_per_cost(
        self.alpha, self.gamma, seconds(self.draft) / one, seconds(self.verify) / one))


def fit_op_latency(rows: Sequence[CallCosts], largest: float = 1e-3) -> float:
  """The one latency per sequential operation, between 0 and `largest` seconds, that brings
  the rows' predicted speedups closest to their measured ones (least squares of the log ratio:
  an overprediction and an underprediction by the same factor weigh the same). A scan of 0 and
  a log-spaced grid, refined by golden-section search between the best point's neighbours."""
  if not rows or any(row.speedup <= 0 for row in rows):
    raise ValueError("fit_op_latency needs rows with measured speedups")
  loss = lambda latency: sum(math.log(row.predicted_speedup(latency) / row.speedup) ** 2
                             for row in rows)
  grid = np.concatenate([[0.0], np.geomspace(largest * 1e-6, largest, 241)])
  best = int(np.argmin([loss(latency) for latency in grid]))
  low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
  ratio = (math.sqrt(5) - 1) / 2
  for _ in range(60):
    left, right = high - ratio * (high - low), low + ratio * (high - low)
    if loss(left) <= loss(right):
      high = right
    else:
      low = left
  found = (low + high) / 2
  return found if loss(found) <= loss(grid[best]) else float(grid[best])


def leave_one_out(rows: Sequence[CallCosts],
                  largest: float = 1e-3) -> list[tuple[CallCosts, float, float]]:
  """(row, the latency fitted on every other row, the row's speedup predicted with it): how
  well the fit predicts a row it did not see."""
  found = []
  for i, row in enumerate(rows):
    latency = fit_op_latency([other for j, other in enumerate(rows) if j != i], largest)
    found.append((row, latency, row.predicted_speedup(latency)))
  return found


def least_worst_errors(rows: Sequence[CallCosts]) -> list[tuple[tuple[str, ...], float]]:
  """What no cost model of the calls can beat: rows whose target, verification and draft calls
  are the same programs (the same `CallCosts` calls) get the same c and v(gamma + 1) from any
  model of a call's time, so Theorem 3.8 predicts each E / (gamma c + v), with E =
  (1 - alpha^(gamma+1)) / (1 - alpha) its own, from one shared denominator. The denominator that
  serves them best leaves the largest |log(predicted / measured)| at half the spread of
  log(E / measured) over the rows. Per group of two or more rows: (their names, that least
  worst error as a factor, e.g. 1.2 = 20% off)."""
  groups: dict[tuple[Any, ...], list[CallCosts]] = {}
  for row in rows:
    groups.setdefault((row.gamma, row.target, row.verify, row.draft), []).append(row)
  found = []
  for group in groups.values():
    if len(group) < 2:
      continue
    logs = [math.log(float(drafting.expected_tokens_per_cost(row.alpha, row.gamma, 0.0, 1.0))
                     / row.speedup) for row in group]
    found.append((tuple(row.name for row in group), math.exp((max(logs) - min(logs)) / 2)))
  return found


def xla_seconds(program: programs.Program) -> float | None:
  """XLA's `optimal_seconds` where it is usable (positive), else None."""
  seconds = program.optimal_seconds
  return seconds if seconds is not None and seconds > 0 else None


@dataclasses.dataclass(frozen=True)
class Estimate:
  """v(k) for each k compiled, c, and Theorem 3.8's speedup, by one way of timing a call."""
  name: str  # 'roofline' or 'XLA'
  v: Mapping[int, float]
  c: float | None
  predicted_speedup: float | None  # at the run's alpha and gamma, with v(gamma + 1)


def estimates(target_calls: Mapping[int, programs.Program],
              draft_call: programs.Program | None, chip: topologies.Chip,
              alpha: float | None, gamma: int | None) -> list[Estimate]:
  """Both estimates (see the module docstring) from calls compiled alone."""
  found = []
  for name, seconds_of in (("roofline", lambda p: programs.roofline_seconds(p, chip)),
                           ("XLA", xla_seconds)):
    seconds = {k: seconds_of(program) for k, program in target_calls.items()}
    one = seconds.get(1)
    if not one:
      found.append(Estimate(name, {}, None, None))
      continue
    v = {k: s / one for k, s in sorted(seconds.items()) if s is not None}
    draft = None if draft_call is None else seconds_of(draft_call)
    c = None if draft is None else draft / one
    predicted = None
    if alpha is not None and gamma is not None and c is not None and gamma + 1 in v:
      predicted = float(drafting.expected_tokens_per_cost(alpha, gamma, c, v[gamma + 1]))
    found.append(Estimate(name, v, c, predicted))
  return found


@dataclasses.dataclass(frozen=True)
class PlanComparison:
  """A whole decode's per-device bytes by XLA next to `spec_decode.plan`'s formula, which
  counts parameters and caches only. A decode makes its caches inside the program, so XLA's
  arguments are the formula's parameters (plus the batch and rng), and its temporaries hold
  the formula's caches plus what the formula does not count (activations, logits, XLA's
  buffers)."""
  formula_params: int
  formula_cache: int
  argument_bytes: int
  temp_bytes: int
  device_bytes: int
  hbm_bytes: int

  @property
  def argument_difference(self) -> float:
    """XLA's argument bytes over the formula's parameters, minus one."""
    return self.argument_bytes / self.formula_params - 1

  @property
  def uncounted_temp_bytes(self) -> int:
    """Temporaries beyond the formula's caches: what `plan` leaves as headroom."""
    return self.temp_bytes - self.formula_cache

  @property
  def fits(self) -> bool:
    return self.device_bytes <= self.hbm_bytes

  @classmethod
  def from_json(cls, entry: Mapping[str, Any]) -> PlanComparison:
    """The comparison as `python -m spec_decode.aot --output_json` writes it ('plan')."""
    return cls(**{field.name: entry[field.name] for field in dataclasses.fields(cls)})


def compare_with_plan(program: programs.Program, target: plan.DeviceBytes,
                      draft: plan.DeviceBytes | None, chip: topologies.Chip) -> PlanComparison:
  models = [target] + ([draft] if draft is not None else [])
  return PlanComparison(sum(m.params for m in models), sum(m.cache for m in models),
                        program.argument_bytes, program.temp_bytes, program.device_bytes,
                        chip.hbm_bytes)


# What a speculative decode's temporaries may take beyond its baseline's (the target alone)
# and the draft's caches, as a fraction of those two: the margin for what the draft's calls
# compute in passing. A weight copy held through the loop does not fit in it.
TEMPORARIES_MARGIN = 0.10


def temporaries_bound(decode: PlanComparison, baseline: PlanComparison) -> float:
  """The most the speculative decode's temporaries should take: the baseline's plus the
  draft's caches (the plan formula's caches of the decode less the baseline's), plus
  TEMPORARIES_MARGIN."""
  draft_cache = decode.formula_cache - baseline.formula_cache
  return (baseline.temp_bytes + draft_cache) * (1 + TEMPORARIES_MARGIN)


def format_temporaries_bound(decode: PlanComparison, baseline: PlanComparison) -> str:
  bound = temporaries_bound(decode, baseline)
  verdict = "within it" if decode.temp_bytes <= bound else "MORE"
  return (f"speculative decode: temporaries {decode.temp_bytes / 2**20:.1f} MiB, at most "
          f"{bound / 2**20:.1f} MiB (the baseline's plus the draft's caches, plus "
          f"{TEMPORARIES_MARGIN:.0%}): {verdict}")


def _gib(n: float) -> str:
  return f"{n / 2**30:.2f}"


def format_programs(compiled: Sequence[programs.Program],
                    plans: Mapping[str, PlanComparison]) -> list[str]:
  header = ["program", "lower s", "compile s", "arguments", "temporaries", "output", "code",
            "total GiB", "fits HBM", "plan params", "args vs plan", "plan cache"]
  rows = [header]
  for program in compiled:
    comparison = plans.get(program.name)
    rows.append([
        program.name, f"{program.lower_seconds:.1f}", f"{program.compile_seconds:.1f}",
        _gib(program.argument_bytes), _gib(program.temp_bytes),
        _gib(program.output_bytes - program.alias_bytes), f"{program.code_bytes / 2**20:.1f} MiB",
        _gib(program.device_bytes),
        "-" if comparison is None else ("yes" if comparison.fits else "NO"),
        "-" if comparison is None else _gib(comparison.formula_params),
        "-" if comparison is None else f"{comparison.argument_difference:+.1%}",
        "-" if comparison is None else _gib(comparison.formula_cache)])
  return _table(rows)


def format_calls(target_calls: Mapping[int, programs.Program],
                 draft_call: programs.Program | None, chip: topologies.Chip) -> list[str]:
  rows = [["call", "GFLOP", "arguments GiB", "XLA bytes accessed GiB", "XLA optimal_seconds",
           "roofline s", "ops in sequence"]]
  calls = [(f"target k={k}", p) for k, p in sorted(target_calls.items())]
  if draft_call is not None:
    calls.append(("draft k=1", draft_call))
  for label, program in calls:
    rows.append([label, f"{program.flops / 1e9:.2f}", _gib(program.argument_bytes),
                 _gib(program.bytes_accessed),
                 "-" if program.optimal_seconds is None else f"{program.optimal_seconds:.3g}",
                 f"{programs.roofline_seconds(program, chip):.3g}", str(program.sequential_ops)])
  return _table(rows)


def format_estimates(found: Sequence[Estimate], alpha: float | None, gamma: int | None,
                     paper_speedup: float | None) -> list[str]:
  lines = []
  for estimate in found:
    if not estimate.v:
      lines.append(f"{estimate.name}: no usable estimate of a 1-token target call")
      continue
    v = ", ".join(f"v({k})={value:.2f}" for k, value in estimate.v.items())
    c = "-" if estimate.c is None else f"{estimate.c:.3f}"
    line = f"{estimate.name}: {v}; c={c}"
    if estimate.predicted_speedup is not None:
      line += (f"; Theorem 3.8 at alpha {alpha:.2f}, gamma {gamma}: "
               f"{estimate.predicted_speedup:.2f}x")
    lines.append(line)
  if paper_speedup is not None:
    lines.append(f"the paper measured {paper_speedup}x (TPU-v4, batch 1)")
  return lines


def format_collectives(program: programs.Program) -> str:
  counts: dict[str, int] = {}
  for op, _ in program.loop_collectives:
    counts[op] = counts.get(op, 0) + 1
  found = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"
  return f"{program.name}: collectives inside its loops: {found}"


def format_relaid(program: programs.Program, shown: int = 4) -> str:
  """The weights the program copies before its loop and holds through it
  (`programs.loop_relaid_parameters`): temporaries the plan's formula does not count."""
  relaid = program.loop_relaid_parameters
  if not relaid:
    return f"{program.name}: no weight copied before its loop and live across it"
  names = ", ".join(name for name, _ in relaid[:shown])
  more = f", ... ({len(relaid) - shown} more)" if len(relaid) > shown else ""
  weights = "weight" if len(relaid) == 1 else "weights"
  return (f"{program.name}: {len(relaid)} {weights} copied into another layout before its loop "
          f"and live across it, {_gib(program.loop_relaid_bytes)} GiB of its temporaries: "
          f"{names}{more}")


def format_relaid_state(program: programs.Program) -> str:
  """The values (a decode's caches) the program copies into another layout at its loop's entry
  (`programs.loop_relaid_state`): each live twice there, the original and the copy."""
  relaid = program.loop_relaid_state
  if not relaid:
    return f"{program.name}: no computed value copied into another layout for its loop"
  shapes: dict[str, int] = {}
  for shape, _ in relaid:
    shapes[shape] = shapes.get(shape, 0) + 1
  listed = ", ".join(f"{count} x {shape}" for shape, count in shapes.items())
  values = "value" if len(relaid) == 1 else "values"
  return (f"{program.name}: {len(relaid)} computed {values} copied into another layout for its "
          f"loop, {sum(size for _, size in relaid) / 2**20:.2f} MiB: {listed}")


def as_json(program: programs.Program) -> dict[str, Any]:
  return {**dataclasses.asdict(program), "device_bytes": program.device_bytes}


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ["  ".join(cell.rjust(width) if i else cell.ljust(width)
                    for i, (cell, width) in enumerate(zip(row, widths))) for row in rows]
