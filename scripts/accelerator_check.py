"""The accelerator check: `scripts/accelerator_check.sh OUTDIR [--dry_run]` runs this.

What a few lent minutes on an accelerator should answer, on whatever device JAX sees, each part
in a process of its own with its own time limit, every result under OUTDIR, a failing part
recorded and the rest still run (see PARTS for what each part runs and its times). Random
weights throughout: nothing is downloaded there (no network), and the pure-Python packages the
accelerator lacks are installed from wheels brought along in the working tree
(`scripts/accelerator_wheels.sh` downloads them here; `install_missing`).

OUTDIR gets `summary.md` and `summary.json` (every part: status, seconds, its limit, its log,
its key numbers or why there are none), `environment.json`, and per part `<part>.log` plus, for
the benchmark parts, `<part>/bench.{json,md}` (`python -m spec_decode.bench`'s report).

`--dry_run`: the same parts on this CPU with tiny models
(configs/bench/accelerator_check/dry_run.gin), a few tests and a reduced
exactness sample count: checks the program end to end (tests/test_accelerator_check.py), so
the first minute on an accelerator is not spent on a typo. Its numbers mean nothing.

`--wheel_requirements`: prints `distribution==version` for the wheels to bring, at the versions
this interpreter has (what accelerator_wheels.sh downloads).

Exit status: 0 when every part passed (or was not needed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any, Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
GIN_DIR = "configs/bench/accelerator_check"
DRY_RUN_GIN = f"{GIN_DIR}/dry_run.gin"
WHEEL_DIR = ROOT / "build" / "accelerator_wheels"
SUMMARY_MD, SUMMARY_JSON, ENVIRONMENT_JSON = "summary.md", "summary.json", "environment.json"

# Everything together stays under 8 minutes on the accelerator: each part's limit is also cut
# to what is left of this, and a part with under MIN_PART_S left is not started.
TOTAL_BUDGET_S = 470
MIN_PART_S = 15

# (module, distribution): what the parts import beyond the accelerator's own stack (JAX, flax,
# numpy, scipy, torch, transformers, tensorstore, sentencepiece), brought as wheels and
# installed only where missing: gin-config and pytest with its dependencies are pure Python;
# msgpack and safetensors are binary (CPython 3.12, manylinux x86-64), flax's and transformers'
# own dependencies, brought in case an install lacks them.
WHEELS = (("gin", "gin-config"), ("absl", "absl-py"), ("msgpack", "msgpack"),
          ("safetensors", "safetensors"), ("pytest", "pytest"), ("iniconfig", "iniconfig"),
          ("pluggy", "pluggy"), ("packaging", "packaging"), ("pygments", "pygments"))
# Expected there and not brought (too large, or binary builds tied to the device's stack):
# reported when missing, the parts that need them then fail saying so.
EXPECTED = ("jax", "flax", "numpy", "scipy", "tensorstore", "sentencepiece", "torch",
            "transformers")

# Distributions whose versions environment.json records, besides the wheels'.
VERSIONS_REPORTED = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "numpy",
                     "scipy", "torch", "transformers", "tensorstore", "sentencepiece")

# The tests that mean something on an accelerator: greedy identity (speculative == baseline,
# and == Hugging Face's generate), the network against Hugging Face's and its cache, T5X's model
# protocol; the engine's exactness (chi-square, every rule and policy, at the full sample
# count: on an accelerator its cost is compiling, not sampling).
IDENTITY_TESTS = ("tests/test_t5_decoding.py", "tests/test_models.py", "tests/test_network.py")
SHARDING_TESTS = "tests/sharding"  # added when JAX sees several devices
EXACTNESS_TESTS = ("tests/test_exactness.py",)
# The dry run's share of them (torch is exercised by the pair part's Hugging Face worker): the
# exactness test at its minimum count. The first runs fastest: the dry run's
# tests_highest_precision reruns it.
DRY_RUN_IDENTITY_TESTS = (
    "tests/test_network.py::test_relative_position_bucket_known_values",
    "tests/test_t5_decoding.py::test_greedy_speculative_equals_baseline_with_t5_pair")
DRY_RUN_EXACTNESS_TESTS = (
    "tests/test_exactness.py::test_sequences_follow_the_target_law[temperature_1-token-fixed]",)
DRY_RUN_EXACTNESS_SAMPLES = "10000"


@dataclasses.dataclass(frozen=True)
class Part:
  """One part: `expected_s` is the estimate on one H200 (stated in the .sh header, checked
  against it by the test), `timeout_s` its limit."""
  name: str
  description: str
  expected_s: int
  timeout_s: int


PARTS = (
    Part("environment", "JAX's devices, torch's CUDA, versions, nvidia-smi", 10, 20),
    Part("tests_identity_parity", "greedy identity and Hugging Face parity tests", 400, 450),
    Part("tests_exactness", "the engine's exactness (chi-square) tests", 240, 300),
    Part("verify_cost_float32", "v(k), k = 1..8, T5.1.1-large and -XL, float32", 200, 260),
    Part("verify_cost_bfloat16", "v(k), k = 1..8, T5.1.1-large and -XL, bfloat16", 200, 260),
    Part("pair_large_float32", "near-bigram T5.1.1-large pair: speculative vs baseline at "
         "batch 1 and 8, Hugging Face with and without assistant, physical limit", 150, 210),
    Part("simulated_table2_xxl_bfloat16", "SIMULATED Table 2 rows at T5.1.1-XXL bfloat16, "
         "physical limit", 200, 260),
    Part("tests_highest_precision", "the failed tests again with float32 matmuls at full "
         "precision (tells TF32-style rounding from a bug)", 20, 40),
)

BENCH_PARTS = {  # part: (gin file, extra bindings)
    "verify_cost_float32": (f"{GIN_DIR}/verify_cost.gin", ()),
    "verify_cost_bfloat16": (f"{GIN_DIR}/verify_cost.gin",
                             ("--gin.bench.VerifyCostConfig.overrides={'dtype': 'bfloat16'}",)),
    "pair_large_float32": (f"{GIN_DIR}/large_pair.gin", ()),
    "simulated_table2_xxl_bfloat16": (f"{GIN_DIR}/simulated_xxl.gin", ()),
}

_PYTEST_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


# --------------------------------------------------------------------------- packages


def wheel_requirements() -> list[str]:
  """`distribution==version` of every wheel to bring, at this interpreter's versions."""
  return [f"{dist}=={importlib.metadata.version(dist)}" for _, dist in WHEELS]


def _wheel_name(distribution: str) -> str:
  return re.sub(r"[-_.]+", "_", distribution).lower()


def install_missing(wheel_dir: pathlib.Path, site_dir: pathlib.Path) -> dict[str, Any]:
  """Unpacks the wheel of every WHEELS module this interpreter cannot import into `site_dir`
  (a wheel is a zip of what site-packages would hold: no pip, no index needed); returns what
  was present, installed, missing without a wheel, and which EXPECTED modules are missing."""
  result: dict[str, Any] = {"present": [], "installed": [], "no_wheel": [],
                            "expected_missing": [], "wheel_dir": str(wheel_dir),
                            "site_dir": str(site_dir)}
  wheels = sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
  for module, distribution in WHEELS:
    if importlib.util.find_spec(module) is not None:
      result["present"].append(distribution)
      continue
    prefix = _wheel_name(distribution) + "-"
    found = [w for w in wheels if w.name.lower().startswith(prefix)]
    if not found:
      result["no_wheel"].append(distribution)
      continue
    site_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as archive:
      archive.extractall(site_dir)
    result["installed"].append(found[-1].name)
  result["expected_missing"] = [m for m in EXPECTED if importlib.util.find_spec(m) is None]
  return result


# --------------------------------------------------------------------------- running parts


def run_command(command: Sequence[str], log_path: pathlib.Path, timeout_s: float,
                environment: dict[str, str]) -> dict[str, Any]:
  """Runs `command` in the repository root, stdout and stderr into `log_path`, in a session of
  its own so that a timeout ends its children too (the Hugging Face worker)."""
  start = time.perf_counter()
  with open(log_path, "w") as log:
    log.write("$ " + " ".join(command) + "\n\n")
    log.flush()
    process = subprocess.Popen(list(command), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=environment, start_new_session=True)
    try:
      returncode = process.wait(timeout=timeout_s)
      timed_out = False
    except subprocess.TimeoutExpired:
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:  # it ended between the timeout and the kill
        pass
      returncode = process.wait()
      timed_out = True
  return {"returncode": returncode, "timed_out": timed_out,
          "seconds": time.perf_counter() - start}


def pytest_outcomes(log_text: str) -> dict[str, list[str]]:
  """Node ids by outcome, from `pytest -v` lines (read also after a timeout, when pytest wrote
  no report of its own)."""
  outcomes: dict[str, list[str]] = {}
  for line in log_text.splitlines():
    match = _PYTEST_LINE.match(line)
    if match:
      outcomes.setdefault(match.group(2).lower(), []).append(match.group(1))
  return outcomes


def _pytest_result(run: dict[str, Any], log_path: pathlib.Path) -> dict[str, Any]:
  outcomes = pytest_outcomes(log_path.read_text(errors="replace"))
  counts = {outcome: len(ids) for outcome, ids in outcomes.items()}
  failed = outcomes.get("failed", []) + outcomes.get("error", [])
  if run["timed_out"]:
    status = "timeout"
  elif failed or run["returncode"] != 0 or not counts:
    status = "failed"
  else:
    status = "passed"
  return {"status": status, "counts": counts, "failed_tests": failed,
          "skipped_tests": outcomes.get("skipped", []), "passed_tests": outcomes.get("passed", [])}


def _fmt(value: Any, digits: int = 3) -> str:
  # bench.report's formatting, kept here: the driver imports nothing of the package, whose
  # dependencies it may have to unpack first.
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}"
  return str(value)


def bench_numbers(report: dict[str, Any]) -> dict[str, Any]:
  """The key numbers of a bench report, and the errors its suites recorded."""
  suites, numbers, errors = report["suites"], {}, []
  if "verify_cost" in suites:
    cost = suites["verify_cost"]
    numbers["verify_cost"] = {
        "read_bandwidth_GB_s": cost["read_bandwidth"]["bytes_per_s"] / 1e9,
        "matmul_float32_TFLOP_s": cost["matmul"]["flops_per_s"] / 1e12,
        "models": [{"model": m["model"], "num_params": m["num_params"],
                    "weight_bytes_per_step": m["weight_bytes_per_step"],
                    "read_bandwidth_fraction": m.get("read_bandwidth_fraction"),
                    "one_token_step_ms": m["rows"][0]["step_s"] * 1e3,
                    "v": {row["k"]: row.get("v") for row in m["rows"]},
                    "roofline_v": {row["k"]: row["roofline_v"] for row in m["rows"]}}
                   for m in cost["models"]]}
  if "own_baseline" in suites:
    numbers["own_baseline"] = [
        {"temperature": g["temperature"], "batch_size": g["batch_size"], "gamma": g["gamma"],
         "baseline_tokens_per_s": g["baseline"]["tokens_per_s"],
         "speculative_tokens_per_s": g["speculative"]["tokens_per_s"],
         **{key: g["speculative"].get(key) for key in (
             "speedup", "decode_speedup", "alpha", "c", "v", "predicted_speedup",
             "measured_over_predicted")}}
        for g in suites["own_baseline"]["groups"]]
  if "peer" in suites:
    peer = suites["peer"]
    if "error" in peer:
      errors.append(f"peer: {peer['error']}")
    entries = []
    for entry in peer.get("temperatures", []):
      if "error" in entry:
        errors.append(f"peer T={entry['temperature']}: {entry['error']}")
        continue
      agreement = entry.get("greedy_agreement_with_ours_baseline") or {}
      entries.append({
          "temperature": entry["temperature"],
          **{f"{label.replace(' ', '_')}_tokens_per_s": entry[label]["tokens_per_s"]
             for label in ("ours baseline", "ours speculative", "hf generate", "hf assisted")},
          "ours_speedup": entry["ours_speedup"], "hf_speedup": entry["hf_speedup"],
          "ours_speculative_over_hf_assisted": entry["ours_speculative_over_hf_assisted"],
          "greedy_identical_to_ours_baseline": {
              label: f"{a['identical']}/{a['compared']}" for label, a in agreement.items()}})
    numbers["peer"] = {"torch_device": peer.get("torch_device"), "temperatures": entries}
  if "physical_limit" in suites:
    limit = suites["physical_limit"]
    numbers["physical_limit"] = {
        "copy_bandwidth_GB_s": limit["copy"]["bytes_per_s"] / 1e9,
        "targets": [{"model": t["model"], "step_ms": t["step_s"] * 1e3,
                     "weight_GB_s": t["weight_bytes_per_s"] / 1e9,
                     "fraction_of_copy_bandwidth": t["fraction_of_copy_bandwidth"]}
                    for t in limit["targets"]]}
  if "simulated_table2" in suites:
    numbers["simulated_table2"] = [
        {key: row.get(key) for key in (
            "label", "gamma", "forced_alpha", "paper_speedup", "c", "v", "speedup",
            "decode_speedup", "predicted_speedup", "measured_over_predicted")}
        for row in suites["simulated_table2"]["rows"]]
  return {"numbers": numbers, "errors": errors, "machine": report.get("machine")}


# --------------------------------------------------------------------------- the check


class Check:
  """The parts in order, each `_<kind>` method returning its result entry."""

  def __init__(self, outdir: pathlib.Path, dry_run: bool, python: str,
               selected: Sequence[str] | None = None, part_timeout_s: int | None = None):
    self.outdir, self.dry_run, self.python = outdir, dry_run, python
    # None: every part at its own limit. Otherwise the environment part and `selected`, each
    # of them at `part_timeout_s` where given (still cut to what is left of the total).
    self.selected = None if selected is None else ("environment", *selected)
    self.part_timeout_s = part_timeout_s
    self.deadline = time.monotonic() + TOTAL_BUDGET_S
    self.site_dir = pathlib.Path(tempfile.gettempdir()) / "spec_decode_accelerator_site"
    self.packages = install_missing(WHEEL_DIR, self.site_dir)
    paths = [str(ROOT)] + ([str(self.site_dir)] if self.site_dir.is_dir() else [])
    self.environment = dict(os.environ)
    self.environment["PYTHONPATH"] = os.pathsep.join(
        paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    self.environment["PYTHONUNBUFFERED"] = "1"  # a killed part's log keeps what it printed
    self.results: dict[str, dict[str, Any]] = {}
    self.device_count = 1

  def _timeout_s(self, part: Part) -> int:
    if (self.selected is not None and self.part_timeout_s and part.name in self.selected
        and part.name != "environment"):
      return self.part_timeout_s
    return part.timeout_s

  def _limit(self, part: Part) -> float:
    return min(self._timeout_s(part), self.deadline - time.monotonic())

  def _run(self, part: Part, command: Sequence[str], extra_env: dict[str, str] | None = None
           ) -> tuple[dict[str, Any], pathlib.Path]:
    log_path = self.outdir / f"{part.name}.log"
    environment = dict(self.environment, **(extra_env or {}))
    return run_command(command, log_path, self._limit(part), environment), log_path

  def run_all(self) -> dict[str, Any]:
    runners: dict[str, Callable[[Part], dict[str, Any]]] = {
        "environment": self._environment,
        "tests_identity_parity": lambda part: self._tests(part, self._identity_tests()),
        "tests_exactness": lambda part: self._tests(
            part, DRY_RUN_EXACTNESS_TESTS if self.dry_run else EXACTNESS_TESTS,
            {"SPEC_DECODE_EXACTNESS_SAMPLES": DRY_RUN_EXACTNESS_SAMPLES} if self.dry_run
            else None),
        "tests_highest_precision": self._rerun_at_highest_precision,
    }
    for part in PARTS:
      entry: dict[str, Any] = {"description": part.description, "expected_s": part.expected_s,
                               "timeout_s": self._timeout_s(part)}
      if self.selected is not None and part.name not in self.selected:
        entry.update(status="not selected", reason="not among --parts")
      elif self.deadline - time.monotonic() < MIN_PART_S:
        entry.update(status="not run", reason="out of the check's total time")
      else:
        try:
          runner = runners.get(part.name) or self._bench
          entry.update(runner(part))
        except Exception as e:  # pylint: disable=broad-except  (recorded; the rest still run)
          entry.update(status="failed", reason=f"the check itself: {type(e).__name__}: {e}")
      self.results[part.name] = entry
      print(f"[accelerator_check] {part.name}: {entry['status']}"
            f" ({entry.get('seconds', 0):.0f} s)", flush=True)
    return self.results

  def _environment(self, part: Part) -> dict[str, Any]:
    probe = (
        "import json, platform, sys\n"
        "import jax\n"
        "info = {'python': platform.python_version(), 'jax': jax.__version__,\n"
        "        'backend': jax.default_backend(), 'device_count': jax.device_count(),\n"
        "        'devices': [str(d) for d in jax.devices()],\n"
        "        'device_kinds': sorted({d.device_kind for d in jax.devices()})}\n"
        "try:\n"
        "  stats = jax.devices()[0].memory_stats() or {}\n"
        "  info['device_memory_bytes'] = stats.get('bytes_limit')\n"
        "except Exception as e:\n"
        "  info['device_memory_bytes'] = None\n"
        "try:\n"
        "  import torch\n"
        "  info['torch'] = torch.__version__\n"
        "  info['torch_cuda'] = torch.cuda.is_available()\n"
        "  info['torch_cuda_device'] = (torch.cuda.get_device_name(0)\n"
        "                               if torch.cuda.is_available() else None)\n"
        "except ImportError as e:\n"
        "  info['torch'] = f'missing: {e}'\n"
        "import importlib.metadata as m\n"
        "info['versions'] = {}\n"
        f"for d in {[d for _, d in WHEELS] + list(VERSIONS_REPORTED)!r}:\n"
        "  try:\n"
        "    info['versions'][d] = m.version(d)\n"
        "  except m.PackageNotFoundError:\n"
        "    info['versions'][d] = None\n"
        "print('ENVIRONMENT ' + json.dumps(info))\n")
    run, log_path = self._run(part, [self.python, "-c", probe])
    info: dict[str, Any] = {}
    for line in log_path.read_text(errors="replace").splitlines():
      if line.startswith("ENVIRONMENT "):
        info = json.loads(line[len("ENVIRONMENT "):])
    if shutil.which("nvidia-smi"):
      smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=15)
      info["nvidia_smi"] = smi.stdout
    info["packages"] = self.packages
    (self.outdir / ENVIRONMENT_JSON).write_text(json.dumps(info, indent=2))
    self.device_count = info.get("device_count", 1)
    ok = run["returncode"] == 0 and bool(info) and not self.packages["no_wheel"]
    notes = []
    if self.packages["no_wheel"]:
      notes.append(f"missing with no wheel in {WHEEL_DIR}: {self.packages['no_wheel']} "
                   "(scripts/accelerator_wheels.sh)")
    if self.packages["expected_missing"]:
      notes.append(f"missing: {self.packages['expected_missing']}")
    if info.get("backend") == "cpu" and not self.dry_run:
      notes.append("JAX sees no accelerator: every number below is the CPU's")
    return {"status": "passed" if ok else "failed", "seconds": run["seconds"],
            "log": log_path.name, "environment": {k: v for k, v in info.items()
                                                   if k not in ("nvidia_smi", "packages")},
            "packages_installed": self.packages["installed"],
            **({"reason": "; ".join(notes)} if notes else {})}

  def _identity_tests(self) -> Sequence[str]:
    if self.dry_run:
      return DRY_RUN_IDENTITY_TESTS
    return IDENTITY_TESTS + ((SHARDING_TESTS,) if self.device_count > 1 else ())

  def _tests(self, part: Part, tests: Sequence[str], extra_env: dict[str, str] | None = None
             ) -> dict[str, Any]:
    command = [self.python, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
               *tests]
    run, log_path = self._run(part, command, extra_env)
    result = _pytest_result(run, log_path)
    if extra_env:
      result["environment_variables"] = extra_env
    return {**result, "seconds": run["seconds"], "log": log_path.name, "selection": list(tests)}

  def _rerun_at_highest_precision(self, part: Part) -> dict[str, Any]:
    failed = [test for name in ("tests_identity_parity", "tests_exactness")
              for test in self.results.get(name, {}).get("failed_tests", [])]
    note = None
    if not failed:
      passed = self.results.get("tests_identity_parity", {}).get("passed_tests", [])
      if not (self.dry_run and passed):
        return {"status": "not needed", "reason": "no test failed"}
      failed, note = passed[:1], "dry run: one passing test, to exercise this part"
    result = self._tests(part, failed, {"JAX_DEFAULT_MATMUL_PRECISION": "highest"})
    return {**result, **({"note": note} if note else {})}

  def _bench(self, part: Part) -> dict[str, Any]:
    output_dir = self.outdir / part.name
    run, log_path = self._run(part, bench_command(part.name, output_dir, self.dry_run,
                                                  self.python))
    entry: dict[str, Any] = {"seconds": run["seconds"], "log": log_path.name,
                             "report": f"{part.name}/bench.md"}
    # The peer suite exports the pair's weights into a temporary folder of the output folder
    # (T5.1.1-large: 6 GB); a part killed at its limit leaves it, and it must not come back
    # with the results.
    leftovers = ([path for path in output_dir.iterdir() if path.is_dir()]
                 if output_dir.is_dir() else [])
    for path in leftovers:
      shutil.rmtree(path, ignore_errors=True)
    if leftovers:
      entry["removed"] = [path.name for path in leftovers]
    report_path = output_dir / "bench.json"
    if run["timed_out"]:
      return {**entry, "status": "timeout"}
    if run["returncode"] != 0 or not report_path.exists():
      return {**entry, "status": "failed",
              "reason": _last_line(log_path) or f"exit status {run['returncode']}"}
    entry.update(bench_numbers(json.loads(report_path.read_text())))
    entry.pop("machine", None)
    entry["status"] = "partial" if entry["errors"] else "passed"
    return entry


def bench_command(part_name: str, output_dir: pathlib.Path, dry_run: bool, python: str
                  ) -> list[str]:
  """`python -m spec_decode.bench` as a benchmark part runs it."""
  gin_file, bindings = BENCH_PARTS[part_name]
  return [python, "-m", "spec_decode.bench", f"--gin_file={gin_file}",
          *([f"--gin_file={DRY_RUN_GIN}"] if dry_run else []), f"--output_dir={output_dir}",
          *bindings]


def _last_line(log_path: pathlib.Path) -> str:
  lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
  return lines[-1][:500] if lines else ""


# --------------------------------------------------------------------------- the summary


def to_markdown(summary: dict[str, Any]) -> str:
  """summary.md: one row per part, then each part's key numbers."""
  environment = summary["parts"].get("environment", {}).get("environment", {})
  lines = ["# Accelerator check" + (" (DRY RUN: tiny models, numbers mean nothing)"
                                    if summary["dry_run"] else ""), "",
           f"JAX {environment.get('jax')} on {environment.get('backend')}: "
           f"{', '.join(environment.get('device_kinds') or [])} x "
           f"{environment.get('device_count')}; torch {environment.get('torch')}, CUDA "
           f"{environment.get('torch_cuda')}. Total {summary['seconds']:.0f} s "
           f"(budget {TOTAL_BUDGET_S} s).", "",
           "| part | status | seconds | limit | expected | result |", "|---|---|---|---|---|---|"]
  for name, part in summary["parts"].items():
    lines.append(f"| {name} | {part['status']} | {_fmt(part.get('seconds'))} | "
                 f"{part['timeout_s']} | {part['expected_s']} | {_result_line(part)} |")
  lines.append("")
  for name, part in summary["parts"].items():
    numbers = part.get("numbers")
    if not numbers:
      continue
    lines += [f"## {name}", "", f"Full tables: {part['report']}; log: {part['log']}.", ""]
    lines += _numbers_markdown(numbers)
  return "\n".join(lines) + "\n"


def _result_line(part: dict[str, Any]) -> str:
  pieces = []
  if "counts" in part:
    pieces.append(", ".join(f"{n} {k}" for k, n in sorted(part["counts"].items())))
    if part.get("failed_tests"):
      pieces.append("failed: " + ", ".join(part["failed_tests"][:8]))
  for key in ("reason", "note"):
    if part.get(key):
      pieces.append(str(part[key]))
  pieces += part.get("errors", [])
  if part.get("log"):
    pieces.append(f"log {part['log']}")
  return "; ".join(pieces).replace("|", "/").replace("\n", " ")


def _numbers_markdown(numbers: dict[str, Any]) -> list[str]:
  lines = []
  if "verify_cost" in numbers:
    cost = numbers["verify_cost"]
    lines += [f"v(k): read bandwidth {_fmt(cost['read_bandwidth_GB_s'])} GB/s, float32 matmul "
              f"{_fmt(cost['matmul_float32_TFLOP_s'])} TFLOP/s.", "",
              "| model | params | 1-token ms | of read bandwidth | "
              + " | ".join(f"v({k})" for k in range(1, 9)) + " |", "|---" * 12 + "|"]
    for m in cost["models"]:
      v = {int(k): value for k, value in m["v"].items()}
      lines.append(f"| {m['model']} | {m['num_params'] / 1e6:.0f}M | "
                   f"{_fmt(m['one_token_step_ms'])} | {_fmt(m['read_bandwidth_fraction'])} | "
                   + " | ".join(_fmt(v.get(k)) for k in range(1, 9)) + " |")
    lines.append("")
  if "own_baseline" in numbers:
    lines += ["| T | batch | gamma | baseline tok/s | speculative tok/s | speedup | loop "
              "speedup | alpha | c | v | predicted | loop / predicted |", "|---" * 12 + "|"]
    for g in numbers["own_baseline"]:
      lines.append("| " + " | ".join(_fmt(g[k]) for k in (
          "temperature", "batch_size", "gamma", "baseline_tokens_per_s",
          "speculative_tokens_per_s", "speedup", "decode_speedup", "alpha", "c", "v",
          "predicted_speedup", "measured_over_predicted")) + " |")
    lines.append("")
  if "peer" in numbers:
    peer = numbers["peer"]
    lines += [f"Hugging Face on {peer['torch_device']}.", "",
              "| T | ours base | ours spec | HF generate | HF assisted | ours speedup | HF "
              "speedup | ours spec / HF assisted | greedy identical to ours baseline |",
              "|---" * 9 + "|"]
    for e in peer["temperatures"]:
      lines.append("| " + " | ".join(_fmt(e[k]) for k in (
          "temperature", "ours_baseline_tokens_per_s", "ours_speculative_tokens_per_s",
          "hf_generate_tokens_per_s", "hf_assisted_tokens_per_s", "ours_speedup",
          "hf_speedup", "ours_speculative_over_hf_assisted"))
          + " | " + ", ".join(f"{k} {v}" for k, v in
                              e["greedy_identical_to_ours_baseline"].items()) + " |")
    lines.append("")
  if "physical_limit" in numbers:
    limit = numbers["physical_limit"]
    lines += [f"Physical limit: copy bandwidth {_fmt(limit['copy_bandwidth_GB_s'])} GB/s.", "",
              "| target | step ms | weights GB/s | fraction of copy bandwidth |",
              "|---|---|---|---|"]
    lines += [f"| {t['model']} | {_fmt(t['step_ms'])} | {_fmt(t['weight_GB_s'])} | "
              f"{_fmt(t['fraction_of_copy_bandwidth'])} |" for t in limit["targets"]]
    lines.append("")
  if "simulated_table2" in numbers:
    lines += ["| row | gamma | alpha | paper | c | v | speedup | loop speedup | predicted | "
              "loop / predicted |", "|---" * 10 + "|"]
    for row in numbers["simulated_table2"]:
      lines.append("| " + " | ".join(_fmt(row[k]) for k in (
          "label", "gamma", "forced_alpha", "paper_speedup", "c", "v", "speedup",
          "decode_speedup", "predicted_speedup", "measured_over_predicted")) + " |")
    lines.append("")
  return lines


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="scripts/accelerator_check.sh",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("outdir", nargs="?", help="every result goes here")
  parser.add_argument("--dry_run", action="store_true",
                      help="tiny models on this machine: checks the program, measures nothing")
  parser.add_argument("--parts", help="comma-separated parts to run (the environment part "
                      "always runs first); default: every part")
  parser.add_argument("--part_timeout_s", type=int,
                      help="with --parts: the limit of each selected part (default: its own)")
  parser.add_argument("--wheel_requirements", action="store_true",
                      help="print the wheels to bring (distribution==version) and exit")
  args = parser.parse_args(argv)
  if args.wheel_requirements:
    print("\n".join(wheel_requirements()))
    return 0
  if not args.outdir:
    parser.error("OUTDIR is required")
  selected = None
  if args.parts:
    selected = tuple(name for name in args.parts.split(",") if name)
    unknown = sorted(set(selected) - {part.name for part in PARTS})
    if unknown:
      parser.error(f"unknown parts {unknown}; the parts: {[part.name for part in PARTS]}")
  if args.part_timeout_s is not None and selected is None:
    parser.error("--part_timeout_s applies to the parts --parts selects")
  # The budget is what one device call affords; the dry run's tiny models take seconds.
  expected = sum(part.expected_s for part in PARTS
                 if selected is None or part.name in ("environment", *selected))
  if not args.dry_run and expected > TOTAL_BUDGET_S:
    parser.error(f"the selected parts are expected to take {expected} s on an H200, over the "
                 f"{TOTAL_BUDGET_S} s budget: choose fewer with --parts")
  outdir = pathlib.Path(args.outdir).resolve()
  outdir.mkdir(parents=True, exist_ok=True)
  start = time.monotonic()
  check = Check(outdir, args.dry_run, sys.executable, selected, args.part_timeout_s)
  parts = check.run_all()
  summary = {"dry_run": args.dry_run, "seconds": time.monotonic() - start,
             "total_budget_s": TOTAL_BUDGET_S, "parts": parts}
  (outdir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2))
  markdown = to_markdown(summary)
  (outdir / SUMMARY_MD).write_text(markdown)
  print(markdown)
  ok = all(part["status"] in ("passed", "not needed", "not selected")
           for part in parts.values())
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
