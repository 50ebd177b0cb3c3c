"""Measured speedups beside the paper's Theorem 3.8 and two refinements of it.

Inputs are `timing.summarize` summaries and `costs` as `Workspace.costs` returns them: c (draft
step / target step), v (target (gamma+1)-token call / target step), the step times in seconds and
`iteration_calls_s` (one fixed-gamma iteration's model calls timed together).

  predicted_speedup(alpha, gamma, c, v)   Theorem 3.8, from alpha.
  realized_speedup(summary, costs)        the same cost model with the realized tokens and
                                          draft calls per target call.
  compare_with_theory(...)                the decoding-loop speedup beside all three
                                          predictions (the third prices an iteration's calls
                                          timed together) and their ratios.
  model_call_share(...)                   the share of loop time the model calls alone take.
"""

from __future__ import annotations

from typing import Any, Mapping

from spec_decode.engine import drafting


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float, verify_cost: float) -> float:
  """The paper's Theorem 3.8 walltime improvement (via `drafting.expected_tokens_per_cost`)."""
  return float(drafting.expected_tokens_per_cost(alpha, gamma, cost_ratio, verify_cost))


def realized_speedup(summary: Mapping[str, Any], costs: Mapping[str, float]) -> float:
  """Theorem 3.8's cost model fed with what the run realized instead of an i.i.d. alpha:
  tokens per target call / (draft calls per target call * c + v).

  The formula's alpha assumes independent acceptances and unbounded outputs; an output ending
  (EOS or the length limit cuts the last block) and positions harder than others give fewer
  tokens per call than (1 - alpha^(gamma+1)) / (1 - alpha). Measured / this isolates the
  implementation's own cost from the formula's assumptions.
  """
  return summary["tokens_per_target_call"] / (
      summary["draft_calls_per_target_call"] * costs["c"] + costs["v"])


def model_call_share(summary: Mapping[str, Any], costs: Mapping[str, float],
                     batch_size: int) -> float:
  """The share of a decoder's decoding-loop time that its model calls alone take, priced with
  the measured step times: 1 means no time outside the networks, lower values show what the
  formula (which counts only model calls) leaves out. Rows' mean call counts stand for the
  loop's iterations (exact at batch 1, approximate when rows stop at different lengths)."""
  if "counters" in summary:
    counters = summary["counters"]
    seconds = (counters["target_calls"] * costs["verify_step_s"]
               + counters["draft_calls"] * costs["draft_step_s"])
  else:
    seconds = summary["tokens"] * costs["target_step_s"]
  return seconds / batch_size / summary["decode_seconds"]


def compare_with_theory(speculative: Mapping[str, Any], baseline: Mapping[str, Any],
                        costs: Mapping[str, float], alpha: float, gamma: int,
                        batch_size: int) -> dict[str, Any]:
  """The decoding-loop speedup of `speculative` (a fixed-gamma decoder) over `baseline`
  (summaries) beside three predictions, each dropping one more assumption of Theorem 3.8:
  from alpha (`predicted_speedup`); from the realized tokens and draft calls per target call
  (`realized_speedup`); and from the realized tokens per call priced with an iteration's model
  calls timed together (`costs['iteration_calls_s']`). What separates the measured speedup from
  the last is the engine's own work outside the networks."""
  decode_speedup = speculative["decode_tokens_per_s"] / baseline["decode_tokens_per_s"]
  predicted = predicted_speedup(alpha, gamma, costs["c"], costs["v"])
  realized = realized_speedup(speculative, costs)
  # The realized counts priced with one iteration's model calls timed together (fixed gamma).
  interleaved = (speculative["tokens_per_target_call"] * costs["target_step_s"]
                 / costs["iteration_calls_s"])
  return {**costs, "decode_speedup": decode_speedup, "predicted_speedup": predicted,
          "measured_over_predicted": decode_speedup / predicted,
          "predicted_speedup_realized": realized,
          "measured_over_realized": decode_speedup / realized,
          "predicted_speedup_interleaved": interleaved,
          "measured_over_interleaved": decode_speedup / interleaved,
          "model_call_share": model_call_share(speculative, costs, batch_size)}
