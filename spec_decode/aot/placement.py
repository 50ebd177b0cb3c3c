"""Where a target split over several devices leaves the draft: its 1-token call compiled
alone with the draft's parameters replicated on every device and sharded like the target's
(`draft_placement_calls`), each priced by its roofline (`programs.roofline_seconds`) plus the
collectives the call runs at an assumed latency each (`draft_placements`), the cheapest first:
the placement a run should use (the T5X hook's SHARD_DRAFT). Compiled and priced, not run: the
collective latency is an assumption that only a TPU can replace with a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spec_decode.aot import programs
from spec_decode.aot import topologies
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning

DRAFT_PLACEMENTS = ("replicated", "sharded")


def draft_placement_calls(layout: decode_layout.DecodeLayout, *, batch_rows: int,
                          input_length: int, max_decode_len: int, param_dtype: Any = None,
                          progress: Callable[[str], None] = lambda _: None
                          ) -> dict[str, programs.Program | str]:
  """The draft's 1-token call compiled alone (`programs.call_program`) with its parameters
  'replicated' on every device (`decode_layout`'s default) and 'sharded' like the target's (the
  target's logical axis rules: the T5X hook's SHARD_DRAFT), whatever `layout`'s own draft
  rules; in place of a program, why the mesh cannot hold the draft so (a dimension it does not
  divide)."""
  if layout.draft is None:
    raise ValueError("this layout has no draft to place")
  rules = layout.partitioner.logical_axis_rules
  found = {}
  for placement, draft_rules in zip(DRAFT_PLACEMENTS, (
      partitioning.replicated_parameter_rules(rules), rules)):
    try:
      placed = decode_layout.decode_layout(layout.partitioner, layout.target, layout.draft,
                                           draft_rules, layout.compiler_options)
    except ValueError as e:
      found[placement] = re.sub(r":?\s*\n\s*", ": ", str(e).strip())
      continue
    found[placement] = programs.call_program(
        placed, "draft", batch_rows=batch_rows, input_length=input_length,
        max_decode_len=max_decode_len, num_tokens=1, param_dtype=param_dtype,
        name=f"draft call k=1, {placement}", progress=progress)
  return found


# The latency assumed for one collective of a batch-1 draft call (a few KiB of activations
# over the chips' interconnect): an order of magnitude, not a measurement; the command's
# --collective_latency replaces it.
COLLECTIVE_LATENCY = 1e-5


@dataclasses.dataclass(frozen=True)
class DraftPlacement:
  """One placement of the draft's parameters priced by its compiled 1-token call: the call's
  roofline per chip plus `collective_latency` for each collective it runs."""
  placement: str  # one of DRAFT_PLACEMENTS
  roofline_seconds: float
  collectives: int
  collective_latency: float
  impossible: str = ""  # why the mesh cannot hold the draft so; then the rest is meaningless

  @property
  def seconds(self) -> float:
    if self.impossible:
      return math.inf
    return self.roofline_seconds + self.collectives * self.collective_latency


def draft_placements(calls: Mapping[str, programs.Program | str], chip: topologies.Chip,
                     collective_latency: float = COLLECTIVE_LATENCY) -> list[DraftPlacement]:
  """Each placement's `DraftPlacement` (`draft_placement_calls`), cheapest first (the
  replicated draft on a tie: it needs no collective), impossible ones last."""
  if collective_latency < 0:
    raise ValueError(f"the collective latency is seconds >= 0, got {collective_latency}")
  found = [DraftPlacement(name, math.nan, 0, collective_latency, impossible=program)
           if isinstance(program, str) else
           DraftPlacement(name, programs.roofline_seconds(program, chip),
                          program.sequential_collectives,
                          collective_latency) for name, program in calls.items()]
  return sorted(found, key=lambda p: (p.seconds, p.placement != "replicated"))


def format_draft_placements(found: Sequence[DraftPlacement]) -> list[str]:
  """What each placement of the draft costs a call and which one to use."""
  lines = [f"draft placement, one 1-token draft call per chip (roofline + collectives x "
           f"{found[0].collective_latency * 1e6:.3g} us each, assumed):"]
  for placement in found:
    if placement.impossible:
      lines.append(f"  {placement.placement}: not possible: {placement.impossible}")
      continue
    lines.append(f"  {placement.placement}: roofline {placement.roofline_seconds * 1e3:.3f} ms "
                 f"+ {placement.collectives} collectives = {placement.seconds * 1e3:.3f} ms")
  best = found[0].placement
  lines.append(f"  use: {best} (the T5X hook's SHARD_DRAFT={best == 'sharded'})")
  return lines
