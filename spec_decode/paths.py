"""Where files are found: the one place that knows the package's and the shared data's location.

Paths in gin configs and on the command line are relative to the working directory or, when
not found there, to `ROOT`: the directory that holds the `spec_decode` package (a checkout's
root, or site-packages after `pip install`), or to `CONFIG_ROOT`: the directory that holds
`configs/` (a checkout's root; the package itself once installed, since a wheel carries the
configs inside the package). So `configs/demo/infer.gin` and
`spec_decode/assets/demo/target.safetensors` name the shipped files wherever the package is,
and T5X users give `--gin_search_paths=$(python -m spec_decode.paths)` to include them.
`SHARED` is the developers' data folder (`../shared` beside a checkout): real corpora, the T5
vocabulary and T5X-written checkpoints, absent on a user's machine.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spec_decode"
CONFIG_ROOT = PACKAGE if (PACKAGE / "configs").is_dir() else ROOT
CONFIGS = CONFIG_ROOT / "configs"
DEMO_ASSETS = PACKAGE / "assets" / "demo"
SHARED = ROOT.parent / "shared"


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
