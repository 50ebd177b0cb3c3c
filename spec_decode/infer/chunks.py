"""Resumable `spec_decode.infer`: each decoder's outputs committed in chunks, a rerun resuming.

INFER_OUTPUT_DIR/chunks/ holds
  * `run.json`: the run's identity (`run_identity`: model, checkpoints, decode settings, seed,
    batch size, feature lengths, inputs), written with the first chunk;
  * `<decoder>.<first>-<end>.json`: the outputs of batches [first, end) of one decoder
    ('decoder', or 'baseline' for the target alone), one JSON document per file, put in place
    whole (temporary file, then rename: a chunk is on disk whole or not at all), with the time
    its compiled calls took.
A rerun of the same command in the same INFER_OUTPUT_DIR (`ChunkStore.open`) reads the chunks
that cover batches 0, 1, ... without a gap, decodes the batches after them only, and writes the
final predictions.jsonl and summary.json from the committed outputs and the new ones: the same
records as an uninterrupted run, since each batch's rng depends on the seed and the batch's index
alone (`infer.decode_all`) and the identity fixes the batches. A run whose identity differs from
the stored one is refused before anything is read or written, naming the first difference;
`--restart` starts over (the old chunks are removed when the new run commits its first chunk).
A finished run (`ChunkStore.finish`, after the final files are written) protects nothing
unfinished: a different run in its INFER_OUTPUT_DIR replaces it, as the final files always did.

Multi-process: process 0 alone reads and writes chunks; the others learn from it how many batches
of each decoder are committed (`ChunkStore.committed_batches` broadcasts it), so every process
resumes at the same batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import re
import shutil
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from spec_decode.infer import outputs
from spec_decode.gin_utils import UsageError

CHUNK_DIR = "chunks"
RUN_FILE = "run.json"
COMPLETE_FILE = "complete"  # written once the final outputs are
_CHUNK_NAME = re.compile(r"(?P<decoder>[a-z_]+)\.(?P<first>\d+)-(?P<end>\d+)\.json")


def inputs_digest(examples: Sequence[Any]) -> str:
  """A digest of the run's inputs (text, token ids and target of every example, in order)."""
  digest = hashlib.sha256()
  for example in examples:
    digest.update(json.dumps([example.inputs, list(example.input_ids), example.target],
                             ensure_ascii=False).encode("utf-8"))
  return digest.hexdigest()


def _stable_text(value: Any) -> str:
  """A value JSON has no form for, as text that is the same in every process: a function (a
  bound logit_callback_fn) by its module and name, not by its repr's memory address."""
  if callable(value) and hasattr(value, "__qualname__"):
    return f"{getattr(value, '__module__', None)}.{value.__qualname__}"
  return str(value)


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value, default=_stable_text))


@dataclasses.dataclass
class ChunkStore:
  """The committed chunks of one run in `output_dir` (see the module docstring). `writer`:
  this process writes (process 0); `restart`: stored chunks are ignored, and removed at the
  first commit."""
  output_dir: pathlib.Path
  identity: dict[str, Any]
  writer: bool
  restart: bool = False
  _started: bool = False

  @property
  def directory(self) -> pathlib.Path:
    return self.output_dir / CHUNK_DIR

  @classmethod
  def open(cls, output_dir: str, identity: Mapping[str, Any], restart: bool = False
           ) -> "ChunkStore":
    """The store of `output_dir` for a run of `identity`; UsageError naming the first field
    that differs from a stored run's (nothing is written here)."""
    store = cls(pathlib.Path(output_dir), _jsonable(dict(identity)),
                writer=jax.process_index() == 0, restart=restart)
    if store.writer and not restart:
      store._check_identity()
    return store

  def _check_identity(self) -> None:
    path = self.directory / RUN_FILE
    if not path.is_file():
      return
    try:
      stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
      raise UsageError(f"{path} is unreadable ({e}): rerun with --restart to start over") from None
    difference = _first_difference(stored, self.identity)
    if difference is None:
      return
    if (self.directory / COMPLETE_FILE).is_file():  # a finished run: its outputs are written
      print(f"INFER_OUTPUT_DIR {self.output_dir} holds a finished run with another "
            f"{difference[0]}: replacing it", flush=True)
      self.restart = True
      return
    name, before, now = difference
    raise UsageError(
        f"INFER_OUTPUT_DIR {self.output_dir} holds an unfinished run with another {name} "
        f"({_short(before)}, now {_short(now)}): rerun with --restart to start over there, or "
        "choose another INFER_OUTPUT_DIR")

  def _chunks(self, decoder: str) -> list[tuple[int, int, pathlib.Path]]:
    """(first batch, end batch, file) of `decoder`'s chunks that continue each other from 0."""
    if self.restart or not self.directory.is_dir():
      return []
    found = {}
    for path in self.directory.iterdir():
      match = _CHUNK_NAME.fullmatch(path.name)
      if match and match["decoder"] == decoder:
        found[int(match["first"])] = (int(match["first"]), int(match["end"]), path)
    chunks, next_batch = [], 0
    while next_batch in found:
      chunks.append(found[next_batch])
      next_batch = found[next_batch][1]
    return chunks

  def committed_batches(self, decoder: str) -> int:
    """How many batches of `decoder` are committed: process 0's count, on every process."""
    chunks = self._chunks(decoder) if self.writer else []
    num_batches = chunks[-1][1] if chunks else 0
    if jax.process_count() > 1:
      num_batches = int(multihost_utils.broadcast_one_to_all(np.int32(num_batches)))
    return num_batches

  def read(self, decoder: str) -> outputs.DecodeRun:
    """The committed outputs of `decoder` (process 0; empty elsewhere: only process 0 writes)."""
    run = outputs.DecodeRun([], [], 0.0, 0.0)
    for _, _, path in self._chunks(decoder) if self.writer else []:
      try:
        chunk = json.loads(path.read_text(encoding="utf-8"))
        run.decodes += [np.asarray(tokens, np.int32) for tokens in chunk["decodes"]]
        run.aux += chunk["aux"]
        run.compile_seconds += chunk["compile_seconds"]
        run.seconds += chunk["seconds"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"chunk {path} is unreadable ({type(e).__name__}): rerun with "
                         "--restart to start over") from None
    return run

  def commit(self, decoder: str, first: int, end: int, decodes: Sequence[np.ndarray],
             aux: Sequence[Mapping[str, Any]], compile_seconds: float, seconds: float) -> None:
    """Puts batches [first, end) of `decoder` on disk, whole (process 0; a no-op elsewhere)."""
    if not self.writer or end <= first:
      return
    if not self._started:
      self._start()
    chunk = {"decoder": decoder, "batches": [first, end], "compile_seconds": compile_seconds,
             "seconds": seconds, "decodes": [np.asarray(d).tolist() for d in decodes],
             "aux": list(aux)}
    outputs.write_atomically(self.directory / f"{decoder}.{first:06d}-{end:06d}.json",
                                   json.dumps(chunk, ensure_ascii=False))

  def finish(self) -> None:
    """Marks the run finished (its final outputs written): another run may replace it."""
    if self.writer:
      (self.directory / COMPLETE_FILE).touch()

  def _start(self) -> None:
    """Before the first commit: a restart's old chunks go; leftovers of an interrupted write
    go; the identity is written."""
    if self.restart and self.directory.exists():
      shutil.rmtree(self.directory)
    (self.directory / COMPLETE_FILE).unlink(missing_ok=True)
    self.directory.mkdir(parents=True, exist_ok=True)
    for path in self.directory.iterdir():
      if path.name.startswith("."):  # a temporary file whose write was interrupted
        path.unlink()
    outputs.write_atomically(self.directory / RUN_FILE,
                                   json.dumps(self.identity, indent=2, ensure_ascii=False))
    self.restart, self._started = False, True


def _first_difference(stored: Any, now: Any, name: str = "") -> tuple[str, Any, Any] | None:
  """(dotted name, stored value, new value) of the first field where two identities differ."""
  if isinstance(stored, dict) and isinstance(now, dict):
    for key in list(now) + [key for key in stored if key not in now]:
      found = _first_difference(stored.get(key), now.get(key), f"{name}.{key}" if name else key)
      if found is not None:
        return found
    return None
  return None if stored == now else (name, stored, now)


def _short(value: Any, limit: int = 80) -> str:
  text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
  return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclasses.dataclass
class ChunkWriter:
  """Collects one decoder's batches and commits them every `period` batches (and on `flush`)."""
  store: ChunkStore
  decoder: str
  period: int
  first: int
  decodes: list[np.ndarray] = dataclasses.field(default_factory=list)
  aux: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  compile_seconds: float = 0.0
  seconds: float = 0.0
  end: int | None = None

  def add(self, batch_index: int, decodes: Sequence[np.ndarray],
          aux: Sequence[Mapping[str, Any]], seconds: float, compile_seconds: float = 0.0
          ) -> None:
    """Batch `batch_index`'s outputs, the time of its compiled call and of a compile it did."""
    self.decodes += decodes
    self.aux += aux
    self.seconds += seconds
    self.compile_seconds += compile_seconds
    self.end = batch_index + 1
    if self.end - self.first >= self.period:
      self.flush()

  def flush(self) -> None:
    if self.end is None:
      return
    self.store.commit(self.decoder, self.first, self.end, self.decodes, self.aux,
                      self.compile_seconds, self.seconds)
    self.first, self.end, self.decodes, self.aux = self.end, None, [], []
    self.compile_seconds = self.seconds = 0.0
