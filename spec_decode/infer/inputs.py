"""The runner's inputs: where they come from (`DatasetConfig`), read as `Example`s (task
examples trimmed to TASK_FEATURE_LENGTHS with EOS kept, or text, the task's vocabulary checked to
be the model's), and cut into batches of one shape: seqio's encoder-decoder features, or for a
decoder-only model its decoder features, each input the prompt to continue.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping, Sequence

import numpy as np

from spec_decode import models
from spec_decode.data import corpora
from spec_decode.gin_utils import UsageError
from spec_decode.t5 import network
from spec_decode.t5 import vocab


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
  """Where inputs come from: exactly one of a seqio task, a text file or inline texts."""
  mixture_or_task_name: str | None = None
  task_feature_lengths: Mapping[str, int] | None = None
  split: str = "test"
  batch_size: int = 32
  num_examples: int | None = None
  input_file: str | None = None
  texts: Sequence[str] | None = None
  input_prefix: str = ""


@dataclasses.dataclass(frozen=True)
class Example:
  inputs: str  # the text the model reads (prefix included)
  # EOS-terminated, at most task_feature_lengths['inputs'] long; a language model's text
  # prompt has no EOS (it is continued, not ended).
  input_ids: list[int]
  target: str | None = None


def feature_lengths(cfg: DatasetConfig) -> tuple[int, int]:
  """(input length, target length) after checking the config."""
  sources = [name for name, value in (("mixture_or_task_name", cfg.mixture_or_task_name),
                                      ("input_file", cfg.input_file), ("texts", cfg.texts))
             if value is not None]
  if len(sources) != 1:
    raise UsageError("give exactly one input source: MIXTURE_OR_TASK_NAME, --input_file or "
                     f"--text (got {', '.join(sources) or 'none'})")
  lengths = cfg.task_feature_lengths
  if (not isinstance(lengths, Mapping) or set(lengths) != {"inputs", "targets"}
      or not all(isinstance(n, int) and n >= 2 for n in lengths.values())):
    raise UsageError("TASK_FEATURE_LENGTHS must be {'inputs': int >= 2, 'targets': int >= 2}, "
                     f"got {lengths!r}")
  if not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
    raise UsageError(f"BATCH_SIZE must be an integer >= 1, got {cfg.batch_size!r}")
  if cfg.num_examples is not None and (not isinstance(cfg.num_examples, int)
                                       or cfg.num_examples < 1):
    raise UsageError(f"NUM_EXAMPLES must be an integer >= 1 or None, got {cfg.num_examples!r}")
  return lengths["inputs"], lengths["targets"]


def _vocabulary_signature(vocabulary: Any) -> tuple[int, int, bytes]:
  """(vocab_size, extra_ids, model file bytes): equal for seqio's and spec_decode.t5.vocab's
  SentencePiece vocabularies exactly when they tokenize alike."""
  with open(vocabulary.sentencepiece_model_file, "rb") as f:
    return vocabulary.vocab_size, vocabulary.extra_ids, f.read()


def _task_examples(cfg: DatasetConfig, model: models.BaseTransformerModel) -> list[Example]:
  # Only a task imports TensorFlow.
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top
  vocabularies = tasks.output_vocabularies(cfg.mixture_or_task_name)
  for feature, model_vocabulary in (("inputs", model.input_vocabulary),
                                    ("targets", model.output_vocabulary)):
    if _vocabulary_signature(vocabularies[feature]) != _vocabulary_signature(model_vocabulary):
      raise UsageError(
          f"task {cfg.mixture_or_task_name!r} and the model have different {feature} "
          f"vocabularies ({vocabularies[feature].sentencepiece_model_file}, "
          f"{vocabularies[feature].vocab_size} ids vs "
          f"{model_vocabulary.sentencepiece_model_file}, {model_vocabulary.vocab_size} ids)")
  rows = tasks.load_examples(cfg.mixture_or_task_name, cfg.split, cfg.task_feature_lengths,
                             cfg.num_examples)
  return [Example(row["inputs_pretokenized"], row["inputs"], row.get("targets_pretokenized"))
          for row in rows]


def _text_examples(cfg: DatasetConfig, model: models.BaseTransformerModel,
                   input_length: int) -> list[Example]:
  """The texts as inputs: an encoder-decoder's cut to `input_length` with EOS (a warning says
  how many were), a language model's prompts whole (UsageError naming the first longer than
  `input_length`, the room its decode leaves a prompt)."""
  if cfg.texts is not None:
    if isinstance(cfg.texts, str):
      raise UsageError("texts must be a list of strings, got one string")
    texts = list(cfg.texts)
  else:
    texts = corpora.read_input_lines(cfg.input_file)
  texts = texts[:cfg.num_examples] if cfg.num_examples is not None else texts
  vocabulary = model.input_vocabulary
  examples, num_cut, most_cut = [], 0, 0
  for i, text in enumerate(texts):
    inputs = cfg.input_prefix + text
    ids = vocabulary.encode(inputs)
    if network.is_decoder_only(model.module):
      if len(ids) > input_length:
        raise UsageError(f"prompt {i + 1} has {len(ids)} tokens, more than the "
                         f"{input_length} of TASK_FEATURE_LENGTHS['inputs'], the longest "
                         "prompt the decode length allows")
      examples.append(Example(inputs, list(ids)))
      continue
    if len(ids) > input_length - 1:  # room for EOS
      num_cut, most_cut = num_cut + 1, max(most_cut, len(ids) - (input_length - 1))
    examples.append(Example(inputs, vocab.trim_with_eos(ids, input_length, vocabulary.eos_id)))
  if num_cut:
    print(f"warning: {num_cut} of {len(examples)} inputs are longer than "
          f"TASK_FEATURE_LENGTHS['inputs'] = {input_length} tokens (EOS included) and were cut, "
          f"by up to {most_cut} tokens", file=sys.stderr)
  return examples


def read_examples(cfg: DatasetConfig, model: models.BaseTransformerModel) -> list[Example]:
  """The run's inputs (see the module docstring); UsageError when there are none."""
  input_length, _ = feature_lengths(cfg)
  examples = (_task_examples(cfg, model) if cfg.mixture_or_task_name is not None
              else _text_examples(cfg, model, input_length))
  if not examples:
    raise UsageError("no input examples")
  return examples


def make_batches(examples: Sequence[Example], batch_size: int, input_length: int,
                 target_length: int, decoder_only: bool = False
                 ) -> list[tuple[dict[str, np.ndarray], int]]:
  """(batch, number of real rows) pairs, all one shape: seqio's encoder-decoder features, or
  with `decoder_only` its decoder features of length input_length + target_length (BOS = 0,
  then the prompt, decoder_causal_attention 1 over both: `seqio.DecoderFeatureConverter`'s).
  The last batch is completed with copies of its last example, which finish when it does."""
  batches = []
  for start in range(0, len(examples), batch_size):
    rows = list(examples[start:start + batch_size])
    num_real = len(rows)
    rows += [rows[-1]] * (batch_size - num_real)
    if decoder_only:
      decoder_input_tokens = np.zeros((batch_size, input_length + target_length), np.int32)
      decoder_causal_attention = np.zeros_like(decoder_input_tokens)
      for i, row in enumerate(rows):
        decoder_input_tokens[i, 1:len(row.input_ids) + 1] = row.input_ids
        decoder_causal_attention[i, :len(row.input_ids) + 1] = 1
      batches.append(({"decoder_input_tokens": decoder_input_tokens,
                       "decoder_causal_attention": decoder_causal_attention}, num_real))
      continue
    encoder_input_tokens = np.zeros((batch_size, input_length), np.int32)
    for i, row in enumerate(rows):
      encoder_input_tokens[i, :len(row.input_ids)] = row.input_ids
    batches.append(({"encoder_input_tokens": encoder_input_tokens,
                     "decoder_input_tokens": np.zeros((batch_size, target_length), np.int32)},
                    num_real))
  return batches
