"""The command: read a run config as `spec_decode.infer` would (nothing restored), lay it out on
a topology's devices, compile its programs, print the report (see the package docstring)."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from spec_decode import gin_utils
from spec_decode.infer import cli as infer_cli
from spec_decode import plan
from spec_decode.aot import placement
from spec_decode.aot import programs
from spec_decode.aot import report
from spec_decode.aot import runs
from spec_decode.aot import topologies
from spec_decode.bench import paper

PROGRAMS = ("decode", "baseline", "target_calls", "draft_call", "draft_placement")


def compile_run(run: runs.Run, wanted: Sequence[str], call_tokens: Sequence[int],
                progress: Any, jobs: int = 1) -> dict[str, Any]:
  """Every program asked for: {'decode': Program, 'baseline': Program, 'target_calls':
  {k: Program}, 'draft_call': Program, 'draft_placement': {placement: Program}}, each present
  when compiled ('draft_placement' where the mesh splits the target over several devices);
  `jobs` compile at once (XLA compiles a program on one core)."""
  model, layout = run.model, run.layout
  sizes = dict(batch_size=run.batch_size, input_length=run.input_length,
               target_length=run.target_length, param_dtype=run.checkpoint_dtype,
               eos_id=runs.EOS_ID, num_decodes=model.num_decodes, progress=progress)
  rows = dict(batch_rows=run.batch_size * model.num_decodes, input_length=run.input_length,
              max_decode_len=run.decode_length, progress=progress)
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    pending: dict[str, Any] = {}
    if "decode" in wanted:
      name = "speculative decode" if model.is_speculative else "decode"
      pending["decode"] = pool.submit(programs.predict_program, layout, model.decoder,
                                      name=name, **sizes)
    if "baseline" in wanted and model.is_speculative:
      pending["baseline"] = pool.submit(programs.predict_program, layout,
                                        model.decoder.baseline(),
                                        name="baseline (target alone)", **sizes)
    if "target_calls" in wanted:
      pending["target_calls"] = {
          k: pool.submit(programs.call_program, layout, "target", num_tokens=k,
                         param_dtype=run.checkpoint_dtype, **rows) for k in call_tokens}
    if "draft_call" in wanted and layout.draft is not None:
      pending["draft_call"] = pool.submit(programs.call_program, layout, "draft",
                                          num_tokens=1, param_dtype=run.checkpoint_dtype,
                                          **rows)
    if ("draft_placement" in wanted and layout.draft is not None
        and layout.mesh.shape["model"] > 1):
      pending["draft_placement"] = pool.submit(
          placement.draft_placement_calls, layout, param_dtype=run.checkpoint_dtype, **rows)
    return {name: ({k: future.result() for k, future in value.items()}
                   if isinstance(value, dict) else value.result())
            for name, value in pending.items()}


def _report(args: argparse.Namespace, topology: topologies.Topology, run: runs.Run,
            compiled: dict[str, Any], seconds: float) -> dict[str, Any]:
  model, layout, chip = run.model, run.layout, topology.chip
  settings = model.decode_settings
  gamma = settings.get("gamma")
  row = paper.TABLE2.get(run.row_name)
  alpha = args.alpha if args.alpha is not None else (row.alpha if row else None)
  batch_rows = run.batch_size * model.num_decodes
  target, draft = plan.layout_bytes(layout, batch_rows, run.input_length, run.decode_length,
                                    run.checkpoint_dtype)
  whole = [compiled[name] for name in ("decode", "baseline") if name in compiled]
  plans = {}
  if "decode" in compiled:
    plans[compiled["decode"].name] = report.compare_with_plan(
        compiled["decode"], target, draft if model.is_speculative else None, chip)
  if "baseline" in compiled:
    plans[compiled["baseline"].name] = report.compare_with_plan(compiled["baseline"], target,
                                                                None, chip)
  lines = [
      f"{' '.join(args.gin_file)} on {topology.name} ({topology.libtpu_name}: "
      f"{topology.num_chips} x {chip.kind}, {topology.num_hosts} host"
      f"{'s' if topology.num_hosts > 1 else ''}), mesh {dict(layout.mesh.shape)}, platform "
      f"{layout.platform.name}",
      f"decode loop {model.decoder.loop_name} {settings}; batch {run.batch_size} x "
      f"{model.num_decodes} decodes, inputs {run.input_length}, targets {run.target_length}; "
      f"target params {jnp.dtype(run.checkpoint_dtype or layout.target.dtype).name}",
      f"Compiled by XLA for {chip.kind} on this host in {seconds:.0f} s, not run: figures per "
      f"device; 'XLA' is XLA's cost model and 'roofline' a bound from the chip's published "
      f"peaks ({chip.bf16_flops_per_second / 1e12:.0f} TFLOP/s bf16, "
      f"{chip.hbm_bytes_per_second / 1e9:.0f} GB/s, {chip.hbm_bytes / 2**30:.0f} GiB HBM)."]
  lines += report.format_programs(whole + list(compiled.get("target_calls", {}).values())
                                  + ([compiled["draft_call"]] if "draft_call" in compiled
                                     else [])
                                  + [p for p in compiled.get("draft_placement", {}).values()
                                     if not isinstance(p, str)], plans)
  for program in whole:
    lines.append(report.format_collectives(program))
    lines.append(report.format_relaid(program))
    lines.append(report.format_relaid_state(program))
    foreign = [name for name in program.custom_calls if name.startswith("spec_decode")]
    if foreign:
      lines.append(f"{program.name}: holds the CPU custom calls {foreign}")
  if "decode" in compiled and "baseline" in compiled:
    lines.append(report.format_temporaries_bound(plans[compiled["decode"].name],
                                                 plans[compiled["baseline"].name]))
  found = []
  if compiled.get("target_calls") or "draft_call" in compiled:
    lines += report.format_calls(compiled.get("target_calls", {}), compiled.get("draft_call"),
                                 chip)
  if compiled.get("target_calls"):
    found = report.estimates(compiled["target_calls"], compiled.get("draft_call"), chip,
                             alpha if model.is_speculative else None, gamma)
    lines += report.format_estimates(found, alpha, gamma, row.speedup if row else None)
  placements = []
  if "draft_placement" in compiled:
    placements = placement.draft_placements(compiled["draft_placement"], chip,
                                         args.collective_latency)
    lines += placement.format_draft_placements(placements)
  print("\n".join(lines))
  return {
      "gin_files": list(args.gin_file), "topology": topology.name,
      "libtpu_topology": topology.libtpu_name, "chip": dataclasses.asdict(chip),
      "num_hosts": topology.num_hosts, "mesh": dict(layout.mesh.shape),
      "decode_loop": model.decoder.loop_name, "decode_settings": settings,
      "batch_size": run.batch_size, "num_decodes": model.num_decodes,
      "input_length": run.input_length, "target_length": run.target_length,
      "table2_row": run.row_name if row else None, "alpha": alpha,
      "paper_speedup": row.speedup if row else None, "seconds": seconds,
      "programs": [report.as_json(p) for p in whole],
      "plan": {name: {**dataclasses.asdict(c), "fits": c.fits} for name, c in plans.items()},
      "target_calls": {k: report.as_json(p)
                       for k, p in compiled.get("target_calls", {}).items()},
      "draft_call": (report.as_json(compiled["draft_call"]) if "draft_call" in compiled
                     else None),
      "estimates": [dataclasses.asdict(e) for e in found],
      "draft_placement": {name: p if isinstance(p, str) else report.as_json(p)
                          for name, p in compiled.get("draft_placement", {}).items()},
      "draft_placements": [{**dataclasses.asdict(p), "seconds": p.seconds}
                           for p in placements]}


def _parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(
      prog="python -m spec_decode.aot",
      description="A run config's decode compiled for a TPU topology from this host (see the "
                  "spec_decode.aot docstring).")
  gin_utils.add_gin_arguments(parser, infer_cli.DEFAULT_GIN_FILE)
  parser.add_argument("--topology", default="v4-8",
                      help=f"a Cloud TPU name ({', '.join(topologies.NAMED)}) or libtpu's "
                           "<generation>:<chips per axis>, e.g. v4:1x1x1 (one v4 chip); "
                           "default v4-8")
  parser.add_argument("--num_partitions", type=int, default=None,
                      help="the mesh's 'model' axis (default: the config's partitioner)")
  parser.add_argument("--draft_gin_file", default=None,
                      help="model gin file of the draft (default: the config's draft, else "
                           "the config DRAFT_CHECKPOINT_PATH's checkpoint holds)")
  parser.add_argument("--batch_size", type=int, default=None, help="default: BATCH_SIZE")
  parser.add_argument("--input_length", type=int, default=None)
  parser.add_argument("--target_length", type=int, default=None)
  parser.add_argument("--programs", default=",".join(PROGRAMS),
                      help=f"which to compile, of {', '.join(PROGRAMS)}")
  parser.add_argument("--call_tokens", default="1,2,3,4,5,6,7,8",
                      help="fed tokens k of the target calls compiled alone")
  parser.add_argument("--alpha", type=float, default=None,
                      help="alpha for Theorem 3.8 (default: the paper's, for a Table 2 row)")
  parser.add_argument("--collective_latency", type=float, default=placement.COLLECTIVE_LATENCY,
                      help="seconds assumed for one collective of a draft call, to price the "
                           "sharded draft against the replicated one (default "
                           f"{placement.COLLECTIVE_LATENCY:g}, an assumption)")
  parser.add_argument("--output_json", default=None, help="also write the figures here")
  parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                      help="programs compiled at once (default: 2, or this host's cores)")
  args, bindings = gin_utils.parse_args(parser, argv)
  args.gin_file = args.gin_file or [infer_cli.DEFAULT_GIN_FILE]
  return args, bindings


def _run(args: argparse.Namespace, bindings: list[str]) -> None:
  start = time.perf_counter()
  try:
    wanted = [name for name in args.programs.split(",") if name]
    unknown = sorted(set(wanted) - set(PROGRAMS))
    if unknown:
      raise ValueError(f"--programs takes {', '.join(PROGRAMS)}, got {', '.join(unknown)}")
    if args.collective_latency < 0:
      raise ValueError(f"--collective_latency is seconds >= 0, got {args.collective_latency}")
    call_tokens = sorted({int(k) for k in args.call_tokens.split(",") if k})
    if "target_calls" in wanted and (not call_tokens or call_tokens[0] < 1
                                     or 1 not in call_tokens):
      raise ValueError(f"--call_tokens needs 1 (v(k) is relative to it), got {args.call_tokens}")
    topology = topologies.topology(args.topology)
    devices = topology.devices()
    run = runs.read_run(args, bindings, devices)
  except (ValueError, FileNotFoundError, TypeError) as e:  # what the config or flags name
    raise gin_utils.UsageError(gin_utils.first_line(e)) from None

  def progress(message: str) -> None:
    print(f"[{time.perf_counter() - start:6.0f} s] {message}", file=sys.stderr, flush=True)

  compiled = compile_run(run, wanted, call_tokens, progress, max(1, args.jobs))
  figures = _report(args, topology, run, compiled, time.perf_counter() - start)
  if args.output_json:
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w", encoding="utf-8") as out:
      json.dump(figures, out, indent=1, default=str)


def main(argv: Sequence[str] | None = None) -> int:
  args, bindings = _parse_args(sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.aot", lambda: _run(args, bindings))
