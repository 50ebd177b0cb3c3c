"""`python -m spec_decode.plan`: per-device memory of a sharded decode, before running one.

Run: `python -m spec_decode.plan --gin_file=configs/table2/spec_decode.gin
--gin_file=configs/table2/ende_small_t0.gin
[--device_kind=tpu_v4|h200|cpu] [--num_devices=N] [--batch_size=B] [--input_length=Le]
[--target_length=L] [--num_decodes=n] [--param_dtype=D] [--draft_gin_file=F]
[--parameter_partitioning_dims=1|2] [--compile_for=TOPOLOGY [--largest_batch_up_to=N]]
[--gin_bindings=B ...]`.

What it reads (`gin_utils.read_run_config`: the gin config is parsed, nothing is built or
allocated):
  * the target: the network config the config binds (`gin_utils.bound_network_config`: a T5's
    or a decoder-only language model's);
  * the draft: `--draft_gin_file` (a model gin file), else the config's speculative model's
    `draft_module`, else the config read from the
    checkpoint DRAFT_CHECKPOINT_PATH names (its parameter shapes: `formats.checkpoint_config`);
    without any, the target alone is planned;
  * batch size and lengths: the BATCH_SIZE and TASK_FEATURE_LENGTHS macros ({'inputs': Le,
    'targets': L}), each overridden by its flag; a language model decodes Le + L positions
    (its prompt, then the continuation: `network.decode_length`).

What it prints, for num_partitions P in 1, 2, 4, 8, 16 on a ('data', 'model') mesh of
(num_devices / P, P) devices (num_devices defaults to P: one model-parallel group), per device:
  * parameters, every floating one counted in `param_dtype` (default: the target config's dtype,
    bfloat16 for the T5X configs: T5X's inference dtype), split by T5X's standard logical axis
    rules (`partitioning.standard_logical_axis_rules`);
  * decode caches: exactly the leaves of `network.init_decode_cache` for B * num_decodes rows
    (per decoder layer self-attention K/V [B, L, H, D] and cross-attention K/V [B, H, D, Le],
    plus the encoder mask [B, Le] and cache index [B]), from `jax.eval_shape`, split alike;
  * the totals of the target alone (the baseline) and of target + draft (speculative decoding),
    and whether each fits one device of `device_kind` (tpu_v4: 32 GiB HBM per chip; h200: 141 GB;
    cpu: this machine's RAM). The draft is replicated on every device, as
    `decode_layout.DecodeLayout` (what `spec_decode.infer` runs) places it by default;
    `spec_decode.infer` refuses, before restoring, a run whose numbers exceed its budget
    (`check_fits`).
A mesh that does not divide a split dimension (heads, mlp_dim, vocabulary, batch) is shown as
such instead of numbers. Not counted: activations, logits, the engine's small [B, L] buffers and
XLA's temporaries, so leave headroom. With `--compile_for=TOPOLOGY` (a TPU topology of
`spec_decode.aot`, e.g. v4-8; needs `jax[tpu]`), the decode is also compiled by XLA for each P
the topology has chips for, on P of them, and XLA's own per-device arguments, temporaries and
code are printed under the formula's (`python -m spec_decode.aot` says more); where P > 1 and
there is a draft, its call compiled replicated and sharded like the target, each priced by its
roofline plus its collectives at an assumed latency (`aot.placement.draft_placements`), and the
placement the run should use (the T5X hook's SHARD_DRAFT). With
`--largest_batch_up_to=N` as well, for each such P the largest batch size up to N (a multiple of
the mesh's 'data' axis) whose decode fits one chip's HBM by XLA's memory analysis, found by
bisection over compiled programs (`largest_batch`: at most log2(N) + 3 compiles per P) instead of
the decode at the config's batch size; XLA's temporaries, which the formula leaves out, are in
it. A batch XLA:TPU refuses to compile (RESOURCE_EXHAUSTED: its temporaries exceed the HBM it
leaves them) does not fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh

from spec_decode import gin_utils
from spec_decode.t5 import network
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning

NUM_PARTITIONS = (1, 2, 4, 8, 16)
DEVICE_KINDS = ("tpu_v4", "h200", "cpu")


def device_memory_bytes(device_kind: str) -> int:
  """Memory of one device of `device_kind`."""
  if device_kind == "tpu_v4":
    return 32 * 2**30
  if device_kind == "h200":
    return 141 * 10**9
  if device_kind == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  raise ValueError(f"unknown device kind {device_kind!r}; known: {', '.join(DEVICE_KINDS)}")


# --------------------------------------------------------------------------- memory


@dataclasses.dataclass(frozen=True)
class ModelShapes:
  """Everything about one model's memory that does not depend on the mesh."""
  config: network.NetworkConfig
  params: Any  # ShapeDtypeStructs
  params_axes: Any  # logical PartitionSpecs
  cache: Any  # ShapeDtypeStructs of network.init_decode_cache


def model_shapes(config: network.NetworkConfig, batch_rows: int, input_length: int,
                 max_decode_len: int) -> ModelShapes:
  params, axes = partitioning.abstract_params(config)
  cache = partitioning.abstract_decode_cache(config, batch_rows, input_length, max_decode_len,
                                             params)
  return ModelShapes(config, params, axes, cache)


@dataclasses.dataclass(frozen=True)
class DeviceBytes:
  """One model's bytes per device on one mesh, or why the mesh does not fit it."""
  params: int = 0
  cache: int = 0
  problems: tuple[partitioning.Indivisible, ...] = ()

  @property
  def total(self) -> int:
    return self.params + self.cache


def _per_device(shapes: Any, logical_axes: Any, rules: partitioning.LogicalAxisRules,
                mesh: AbstractMesh, dtype_of: Any) -> int:
  shardings = partitioning.logical_shardings(mesh, logical_axes, rules)
  return sum(math.prod(sharding.shard_shape(leaf.shape)) * jnp.dtype(dtype_of(leaf)).itemsize
             for leaf, sharding in zip(jax.tree_util.tree_leaves(shapes),
                                       jax.tree_util.tree_leaves(shardings)))


def device_bytes(model: ModelShapes, mesh_shape: tuple[int, int],
                 rules: partitioning.LogicalAxisRules, param_dtype: Any) -> DeviceBytes:
  """Per-device bytes of `model`'s parameters (floating ones in `param_dtype`; None: in their
  own dtype, float32) and caches."""
  mesh = AbstractMesh(mesh_shape, partitioning.MESH_AXES)
  cache_axes = network.cache_logical_axes(model.cache)
  problems = partitioning.indivisible_axes({"params": model.params, "cache": model.cache},
                                          {"params": model.params_axes, "cache": cache_axes},
                                          rules, mesh)
  if problems:
    return DeviceBytes(problems=tuple(problems))

  def param_dtype_of(leaf: jax.ShapeDtypeStruct) -> Any:
    floating = param_dtype is not None and jnp.issubdtype(leaf.dtype, jnp.floating)
    return param_dtype if floating else leaf.dtype

  return DeviceBytes(
      params=_per_device(model.params, model.params_axes, rules, mesh, param_dtype_of),
      cache=_per_device(model.cache, cache_axes, rules, mesh, lambda leaf: leaf.dtype))


@dataclasses.dataclass(frozen=True)
class PlanRow:
  num_partitions: int
  mesh_shape: tuple[int, int] | None  # None: the devices cannot form this mesh (see `unavailable`)
  target: DeviceBytes | None = None
  draft: DeviceBytes | None = None
  unavailable: str = ""


def plan(target: ModelShapes, draft: ModelShapes | None, param_dtype: Any,
         num_devices: int | None = None, parameter_partitioning_dims: int = 1,
         num_partitions: Sequence[int] = NUM_PARTITIONS) -> list[PlanRow]:
  """One row per num_partitions: the mesh and each model's per-device bytes."""
  rules = partitioning.standard_logical_axis_rules(parameter_partitioning_dims)
  draft_rules = partitioning.replicated_parameter_rules(rules)
  rows = []
  for model_size in num_partitions:
    try:
      mesh_shape = partitioning.mesh_shape_for(num_devices or model_size, model_size)
    except ValueError as e:
      rows.append(PlanRow(model_size, None, unavailable=str(e)))
      continue
    rows.append(PlanRow(
        model_size, mesh_shape, device_bytes(target, mesh_shape, rules, param_dtype),
        None if draft is None else device_bytes(draft, mesh_shape, draft_rules, param_dtype)))
  return rows


def layout_bytes(layout: decode_layout.DecodeLayout, batch_rows: int, input_length: int,
                 max_decode_len: int, param_dtype: Any = None
                 ) -> tuple[DeviceBytes, DeviceBytes | None]:
  """(target, draft or None) per-device bytes of a run's `decode_layout.DecodeLayout`: its mesh
  and rules, `batch_rows` = batch size x num_decodes, both models' floating parameters in
  `param_dtype` (None: float32). These are what each device holds after `layout.restore`
  (parameters) and in the decode loop (caches)."""
  mesh_shape = tuple(layout.mesh.shape[axis] for axis in partitioning.MESH_AXES)
  shapes = functools.partial(model_shapes, batch_rows=batch_rows, input_length=input_length,
                             max_decode_len=max_decode_len)
  target = device_bytes(shapes(layout.target), mesh_shape, layout.rules("target"), param_dtype)
  draft = (None if layout.draft is None else
           device_bytes(shapes(layout.draft), mesh_shape, layout.rules("draft"), param_dtype))
  return target, draft


def local_device_memory_bytes() -> int | None:
  """Memory of this process's first device as its runtime reports it (GPU, TPU), or None where
  it reports none (CPU)."""
  stats = jax.local_devices()[0].memory_stats()
  return (stats or {}).get("bytes_limit")


def check_fits(layout: decode_layout.DecodeLayout, batch_rows: int, input_length: int,
               target_length: int, param_dtype: Any, budget_gib: float | None) -> None:
  """`gin_utils.UsageError` when a run's per-device bytes (`layout_bytes`) exceed the budget
  (infer's DEVICE_MEMORY_GIB, or the device's own memory where its runtime reports it)."""
  budget = (local_device_memory_bytes() if budget_gib is None
            else int(budget_gib * 2**30))
  if budget is None:
    return
  target, draft = layout_bytes(layout, batch_rows, input_length, target_length, param_dtype)
  needed = target.total + (draft.total if draft is not None else 0)
  if needed > budget:
    draft_text = ("" if draft is None else
                  f", draft params {format_bytes(draft.params)} + cache "
                  f"{format_bytes(draft.cache)}")
    raise gin_utils.UsageError(
        f"num_partitions={layout.mesh.shape['model']} (mesh {dict(layout.mesh.shape)}) needs "
        f"{format_bytes(needed)} per device (target params "
        f"{format_bytes(target.params)} + cache {format_bytes(target.cache)}"
        f"{draft_text}; see python -m spec_decode.plan), more than the "
        f"{format_bytes(budget)} per device budget")


def largest_batch(fits: Callable[[int], bool], up_to: int, step: int = 1,
                  guess: int | None = None) -> int:
  """The largest multiple of `step` up to `up_to` for which `fits` holds, 0 where `step` does
  not fit. Assumes what a decode's memory does: it grows with the batch, so `fits` holds up to
  some batch and not beyond. Bisection: `fits` is asked ceil(log2(up_to // step)) + 2 times at
  most, `up_to` first (the answer where it fits, in one call). With a `guess` (e.g. from a
  linear model of the memory of two compiled batches), the search starts there instead:
  `guess` and its neighbour first, 2 calls where the guess is right, then steps doubling away
  from it until a batch on the other side brackets the answer, then bisection between them."""
  top = up_to // step
  if top < 1:
    return 0
  if guess is None:
    if fits(top * step):
      return top * step
    if top == 1 or not fits(step):
      return 0
    low, high = 1, top  # fits(low * step), not fits(high * step)
  else:
    start = min(max(guess // step, 1), top)
    if fits(start * step):
      low, high, distance = start, None, 1
      while high is None:  # gallop up
        if low == top:
          return top * step
        probe = min(low + distance, top)
        if fits(probe * step):
          low, distance = probe, distance * 2
        else:
          high = probe
    else:
      low, high, distance = None, start, 1
      while low is None:  # gallop down
        if high == 1:
          return 0
        probe = max(high - distance, 1)
        if fits(probe * step):
          low = probe
        else:
          high, distance = probe, distance * 2
  while high - low > 1:
    middle = (low + high) // 2
    if fits(middle * step):
      low = middle
    else:
      high = middle
  return low * step


# --------------------------------------------------------------------------- printing


def format_bytes(n: int) -> str:
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n} B"


def _describe(name: str, model: ModelShapes, param_dtype: Any) -> str:
  cfg = model.config
  count = sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(model.params))
  layers = (f"{cfg.num_layers} decoder-only layers" if network.is_decoder_only(cfg) else
            f"{cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers")
  return (f"{name}: {count / 1e9:.3f}B parameters (emb {cfg.emb_dim}, {layers}"
          f", {cfg.num_heads} heads x {cfg.head_dim}, mlp "
          f"{cfg.mlp_dim}, vocab {cfg.vocab_size}) in {jnp.dtype(param_dtype).name}; cache "
          f"{jnp.dtype(cfg.dtype).name}")


def format_plan(rows: Sequence[PlanRow], target: ModelShapes, draft: ModelShapes | None, *,
                param_dtype: Any, device_kind: str, batch_rows: int, input_length: int,
                max_decode_len: int) -> str:
  capacity = device_memory_bytes(device_kind)
  lines = [_describe("target", target, param_dtype)]
  if draft is not None:
    lines.append(_describe("draft ", draft, param_dtype) + "; replicated on every device")
  decoded = (f"decode length {max_decode_len} (prompt + continuation)"
             if network.is_decoder_only(target.config) else f"targets {max_decode_len}")
  lines.append(f"batch rows {batch_rows}, inputs {input_length}, {decoded}; "
               f"per device, {device_kind} = {format_bytes(capacity)}")
  header = ["P", "mesh", "target params", "target cache", "target total", "fits"]
  if draft is not None:
    header += ["draft params", "draft cache", "target+draft", "fits"]
  table = [header]
  notes = []

  def fits(n: int) -> str:
    return "yes" if n <= capacity else "NO"

  for row in rows:
    cells = [str(row.num_partitions)]
    if row.mesh_shape is None:
      notes.append(f"P={row.num_partitions}: {row.unavailable}")
      table.append(cells + ["-"] * (len(header) - 1))
      continue
    cells.append(f"{row.mesh_shape}")
    problems = row.target.problems + (row.draft.problems if row.draft is not None else ())
    if problems:
      # The draft's batch problem is the target's: name each (axis, size) once.
      unique = {(p.logical_axis, p.size, p.mesh_axes): p for p in problems}
      notes += [f"P={row.num_partitions}: {problem}" for problem in unique.values()]
      table.append(cells + ["indivisible"] + ["-"] * (len(header) - 3))
      continue
    cells += [format_bytes(row.target.params), format_bytes(row.target.cache),
              format_bytes(row.target.total), fits(row.target.total)]
    if row.draft is not None:
      total = row.target.total + row.draft.total
      cells += [format_bytes(row.draft.params), format_bytes(row.draft.cache),
                format_bytes(total), fits(total)]
    table.append(cells)
  widths = [max(len(r[i]) for r in table) for i in range(len(header))]
  lines += ["  ".join(cell.rjust(width) for cell, width in zip(r, widths)) for r in table]
  lines += notes
  lines.append("Not counted: activations, logits, small engine buffers, XLA temporaries.")
  return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(
      prog="python -m spec_decode.plan",
      description="Per-device memory of a sharded decode (see the module docstring).")
  gin_utils.add_gin_arguments(parser)
  parser.add_argument("--draft_gin_file", default=None,
                      help="model gin file of the draft (default: the config's draft_module)")
  parser.add_argument("--device_kind", default="tpu_v4", choices=DEVICE_KINDS)
  parser.add_argument("--num_devices", type=int, default=None,
                      help="devices in the mesh (default: P for each num_partitions P)")
  parser.add_argument("--batch_size", type=int, default=None, help="default: BATCH_SIZE")
  parser.add_argument("--input_length", type=int, default=None,
                      help="default: TASK_FEATURE_LENGTHS['inputs']")
  parser.add_argument("--target_length", type=int, default=None,
                      help="decode length; default: TASK_FEATURE_LENGTHS['targets']")
  parser.add_argument("--num_decodes", type=int, default=1)
  parser.add_argument("--param_dtype", default=None,
                      help="dtype of floating parameters (default: the target config's dtype)")
  parser.add_argument("--parameter_partitioning_dims", type=int, default=1, choices=(1, 2))
  parser.add_argument("--compile_for", default=None,
                      help="also compile the decode for this TPU topology (e.g. v4-8) and "
                           "print XLA's memory per device")
  parser.add_argument("--largest_batch_up_to", type=int, default=None,
                      help="with --compile_for: the largest batch size up to this whose decode "
                           "fits a chip's HBM by XLA's memory analysis (bisection)")
  args, bindings = gin_utils.parse_args(parser, argv)
  if not args.gin_file:
    parser.error("give --gin_file, e.g. --gin_file=configs/table2/spec_decode.gin "
                 "--gin_file=configs/table2/ende_small_t0.gin")
  if args.largest_batch_up_to is not None and (not args.compile_for
                                               or args.largest_batch_up_to < 1):
    parser.error("--largest_batch_up_to takes a positive batch size and needs --compile_for")
  return args, bindings


def _run(args: argparse.Namespace, bindings: list[str]) -> None:
  try:
    config = gin_utils.read_run_config(args.gin_file, bindings, args.draft_gin_file)
    sizes = {"batch size": args.batch_size or config.batch_size,
             "input length": args.input_length or config.input_length,
             "target length": args.target_length or config.target_length,
             "num_decodes": args.num_decodes, "num_devices": args.num_devices or 1}
    for name, value in sizes.items():
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (set it in the config or by its "
                         f"flag), got {value!r}")
    batch_rows = sizes["batch size"] * args.num_decodes
    max_decode_len = network.decode_length(config.target, sizes["input length"],
                                           sizes["target length"])
    shapes = functools.partial(model_shapes, batch_rows=batch_rows,
                               input_length=sizes["input length"],
                               max_decode_len=max_decode_len)
    param_dtype = jnp.dtype(args.param_dtype or config.target.dtype)
    target = shapes(config.target)
    draft = None if config.draft is None else shapes(config.draft)
    rows = plan(target, draft, param_dtype, args.num_devices, args.parameter_partitioning_dims)
  except (ValueError, FileNotFoundError, TypeError) as e:  # what the config or flags name
    raise gin_utils.UsageError(gin_utils.first_line(e)) from None
  print(format_plan(rows, target, draft, param_dtype=param_dtype, device_kind=args.device_kind,
                    batch_rows=batch_rows, input_length=sizes["input length"],
                    max_decode_len=max_decode_len))
  if args.compile_for:
    _print_compiled(args, bindings, rows)


def _print_compiled(args: argparse.Namespace, bindings: list[str],
                    rows: Sequence[PlanRow]) -> None:
  """XLA's per-device memory of the decode for each P the topology holds (`spec_decode.aot`),
  or with `--largest_batch_up_to` the largest batch that fits for each."""
  from spec_decode.aot import programs  # pylint: disable=g-import-not-at-top  (imports plan)
  from spec_decode.aot import placement  # pylint: disable=g-import-not-at-top
  from spec_decode.aot import runs  # pylint: disable=g-import-not-at-top
  from spec_decode.aot import topologies  # pylint: disable=g-import-not-at-top
  try:
    topology = topologies.topology(args.compile_for)
    devices = topology.devices()
  except ValueError as e:
    raise gin_utils.UsageError(gin_utils.first_line(e)) from None
  hbm = topology.chip.hbm_bytes

  def read(row: PlanRow, batch_size: int | None) -> runs.Run:
    aot_args = argparse.Namespace(
        gin_file=args.gin_file, draft_gin_file=args.draft_gin_file,
        num_partitions=row.num_partitions, batch_size=batch_size,
        input_length=args.input_length, target_length=args.target_length)
    return runs.read_run(aot_args, bindings, devices[:math.prod(row.mesh_shape)])

  def attempt(row: PlanRow, batch_size: int | None) -> programs.Program | str:
    """The decode compiled for P = row.num_partitions, or XLA:TPU's refusal to compile one
    whose temporaries its HBM cannot hold."""
    run = read(row, batch_size)
    return runs.decode_program(
        run, lambda message: print(f"P={row.num_partitions} batch {run.batch_size}: {message}",
                                   file=sys.stderr, flush=True))

  def describe(program: programs.Program | str) -> str:
    if isinstance(program, str):
      return f"not compiled, XLA: {program}"
    return (f"arguments {format_bytes(program.argument_bytes)}, temporaries "
            f"{format_bytes(program.temp_bytes)}, code {format_bytes(program.code_bytes)}: "
            f"{format_bytes(program.device_bytes)}")

  def fits_hbm(program: programs.Program | str) -> bool:
    return not isinstance(program, str) and program.device_bytes <= hbm

  def placed(row: PlanRow) -> list[str]:
    """Where a target split over several chips leaves the draft: its call replicated and
    sharded, priced (`placement.draft_placements`), and the placement to use."""
    run = read(row, args.batch_size)
    if run.layout.draft is None or run.layout.mesh.shape["model"] == 1:
      return []
    calls = placement.draft_placement_calls(
        run.layout, batch_rows=run.batch_size * run.model.num_decodes,
        input_length=run.input_length, max_decode_len=run.decode_length,
        param_dtype=run.checkpoint_dtype)
    return [f"P={row.num_partitions} {line.strip()}" for line in
            placement.format_draft_placements(placement.draft_placements(calls, topology.chip))]

  print(f"compiled by XLA for {topology.name} ({topology.chip.kind}), per device, not run:")
  for row in rows:
    if row.mesh_shape is None or math.prod(row.mesh_shape) > len(devices):
      continue
    tried: dict[int, programs.Program | str] = {}

    def fits(batch_size: int, row: PlanRow = row) -> bool:
      tried[batch_size] = attempt(row, batch_size)
      return fits_hbm(tried[batch_size])

    try:
      if args.largest_batch_up_to is None:
        program = attempt(row, args.batch_size)
        print(f"P={row.num_partitions}: {describe(program)} (fits {format_bytes(hbm)}: "
              f"{'yes' if fits_hbm(program) else 'NO'})")
        for line in placed(row):
          print(line)
        continue
      found = largest_batch(fits, args.largest_batch_up_to, step=row.mesh_shape[0])
    except ValueError as e:
      print(f"P={row.num_partitions}: not compiled: {gin_utils.first_line(e)}")
      continue
    larger = min((b for b in tried if b > found), default=None)
    text = (f"P={row.num_partitions}: largest batch up to {args.largest_batch_up_to} that fits "
            f"{format_bytes(hbm)}: {found or 'none'}")
    if found:
      text += f" ({describe(tried[found])})"
    if larger is not None:
      text += f"; batch {larger}: {describe(tried[larger])}"
    print(f"{text}; {len(tried)} batches tried")


def main(argv: Sequence[str] | None = None) -> int:
  args, bindings = _parse_args(sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.plan", lambda: _run(args, bindings))


if __name__ == "__main__":
  sys.exit(main())
