#!/usr/bin/env bash
# The fast tier, for before every commit: every test not marked `slow` (pytest.ini), in every
# test module, the engine's included; README, Tests says what that holds and how long it takes.
# The 8-device sharding tests need their own process (scripts/test.sh) and are not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
# Two workers, one test file each at a time, as in scripts/test.sh.
python -m pytest -q -n 2 --dist loadfile -m "not slow" tests --ignore=tests/sharding "$@"
