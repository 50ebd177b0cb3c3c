"""Training a decoder-only language model (`network.DecoderOnlyTransformer`) on monolingual text.

Run: `python -m spec_decode.training.lm --gin_file=configs/train/lm_target.gin --model_dir=<dir>
     [--gin.lm.train_lm.max_wall_time_s=600 ...]`.

The loop, optimizer handling, checkpoints (project msgpack and T5X's legacy layout) and resume
are `train.fit`'s; this module supplies the data and the evaluation:
- `train_files` / `eval_files`: UTF-8 text, one sentence per line (relative paths under the data
  root). Each line is tokenized with the SentencePiece vocabulary and gets EOS; lines longer than
  `sequence_length` tokens (EOS included) are dropped, not truncated, as the translation
  trainer drops them.
- Sentences are packed T5X-style into rows of `sequence_length` tokens: each sentence is a
  segment (`decoder_segment_ids` 1, 2, ...; `decoder_positions` restart at 0) whose inputs start
  with BOS = 0, so a packed row trains exactly what a padded one would (the decoder-only mask
  keeps segments apart) without spending compute on padding.
- The batch of step s is a pure function of (seed, s): rows are packed once, in an order fixed
  by the seed, and each epoch permutes them with rng(seed, epoch).
- Evaluation: per-token loss, accuracy and perplexity on the packed `eval_files`.
- `initial_model` (any checkpoint `formats.load_model` reads, such as this trainer's
  `model_dir/t5x/checkpoint_<step>`, of `config`): the parameters a new run starts from, with a
  fresh optimizer; None: `init_params` of `seed`.
- `distillation` (a `draft_distillation.Distillation` whose target is a decoder-only checkpoint,
  such as another run's `model_dir/t5x/checkpoint_<step>`, of the draft's vocabulary): white-box
  distillation of this model, the draft, on the frozen target's token distributions over the
  packed text (data source 'dataset') instead of cross-entropy; the progress line shows alpha
  at the distillation temperature, and evaluation adds the divergence and alpha at that
  temperature, at T=0 and at T=1 (the expected acceptance rate of speculative decoding at each,
  from both distributions, no decoding) to the draft's own loss and perplexity
  (configs/train/lm_draft_whitebox.gin).
"""
from __future__ import annotations

import pathlib
import sys
import time
from typing import Any, Iterator, Sequence

import gin
import numpy as np
import optax
import sentencepiece as spm

from spec_decode import paths
from spec_decode.data import corpora
from spec_decode.t5 import network
from spec_decode.training import data
from spec_decode.training import draft_distillation
from spec_decode.training import train

Batch = dict[str, np.ndarray]


def read_sentences(files: Sequence[str], data_root: str | None = None) -> list[str]:
  """The non-blank lines of `files`, concatenated."""
  sentences = []
  for name in files:
    text = corpora.resolve(name, data_root).read_text(encoding="utf-8")
    # Split on "\n" only: str.splitlines also breaks at U+2028 etc., which occur inside lines.
    sentences.extend(line.strip() for line in text.split("\n") if line.strip())
  return sentences


def pack(sequences: Sequence[Sequence[int]], length: int) -> Batch:
  """Packs token sequences (EOS included) greedily, in order, into rows of `length`: T5X's
  decoder-only features plus `decoder_loss_weights`. Sequences longer than `length` are
  dropped."""
  rows: list[list[Sequence[int]]] = [[]]
  used = 0
  for sequence in sequences:
    if not sequence or len(sequence) > length:
      continue
    if used + len(sequence) > length:
      rows.append([])
      used = 0
    rows[-1].append(sequence)
    used += len(sequence)
  shape = (len(rows), length)
  targets, inputs = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  segments, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  for r, row in enumerate(rows):
    start = 0
    for segment, sequence in enumerate(row, start=1):
      end = start + len(sequence)
      targets[r, start:end] = sequence
      inputs[r, start + 1:end] = sequence[:-1]  # inputs[r, start] stays BOS = 0
      segments[r, start:end] = segment
      positions[r, start:end] = np.arange(len(sequence))
      start = end
  return {"decoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_segment_ids": segments, "decoder_positions": positions,
          "decoder_loss_weights": (targets != data.PAD_ID).astype(np.int32)}


def encode(sp: spm.SentencePieceProcessor, sentences: Sequence[str]) -> list[list[int]]:
  """Token ids of each sentence, EOS appended."""
  return [ids + [data.EOS_ID] for ids in sp.encode(list(sentences))]


class PackedStream:
  """Batches of `batch_size` packed rows; epoch e is the rows permuted by rng(seed, e), its
  ragged tail dropped (a new shape to compile)."""

  def __init__(self, rows: Batch, batch_size: int, seed: int = 0):
    self.rows = rows
    self.batch_size = batch_size
    self.seed = seed
    self.num_rows = len(rows["decoder_target_tokens"])
    self.batches_per_epoch = self.num_rows // batch_size
    if not self.batches_per_epoch:
      raise ValueError(f"{self.num_rows} packed rows do not fill a batch of {batch_size}")
    self._order: tuple[int, np.ndarray] | None = None

  def batch_at(self, step: int) -> Batch:
    epoch, index = divmod(step, self.batches_per_epoch)
    if self._order is None or self._order[0] != epoch:
      self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_rows))
    rows = self._order[1][index * self.batch_size:(index + 1) * self.batch_size]
    return {k: v[rows] for k, v in self.rows.items()}

  def iterate(self, start_step: int) -> Iterator[Batch]:
    step = start_step
    while True:
      yield self.batch_at(step)
      step += 1


def eval_batches(rows: Batch, batch_size: int) -> Iterator[Batch]:
  """In-order batches of fixed shape (the last one filled with empty rows, loss weight 0)."""
  num_rows = len(rows["decoder_target_tokens"])
  for start in range(0, num_rows, batch_size):
    fill = batch_size - min(batch_size, num_rows - start)
    yield {k: np.pad(v[start:start + batch_size], ((0, fill), (0, 0))) for k, v in rows.items()}


def train_lm(model_dir: str,
             config: network.DecoderOnlyConfig = gin.REQUIRED,
             optimizer: optax.GradientTransformation = gin.REQUIRED,
             vocab_path: str = gin.REQUIRED,
             train_files: Sequence[str] = gin.REQUIRED,
             eval_files: Sequence[str] = gin.REQUIRED,
             data_root: str | None = None,
             sequence_length: int = 64,
             batch_size: int = 32,
             num_train_steps: int = 1000,
             max_wall_time_s: float | None = None,
             clip_grad_norm: float | None = 1.0,
             z_loss: float = 0.0,
             label_smoothing: float = 0.0,
             eval_every: int | None = 500,
             max_eval_rows: int | None = None,
             eval_batch_size: int = 64,
             checkpoint_every: int = 500,
             keep_checkpoints: int = 2,
             t5x_checkpoints: bool = True,
             log_every: int = 20,
             seed: int = 0,
             initial_model: str | None = None,
             distillation: draft_distillation.Distillation | None = None) -> dict[str, float]:
  """Trains until `num_train_steps` (or the wall-time budget); returns the last eval metrics
  (`{}` with `eval_every=None`). `max_eval_rows` caps the packed eval rows (evaluation time).
  With `distillation` the model trained is a draft distilled on the target it names (module
  docstring)."""
  start_time = time.time()
  step_fn, distilled_metrics = None, None
  if distillation is not None:
    step_fn, distilled_metrics = draft_distillation.for_trainer(
        distillation, config, z_loss=z_loss, label_smoothing=label_smoothing)
  initial_params = train.initial_state_params(
      draft_distillation.start_from(distillation, initial_model), config)
  out = pathlib.Path(model_dir)
  out.mkdir(parents=True, exist_ok=True)
  sp = spm.SentencePieceProcessor(model_file=str(paths.resolve(vocab_path)))
  if sp.vocab_size() > config.vocab_size:
    raise ValueError(f"vocabulary has {sp.vocab_size()} ids > config.vocab_size")

  sentences = read_sentences(train_files, data_root)
  # Packing in file order would fill rows with neighbouring (often related) lines of one
  # corpus; a seeded shuffle first mixes the corpora within rows.
  order = np.random.default_rng(seed).permutation(len(sentences))
  stream = PackedStream(pack(encode(sp, [sentences[i] for i in order]), sequence_length),
                        batch_size, seed)
  eval_rows = pack(encode(sp, read_sentences(eval_files, data_root)), sequence_length)
  eval_rows = {k: v[:max_eval_rows] for k, v in eval_rows.items()}
  train_tokens = int(stream.rows["decoder_loss_weights"].sum())
  print(f"train: {len(sentences)} sentences, {train_tokens} tokens in {stream.num_rows} rows of "
        f"{sequence_length}, {stream.batches_per_epoch} batches/epoch; eval: "
        f"{int(eval_rows['decoder_loss_weights'].sum())} tokens", flush=True)
  state = train.create_state(config, optimizer, clip_grad_norm, seed, params=initial_params)

  def evaluate(params: Any) -> dict[str, float]:
    sums = train.eval_sums(params, state.apply_fn, eval_batches(eval_rows, eval_batch_size))
    loss = sums["loss_sum"] / sums["num_tokens"]
    metrics = {"eval_loss": loss, "eval_perplexity": float(np.exp(loss)),
               "eval_accuracy": sums["correct_sum"] / sums["num_tokens"]}
    if distilled_metrics is not None:
      metrics.update(distilled_metrics(params, eval_batches(eval_rows, eval_batch_size)))
    return metrics

  return train.fit(state, stream, out, evaluate, start_time=start_time,
                   num_train_steps=num_train_steps, max_wall_time_s=max_wall_time_s,
                   z_loss=z_loss, label_smoothing=label_smoothing,
                   dropout=config.dropout_rate > 0, eval_every=eval_every,
                   checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints,
                   t5x_checkpoints=t5x_checkpoints, log_every=log_every, seed=seed,
                   step_fn=step_fn)


def main(argv: Sequence[str] | None = None) -> int:
  return train.cli("spec_decode.training.lm", "train_lm", __doc__, argv)


if __name__ == "__main__":
  sys.exit(main())
