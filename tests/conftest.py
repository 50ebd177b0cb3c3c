"""The whole suite reads the developers' data folder `../shared` (real text, the T5 vocabulary,
T5X-written checkpoints) where it exists: the library knows no folder of its own, so the runs
under test (in process and in subprocesses) get it as a user's environment would give it."""

import os
import pathlib
import socket

import pytest

from spec_decode import paths

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"

if SHARED.is_dir():
  os.environ.setdefault(paths.DATA_ROOT_VARIABLE, str(SHARED / "data"))
  os.environ.setdefault(paths.T5_VOCABULARY_VARIABLE,
                        str(SHARED / "vocab" / "t5_cc_all_32000.model"))


@pytest.fixture()
def unreachable_gcs(monkeypatch):
  """Google Cloud Storage as a run without network or credentials meets it: requests that are
  never answered (a local socket that accepts and stays silent), with `storage`'s bounded wait
  cut to 2 s. Yields that wait."""
  from spec_decode.t5 import storage  # pylint: disable=g-import-not-at-top
  with socket.socket() as silent:
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(storage, "GCS_WAIT_SECONDS", 2)
    yield storage.GCS_WAIT_SECONDS
