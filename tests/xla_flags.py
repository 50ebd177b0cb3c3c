"""XLA_FLAGS for the suite's processes: the fast-compiling level every test runs at
(tests/conftest.py says why), plus, for a process that needs them, simulated CPU devices."""

from __future__ import annotations

FAST_COMPILE = "--xla_backend_optimization_level=0"
DEVICES = "--xla_force_host_platform_device_count"


def with_devices(count: int | None, flags: str = "") -> str:
  """`flags` with FAST_COMPILE added (once) and, where `count` is given, `count` simulated CPU
  devices in place of any count `flags` held."""
  kept = [flag for flag in flags.split()
          if flag != FAST_COMPILE and not (count is not None and flag.startswith(DEVICES + "="))]
  return " ".join(kept + [FAST_COMPILE] + ([f"{DEVICES}={count}"] if count is not None else []))
