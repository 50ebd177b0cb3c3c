"""SentencePiece vocabulary with T5's conventions, without seqio or TensorFlow.

Contract (mirrors `seqio.SentencePieceVocabulary`'s Python side, so it can stand in for it
in T5X-style code; the TensorFlow methods `encode_tf`/`decode_tf` are deliberately absent):

- ids: pad 0, eos 1, unk 2 (checked when the model loads); T5 has no BOS (`bos_id` is -1).
- `extra_ids` sentinels are appended after the model's own pieces as user-defined pieces
  `▁<extra_id_{i}>`, numbered in reverse by default (seqio's `reverse_extra_ids=True`):
  with the 32000-piece T5 model and 100 extra ids, `<extra_id_0>` is 32099 and
  `vocab_size` is 32100 (checkpoints pad their embedding further, to 32128).
- `encode(s) -> list[int]` tokenizes without appending EOS.
- `decode(ids) -> str` reads up to and including the first EOS, maps ids outside the
  vocabulary to UNK, and drops pad/EOS (control pieces render as nothing).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import sentencepiece

from spec_decode.checkpoints import storage

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
T5_EXTRA_IDS = 100

# SentencePiece's `ModelProto.SentencePiece.Type.USER_DEFINED`.
_USER_DEFINED_PIECE_TYPE = 4


def _varint(value: int) -> bytes:
  """Protocol-buffer base-128 varint encoding of a non-negative int."""
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _user_defined_piece_record(piece: str) -> bytes:
  """A serialized `ModelProto.pieces` entry (field 1) holding one user-defined piece.

  Protocol buffers append repeated-field entries found anywhere in a message, so adding
  pieces to a model is concatenating such records to its bytes; this spares a protobuf
  dependency for what seqio does through `sentencepiece_model_pb2`.
  """
  text = piece.encode("utf-8")
  message = (
      b"\x0a" + _varint(len(text)) + text  # piece: string, field 1
      + b"\x15" + struct.pack("<f", 0.0)  # score: float, field 2
      + b"\x18" + _varint(_USER_DEFINED_PIECE_TYPE)  # type: enum, field 3
  )
  return b"\x0a" + _varint(len(message)) + message


class SentencePieceVocabulary:
  """A T5 SentencePiece vocabulary; see the module docstring for the contract."""

  def __init__(self, sentencepiece_model_file: str, extra_ids: int = 0,
               reverse_extra_ids: bool = True):
    if extra_ids < 0:
      raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
    self._sentencepiece_model_file = os.fspath(sentencepiece_model_file)
    self._extra_ids = extra_ids
    self._reverse_extra_ids = reverse_extra_ids
    self._load()

  def _load(self) -> None:
    sp_model = storage.read_file(self._sentencepiece_model_file)  # local or gs://
    if sp_model is None:
      raise FileNotFoundError(
          f"SentencePiece model file not found: {self._sentencepiece_model_file}")
    order = reversed(range(self._extra_ids)) if self._reverse_extra_ids else range(self._extra_ids)
    sp_model += b"".join(_user_defined_piece_record(f"▁<extra_id_{i}>") for i in order)
    tokenizer = sentencepiece.SentencePieceProcessor()
    try:
      tokenizer.LoadFromSerializedProto(sp_model)
    except RuntimeError as e:
      raise ValueError(
          f"not a SentencePiece model: {self._sentencepiece_model_file} ({e})") from e
    found = (tokenizer.pad_id(), tokenizer.eos_id(), tokenizer.unk_id())
    if found != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(
          f"{self._sentencepiece_model_file} has (pad, eos, unk) ids {found}; "
          f"T5 needs {(PAD_ID, EOS_ID, UNK_ID)}")
    self._sp_model = sp_model
    self._tokenizer = tokenizer

  # Pickling (gin deep-copies configurables' arguments) re-reads the model file.
  def __getstate__(self) -> dict:
    state = self.__dict__.copy()
    del state["_tokenizer"], state["_sp_model"]
    return state

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state)
    self._load()

  @property
  def sentencepiece_model_file(self) -> str:
    return self._sentencepiece_model_file

  @property
  def sp_model(self) -> bytes:
    """The serialized model, extra ids included."""
    return self._sp_model

  @property
  def tokenizer(self) -> sentencepiece.SentencePieceProcessor:
    return self._tokenizer

  @property
  def bos_id(self) -> int:
    return self._tokenizer.bos_id()

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  @property
  def extra_ids(self) -> int:
    return self._extra_ids

  @property
  def vocab_size(self) -> int:
    """Number of ids, extra ids included (not the checkpoint's padded embedding size)."""
    return self._tokenizer.GetPieceSize()

  def encode(self, s: str) -> list[int]:
    """Token ids of `s`, without EOS."""
    if not isinstance(s, str):
      raise TypeError(f"encode expects a str, got {type(s).__name__}")
    return self._tokenizer.EncodeAsIds(s)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; out-of-vocabulary ids read as UNK."""
    clean = []
    for token in ids:
      token = int(token)
      if token < 0:
        raise ValueError(f"negative token id {token} in decode input")
      clean.append(token if token < self.vocab_size else UNK_ID)
      if token == EOS_ID:
        break
    return self._tokenizer.DecodeIds(clean)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, SentencePieceVocabulary):
      return NotImplemented
    return self.__getstate__() == other.__getstate__()

  def __hash__(self) -> int:
    return hash((self._sentencepiece_model_file, self._extra_ids, self._reverse_extra_ids))

  def __repr__(self) -> str:
    return (f"SentencePieceVocabulary(file={self._sentencepiece_model_file!r}, "
            f"extra_ids={self._extra_ids})")


def t5_vocabulary(sentencepiece_model_file: str) -> SentencePieceVocabulary:
  """The vocabulary T5/T5.1.1 checkpoints use: the model plus 100 extra ids."""
  return SentencePieceVocabulary(sentencepiece_model_file, extra_ids=T5_EXTRA_IDS)


def trim_with_eos(ids: list[int], length: int, eos_id: int = EOS_ID) -> list[int]:
  """Input ids cut to `length` with EOS kept last, as seqio's `append_eos_after_trim`."""
  return ids[:length - 1] + [eos_id]


def until_eos(tokens: Iterable[int], eos_id: int = EOS_ID) -> list[int]:
  """A decode's generated tokens up to and including the first EOS (after it: PAD)."""
  tokens = list(tokens)
  return tokens[:tokens.index(eos_id) + 1] if eos_id in tokens else tokens
