"""seqio task 'tatoeba_ende_t5x_test', registered on import (the tests' gin files import it):
the first NUM_EXAMPLES Tatoeba English->German pairs of ../shared, T5 vocabulary (as
seqio.SentencePieceVocabulary, which T5X's vocabulary check compares with the model's)."""

import pathlib

import seqio
import tensorflow as tf

TASK_NAME = "tatoeba_ende_t5x_test"
NUM_EXAMPLES = 6  # batches of 4: one full, one padded by T5X
SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared"
VOCAB_FILE = SHARED / "vocab" / "t5_cc_all_32000.model"
T5_EXTRA_IDS = 100


def _pairs(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del split, shuffle_files, seed
  corpus = SHARED / "data" / "tatoeba_ende" / "tatoeba"
  english, german = ([line.rstrip("\n") for line, _ in
                      zip(open(f"{corpus}.{language}", encoding="utf-8"), range(NUM_EXAMPLES))]
                     for language in ("en", "de"))
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": ["translate English to German: " + line for line in english],
       "targets": german})


def exact_match(targets: list[str], predictions: list[str]) -> dict[str, float]:
  """A metric, so that t5x.eval has something to evaluate."""
  return {"exact_match": sum(map(str.__eq__, targets, predictions)) / max(len(targets), 1)}


_VOCABULARY = seqio.SentencePieceVocabulary(str(VOCAB_FILE), extra_ids=T5_EXTRA_IDS)
if TASK_NAME in seqio.TaskRegistry.names():
  seqio.TaskRegistry.remove(TASK_NAME)
seqio.TaskRegistry.add(
    TASK_NAME, source=seqio.FunctionDataSource(_pairs, splits=["test"]),
    preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features={name: seqio.Feature(_VOCABULARY, add_eos=True)
                     for name in ("inputs", "targets")},
    metric_fns=[exact_match])
