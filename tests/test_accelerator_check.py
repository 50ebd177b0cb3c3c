"""`scripts/accelerator_check.sh OUTDIR --dry_run` end to end, and the pieces of its driver
(`scripts/accelerator_check.py`) a dry run on CPU cannot reach: wheels unpacked where a module
is missing, a part killed at its limit, pytest outcomes read from a log."""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHELL_SCRIPT = ROOT / "scripts" / "accelerator_check.sh"


def _load_driver():
  spec = importlib.util.spec_from_file_location("accelerator_check",
                                                ROOT / "scripts" / "accelerator_check.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


check = _load_driver()
PART_NAMES = [part.name for part in check.PARTS]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  outdir = tmp_path_factory.mktemp("accelerator_check")
  environment = dict(os.environ, PYTHON=sys.executable)
  completed = subprocess.run([str(SHELL_SCRIPT), str(outdir), "--dry_run"], cwd="/",
                             env=environment, capture_output=True, text=True, timeout=400)
  return outdir, completed


@pytest.mark.slow
def test_dry_run_runs_every_part_and_summarizes_it(dry_run):
  outdir, completed = dry_run
  assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
  summary = json.loads((outdir / check.SUMMARY_JSON).read_text())
  markdown = (outdir / check.SUMMARY_MD).read_text()
  assert summary["dry_run"] and "DRY RUN" in markdown
  assert list(summary["parts"]) == PART_NAMES
  for name, part in summary["parts"].items():
    assert part["status"] == "passed", (name, part)
    assert re.search(rf"^\| {name} \| passed \| [0-9.]+ \|", markdown, re.MULTILINE), name
    assert (outdir / part["log"]).is_file(), name
  assert summary["seconds"] < check.TOTAL_BUDGET_S

  environment = json.loads((outdir / check.ENVIRONMENT_JSON).read_text())
  assert environment["backend"] == "cpu" and environment["device_count"] >= 1
  assert environment["versions"]["gin-config"]

  parts = summary["parts"]
  # Tests: run, read back from pytest's output, none failed; the exactness test at the
  # reduced count it was given.
  for name in ("tests_identity_parity", "tests_exactness", "tests_highest_precision"):
    assert parts[name]["counts"].get("passed", 0) == len(parts[name]["selection"]), name
    assert not parts[name]["failed_tests"], name
  assert parts["tests_exactness"]["environment_variables"] == {
      "SPEC_DECODE_EXACTNESS_SAMPLES": check.DRY_RUN_EXACTNESS_SAMPLES}
  assert parts["tests_highest_precision"]["environment_variables"] == {
      "JAX_DEFAULT_MATMUL_PRECISION": "highest"}

  # Benchmark parts: their own reports, and the key numbers in the summary.
  for name in check.BENCH_PARTS:
    assert (outdir / name / "bench.json").is_file() and (outdir / name / "bench.md").is_file()
    assert parts[name]["errors"] == [], name
  dtypes = {}
  for name in ("verify_cost_float32", "verify_cost_bfloat16"):
    report = json.loads((outdir / name / "bench.json").read_text())
    (model, _) = report["suites"]["verify_cost"]["models"]
    dtypes[name] = model["weight_bytes_per_step"]
    for entry in parts[name]["numbers"]["verify_cost"]["models"]:
      assert entry["v"]["1"] == 1.0 and entry["v"]["2"] > 0, (name, entry)
  # bfloat16 weights are read as bfloat16: half the bytes of the float32 run's.
  assert dtypes["verify_cost_bfloat16"] * 2 == dtypes["verify_cost_float32"]

  pair = parts["pair_large_float32"]["numbers"]
  assert [g["batch_size"] for g in pair["own_baseline"]] == [1, 8]
  assert all(g["temperature"] == 0 and g["speedup"] > 0 and g["measured_over_predicted"] > 0
             for g in pair["own_baseline"])
  assert pair["peer"]["torch_device"] == "cpu"
  (peer,) = pair["peer"]["temperatures"]
  # Greedy: ours speculative and both of Hugging Face's decode our baseline's tokens.
  assert set(peer["greedy_identical_to_ours_baseline"].values()) == {"1/1"}
  assert [t["fraction_of_copy_bandwidth"] > 0 for t in pair["physical_limit"]["targets"]] == [True]

  simulated = parts["simulated_table2_xxl_bfloat16"]["numbers"]
  (row,) = simulated["simulated_table2"]
  assert row["label"].startswith("SIMULATED") and row["measured_over_predicted"] > 0
  assert len(simulated["physical_limit"]["targets"]) == 1
  for heading in ("## verify_cost_float32", "## verify_cost_bfloat16", "## pair_large_float32",
                  "## simulated_table2_xxl_bfloat16", "Hugging Face on cpu", "v(8)"):
    assert heading in markdown, heading


def test_shell_header_states_each_parts_times():
  """The header's table is what the driver runs: every part, its expected time and limit."""
  header = SHELL_SCRIPT.read_text()
  for part in check.PARTS:
    assert re.search(rf"^#\s+{part.name}\s+{part.expected_s} s /\s+{part.timeout_s} s\s",
                     header, re.MULTILINE), part.name
  # The total the driver enforces stays under 8 minutes, every estimate within its limit, and
  # every part fits that total beside the environment part (a run selects what fits).
  assert check.TOTAL_BUDGET_S < 8 * 60
  assert all(part.expected_s < part.timeout_s for part in check.PARTS)
  environment = next(part for part in check.PARTS if part.name == "environment")
  assert all(part.expected_s + environment.expected_s < check.TOTAL_BUDGET_S
             for part in check.PARTS)


def test_a_selection_over_the_budget_is_refused_in_one_line(capsys):
  with pytest.raises(SystemExit):
    check.main(["unused_outdir", "--parts", "tests_identity_parity,tests_exactness"])
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert "over the 470 s budget: choose fewer with --parts" in error
  with pytest.raises(SystemExit):
    check.main(["unused_outdir", "--parts", "no_such_part"])
  assert "unknown parts ['no_such_part']" in capsys.readouterr().err


def test_missing_modules_are_unpacked_from_their_wheels(tmp_path, monkeypatch):
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  with zipfile.ZipFile(wheels / "fake_dist-1.0-py3-none-any.whl", "w") as archive:
    archive.writestr("spec_decode_fake_module/__init__.py", "VALUE = 7\n")
  monkeypatch.setattr(check, "WHEELS", (("spec_decode_fake_module", "fake-dist"),
                                        ("gin", "gin-config"),
                                        ("spec_decode_absent_module", "absent-dist")))
  monkeypatch.setattr(check, "EXPECTED", ("numpy", "spec_decode_expected_module"))
  site = tmp_path / "site"
  result = check.install_missing(wheels, site)
  assert result["installed"] == ["fake_dist-1.0-py3-none-any.whl"]
  assert result["present"] == ["gin-config"]  # importable here: left alone
  assert result["no_wheel"] == ["absent-dist"]
  assert result["expected_missing"] == ["spec_decode_expected_module"]
  imported = subprocess.run([sys.executable, "-c", "import spec_decode_fake_module as m; "
                             "print(m.VALUE)"], env=dict(os.environ, PYTHONPATH=str(site)),
                            capture_output=True, text=True)
  assert imported.stdout.strip() == "7"


def test_a_part_past_its_limit_is_killed_with_its_children(tmp_path):
  marker = tmp_path / "child_survived"
  # A parent that starts a child, as the bench starts its Hugging Face worker.
  script = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            f"\"import time; time.sleep(3); open({str(marker)!r}, 'w')\"]); time.sleep(30)")
  start = time.monotonic()
  run = check.run_command([sys.executable, "-c", script], tmp_path / "part.log", 1.0,
                          dict(os.environ))
  assert run["timed_out"] and time.monotonic() - start < 10
  time.sleep(4)
  assert not marker.exists()


def test_pytest_outcomes_are_read_from_its_verbose_lines():
  log = ("tests/a.py::test_x[p-1] PASSED      [ 33%]\n"
         "tests/a.py::test_y FAILED           [ 66%]\n"
         "tests/b.py::test_z SKIPPED (no GPU) [100%]\n"
         "SKIPPED [1] tests/b.py:3: no GPU\n")
  assert check.pytest_outcomes(log) == {"passed": ["tests/a.py::test_x[p-1]"],
                                        "failed": ["tests/a.py::test_y"],
                                        "skipped": ["tests/b.py::test_z"]}


@pytest.mark.parametrize("log,run,status", [
    ("tests/a.py::test_x PASSED\n", {"timed_out": False, "returncode": 0}, "passed"),
    ("tests/a.py::test_x PASSED\n", {"timed_out": True, "returncode": -9}, "timeout"),
    # pytest's own error (e.g. a missing module) before any test ran: not a pass.
    ("ImportError while loading conftest\n", {"timed_out": False, "returncode": 4}, "failed"),
    ("tests/a.py::test_x ERROR\n", {"timed_out": False, "returncode": 1}, "failed"),
])
def test_a_test_part_passes_only_when_tests_ran_and_none_failed(tmp_path, log, run, status):
  (tmp_path / "part.log").write_text(log)
  assert check._pytest_result(run, tmp_path / "part.log")["status"] == status


def test_accelerator_configs_bind_what_the_parts_promise(tmp_path):
  """What the accelerator runs (no dry run) is never run here: its configs are parsed and
  bound as `python -m spec_decode.bench` would, and checked against each part's promise."""
  import argparse

  import gin

  from spec_decode import bench, gin_utils

  bound = {}
  for name in check.BENCH_PARTS:
    command = check.bench_command(name, tmp_path / name, False, sys.executable)
    assert command[1:3] == ["-m", "spec_decode.bench"]
    parser = argparse.ArgumentParser()
    gin_utils.add_gin_arguments(parser)
    parser.add_argument("--output_dir")
    args, bindings = gin_utils.parse_args(parser, command[3:])
    assert check.DRY_RUN_GIN not in args.gin_file
    gin_utils.parse_config(args.gin_file, bindings)
    classes = (bench.BenchConfig, bench.PairConfig, bench.OwnBaselineConfig, bench.PeerConfig,
               bench.SimulatedTable2Config, bench.PhysicalLimitConfig, bench.VerifyCostConfig)
    gin_utils.check_bindings_take_effect(classes)
    bound[name] = {cls.__name__: gin_utils.configured(cls)() for cls in classes}
  gin.clear_config()

  for name, dtype in (("verify_cost_float32", "float32"), ("verify_cost_bfloat16", "bfloat16")):
    config = bound[name]
    assert config["BenchConfig"].suites == ["verify_cost"]
    assert config["BenchConfig"].compiler_options == {}  # measured as compiled for real
    cost = config["VerifyCostConfig"]
    assert [g.rsplit("/", 1)[1] for g in cost.model_gins] == ["large.gin", "xl.gin"]
    assert dict(cost.overrides) == {"dtype": dtype}
    assert list(cost.num_tokens) == list(range(1, 9))

  pair = bound["pair_large_float32"]
  assert set(pair["BenchConfig"].suites) == {"own_baseline", "peer", "physical_limit"}
  assert pair["PairConfig"].source == "near_bigram"
  assert pair["PairConfig"].target_gin.endswith("t5_1_1/large.gin")
  assert dict(pair["PairConfig"].target_overrides) == {"dtype": "float32"}
  assert list(pair["OwnBaselineConfig"].batch_sizes) == [1, 8]
  assert list(pair["OwnBaselineConfig"].temperatures) == [0.0]
  assert pair["PeerConfig"].torch_device == "auto"
  assert list(pair["PhysicalLimitConfig"].targets) == ["pair"]

  simulated = bound["simulated_table2_xxl_bfloat16"]
  assert set(simulated["BenchConfig"].suites) == {"simulated_table2", "physical_limit"}
  table2 = simulated["SimulatedTable2Config"]
  assert table2.target_gin.endswith("t5_1_1/xxl.gin") and not table2.target_overrides
  assert table2.rows and all(row in bench.paper.TABLE2 for row in table2.rows)
  assert list(simulated["PhysicalLimitConfig"].targets) == ["simulated"]
  for test in check.IDENTITY_TESTS + check.EXACTNESS_TESTS + (check.SHARDING_TESTS,):
    assert (ROOT / test).exists(), test


def test_parts_not_selected_are_recorded_and_not_run(tmp_path):
  selection = check.Check(tmp_path, True, sys.executable, ("tests_highest_precision",), 25)
  results = selection.run_all()
  assert results["environment"]["status"] == "passed"
  # Nothing failed before it, so the one selected part has nothing to rerun.
  assert results["tests_highest_precision"]["status"] == "not needed"
  assert results["tests_highest_precision"]["timeout_s"] == 25
  skipped = {name for name, entry in results.items() if entry["status"] == "not selected"}
  assert skipped == {part.name for part in check.PARTS} - {"environment",
                                                           "tests_highest_precision"}
  assert not any((tmp_path / f"{name}.log").exists() for name in skipped)
