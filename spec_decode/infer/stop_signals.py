"""SIGTERM and SIGINT as a request to stop between batches, not in the middle of a write.

`StopRequest.handling()` installs handlers that only record the signal (the first one; a second
signal gets the default behaviour back, so a stuck run can still be stopped); a decode loop asks
`requested()` between batches, commits what it has and raises `Stopped`. With several
processes, every process learns that any one of them was signalled (an all-gather per
question), so all stop after the same batch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
  """A run stopped by a signal after committing its outputs; `status` is the exit status."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum
    self.status = 128 + signum


class StopRequest:
  """Which signal (if any) asked this run to stop."""

  def __init__(self):
    self.signum: int | None = None

  def _record(self, signum: int, frame) -> None:
    del frame
    self.signum = signum
    for other in SIGNALS:  # a second signal stops the run the usual way
      signal.signal(other, signal.SIG_DFL if other == signal.SIGTERM else
                    signal.default_int_handler)

  @contextlib.contextmanager
  def handling(self) -> Iterator["StopRequest"]:
    """Records SIGTERM/SIGINT inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum in SIGNALS:
      signal.signal(signum, self._record)
    try:
      yield self
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)

  def requested(self) -> bool:
    """Whether this process (or, with several, any process) was signalled."""
    if jax.process_count() == 1:
      return self.signum is not None
    signals = multihost_utils.process_allgather(np.int32(self.signum or 0))
    if self.signum is None and np.any(signals):
      self.signum = int(np.max(signals))
    return self.signum is not None

  @property
  def name(self) -> str:
    return signal.Signals(self.signum).name if self.signum is not None else "nothing"
