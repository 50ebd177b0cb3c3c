"""The programs of a decode, compiled ahead of time on a `decode_layout.DecodeLayout` (any mesh:
local devices or a TPU topology described from this host), and what XLA says of each.

  * `predict_program`: the decode exactly as `spec_decode.infer` compiles it
    (`DecodeLayout.partition_predict`: prefill and loop in one program), with abstract
    arguments: the parameters as `layout.restore` places them (floating ones in the run's
    checkpoint dtype), a batch and an rng;
  * `call_program`: one cached model call of k fed tokens, alone: the call the loop makes,
    with the layout's products and cache layout, the cache donated (the loop updates it in
    place, so a copy of it would be an artefact of compiling the call alone).
Each gives a `Program`: per-device memory (`memory_analysis`), flops, bytes accessed and XLA's
`optimal_seconds` (`cost_analysis`: XLA's cost model, not a measurement), the collectives
inside the program's while loops, and the custom calls it holds.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from spec_decode import core
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

  @property
  def device_bytes(self) -> int:
    """What the program needs on a device while it runs: arguments, outputs not aliased to
    them, temporaries and code."""
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)


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
  return Program(
      name=name, lower_seconds=lowered_at - start, compile_seconds=compiled_at - lowered_at,
      argument_bytes=int(memory.argument_size_in_bytes),
      output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes), temp_bytes=int(memory.temp_size_in_bytes),
      code_bytes=int(memory.generated_code_size_in_bytes),
      flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      optimal_seconds=(float(cost["optimal_seconds"]) if "optimal_seconds" in cost else None),
      loop_collectives=tuple(sorted(collectives_in_loop(text))),
      custom_calls=tuple(sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))))


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
                 param_dtype: Any = None, name: str | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> Program:
  """One cached call of the 'target' or 'draft' feeding `num_tokens` tokens per row, every fed
  token's logits returned (a verification call), compiled alone (see the module docstring)."""
  config = layout.target if role == "target" else layout.draft
  module = network.module_of(config)
  params = abstract_params(config, param_dtype)
  cache = partitioning.abstract_decode_cache(config, batch_rows, input_length, max_decode_len)
  cache_shardings = layout.partitioner.cache_shardings(cache, layout.rules(role))
  params_shardings = layout.params_shardings if role == "target" else layout.draft_params_shardings
  batch = layout.partitioner.batch_sharding

  def call(params, cache, cur_index, cur_token, sequences):
    state = decoding.DecodingState(cur_index=cur_index, cur_token=cur_token,
                                   sequences=sequences, cache=layout.pin_cache(role, cache))
    return layout.tokens_to_logits(role, module, params)(state)

  jitted = layout.partitioner.partition(
      call, (params_shardings, cache_shardings, batch, batch, batch), (None, cache_shardings),
      donate_argnums=(1,), compiler_options=layout.compiler_options)
  arguments = (params, cache, jax.ShapeDtypeStruct((batch_rows,), jnp.int32),
               jax.ShapeDtypeStruct((batch_rows, num_tokens), jnp.int32),
               jax.ShapeDtypeStruct((batch_rows, max_decode_len), jnp.int32))
  return compile_program(name or f"{role} call k={num_tokens}",
                         lambda: jitted.lower(*arguments), progress)


def collectives_in_loop(hlo: str) -> list[tuple[str, str]]:
  """(collective, op_name) of every collective inside a while loop of a compiled HLO module's
  text (the loop bodies and every computation they call)."""
  computations: dict[str, list[str]] = {}
  lines: list[str] = []
  for line in hlo.splitlines():
    header = re.match(r"(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if header and not line.startswith(" "):
      lines = computations.setdefault(header.group(1), [])
    elif line.startswith("  "):
      lines.append(line)
  called = {name: set(re.findall(r"%([\w.\-]+)", " ".join(
      re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=(\{[^}]*\}|%[\w.\-]+)",
                 "\n".join(body)))))
            for name, body in computations.items()}
  pending = [m for body in computations.values() for line in body
             for m in re.findall(r" while\(.*body=%([\w.\-]+)", line)]
  in_loop: set[str] = set()
  while pending:
    name = pending.pop()
    if name not in in_loop:
      in_loop.add(name)
      pending.extend(called.get(name, ()))
  found = []
  for name in in_loop:
    for line in computations.get(name, ()):
      for op in COLLECTIVES:
        if re.search(rf"\s{op}(-start)?\(", line):
          op_name = re.search(r'op_name="([^"]*)"', line)
          found.append((op, op_name.group(1) if op_name else "?"))
  return found
