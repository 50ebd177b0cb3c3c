"""Whether a long run stays steady: what it compiles, and its host memory (RSS), batch by batch.

`CompileCounter` counts XLA backend compilations by function name while it is active (JAX's
monitoring event `/jax/core/compile/backend_compile_duration`; a persistent-cache hit compiles
nothing and is not counted). `rss_bytes()` is the process's resident memory now (Linux
`/proc/self/statm`); `live_rss_bytes()` the same after garbage collection and glibc's
`malloc_trim`, so that neither free memory the allocator keeps resident, nor its reuse, moves it,
in a process started with `MEASURED_ALLOCATOR_ENV`. On `spec_decode.infer`'s decode loop,
`scripts/long_run_steadiness.py` reads `rss_bytes()` and tests/test_infer_steady.py
`live_rss_bytes()`; both count compilations.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import os
import threading
from typing import Any

from jax import monitoring

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
STATM = "/proc/self/statm"
# The environment of a process whose memory is measured with `live_rss_bytes()` (it must be set
# when the process starts). glibc's malloc otherwise raises its mmap and trim thresholds as the
# process frees large blocks, so that a block of about 1 MiB that XLA:CPU's threads allocate
# and free again lands in a thread's arena, and `malloc_trim` never releases the free top of a
# thread's arena: measured on the decode loop, 1.1 MiB that came and went between batches, tens
# of times in 250 batches. Fixed thresholds hand every large block and every arena top over
# 128 KiB back to the OS when freed, and Python's small-object allocator, which takes and
# returns memory in arenas of its own, gives way to malloc; what stays resident is then the
# memory held.
MEASURED_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 2**10),
                          "MALLOC_TRIM_THRESHOLD_": str(128 * 2**10),
                          "PYTHONMALLOC": "malloc"}


def rss_bytes() -> int:
  """Resident set size of this process now, in bytes (Linux only: OSError elsewhere)."""
  with open(STATM) as f:
    resident_pages = int(f.read().split()[1])
  return resident_pages * os.sysconf("SC_PAGE_SIZE")


def live_rss_bytes() -> int:
  """`rss_bytes()` once garbage is collected and glibc's malloc has handed its free pages back
  (`malloc_trim(0)`; a no-op where the C library is not glibc). Plain RSS hides a leak as long as
  the leak reuses memory freed earlier (resident already), and grows in steps when the allocator
  takes a new region; this one follows the memory held, in a process started with
  `MEASURED_ALLOCATOR_ENV`."""
  gc.collect()
  libc = ctypes.CDLL(ctypes.util.find_library("c"))
  if hasattr(libc, "malloc_trim"):
    libc.malloc_trim(0)
  return rss_bytes()


class CompileCounter:
  """`with CompileCounter() as counter:` ... `counter.total`, `counter.by_name[name]`."""

  def __init__(self):
    self.by_name: collections.Counter[str] = collections.Counter()
    self._lock = threading.Lock()

  @property
  def total(self) -> int:
    return sum(self.by_name.values())

  def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
    del duration
    if event == BACKEND_COMPILE_EVENT:
      with self._lock:
        self.by_name[str(kwargs.get("fun_name", "?"))] += 1

  def __enter__(self) -> "CompileCounter":
    monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc_info: Any) -> None:
    monitoring.unregister_event_duration_listener(self._listen)
