"""The kernels a compiled decoding loop executes per iteration, the engine's and the models'
apart: `loop_kernels(compiled_hlo_text)`.

XLA runs a compiled module as a sequence of kernels (on CPU, thunks: a fusion, a dot, a copy, a
custom call, a loop); each costs a dispatch (several microseconds on an accelerator, about one
on XLA:CPU) beside its work, so at small model sizes their number is the engine's cost. What is
counted, in the decoding loop (the largest `while` the entry computation reaches) and in each
loop nested in it: every instruction of the loop's body and condition except those that make no
kernel (parameters, constants, tuples and their elements, bitcasts). An instruction belongs to
a model call when its source location is inside the network (`Transformer.` in its op_name),
or, where XLA's own rewrites left it no source location (the dots it rewrites, the reductions it
splits), when one of its operands belongs to one; everything else is the engine's: sampling,
verification, bookkeeping, the loops themselves (the copies of loop state they make).
"""

from __future__ import annotations

import dataclasses
import re

NO_KERNEL = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all")
MODEL_MARK = "Transformer."

_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_WHILE_PARTS = re.compile(r"(condition|body)=%?([\w.\-]+)")
_CALLED = re.compile(r"to_apply=%?([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Count:
  engine: int = 0
  model: int = 0

  def __add__(self, other: "Count") -> "Count":
    return Count(self.engine + other.engine, self.model + other.model)

  def __mul__(self, times: int) -> "Count":
    return Count(self.engine * times, self.model * times)


@dataclasses.dataclass(frozen=True)
class Loop:
  """One `while`: kernels of one iteration (body + condition, nested loops apart), the loop's
  own dispatch, and the loops nested in its body with their trip counts where XLA knows them."""
  per_iteration: Count
  nested: tuple["Loop", ...]
  trip_count: int | None
  calls_model: bool  # a model call is in it or in a loop nested in it

  def kernels(self, draft_loop_iterations: float) -> Count:
    """Kernels executed by one iteration of this loop, nested loops included: a nested loop
    runs its known trip count, else (the draft's loop) `draft_loop_iterations` times."""
    total = self.per_iteration
    for loop in self.nested:
      trips = loop.trip_count if loop.trip_count is not None else draft_loop_iterations
      # The condition runs once more than the body; counted with the body's iterations.
      total = total + loop.kernels(draft_loop_iterations) * trips
    return total


def _opcode(line: str) -> str | None:
  """The opcode of an instruction line (`%name = type opcode(operands), ...`), else None."""
  opcode = _opcode_match(line)
  return opcode.group(1) if opcode else None


def _opcode_match(line: str) -> re.Match | None:
  """The match of an instruction line's opcode and its opening parenthesis, else None."""
  name = _NAME.match(line)
  if not name:
    return None
  rest, position = line, name.end()
  if rest.startswith("(", position):  # a tuple type: skip to its closing parenthesis
    depth = 0
    for position in range(position, len(rest)):
      depth += {"(": 1, ")": -1}.get(rest[position], 0)
      if depth == 0:
        break
    position += 1
  else:
    position = rest.find(" ", position)
  return _OPCODE.match(rest, position)


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
  computations: dict[str, list[str]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
    elif current is not None and line.startswith(" "):
      computations[current].append(line)
  return computations, entry


def _operands(line: str) -> list[str]:
  """The names of an instruction line's operands (inside its opcode's parentheses, not a
  tuple type's)."""
  start = _opcode_match(line).end() - 1
  depth = 0
  for end in range(start, len(line)):
    depth += {"(": 1, ")": -1}.get(line[end], 0)
    if depth == 0:
      break
  return _OPERAND.findall(line[start:end])


def _is_model(line: str, model_names: set[str]) -> bool:
  if 'op_name="' in line:
    return MODEL_MARK in line
  return any(name in model_names for name in _operands(line))


def _loop(computations: dict[str, list[str]], body: str, condition: str,
          trip_count: int | None) -> Loop:
  count, nested = Count(1, 0), []  # the while's own dispatch
  pending = [body, condition]
  while pending:  # the body, the condition, and computations they call (inlined by the runtime)
    model_names: set[str] = set()  # instructions are listed after their operands
    for line in computations[pending.pop()]:
      opcode = _opcode(line)
      if opcode is None:
        continue
      if opcode in NO_KERNEL:
        if opcode != "parameter" and _is_model(line, model_names):
          model_names.add(_NAME.match(line).group(1))  # a bitcast or tuple of model values
        continue
      if opcode == "while":
        nested.append(_while(computations, line))
      elif opcode == "call":
        pending.extend(_CALLED.findall(line))
      elif _is_model(line, model_names):
        model_names.add(_NAME.match(line).group(1))
        count += Count(0, 1)
      else:
        count += Count(1, 0)
  calls_model = count.model > 0 or any(loop.calls_model for loop in nested)
  return Loop(count, tuple(nested), trip_count, calls_model)


def _while(computations: dict[str, list[str]], line: str) -> Loop:
  parts = dict(_WHILE_PARTS.findall(line))
  trip = _TRIP_COUNT.search(line)
  return _loop(computations, parts["body"], parts["condition"],
               int(trip.group(1)) if trip else None)


def loop_kernels(hlo_text: str) -> Loop:
  """The decoding loop of a compiled module's text (`compiled.as_text()`): the largest `while`
  reachable from the entry computation through calls."""
  computations, entry = _computations(hlo_text)
  loops, pending, seen = [], [entry], set()
  while pending:
    name = pending.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for line in computations[name]:
      opcode = _opcode(line)
      if opcode == "while":
        loops.append(_while(computations, line))
      elif opcode == "call":
        pending.extend(_CALLED.findall(line))
  if not loops:
    raise ValueError("no while loop in the compiled module: not a decoding loop")
  return max(loops, key=lambda loop: loop.kernels(1.0).engine + loop.kernels(1.0).model)
