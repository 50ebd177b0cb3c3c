"""Where files are found: the one place that knows the package's and the shared data's location.

Paths in gin configs and on the command line are relative to the working directory or, when
not found there, to `ROOT`: the directory that holds the `spec_decode` package (a checkout's
root, or site-packages after `pip install`). So `spec_decode/configs/demo/infer.gin` and
`spec_decode/assets/demo/target.safetensors` name the shipped files wherever the package is.
`SHARED` is the developers' data folder (`../shared` beside a checkout): real corpora, the T5
vocabulary and T5X-written checkpoints, absent on a user's machine.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spec_decode"
CONFIGS = PACKAGE / "configs"
DEMO_ASSETS = PACKAGE / "assets" / "demo"
SHARED = ROOT.parent / "shared"


def resolve(path: str | os.PathLike) -> str:
  """A run's file path: absolute and gs:// paths as given; a relative one from the working
  directory when it exists there, else from `ROOT` when it exists there, else as given."""
  path = os.fspath(path)
  if path.startswith("gs://") or os.path.isabs(path) or os.path.exists(path):
    return path
  in_root = ROOT / path
  return str(in_root) if in_root.exists() else path
