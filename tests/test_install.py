"""A plain (non-editable) install finds its own configs and demo pair.

Builds a wheel of this checkout, installs it into a fresh virtual environment outside the
repository and runs the README's default `python -m spec_decode.infer` and `python -m
spec_decode.bench --smoke` from an unrelated working directory. The new environment reuses this
one's third-party packages (a .pth line naming this site-packages), so the test downloads
nothing; spec_decode itself comes only from the wheel (checked).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

# The slow tier (builds the wheel and installs it in fresh environments).
pytestmark = pytest.mark.slow

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(python of a fresh venv with the wheel installed, an empty working directory)."""
  work = tmp_path_factory.mktemp("install")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(work / "dist"), str(REPO_ROOT)], check=True,
                 capture_output=True)
  wheel, = (work / "dist").glob("spec_decode-*.whl")
  environment = work / "venv"
  venv.create(environment, with_pip=False)
  python = environment / "bin" / "python"
  site_packages = subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      check=True, capture_output=True, text=True).stdout.strip()
  # This environment's third-party packages, appended after the new site-packages.
  (pathlib.Path(site_packages) / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                  site_packages, str(wheel)], check=True, capture_output=True)
  cwd = work / "elsewhere"
  cwd.mkdir()
  return python, cwd


def _run(installed, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
  python, cwd = installed
  return subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True,
                        timeout=900, env=env)


def test_the_package_comes_from_the_wheel(installed):
  run = _run(installed, "-c", "import spec_decode; print(spec_decode.__file__)")
  assert run.returncode == 0, run.stderr
  assert pathlib.Path(run.stdout.strip()).is_relative_to(installed[0].parent.parent), run.stdout
  assert not pathlib.Path(run.stdout.strip()).is_relative_to(REPO_ROOT)


def test_default_infer_runs_from_elsewhere(installed):
  run = _run(installed, "-m", "spec_decode.infer")
  assert run.returncode == 0, run.stderr[-2000:]
  assert "identical output: yes" in run.stdout
  assert (installed[1] / "out" / "demo_infer" / "summary.json").is_file()


def test_bench_smoke_runs_from_elsewhere(installed):
  run = _run(installed, "-m", "spec_decode.bench", "--smoke")
  assert run.returncode == 0, run.stderr[-2000:]
  assert (installed[1] / "out" / "bench_smoke" / "bench.json").is_file()


def test_the_cpu_kernel_builds_from_the_wheels_source(installed, tmp_path):
  if shutil.which(os.environ.get("CXX") or "g++") is None:
    pytest.skip("no C++ compiler here: the kernel falls back to XLA's dot (tests/test_cpu_kernels)")
  # An empty cache: the kernel must be compiled from the .cc file the wheel installed.
  run = _run(installed, "-c", "from spec_decode.t5 import cpu_kernels; "
             "print(cpu_kernels.available()); print(cpu_kernels.SOURCE)",
             env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
  assert run.returncode == 0, run.stderr[-2000:]
  available, source = run.stdout.split()
  assert available == "True", run.stderr[-2000:]
  assert pathlib.Path(source).is_relative_to(installed[0].parent.parent)
  assert list((tmp_path / "spec_decode" / "cpu_kernels").glob("*.so"))
