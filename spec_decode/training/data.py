"""Parallel-text data for training: files -> tokenized, length-bucketed, padded batches.

Contract:
- Corpora are pairs of line-aligned text files (`<prefix>.<src_lang>`, `<prefix>.<tgt_lang>`).
  Paths may be relative to the data root (default $SPEC_DECODE_DATA_ROOT).
- Every source gets the T5 task prefix (`translate English to German: `); both sides end in EOS=1.
  Pairs whose source or target exceeds its maximum length (EOS included) are dropped, not
  truncated, so every target the model learns from is complete.
- Batches are dicts of int32 numpy arrays with seqio's encoder-decoder feature names:
    encoder_input_tokens  [B, Le]
    decoder_input_tokens  [B, Ld]  targets shifted right, BOS = 0
    decoder_target_tokens [B, Ld]
    decoder_loss_weights  [B, Ld]  1 on real target tokens, 0 on padding
  Le and Ld are each the smallest bucket boundary that fits the longest row, and B is
  `tokens_per_batch // max(Le, Ld)`, so a few fixed shapes cover all batches (few XLA compiles).
- The batch stream is a pure function of (seed, step): `batch_at(step)` gives the same batch in
  a resumed run as in an uninterrupted one, so the data position is just the step.
- The vocabulary follows T5's conventions: pad 0, eos 1, unk 2, no bos.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import sentencepiece as spm

from spec_decode.data import corpora

PAD_ID = 0
EOS_ID = 1
# The packing features of a decoder-only language model's rows (`spec_decode.training.lm`).
PACKING_FEATURES = ("decoder_segment_ids", "decoder_positions")


def network_inputs(batch: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
  """The positional and packing keyword arguments of a network's teacher-forced call on a
  seqio-named batch: an encoder-decoder's (a batch with `encoder_input_tokens`), else a
  decoder-only language model's, whose packed rows also carry segment ids and positions."""
  if "encoder_input_tokens" in batch:
    return (batch["encoder_input_tokens"], batch["decoder_input_tokens"],
            batch["decoder_target_tokens"]), {}
  return ((batch["decoder_input_tokens"], batch["decoder_target_tokens"]),
          {k: batch[k] for k in PACKING_FEATURES if k in batch})


def train_vocab(prefixes: Sequence[str], model_prefix: str, vocab_size: int = 8000,
                data_root: str | None = None, seed_sentencepiece_size: int = 1_000_000) -> str:
  """Trains a joint source/target unigram SentencePiece model with T5's special ids.

  The task prefix is included once so it tokenizes into a few whole pieces.
  Returns the path of the written `.model` file.
  """
  sources, targets = corpora.read_parallel(prefixes, data_root=data_root)
  sentences = [corpora.TRANSLATE_PREFIX.strip()] + sources + targets
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_prefix=model_prefix, vocab_size=vocab_size,
      model_type="unigram", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=2,
      bos_id=-1, seed_sentencepiece_size=seed_sentencepiece_size, num_threads=2,
      minloglevel=2)
  return model_prefix + ".model"


@dataclasses.dataclass(frozen=True)
class Encoded:
  """Tokenized pairs (EOS appended), aligned by index."""
  inputs: list[np.ndarray]
  targets: list[np.ndarray]


def encode_pairs(sp: spm.SentencePieceProcessor, sources: Sequence[str], targets: Sequence[str],
                 max_input_len: int, max_target_len: int) -> Encoded:
  """Tokenizes with the task prefix and EOS; drops pairs that do not fit."""
  src_ids = sp.encode([corpora.TRANSLATE_PREFIX + s for s in sources])
  tgt_ids = sp.encode(list(targets))
  inputs, outs = [], []
  for s, t in zip(src_ids, tgt_ids):
    if len(s) + 1 <= max_input_len and len(t) + 1 <= max_target_len and t:
      inputs.append(np.asarray(s + [EOS_ID], np.int32))
      outs.append(np.asarray(t + [EOS_ID], np.int32))
  return Encoded(inputs, outs)


def _bucket(length: int, boundaries: Sequence[int]) -> int:
  return next(b for b in boundaries if length <= b)


def pad_batch(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], input_len: int,
              target_len: int) -> dict[str, np.ndarray]:
  """Pads rows to fixed lengths and builds the seqio feature dict."""
  b = len(inputs)
  enc = np.zeros((b, input_len), np.int32)
  tgt = np.zeros((b, target_len), np.int32)
  for i, (x, y) in enumerate(zip(inputs, targets)):
    enc[i, :len(x)] = x
    tgt[i, :len(y)] = y
  dec_in = np.zeros_like(tgt)
  dec_in[:, 1:] = tgt[:, :-1]  # shift right; position 0 stays BOS = 0
  return {
      "encoder_input_tokens": enc,
      "decoder_input_tokens": dec_in,
      "decoder_target_tokens": tgt,
      "decoder_loss_weights": (tgt != PAD_ID).astype(np.int32),
  }


class BatchStream:
  """Deterministic, shuffled, length-bucketed batches; indexable by global step.

  Each epoch: shuffle examples with rng(seed, epoch), group them by bucket, cut each bucket
  into batches, then shuffle the batch order with the same rng.
  """

  def __init__(self, encoded: Encoded, tokens_per_batch: int = 4096,
               boundaries: Sequence[int] = (16, 32, 48, 64), seed: int = 0):
    self.encoded = encoded
    self.tokens_per_batch = tokens_per_batch
    self.boundaries = tuple(boundaries)
    self.seed = seed
    self._epoch_cache: tuple[int, list[np.ndarray]] | None = None
    self.batches_per_epoch = len(self._epoch_plan(0))

  def _row_bucket(self, i: int) -> int:
    return _bucket(max(len(self.encoded.inputs[i]), len(self.encoded.targets[i])),
                   self.boundaries)

  def _epoch_plan(self, epoch: int) -> list[np.ndarray]:
    if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
      return self._epoch_cache[1]
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(len(self.encoded.inputs))
    by_bucket: dict[int, list[int]] = {}
    for i in order:
      by_bucket.setdefault(self._row_bucket(int(i)), []).append(int(i))
    plan = []
    for length, rows in sorted(by_bucket.items()):
      size = max(1, self.tokens_per_batch // length)
      # Drop the ragged tail of each bucket: it would be a new (rare) shape to compile.
      for start in range(0, len(rows) - size + 1, size):
        plan.append(np.asarray(rows[start:start + size]))
    plan = [plan[j] for j in rng.permutation(len(plan))]
    self._epoch_cache = (epoch, plan)
    return plan

  def batch_at(self, step: int) -> dict[str, np.ndarray]:
    epoch, index = divmod(step, self.batches_per_epoch)
    rows = self._epoch_plan(epoch)[index]
    length = self._row_bucket(int(rows[0]))
    return pad_batch([self.encoded.inputs[i] for i in rows],
                     [self.encoded.targets[i] for i in rows], length, length)

  def iterate(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    step = start_step
    while True:
      yield self.batch_at(step)
      step += 1


def eval_batches(encoded: Encoded, batch_size: int, input_len: int,
                 target_len: int) -> Iterator[dict[str, np.ndarray]]:
  """In-order, fixed-shape batches (the last one padded with empty rows, loss weight 0)."""
  n = len(encoded.inputs)
  for start in range(0, n, batch_size):
    inputs = encoded.inputs[start:start + batch_size]
    targets = encoded.targets[start:start + batch_size]
    fill = batch_size - len(inputs)
    empty = np.zeros((0,), np.int32)
    yield pad_batch(list(inputs) + [empty] * fill, list(targets) + [empty] * fill, input_len,
                    target_len)
