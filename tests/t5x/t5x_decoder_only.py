"""T5X's own decoder-only network (`t5x.examples.decoder_only.network`), for the tests that
compare the hook's decoder-only model with it.

T5X's wheel leaves that network's Python files out (their folder has no `__init__.py`, only its
gin files are packaged), so they are read from a T5X source checkout: `$T5X_SOURCE` holds
`t5x/examples/decoder_only/{layers,network}.py` (scripts/test.sh extracts them from a T5X git
mirror). `network()` returns the module, importing it where T5X has it, else from
`$T5X_SOURCE`, else skips the test saying how to provide it. `PRELUDE` is that loader as
Python source, to run first in a subprocess (`python -c PRELUDE + ...`), so that a T5X gin
file's `from t5x.examples.decoder_only import network` works in `python -m t5x.infer`.
"""

import importlib
import os
import pathlib
import types

import pytest

PACKAGE = "t5x.examples.decoder_only"
SKIP_REASON = ("needs T5X's decoder-only network, absent from T5X's wheel: set T5X_SOURCE to a "
               "T5X source checkout (README: Tests)")


def install() -> bool:
  """Makes `t5x.examples.decoder_only.network` importable, under its own name (T5X's gin
  files and its `layers` import name it so): True where it is."""
  try:
    importlib.import_module(f"{PACKAGE}.network")
    return True
  except ImportError:
    pass
  source = os.environ.get("T5X_SOURCE")
  folder = pathlib.Path(source or "/nonexistent") / "t5x" / "examples" / "decoder_only"
  if not source or not (folder / "network.py").is_file():
    return False
  # The wheel's folder (gin files only) is a namespace package: its search path takes the
  # source checkout's folder too, and both modules then import as T5X names them.
  package = importlib.import_module(PACKAGE)
  package.__path__.append(str(folder))
  importlib.import_module(f"{PACKAGE}.network")
  return True


def network() -> types.ModuleType:
  """T5X's `t5x.examples.decoder_only.network`, or the test skips (see the module docstring)."""
  if not install():
    pytest.skip(SKIP_REASON)
  return importlib.import_module(f"{PACKAGE}.network")


# For a subprocess whose PYTHONPATH holds this folder: the loader, then the caller's code.
PRELUDE = "import t5x_decoder_only; t5x_decoder_only.install(); "
