"""The machine a run measured: `describe_machine()` for the report, `usable_cores()` for
thread counts."""

from __future__ import annotations

import os
import platform
from typing import Any

import jax


def usable_cores() -> int:
  """The cores this process may run on (what JAX's CPU backend uses)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def describe_machine() -> dict[str, Any]:
  """CPU model, cores, memory, load and the software stack the numbers were measured with
  (the load matters: on a shared machine every timing is only as good as it)."""
  cpu_model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu_model = names[0] if names else cpu_model
  except OSError:
    pass
  try:
    memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    memory_bytes = None
  return {
      "cpu_model": cpu_model,
      "cpu_count": os.cpu_count(),
      "usable_cores": usable_cores(),
      "memory_bytes": memory_bytes,
      "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
      "platform": platform.platform(),
      "python": platform.python_version(),
      "jax_version": jax.__version__,
      "jax_backend": jax.default_backend(),
      "jax_devices": [str(device) for device in jax.devices()],
  }
