"""Whether a long run stays steady: what it compiles, and its host memory (RSS), batch by batch.

`CompileCounter` counts XLA backend compilations by function name while it is active (JAX's
monitoring event `/jax/core/compile/backend_compile_duration`; a persistent-cache hit compiles
nothing and is not counted). `rss_bytes()` is the process's resident memory now (Linux
`/proc/self/statm`); `live_rss_bytes()` the same after garbage collection and glibc's
`malloc_trim`, so that neither free memory the allocator keeps resident, nor its reuse, moves it.
`scripts/long_run_steadiness.py` and tests/test_infer_steady.py use both
on `spec_decode.infer`'s decode loop.
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


def rss_bytes() -> int:
  """Resident set size of this process now, in bytes (Linux only: OSError elsewhere)."""
  with open(STATM) as f:
    resident_pages = int(f.read().split()[1])
  return resident_pages * os.sysconf("SC_PAGE_SIZE")


def live_rss_bytes() -> int:
  """`rss_bytes()` once garbage is collected and glibc's malloc has handed its free pages back
  (`malloc_trim(0)`; a no-op where the C library is not glibc). Plain RSS hides a leak as long as
  the leak reuses memory freed earlier (resident already), and grows in steps when the allocator
  takes a new region; this one follows the memory held."""
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
