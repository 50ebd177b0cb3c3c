#!/usr/bin/env bash
# The whole test suite: the main process, then the 8-device sharding tests in their own process
# (XLA_FLAGS must be set before JAX starts, so they cannot share the first process).
set -euo pipefail
cd "$(dirname "$0")/.."
# T5X is not on the package registry: where the developers' data folder ($SPEC_DECODE_SHARED,
# else ../shared) holds its wheels (and the two GitHub-only packages it imports), install them
# without dependencies; `pip install '.[test]'` brought those. Elsewhere README, Tests says how.
shared=${SPEC_DECODE_SHARED:-../shared}
if [ -d "$shared/wheels" ] && ! python -m pip show -q t5x >/dev/null 2>&1; then
  python -m pip install -q --no-deps "$shared"/wheels/*.whl
fi
# Two workers, one test file each at a time: most of the suite's time is XLA compiling, which
# uses one core, so two processes keep both cores busy. Every tier: no marker selection.
python -m pytest -q -n 2 --dist loadfile tests --ignore=tests/sharding "$@"
if [ -d tests/sharding ]; then
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -q tests/sharding "$@"
fi
