"""T5X's own decoder-only network, `t5x.examples.decoder_only.network`, imported under its own
name: what T5X's decoder-only gin files, the benchmark's T5X peer for language models and the
identity tests build T5X's `DecoderOnlyModel` over.

T5X's wheel leaves that network's Python files out (their folder has no `__init__.py`; only its
gin files are packaged). `install()` makes the module importable where T5X has it or where
`$T5X_SOURCE` names a T5X source checkout holding `t5x/examples/decoder_only/{layers,
network}.py`; `network()` returns it, or raises ImportError saying how to provide it.
"""

import importlib
import os
import pathlib
import types

PACKAGE = "t5x.examples.decoder_only"
MISSING = ("T5X's decoder-only network (t5x/examples/decoder_only/network.py) is absent from "
           "this T5X installation (its wheel leaves it out): set T5X_SOURCE to a T5X source "
           "checkout")


def install() -> bool:
  """Makes `t5x.examples.decoder_only.network` importable under its own name (T5X's gin files
  and its `layers` import name it so): True where it is."""
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
  """T5X's `t5x.examples.decoder_only.network`; ImportError (MISSING) where it cannot be had."""
  if not install():
    raise ImportError(MISSING)
  return importlib.import_module(f"{PACKAGE}.network")
