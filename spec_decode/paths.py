"""Where files are found: the package's, the configs' and the data's locations, in one place.

Paths in gin configs and on the command line are relative to the working directory or, when
not found there, to `ROOT`: the directory that holds the `spec_decode` package (a checkout's
root, or site-packages after `pip install`), or to `CONFIG_ROOT`: the directory that holds
`configs/` (a checkout's root; the package itself once installed, since a wheel carries the
configs inside the package). So `configs/demo/infer.gin` and
`spec_decode/assets/demo/target.safetensors` name the shipped files wherever the package is,
and T5X users give `--gin_search_paths=$(python -m spec_decode.paths)` to include them.
The tasks' text (wmt_ende/, cnn_dailymail/, ... under a data root) and their T5 vocabulary come
from a config or flag, else from the run's environment (`data_root`, `t5_vocabulary`): the
library knows no folder of its own for them.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spec_decode"
CONFIG_ROOT = PACKAGE if (PACKAGE / "configs").is_dir() else ROOT
CONFIGS = CONFIG_ROOT / "configs"
DEMO_ASSETS = PACKAGE / "assets" / "demo"
# The environment variables a run (or a test suite) sets for `data_root` and `t5_vocabulary`.
DATA_ROOT_VARIABLE = "SPEC_DECODE_DATA_ROOT"
T5_VOCABULARY_VARIABLE = "SPEC_DECODE_T5_VOCABULARY"
# The T5 SentencePiece model (cc_all.32000) where T5X reads it.
T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"


def data_root(path: str | os.PathLike | None = None) -> pathlib.Path:
  """The root of the tasks' and corpora's text: `path`, else $SPEC_DECODE_DATA_ROOT;
  FileNotFoundError saying how to give one when neither names a folder."""
  path = path or os.environ.get(DATA_ROOT_VARIABLE)
  if not path:
    raise FileNotFoundError(f"no data directory: pass --data_dir (or bind tasks.data_dir.path, "
                            f"or set {DATA_ROOT_VARIABLE})")
  if not os.path.isdir(path):
    raise FileNotFoundError(f"data directory not found: {path}")
  return pathlib.Path(path)


def t5_vocabulary(path: str | None = None) -> str:
  """The T5 SentencePiece model: `path`, else $SPEC_DECODE_T5_VOCABULARY, else T5X's copy."""
  return path or os.environ.get(T5_VOCABULARY_VARIABLE) or T5_VOCABULARY


def resolve(path: str | os.PathLike) -> str:
  """A run's file path: absolute and gs:// paths as given; a relative one from the working
  directory when it exists there, else from `ROOT` or `CONFIG_ROOT` when it exists there, else
  as given."""
  path = os.fspath(path)
  if path.startswith("gs://") or os.path.isabs(path) or os.path.exists(path):
    return path
  for root in (ROOT, CONFIG_ROOT):
    if (root / path).exists():
      return str(root / path)
  return path


if __name__ == "__main__":  # the directory T5X's --gin_search_paths needs for configs/...
  print(CONFIG_ROOT)
