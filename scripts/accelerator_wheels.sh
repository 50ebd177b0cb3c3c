#!/usr/bin/env bash
# Downloads here the wheels the accelerator check installs where they are missing (no network
# there): `scripts/accelerator_wheels.sh [DIR]`, default build/accelerator_wheels (ignored by
# git; the device tool carries it: carry ["build/accelerator_wheels"]). Versions: those of
# $PYTHON's environment (default python3), for CPython 3.12 on x86-64 Linux, the accelerator's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DIR="${1:-build/accelerator_wheels}"
mkdir -p "$DIR"
mapfile -t REQUIREMENTS < <("$PYTHON" scripts/accelerator_check.py --wheel_requirements)
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DIR" "${REQUIREMENTS[@]}"
ls -l "$DIR"
