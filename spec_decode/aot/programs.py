"""The programs of a decode, compiled ahead of time on a `decode_layout.DecodeLayout` (any mesh:
local devices or a TPU topology described from this host), and what XLA says of each.

  * `predict_program`: the decode exactly as `spec_decode.infer` compiles it
    (`DecodeLayout.partition_predict`: prefill and loop in one program), with abstract
    arguments: the parameters as `layout.restore` places them (floating ones in the run's
    checkpoint dtype), a batch and an rng;
  * `call_program`: one cached model call of k fed tokens, alone: the call the loop makes,
    with the layout's products and cache layout, the cache donated (the loop updates it in
    place, so a copy of it would be an artefact of compiling the call alone); a chain call, or
    a tree call (the contract's token positions and mask, as `speculative_tree_sample` makes).
Each gives a `Program`: per-device memory (`memory_analysis`), flops, bytes accessed and XLA's
`optimal_seconds` (`cost_analysis`: XLA's cost model, not a measurement), the collectives
inside the program's while loops, the custom calls it holds, and the parameters the program
copies into another layout before a while loop and hands to it (`loop_relaid_parameters`:
such a copy stays live for the whole loop, temporaries the plan's formula does not count), the
values it computes and copies into another layout at a loop's entry (`loop_relaid_state`), and
the operations the program launches one after another (`sequential_ops`: its kernels, copies,
custom calls and collectives, each paying a fixed launch cost that a roofline does not show).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from spec_decode import core
from spec_decode.aot import topologies
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode.engine import decoding
from spec_decode.t5 import network

COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce", "reduce-scatter")


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program and XLA's figures for it, per device (bytes, flops, seconds)."""
  name: str
  lower_seconds: float
  compile_seconds: float
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  flops: float
  bytes_accessed: float
  optimal_seconds: float | None  # XLA's cost model; None where it gives none
  loop_collectives: tuple[tuple[str, str], ...]  # (collective, op_name) inside while loops
  custom_calls: tuple[str, ...]  # custom-call targets in the compiled program
  # (parameter, bytes) of every weight copied before a while loop and live across it
  loop_relaid_parameters: tuple[tuple[str, int], ...] = ()
  # (shape, bytes) of every computed value (a cache) relaid at a while loop's entry; empty in
  # figures compiled before they were read
  loop_relaid_state: tuple[tuple[str, int], ...] = ()
  # the operations the program launches in sequence, and how many of them are collectives
  # (`sequential_ops`); 0 in figures compiled before they were counted
  sequential_ops: int = 0
  sequential_collectives: int = 0

  @property
  def loop_relaid_bytes(self) -> int:
    return sum(size for _, size in self.loop_relaid_parameters)

  @property
  def device_bytes(self) -> int:
    """What the program needs on a device while it runs: arguments, outputs not aliased to
    them, temporaries and code."""
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)


def roofline_seconds(program: Program, chip: topologies.Chip) -> float:
  """max(flops / peak bf16 FLOP/s, argument bytes / HBM bandwidth) on `chip`: a bound no run of
  the program on that chip beats (`report` says why argument bytes)."""
  return max(program.flops / chip.bf16_flops_per_second,
             program.argument_bytes / chip.hbm_bytes_per_second)


def compile_program(name: str, lower: Callable[[], jax.stages.Lowered],
                    progress: Callable[[str], None] = lambda _: None) -> Program:
  """Lowers and compiles, timing both, and reads XLA's analyses back."""
  progress(f"{name}: lowering")
  start = time.perf_counter()
  lowered = lower()
  lowered_at = time.perf_counter()
  progress(f"{name}: compiling (lowered in {lowered_at - start:.1f} s)")
  compiled = lowered.compile()
  compiled_at = time.perf_counter()
  progress(f"{name}: compiled in {compiled_at - lowered_at:.1f} s")
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else {}
  cost = dict(cost or {})
  text = compiled.as_text()
  launched = sequential_ops(text)
  return Program(
      name=name, lower_seconds=lowered_at - start, compile_seconds=compiled_at - lowered_at,
      argument_bytes=int(memory.argument_size_in_bytes),
      output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes), temp_bytes=int(memory.temp_size_in_bytes),
      code_bytes=int(memory.generated_code_size_in_bytes),
      flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      optimal_seconds=(float(cost["optimal_seconds"]) if "optimal_seconds" in cost else None),
      loop_collectives=tuple(sorted(collectives_in_loop(text))),
      custom_calls=tuple(sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))),
      loop_relaid_parameters=tuple(loop_relaid_parameters(text)),
      loop_relaid_state=tuple(loop_relaid_state(text)),
      sequential_ops=len(launched),
      sequential_collectives=sum(kind in COLLECTIVES for kind in launched))


def abstract_params(config: network.NetworkConfig, dtype: Any = None) -> Any:
  """ShapeDtypeStructs of a model's parameters as a run restores them: floating ones cast to
  `dtype` (None: as stored, float32)."""
  shapes, _ = partitioning.abstract_params(config)
  if dtype is None:
    return shapes
  return jax.tree_util.tree_map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, dtype if jnp.issubdtype(
          leaf.dtype, jnp.floating) else leaf.dtype), shapes)


def abstract_batch(config: network.NetworkConfig, batch_size: int, input_length: int,
                   target_length: int) -> dict[str, jax.ShapeDtypeStruct]:
  """The features a run decodes: seqio's encoder-decoder features, or a decoder-only model's
  decoder features of the prompt and its continuation (`network.decode_length` positions)."""
  tokens = lambda length: jax.ShapeDtypeStruct((batch_size, length), jnp.int32)
  if network.is_decoder_only(config):
    length = network.decode_length(config, input_length, target_length)
    return {"decoder_input_tokens": tokens(length), "decoder_causal_attention": tokens(length)}
  return {"encoder_input_tokens": tokens(input_length),
          "decoder_input_tokens": tokens(target_length)}


def predict_program(layout: decode_layout.DecodeLayout, decoder: core.Decoder, *, eos_id: int,
                    num_decodes: int, batch_size: int, input_length: int, target_length: int,
                    param_dtype: Any = None, name: str = "decode",
                    progress: Callable[[str], None] = lambda _: None) -> Program:
  """`decoder.predict` compiled as `spec_decode.infer` compiles it (see the module
  docstring); `param_dtype`: both models' floating parameters' dtype (the run's
  CHECKPOINT_DTYPE)."""
  predict = layout.partition_predict(decoder, eos_id, num_decodes)
  params = abstract_params(layout.target, param_dtype)
  draft_params = (None if decoder.draft_network is None
                  else abstract_params(layout.draft, param_dtype))
  batch = abstract_batch(layout.target, batch_size, input_length, target_length)
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32)  # jax.random.PRNGKey's
  return compile_program(name, lambda: predict.lower(params, draft_params, batch, rng), progress)


def call_program(layout: decode_layout.DecodeLayout, role: str, *, batch_rows: int,
                 input_length: int, max_decode_len: int, num_tokens: int,
                 param_dtype: Any = None, tree: bool = False, name: str | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> Program:
  """One cached call of the 'target' or 'draft' feeding `num_tokens` tokens per row, every fed
  token's logits returned (a verification call), compiled alone (see the module docstring).
  `tree`: a tree call of the model contract (`token_positions` [B, k] and `token_mask`
  [B, k, k] given, as `speculative_tree_sample` calls), else a chain call."""
  config = layout.target if role == "target" else layout.draft
  module = network.module_of(config)
  params = abstract_params(config, param_dtype)
  cache = partitioning.abstract_decode_cache(config, batch_rows, input_length, max_decode_len)
  cache_shardings = layout.partitioner.cache_shardings(cache, layout.rules(role))
  params_shardings = layout.params_shardings if role == "target" else layout.draft_params_shardings
  batch = layout.partitioner.batch_sharding

  def call(params, cache, cur_index, cur_token, sequences, *tree_fields):
    state = decoding.DecodingState(cur_index=cur_index, cur_token=cur_token,
                                   sequences=sequences, cache=layout.pin_cache(role, cache),
                                   token_positions=tree_fields[0] if tree else None,
                                   token_mask=tree_fields[1] if tree else None)
    return layout.tokens_to_logits(role, module, params)(state)

  arguments = (params, cache, jax.ShapeDtypeStruct((batch_rows,), jnp.int32),
               jax.ShapeDtypeStruct((batch_rows, num_tokens), jnp.int32),
               jax.ShapeDtypeStruct((batch_rows, max_decode_len), jnp.int32))
  if tree:
    arguments += (jax.ShapeDtypeStruct((batch_rows, num_tokens), jnp.int32),
                  jax.ShapeDtypeStruct((batch_rows, num_tokens, num_tokens), jnp.bool_))
  jitted = layout.partitioner.partition(
      call, (params_shardings, cache_shardings) + (batch,) * (len(arguments) - 2),
      (None, cache_shardings), donate_argnums=(1,), compiler_options=layout.compiler_options)
  kind = "tree call" if tree else "call"
  return compile_program(name or f"{role} {kind} k={num_tokens}",
                         lambda: jitted.lower(*arguments), progress)


def _computation_lines(hlo: str) -> tuple[str, dict[str, list[str]]]:
  """The name of a compiled HLO module's entry computation, and each computation's instruction
  lines by name."""
  computations: dict[str, list[str]] = {}
  entry, lines = "", []
  for line in hlo.splitlines():
    header = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header and not line.startswith(" "):
      lines = computations.setdefault(header.group(2), [])
      entry = header.group(2) if header.group(1) else entry
    elif line.startswith("  "):
      lines.append(line)
  return entry, computations


def _called(lines: list[str], attributes: str = "calls|body|condition|to_apply|"
            "branch_computations") -> set[str]:
  """The computations that instruction lines call through the given attributes."""
  return set(re.findall(r"%([\w.\-]+)", " ".join(
      re.findall(rf"(?:{attributes})=(\{{[^}}]*\}}|%[\w.\-]+)", "\n".join(lines)))))


def _collective_in(lines: list[str]) -> str | None:
  """The first collective among instruction lines, else None."""
  for line in lines:
    for op in COLLECTIVES:
      if re.search(rf"\s{op}(-start)?\(", line):
        return op
  return None


def collectives_in_loop(hlo: str) -> list[tuple[str, str]]:
  """(collective, op_name) of every collective inside a while loop of a compiled HLO module's
  text (the loop bodies and every computation they call)."""
  _, computations = _computation_lines(hlo)
  pending = [m for body in computations.values() for line in body
             for m in re.findall(r" while\(.*body=%([\w.\-]+)", line)]
  in_loop: set[str] = set()
  while pending:
    name = pending.pop()
    if name not in in_loop:
      in_loop.add(name)
      pending.extend(_called(computations.get(name, [])))
  found = []
  for name in in_loop:
    for line in computations.get(name, ()):
      op = _collective_in([line])
      if op:
        op_name = re.search(r'op_name="([^"]*)"', line)
        found.append((op, op_name.group(1) if op_name else "?"))
  return found


# What adds no step to the sequence: names, views and constants; moves between memory spaces
# that XLA:TPU starts early to run beside the kernels (prefetches, whole or sliced); and the
# second half of an asynchronous pair (its `-start` is counted).
_NOT_SEQUENTIAL = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                   "partition-id", "replica-id", "opt-barrier", "copy-start", "slice-start")


def sequential_ops(hlo: str) -> list[str]:
  """The operations a compiled HLO module's entry computation runs one after another, in
  order: each fusion (one kernel, whatever it fuses), copy, custom call, collective and other
  instruction, an asynchronous pair once (its `-start`); a while loop's body once per iteration
  where XLA knows its trip count (once otherwise), a call's computation, a conditional's longest
  branch. Names, views, constants and prefetches (`_NOT_SEQUENTIAL`) are left out. Each is given
  by its opcode, or by the collective it performs (also when fused)."""
  entry, computations = _computation_lines(hlo)

  def launched(computation: str) -> list[str]:
    found: list[str] = []
    for line in computations.get(computation, ()):
      instruction = _instruction(line)
      if instruction is None:
        continue
      _, current = instruction
      opcode = current.opcode
      if opcode in _NOT_SEQUENTIAL or opcode.endswith("-done"):
        continue
      if opcode == "while":
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', current.attributes)
        found += launched(*_called([line], "body")) * (int(trips.group(1)) if trips else 1)
      elif opcode == "call":
        found += launched(*_called([line], "to_apply"))
      elif opcode == "conditional":
        found += max((launched(branch) for branch in _called([line], "branch_computations")),
                     key=len, default=[])
      else:
        fused = [line for name in _called([line], "calls") for line in computations.get(name, ())]
        found.append(_collective_in([line]) or _collective_in(fused) or opcode.removesuffix(
            "-start"))
    return found

  return launched(entry)


# Bytes per element of the HLO types a parameter may have.
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                  "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# What passes a buffer on without computing: moves between memory spaces (XLA:TPU's prefetch
# into alternate memory, whole or as async slices joined by a ConcatBitcast custom call) and
# reinterpretations of its shape.
_PASS_THROUGH = ("copy-start", "copy-done", "bitcast", "slice-start", "slice-done",
                 "custom-call ConcatBitcast")
# What writes a new buffer of a single operand's elements in another layout, and what may
# besides (a fusion of one operand rewriting it).
_LAYOUT_COPIES = ("copy", "transpose")
_RELAYOUTS = _LAYOUT_COPIES + ("fusion",)


@dataclasses.dataclass(frozen=True)
class _Instruction:
  shape: str
  opcode: str
  operands: tuple[str, ...]
  op_name: str
  custom_call_target: str
  attributes: str = ""  # the text after the operands

  @property
  def kind(self) -> str:
    """The opcode, and a custom call's target after it."""
    return f"{self.opcode} {self.custom_call_target}".strip()


def _closing(text: str, depth: int) -> int:
  """The index in `text` of the parenthesis that closes `depth` open ones."""
  for end, char in enumerate(text):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      return end
  return len(text)


def _instruction(line: str) -> tuple[str, _Instruction] | None:
  """The name and parts of one instruction line of compiled HLO text, None for other lines."""
  match = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = ", line)
  if not match:
    return None
  rest = line[match.end():]
  if rest.startswith("("):  # a tuple shape: up to its closing parenthesis
    end = _closing(rest, 0)
    shape, rest = rest[:end + 1], rest[end + 2:]
  else:
    shape, _, rest = rest.partition(" ")
  opcode, _, rest = rest.partition("(")
  end = _closing(rest, 1)  # the operands, then the attributes
  op_name = re.search(r'op_name="([^"]*)"', rest[end:])
  target = re.search(r'custom_call_target="([^"]*)"', rest[end:])
  return match.group(1), _Instruction(
      shape, opcode, tuple(re.findall(r"%([\w.\-]+)", rest[:end])),
      op_name.group(1) if op_name else "", target.group(1) if target else "", rest[end:])


def _entry_instructions(hlo: str) -> dict[str, _Instruction]:
  """The instructions of a compiled HLO module's entry computation, by name."""
  entry, computations = _computation_lines(hlo)
  return dict(found for found in map(_instruction, computations.get(entry, ())) if found)


def _array_bytes(shape: str) -> int:
  """Bytes of an HLO array shape such as bf16[512,384]{0,1:T(8,128)(2,1)} (without tiles'
  padding)."""
  match = re.match(r"(\w+)\[([\d,]*)\]", shape)
  if not match or match.group(1) not in _ELEMENT_BYTES:
    return 0
  return math.prod(int(d) for d in match.group(2).split(",") if d) * _ELEMENT_BYTES[
      match.group(1)]


def _layout(shape: str) -> str:
  """An HLO array shape's element type, dimensions and layout, less its memory space:
  bf16[1,512,8,64]{1,3,2,0:T(8,128)(2,1)S(3)} -> bf16[1,512,8,64]{1,3,2,0:T(8,128)(2,1)}."""
  return re.sub(r"S\(\d+\)", "", shape)


def _parameter_name(parameter: str, instruction: _Instruction) -> str:
  """params['decoder']['layers_0'][...] (JAX's name of the argument) as
  params/decoder/layers_0/..., else the HLO parameter's own name."""
  name = instruction.op_name.replace("\\'", "'")
  match = re.fullmatch(r"(\w+)((?:\['[^']*'\])+)", name)
  if not match:
    return parameter
  return "/".join([match.group(1)] + re.findall(r"\['([^']*)'\]", match.group(2)))


def _loop_state(instructions: dict[str, _Instruction]) -> Iterator[str]:
  """The names of the entry computation's values handed to its while loops as their state."""
  for instruction in instructions.values():
    if instruction.opcode != "while":
      continue
    state = instructions.get(instruction.operands[0]) if instruction.operands else None
    yield from (state.operands if state is not None and state.opcode == "tuple"
                else instruction.operands)


def loop_relaid_parameters(hlo: str) -> list[tuple[str, int]]:
  """(parameter, bytes) of every weight a compiled program copies (in another layout, or a
  fusion's rewrite of it) in its entry computation and hands to a while loop: a copy that the
  loop reads every iteration, live from before the loop to its end. XLA:TPU makes such copies
  when a product in the loop wants a weight in another layout than the one it is passed in
  and hoists the relayout out of the loop. Moves between memory spaces (prefetches, whole
  or sliced) and bitcasts are followed, not counted. Sorted by parameter."""
  instructions = _entry_instructions(hlo)
  found = set()
  for element in _loop_state(instructions):
    name, relaid, size = element, False, 0
    while name in instructions:
      current = instructions[name]
      if current.opcode == "parameter":
        if relaid:
          found.add((_parameter_name(name, current), size))
        break
      if current.opcode in _RELAYOUTS and len(current.operands) == 1:
        relaid = True
        size = size or _array_bytes(current.shape)
      elif current.kind not in _PASS_THROUGH or not current.operands:
        break
      name = current.operands[0]
  return sorted(found)


def loop_relaid_state(hlo: str) -> list[tuple[str, int]]:
  """(shape, bytes) of every value computed before a while loop that the program copies into
  another layout (a copy or transpose) to hand to the loop, weights aside
  (`loop_relaid_parameters`): XLA:TPU's relayout of a decode cache the prefill wrote in one
  layout and the loop reads in another, made at the loop's entry while the original is live.
  Moves between memory spaces are followed. Sorted by shape."""
  instructions = _entry_instructions(hlo)
  found = []
  for element in _loop_state(instructions):
    name = element
    while name in instructions and instructions[name].kind in _PASS_THROUGH:
      name = instructions[name].operands[0] if instructions[name].operands else ""
    current = instructions.get(name)
    if current is None or current.opcode not in _LAYOUT_COPIES or len(current.operands) != 1:
      continue
    source = current.operands[0]
    if source in instructions and _layout(instructions[source].shape) == _layout(current.shape):
      continue  # a copy in the same layout (XLA's copy of a small value for the loop to own)
    while source in instructions and instructions[source].kind in _PASS_THROUGH + _LAYOUT_COPIES:
      source = instructions[source].operands[0] if instructions[source].operands else ""
    if source in instructions and instructions[source].opcode != "parameter":
      found.append((current.shape.partition("{")[0], _array_bytes(current.shape)))
  return sorted(found)
