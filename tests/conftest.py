"""The whole suite reads the developers' data folder `../shared` (real text, the T5 vocabulary,
T5X-written checkpoints) where it exists: the library knows no folder of its own, so the runs
under test (in process and in subprocesses) get it as a user's environment would give it."""

import os
import pathlib

from spec_decode import paths

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"

if SHARED.is_dir():
  os.environ.setdefault(paths.DATA_ROOT_VARIABLE, str(SHARED / "data"))
  os.environ.setdefault(paths.T5_VOCABULARY_VARIABLE,
                        str(SHARED / "vocab" / "t5_cc_all_32000.model"))
