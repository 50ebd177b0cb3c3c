"""`python -m spec_decode.bench`: how fast speculative decoding is, and against what.

Run: `python -m spec_decode.bench [--gin_file=FILE ...] [--gin.NAME=VALUE ...] [--smoke]
[--suites=own_baseline,engine_cost,peer,simulated_table2,physical_limit,verify_cost] [--output_dir=DIR]`.
Without --gin_file it reads `configs/bench/default.gin`; `--smoke` adds
`configs/bench/smoke.gin` (tiny random models, one repetition);
`--gin_file=configs/bench/smoke_decoder_only.gin` is the same with decoder-only language
models. Bindings name the configs as the package exports them, e.g.
`--gin.bench.PairConfig.gamma=4`. It
writes `DIR/bench.json` (every number, the machine and the operative gin config) and
`DIR/bench.md` (the same as markdown tables), and prints the tables.

`run_suites(BenchConfig)` runs the selected suites (`bench.suites`) on one shared `Workspace`
with the gin-bound configs and returns the report (`bench.report`), thresholds included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

import gin

from spec_decode import gin_utils
from spec_decode.runtime import partitioning
from spec_decode.bench.config import (SUITES, BenchConfig, EngineCostConfig,
                                      OwnBaselineConfig, PairConfig, PeerConfig,
                                      PhysicalLimitConfig, SimulatedTable2Config,
                                      VerifyCostConfig)
from spec_decode.bench.thresholds import thresholds
from spec_decode.bench.machine import describe_machine
from spec_decode.bench.report import JSON_FILE, MARKDOWN_FILE, plain, write_report
from spec_decode.bench.suites.engine_cost import engine_cost_suite
from spec_decode.bench.suites.own_baseline import own_baseline_suite
from spec_decode.bench.suites.peer import peer_suite
from spec_decode.bench.suites.physical_limit import physical_limit_suite
from spec_decode.bench.suites.simulated_table2 import simulated_table2_suite
from spec_decode.bench.suites.verify_cost import verify_cost_suite
from spec_decode.bench.workspace import Workspace

DEFAULT_GIN_FILE = "configs/bench/default.gin"
SMOKE_GIN_FILE = "configs/bench/smoke.gin"


def _bound(config_class: type) -> Any:
  """An instance of a config dataclass with the bindings in force (its defaults if no config
  binds it)."""
  return gin_utils.configured(config_class)()


def run_suites(bench_config: BenchConfig) -> dict[str, Any]:
  """Runs the selected suites with the gin-bound configs and returns the report."""
  unknown = [suite for suite in bench_config.suites if suite not in SUITES]
  if unknown:
    raise ValueError(f"unknown suites {unknown}; choose from {list(SUITES)}")
  os.makedirs(bench_config.output_dir, exist_ok=True)
  partitioner = partitioning.PjitPartitioner(mesh_shape=(1, bench_config.num_partitions))
  simulated_config = _bound(SimulatedTable2Config)
  workspace = Workspace(_bound(PairConfig), simulated_config, bench_config.compiler_options,
                        partitioner)
  report: dict[str, Any] = {"machine": describe_machine(),
                            "compiler_options": dict(bench_config.compiler_options),
                            "mesh": dict(partitioner.mesh.shape),
                            "suites": {}, "timings_s": {}}
  runners = {
      "own_baseline": lambda: own_baseline_suite(workspace, _bound(OwnBaselineConfig)),
      "engine_cost": lambda: engine_cost_suite(workspace, _bound(EngineCostConfig)),
      "peer": lambda: peer_suite(workspace, _bound(PeerConfig), bench_config.output_dir),
      "simulated_table2": lambda: simulated_table2_suite(workspace, simulated_config),
      "physical_limit": lambda: physical_limit_suite(workspace, _bound(PhysicalLimitConfig)),
      "verify_cost": lambda: verify_cost_suite(workspace, _bound(VerifyCostConfig)),
  }
  for suite in SUITES:
    if suite in bench_config.suites:
      start = time.perf_counter()
      # On stderr as each suite starts and ends: a run killed at a time limit says where it was.
      print(f"[bench] {suite}: started", file=sys.stderr, flush=True)
      report["suites"][suite] = plain(runners[suite]())
      report["timings_s"][suite] = time.perf_counter() - start
      print(f"[bench] {suite}: done in {report['timings_s'][suite]:.0f} s", file=sys.stderr,
            flush=True)
  report["thresholds"] = thresholds(report["suites"])
  report["gin_config"] = gin.config_str()
  return report


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m spec_decode.bench",
                                   description=__doc__.split("\n", 1)[0])
  gin_utils.add_gin_arguments(parser, DEFAULT_GIN_FILE)
  parser.add_argument("--smoke", action="store_true",
                      help=f"add {SMOKE_GIN_FILE}: tiny models, one repetition")
  parser.add_argument("--suites", help=f"comma-separated subset of {','.join(SUITES)}")
  parser.add_argument("--output_dir", help="where bench.json and bench.md go")
  args, bindings = gin_utils.parse_args(parser, sys.argv[1:] if argv is None else argv)

  def run() -> None:
    gin_files = list(args.gin_file or [DEFAULT_GIN_FILE])
    if args.smoke:
      gin_files.append(SMOKE_GIN_FILE)
    if args.suites:
      bindings.append(f"bench.BenchConfig.suites = {args.suites.split(',')!r}")
    if args.output_dir:
      bindings.append(f"bench.BenchConfig.output_dir = {args.output_dir!r}")
    gin_utils.parse_config(gin_files, bindings, args.gin_search_paths)
    gin_utils.check_bindings_take_effect([BenchConfig, PairConfig, OwnBaselineConfig,
                                          EngineCostConfig, PeerConfig,
                                          SimulatedTable2Config, PhysicalLimitConfig,
                                          VerifyCostConfig])
    bench_config = _bound(BenchConfig)
    try:
      report = run_suites(bench_config)
    except ValueError as e:  # e.g. an unknown suite, more partitions than devices
      raise gin_utils.UsageError(gin_utils.first_line(e)) from None
    print(write_report(report, bench_config.output_dir))
    print(f"\nwrote {os.path.join(bench_config.output_dir, JSON_FILE)} and {MARKDOWN_FILE}")

  return gin_utils.run("spec_decode.bench", run)
