"""The whole suite reads the developers' data folder (`shared_data.SHARED`: real text, the T5
vocabulary) where it exists: the library knows no folder of its own, so the runs under test (in
process and in subprocesses) get it as a user's environment would give it."""

import gc
import os
import pathlib
import socket

import jax
import pytest

import shared_data
import xla_flags
from spec_decode import paths

# The suite's time is mostly XLA:CPU compiling hundreds of small programs, and most of a compile
# is LLVM optimizing the machine code, which these programs run too briefly to repay: the suite
# compiles at LLVM's level 0 (measured on 2 cores: the T5X decode-function tests take 37% less
# CPU time, the 100k-sample exactness tests as long as before). The optimized program (its HLO)
# is the same at every level, the machine code differs, and with it float results at most in
# rounding, alike for a decoder and the reference it is compared with; the runs users time
# (bench, the accelerator check) keep XLA's default. Set here, before any test starts JAX, for
# the tests and the subprocesses they start (xla_flags.py composes theirs).
os.environ["XLA_FLAGS"] = xla_flags.with_devices(None, os.environ.get("XLA_FLAGS", ""))

if shared_data.SHARED.is_dir():
  os.environ.setdefault(paths.DATA_ROOT_VARIABLE, str(shared_data.DATA))
  os.environ.setdefault(paths.T5_VOCABULARY_VARIABLE, str(shared_data.T5_VOCAB_FILE))


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
  """Drops JAX's compiled programs after each test module. Each XLA:CPU executable keeps about
  3 memory mappings while cached, and a test worker that compiled its way through many modules
  reached Linux's limit of 65,530 mappings per process (vm.max_map_count; a worker held 36,845
  two thirds through the suite): the next compile then crashed with a segmentation fault. A
  program a later module needs again is compiled again; what it computes is unchanged."""
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="session")
def real_text() -> pathlib.Path:
  """The data folder's real text (data/: WMT, CNN/DailyMail, Multi30k, Tatoeba), with the T5
  vocabulary the tasks over it tokenize with: the one fixture behind every test that reads it;
  without the folder, those tests skip saying so."""
  if not (shared_data.DATA.is_dir() and shared_data.T5_VOCAB_FILE.is_file()):
    pytest.skip(shared_data.missing("the real text (WMT, CNN/DailyMail, Multi30k, Tatoeba) and "
                                    "the T5 vocabulary"))
  return shared_data.DATA


@pytest.fixture()
def unreachable_gcs(monkeypatch):
  """Google Cloud Storage as a run without network or credentials meets it: requests that are
  never answered (a local socket that accepts and stays silent), with `storage`'s bounded wait
  cut to 2 s. Yields that wait."""
  from spec_decode.checkpoints import storage  # pylint: disable=g-import-not-at-top
  with socket.socket() as silent:
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(storage, "GCS_WAIT_SECONDS", 2)
    yield storage.GCS_WAIT_SECONDS
