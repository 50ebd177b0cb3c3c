#!/usr/bin/env bash
# The newest end of the supported versions: Python 3.12 with the newest JAX, flax and optax that
# setup.py admits, in a fresh virtual environment (.venv312). `scripts/test.sh` runs the whole
# suite at the other end (Python 3.11, JAX 0.10); .ci/run runs both.
#
# 1. Installs this checkout with the "test-core" extra (no torch: the registry has only CUDA
#    builds of several GB for Python 3.12, so the Hugging Face parity tests skip here) and
#    `jax[tpu]` (libtpu: XLA's TPU compiler, for the decodes compiled for TPU topologies from
#    this CPU host, tests/test_aot.py), and checks that pip chose the newest JAX release that
#    setup.py admits and `jax[tpu]` can install.
# 2. Installs the wheel of this checkout into a second fresh environment, its dependencies
#    resolved from the wheel alone, and runs the default demo (`python -m spec_decode.infer`, no
#    flags) from an empty folder outside the repository.
# 3. Runs the tests marked `newest` in that environment (pytest.ini: a cross-section of every
#    layer that a newer JAX could break, the TPU-compile tests among them, libtpu being installed
#    here), then those of the 8-device sharding tests. The whole suite runs at the other end.
#
# The interpreter: $NEWEST_PYTHON, else `python3.12` where it runs, else pyenv's newest 3.12.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

python=${NEWEST_PYTHON:-}
if [ -z "$python" ] && python3.12 -c "" >/dev/null 2>&1; then
  python=python3.12
fi
if [ -z "$python" ] && command -v pyenv >/dev/null 2>&1; then
  python=$(ls -d "$(pyenv root)"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V | tail -n 1)
fi
if [ -z "$python" ]; then
  echo "test_newest.sh: no Python 3.12 found (set NEWEST_PYTHON)" >&2
  exit 1
fi

# --- 1. the test environment --------------------------------------------------------------
rm -rf .venv312
"$python" -m venv .venv312
venv_python=$repo/.venv312/bin/python
started=$SECONDS
"$venv_python" -m pip install -q -e '.[test-core]' 'jax[tpu]'
shared=${SPEC_DECODE_SHARED:-../shared}
if [ -d "$shared/wheels" ]; then
  # T5X is not on the registry; the "t5x" extra (inside "test-core") brought what it imports.
  "$venv_python" -m pip install -q --no-deps "$shared"/wheels/*.whl
fi
echo "test_newest.sh: installed in $((SECONDS - started)) s"
# pip resolves the newest JAX whose `jax[tpu]` it can install (a JAX release can precede its
# libtpu on the registry) unless another package holds JAX back: that would silently test an
# older JAX, so it is an error. What `jax[tpu]` alone resolves to within setup.py's range is the
# yardstick; a release newer than that is named.
"$venv_python" - <<'EOF'
import importlib.metadata
import json
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.version import Version

spec = next(Requirement(line).specifier for line in importlib.metadata.requires("spec_decode")
            if Requirement(line).name == "jax" and Requirement(line).marker is None)
report = json.loads(subprocess.run(
    [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
     "--report", "-", f"jax[tpu]{spec}"], check=True, capture_output=True, text=True).stdout)
resolvable = next(Version(item["metadata"]["version"]) for item in report["install"]
                  if item["metadata"]["name"] == "jax")
index = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "jax"],
                       check=True, capture_output=True, text=True).stdout
# "Available versions: 0.12.1, 0.12.0.1, ..." (this pip's plain-text form)
listed = next(line for line in index.splitlines() if line.startswith("Available versions:"))
released = max(v for v in map(Version, listed.split(":", 1)[1].split(",")) if v in spec)
installed = {name: importlib.metadata.version(name)
             for name in ("jax", "jaxlib", "libtpu", "flax", "optax")}
print(f"test_newest.sh: Python {sys.version.split()[0]}, "
      + ", ".join(f"{name} {version}" for name, version in installed.items()))
if released != resolvable:
  print(f"test_newest.sh: jax {released} is released, but the libtpu its jax[tpu] pins is not on "
        f"the registry: jax {resolvable} is the newest end here")
if Version(installed["jax"]) != resolvable:
  sys.exit(f"test_newest.sh: pip installed jax {installed['jax']}, but jax[tpu] alone resolves "
           f"to {resolvable} within setup.py's {spec}: another dependency holds JAX back")
EOF

# --- 2. the wheel, installed alone, runs the demo from elsewhere --------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
"$venv_python" -m pip wheel -q --no-deps -w "$work/dist" .
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$work"/dist/spec_decode-*.whl
echo "test_newest.sh: wheel installed in $((SECONDS - started)) s"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$work/venv/bin/python" -m spec_decode.infer > "$work/demo.txt"
# Asked from the same folder, so that `import spec_decode` resolves as the demo's did.
"$work/venv/bin/python" - "$work" <<'EOF'
import importlib.metadata
import pathlib
import sys

import spec_decode

work = pathlib.Path(sys.argv[1])
output = (work / "demo.txt").read_text()
problems = []
if not pathlib.Path(spec_decode.__file__).is_relative_to(work / "venv"):
  problems.append(f"spec_decode came from {spec_decode.__file__}, not the wheel")
if "identical output: yes" not in output:
  problems.append("the demo's speculative and baseline outputs differ")
if not (work / "elsewhere" / "out" / "demo_infer" / "summary.json").is_file():
  problems.append("the demo wrote no out/demo_infer/summary.json in its working folder")
if problems:
  sys.exit("test_newest.sh: the installed wheel's demo: " + "; ".join(problems)
           + "\n" + output[-2000:])
print(f"test_newest.sh: the wheel's demo ran from an empty folder with jax "
      f"{importlib.metadata.version('jax')}: identical output: yes")
EOF
cd "$repo"

# --- 3. the tests ---------------------------------------------------------------------------
# Two workers, one file each at a time, as in scripts/test.sh.
"$venv_python" -m pytest -q -rs -n 2 --dist loadfile -m newest "$@" tests --ignore=tests/sharding
XLA_FLAGS=--xla_force_host_platform_device_count=8 "$venv_python" -m pytest -q -rs -m newest "$@" \
  tests/sharding
