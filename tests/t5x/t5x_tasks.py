"""seqio task 'ende_t5x_test', registered on import (the tests' gin files import it): NUM_EXAMPLES
English sentences to translate to German, with the vocabulary of t5x_setup (as
seqio.SentencePieceVocabulary, which T5X's vocabulary check compares with the model's). The
models under test are random, so the text needs no corpus: any sentences the vocabulary
encodes do. 'ende_t5x_train_test' has the same sentences with German targets, for training
runs."""

import seqio
import tensorflow as tf

import t5x_setup

TASK_NAME = "ende_t5x_test"
# Batches of 4: one full, one padded by T5X.
SENTENCES = ("The house is wonderful.", "I am going to the station.",
             "She reads a book every evening.", "We did not see the train.",
             "Where is the nearest bakery?", "It rained all day yesterday.")
NUM_EXAMPLES = len(SENTENCES)


def _pairs(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del split, shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": ["translate English to German: " + line for line in SENTENCES],
       # No references: the tests compare runs with each other, and exact_match only needs
       # something to score.
       "targets": [""] * NUM_EXAMPLES})


def exact_match(targets: list[str], predictions: list[str]) -> dict[str, float]:
  """A metric, so that t5x.eval has something to evaluate."""
  return {"exact_match": sum(map(str.__eq__, targets, predictions)) / max(len(targets), 1)}


_VOCABULARY = seqio.SentencePieceVocabulary(str(t5x_setup.VOCAB_FILE),
                                            extra_ids=t5x_setup.T5_EXTRA_IDS)
if TASK_NAME in seqio.TaskRegistry.names():
  seqio.TaskRegistry.remove(TASK_NAME)
seqio.TaskRegistry.add(
    TASK_NAME, source=seqio.FunctionDataSource(_pairs, splits=["test"]),
    preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features={name: seqio.Feature(_VOCABULARY, add_eos=True)
                     for name in ("inputs", "targets")},
    metric_fns=[exact_match])

# 'ende_t5x_train_test': the same sentences with German targets, in a 'train' and a
# 'validation' split, for t5x.train runs (tests/t5x/test_t5x_distillation.py).
TRAIN_TASK_NAME = "ende_t5x_train_test"
TRAIN_TARGETS = ("Das Haus ist wunderbar.", "Ich gehe zum Bahnhof.",
                 "Sie liest jeden Abend ein Buch.", "Wir haben den Zug nicht gesehen.",
                 "Wo ist die nächste Bäckerei?", "Gestern hat es den ganzen Tag geregnet.")


def _train_pairs(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del split, shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": ["translate English to German: " + line for line in SENTENCES],
       "targets": list(TRAIN_TARGETS)})


if TRAIN_TASK_NAME in seqio.TaskRegistry.names():
  seqio.TaskRegistry.remove(TRAIN_TASK_NAME)
seqio.TaskRegistry.add(
    TRAIN_TASK_NAME,
    source=seqio.FunctionDataSource(_train_pairs, splits=["train", "validation"]),
    preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features={name: seqio.Feature(_VOCABULARY, add_eos=True)
                     for name in ("inputs", "targets")},
    metric_fns=[])
