"""Parallel text on disk, as the tasks and the trainer read it.

A corpus is a pair of line-aligned UTF-8 files `<prefix>.<src_lang>`, `<prefix>.<tgt_lang>`; a
relative prefix is taken under the data root (`data_root`, else `paths.data_root()`: from the
environment). `read_parallel(prefixes)` -> (sources, targets), concatenated; files whose
line counts differ are a ValueError naming the corpus. `TRANSLATE_PREFIX` is T5's En->De task
prefix, which every English input carries. `read_input_lines(input_file)`: a run's inputs, one
per non-blank line of a UTF-8 file (a ValueError naming the file, and the line).
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

from spec_decode import paths

TRANSLATE_PREFIX = "translate English to German: "


def resolve(path: str, data_root: str | os.PathLike | None = None) -> pathlib.Path:
  """Absolute paths pass through; relative ones are taken under the data root."""
  p = pathlib.Path(path)
  if p.is_absolute():
    return p
  return paths.data_root(data_root) / p


def _read_lines(path: pathlib.Path) -> list[str]:
  # Split on "\n" only: str.splitlines also breaks at U+2028 etc., which occur inside segments.
  return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def read_parallel(prefixes: Sequence[str], src_lang: str = "en", tgt_lang: str = "de",
                  data_root: str | None = None) -> tuple[list[str], list[str]]:
  """Reads and concatenates line-aligned corpora; returns (sources, targets)."""
  sources, targets = [], []
  for prefix in prefixes:
    base = resolve(prefix, data_root)
    src = _read_lines(base.parent / f"{base.name}.{src_lang}")
    tgt = _read_lines(base.parent / f"{base.name}.{tgt_lang}")
    if len(src) != len(tgt):
      raise ValueError(f"{base}: {len(src)} source lines but {len(tgt)} target lines")
    sources.extend(src)
    targets.extend(tgt)
  return sources, targets


def read_input_lines(input_file: str) -> list[str]:
  """The non-blank lines of a UTF-8 text file (`paths.resolve`d); ValueError naming the file
  (and line)."""
  path = paths.resolve(input_file)
  if not os.path.isfile(path):
    raise ValueError(f"input file not found: {input_file}")
  with open(path, "rb") as f:
    raw_lines = f.read().split(b"\n")
  lines = []
  for number, raw in enumerate(raw_lines, start=1):
    try:
      lines.append(raw.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise ValueError(f"input file {input_file}, line {number}: not UTF-8 ({e.reason} at "
                       f"byte {e.start})") from None
  texts = [line for line in lines if line.strip()]
  if not texts:
    raise ValueError(f"input file {input_file} is empty")
  return texts
