"""seqio tasks of the paper's experiments, registered on import.

This is the only module that imports seqio (and so TensorFlow); nothing else needs it.

Tasks (features 'inputs' and 'targets', each tokenized, EOS appended, trimmed to the requested
sequence lengths with EOS kept; the untokenized text stays in '*_pretokenized'):
  wmt_ende        'translate English to German: ' + English -> German; splits train, validation,
                  test from {data_dir}/wmt_ende/{train,dev,test}.{en,de} (test: newstest2014)
  multi30k_ende   the same from multi30k/{train,val,test}.{en,de}
  tatoeba_ende    the same, split test, from tatoeba_ende/tatoeba.{en,de}
  cnn_dailymail   'summarize: ' + article -> highlights (newline-separated), split validation,
                  from cnn_dailymail/validation_1000.jsonl
use the T5 vocabulary (SentencePiece cc_all.32000 with 100 extra ids, as T5.1.1 checkpoints);
`<name>_demo` variants of the three translation tasks use the demo pair's vocabulary
(spec_decode/assets/demo/spm_ende_8k.model, no extra ids).

Paths are read when a dataset is built, not at import, so the bindings of a config that
imports `spec_decode.tasks` apply: `tasks.data_dir.path` (default: `paths.data_root()`, from the
environment), `tasks.t5_vocabulary_file.path` (default: `paths.t5_vocabulary()`, T5X's copy
unless the environment names another). A missing data directory or file is a FileNotFoundError
naming it.

`load_examples(name, split, task_feature_lengths, num_examples)` reads a task (or mixture) in
order as plain Python: a list of dicts with 'inputs'/'targets' (lists of ids) and
'inputs_pretokenized'/'targets_pretokenized' (str).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any, Callable, Mapping

import seqio
import tensorflow as tf

from spec_decode import corpora
from spec_decode import gin_utils
from spec_decode import paths

SUMMARIZE_PREFIX = "summarize: "
T5_EXTRA_IDS = 100
DEMO_VOCABULARY_FILE = paths.DEMO_ASSETS / "spm_ende_8k.model"


def data_dir(path: str | None = None) -> pathlib.Path:
  """The data root: `path`, else `paths.data_root()`."""
  return paths.data_root(path)


def t5_vocabulary_file(path: str | None = None) -> str:
  """The T5 SentencePiece model: `path`, else `paths.t5_vocabulary()`."""
  file = paths.t5_vocabulary(path)
  if not file.startswith("gs://") and not pathlib.Path(file).is_file():
    raise FileNotFoundError(f"T5 SentencePiece model not found: {file} (bind "
                            "tasks.t5_vocabulary_file.path)")
  return file


class LazyPathSentencePieceVocabulary(seqio.SentencePieceVocabulary):
  """A seqio.SentencePieceVocabulary whose model file is asked of `find_file()` when first
  needed, so that the gin binding in force then decides it (seqio loads its model lazily and
  reads the path it keeps in `_sentencepiece_model_file`)."""

  def __init__(self, find_file: Callable[[], str], extra_ids: int = 0):
    super().__init__(sentencepiece_model_file="", extra_ids=extra_ids)
    self._find_file = find_file

  def _resolve(self) -> None:
    if not self._sentencepiece_model_file:
      self._sentencepiece_model_file = self._find_file()

  @property
  def sentencepiece_model_file(self) -> str:
    self._resolve()
    return self._sentencepiece_model_file

  def _model_context(self):
    self._resolve()
    return super()._model_context()


def _output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  return {"inputs": seqio.Feature(vocabulary, add_eos=True),
          "targets": seqio.Feature(vocabulary, add_eos=True)}


def _parallel_text(prefix_by_split: Mapping[str, str], split: str, shuffle_files: bool,
                   seed: int | None = None) -> tf.data.Dataset:
  """{'inputs': English, 'targets': German} of the corpus `prefix_by_split[split]` (a file
  prefix under the data root)."""
  del shuffle_files, seed  # one file per side
  prefix = gin_utils.configured(data_dir)() / prefix_by_split[split]
  for side in ("en", "de"):
    if not pathlib.Path(f"{prefix}.{side}").is_file():
      raise FileNotFoundError(f"data file not found: {prefix}.{side}")
  sources, targets = corpora.read_parallel([str(prefix)])
  return tf.data.Dataset.from_tensor_slices({"inputs": sources, "targets": targets})


def _cnn_dailymail(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del split, shuffle_files, seed  # one split
  path = gin_utils.configured(data_dir)() / "cnn_dailymail" / "validation_1000.jsonl"
  if not path.is_file():
    raise FileNotFoundError(f"data file not found: {path}")
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return tf.data.Dataset.from_tensor_slices({"inputs": [row["article"] for row in rows],
                                             "targets": [row["highlights"] for row in rows]})


def _prefix_inputs(dataset: tf.data.Dataset, prefix: str) -> tf.data.Dataset:
  return dataset.map(lambda ex: {**ex, "inputs": tf.strings.join([prefix, ex["inputs"]])},
                     num_parallel_calls=tf.data.AUTOTUNE)


def _register(name: str, source: seqio.DataSource, prefix: str,
              vocabulary: seqio.Vocabulary) -> None:
  if name in seqio.TaskRegistry.names():  # a re-import (e.g. importlib.reload) replaces it
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=source, output_features=_output_features(vocabulary),
      preprocessors=[functools.partial(_prefix_inputs, prefix=prefix),
                     seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                     seqio.preprocessors.append_eos_after_trim])


T5_VOCABULARY = LazyPathSentencePieceVocabulary(
    lambda: gin_utils.configured(t5_vocabulary_file)(), extra_ids=T5_EXTRA_IDS)
DEMO_VOCABULARY = LazyPathSentencePieceVocabulary(lambda: str(DEMO_VOCABULARY_FILE))

_TRANSLATION_CORPORA = {
    "wmt_ende": {"train": "wmt_ende/train", "validation": "wmt_ende/dev",
                 "test": "wmt_ende/test"},
    "multi30k_ende": {"train": "multi30k/train", "validation": "multi30k/val",
                      "test": "multi30k/test"},
    "tatoeba_ende": {"test": "tatoeba_ende/tatoeba"},
}

for _name, _corpora in _TRANSLATION_CORPORA.items():
  _source = seqio.FunctionDataSource(functools.partial(_parallel_text, _corpora),
                                     splits=list(_corpora))
  _register(_name, _source, corpora.TRANSLATE_PREFIX, T5_VOCABULARY)
  _register(f"{_name}_demo", _source, corpora.TRANSLATE_PREFIX, DEMO_VOCABULARY)
_register("cnn_dailymail", seqio.FunctionDataSource(_cnn_dailymail, splits=["validation"]),
          SUMMARIZE_PREFIX, T5_VOCABULARY)

TASK_NAMES = tuple(sorted([*_TRANSLATION_CORPORA, *(f"{n}_demo" for n in _TRANSLATION_CORPORA),
                           "cnn_dailymail"]))


def get_task(name: str) -> seqio.Task | seqio.Mixture:
  """The registered task or mixture `name`; ValueError naming the known tasks otherwise."""
  if name not in seqio.TaskRegistry.names() and name not in seqio.MixtureRegistry.names():
    raise ValueError(f"unknown seqio task or mixture {name!r} (this project registers: "
                     f"{', '.join(TASK_NAMES)})")
  return seqio.get_mixture_or_task(name)


def load_examples(name: str, split: str, task_feature_lengths: Mapping[str, int],
                  num_examples: int | None = None) -> list[dict[str, Any]]:
  """The first `num_examples` (all when None) examples of a split, in order, unshuffled."""
  task = get_task(name)
  if split not in task.splits:
    raise ValueError(f"task {name!r} has no split {split!r} (splits: {', '.join(task.splits)})")
  dataset = task.get_dataset(sequence_length=dict(task_feature_lengths), split=split,
                             shuffle=False, use_cached=False, num_epochs=1, seed=0)
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  examples = []
  for example in dataset.as_numpy_iterator():
    examples.append({
        key: (value.decode("utf-8") if isinstance(value, bytes) else value.tolist())
        for key, value in example.items()
        if key in ("inputs", "targets", "inputs_pretokenized", "targets_pretokenized")})
  return examples


def output_vocabularies(name: str) -> dict[str, seqio.Vocabulary]:
  """{'inputs': ..., 'targets': ...}: the vocabularies of a task's features."""
  task = get_task(name)
  return {feature: task.output_features[feature].vocabulary for feature in ("inputs", "targets")}
