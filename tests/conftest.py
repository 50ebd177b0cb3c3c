"""The whole suite reads the developers' data folder (`shared_data.SHARED`: real text, the T5
vocabulary) where it exists: the library knows no folder of its own, so the runs under test (in
process and in subprocesses) get it as a user's environment would give it."""

import os

import shared_data
from spec_decode import paths

if shared_data.SHARED.is_dir():
  os.environ.setdefault(paths.DATA_ROOT_VARIABLE, str(shared_data.DATA))
  os.environ.setdefault(paths.T5_VOCABULARY_VARIABLE, str(shared_data.T5_VOCAB_FILE))
