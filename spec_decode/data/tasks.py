"""seqio tasks of the paper's experiments, registered on import.

This is the only module that imports seqio (and so TensorFlow); nothing else needs it.

Tasks (features 'inputs' and 'targets', each tokenized, EOS appended, trimmed to the requested
sequence lengths with EOS kept; the untokenized text stays in '*_pretokenized'). The paper's
two read the TFDS datasets T5 itself used, with T5's prefixes:
  wmt_ende             'translate English to German: ' + English -> German, TFDS
                       wmt_t2t_translate/de-en:1.0.0; splits train, validation (newstest2013),
                       test (newstest2014)
  cnn_dailymail        'summarize: ' + article -> highlights (newline-separated), TFDS
                       cnn_dailymail:3.4.0; splits train, validation, test
The same from local text files under the data root {data_dir}:
  wmt_ende_files       from wmt_ende/{train,dev,test}.{en,de} (test: newstest2014)
  cnn_dailymail_files  split validation, from cnn_dailymail/validation_1000.jsonl
  multi30k_ende        translation from multi30k/{train,val,test}.{en,de}
  tatoeba_ende         translation, split test, from tatoeba_ende/tatoeba.{en,de}
use the T5 vocabulary (SentencePiece cc_all.32000 with 100 extra ids, as T5 1.0 and T5.1.1
checkpoints); `wmt_ende_demo`, `multi30k_ende_demo` and `tatoeba_ende_demo` are the three
translation file tasks with the demo pair's vocabulary (spec_decode/assets/demo/spm_ende_8k.model,
no extra ids).
A language model's prompts (decoder-only models continue 'inputs'; 'targets' are the reference):
  wmt_en_prompts_demo  each English sentence of wmt_ende/{train,dev,test}.en cut after its first
                       TASK_FEATURE_LENGTHS['inputs'] tokens: those are the prompt (no EOS), the
                       rest the targets (EOS appended, trimmed); sentences no longer than a
                       prompt are left out. The demo vocabulary (the small-scale Table 3 rows).

Paths are read when a dataset is built, not at import, so the bindings of a config that
imports `spec_decode.data.tasks` apply: `tasks.data_dir.path` (default: `paths.data_root()`, from
the environment), `tasks.tfds_data_dir.path` (default: TFDS's own, $TFDS_DATA_DIR or
~/tensorflow_datasets), `tasks.t5_vocabulary_file.path` (default: `paths.t5_vocabulary()`,
T5X's copy unless the environment names another). A missing data directory or file, or a TFDS
dataset not prepared, is a FileNotFoundError naming it (and, for TFDS, how to prepare it).

`load_examples(name, split, task_feature_lengths, num_examples)` reads a task (or mixture) in
order as plain Python: a list of dicts with 'inputs'/'targets' (lists of ids) and
'inputs_pretokenized'/'targets_pretokenized' (str).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any, Callable, Mapping, NamedTuple

import seqio
import tensorflow as tf

from spec_decode.data import corpora
from spec_decode import gin_utils
from spec_decode import paths

SUMMARIZE_PREFIX = "summarize: "
T5_EXTRA_IDS = 100
DEMO_VOCABULARY_FILE = paths.DEMO_ASSETS / "spm_ende_8k.model"


def data_dir(path: str | None = None) -> pathlib.Path:
  """The data root: `path`, else `paths.data_root()`."""
  return paths.data_root(path)


def tfds_data_dir(path: str | None = None) -> str | None:
  """Where the TFDS datasets are prepared: `path`, else None (TFDS's own default)."""
  return path


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


def _cnn_dailymail_file(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
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


def _prompt_and_continuation(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
                             output_features: Mapping[str, seqio.Feature]) -> tf.data.Dataset:
  """{'text'} -> a language model's example: the first sequence_length['inputs'] tokens of the
  text, its prompt, as 'inputs' and the rest as 'targets' (with their text in
  '*_pretokenized'); texts of no more tokens than a prompt are dropped."""
  vocabulary = output_features["inputs"].vocabulary
  length = sequence_length["inputs"]

  def split(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    tokens = vocabulary.encode_tf(example["text"])
    return {"inputs": tokens[:length], "targets": tokens[length:],
            "inputs_pretokenized": vocabulary.decode_tf(tokens[:length]),
            "targets_pretokenized": vocabulary.decode_tf(tokens[length:])}

  return dataset.map(split, num_parallel_calls=tf.data.AUTOTUNE).filter(
      lambda example: tf.size(example["targets"]) > 0)


def _register_prompts(name: str, source: seqio.DataSource,
                      vocabulary: seqio.Vocabulary) -> None:
  """Registers a language model's prompt task (`_prompt_and_continuation`) reading `source`'s
  'inputs' text."""
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=source,
      output_features={"inputs": seqio.Feature(vocabulary, add_eos=False),
                       "targets": seqio.Feature(vocabulary, add_eos=True)},
      preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={"text": "inputs"}),
                     _prompt_and_continuation, seqio.preprocessors.append_eos_after_trim])


def _register(name: str, source: seqio.DataSource, prefix: str, vocabulary: seqio.Vocabulary,
              key_map: Mapping[str, str] | None = None) -> None:
  """Registers a task reading `source`; `key_map` names the source's features that become
  'inputs' and 'targets' (a TFDS dataset's own names)."""
  if name in seqio.TaskRegistry.names():  # a re-import (e.g. importlib.reload) replaces it
    seqio.TaskRegistry.remove(name)
  rekey = [functools.partial(seqio.preprocessors.rekey, key_map=dict(key_map))] if key_map else []
  seqio.TaskRegistry.add(
      name, source=source, output_features=_output_features(vocabulary),
      preprocessors=[*rekey, functools.partial(_prefix_inputs, prefix=prefix),
                     seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                     seqio.preprocessors.append_eos_after_trim])


T5_VOCABULARY = LazyPathSentencePieceVocabulary(
    lambda: gin_utils.configured(t5_vocabulary_file)(), extra_ids=T5_EXTRA_IDS)
DEMO_VOCABULARY = LazyPathSentencePieceVocabulary(lambda: str(DEMO_VOCABULARY_FILE))

class TfdsTask(NamedTuple):
  """A task of a TFDS dataset: its `tfds_name` (name/config:version), the features that become
  'inputs' and 'targets' (`key_map`), the input `prefix`, and the task reading the same text from
  local files (`files_task`)."""
  tfds_name: str
  key_map: Mapping[str, str]
  prefix: str
  files_task: str


# T5's own tasks of these datasets (t5.data's wmt_t2t_ende_v003 and cnn_dailymail_v002).
TFDS_TASKS = {
    "wmt_ende": TfdsTask("wmt_t2t_translate/de-en:1.0.0", {"inputs": "en", "targets": "de"},
                         corpora.TRANSLATE_PREFIX, "wmt_ende_files"),
    "cnn_dailymail": TfdsTask("cnn_dailymail:3.4.0",
                              {"inputs": "article", "targets": "highlights"}, SUMMARIZE_PREFIX,
                              "cnn_dailymail_files"),
}
TFDS_SPLITS = ("train", "validation", "test")

# File task: (its twin with the demo pair's vocabulary, the corpus prefix under the data root by
# split).
_TRANSLATION_CORPORA = {
    TFDS_TASKS["wmt_ende"].files_task: ("wmt_ende_demo", {"train": "wmt_ende/train",
                                                          "validation": "wmt_ende/dev",
                                                          "test": "wmt_ende/test"}),
    "multi30k_ende": ("multi30k_ende_demo", {"train": "multi30k/train",
                                             "validation": "multi30k/val",
                                             "test": "multi30k/test"}),
    "tatoeba_ende": ("tatoeba_ende_demo", {"test": "tatoeba_ende/tatoeba"}),
}

for _name, _task in TFDS_TASKS.items():
  # read_only: a dataset not prepared is an error saying how to prepare it (`load_examples`),
  # never a download of the whole corpus in the middle of a run.
  _register(_name, seqio.TfdsDataSource(tfds_name=_task.tfds_name, splits=TFDS_SPLITS,
                                        read_only=True),
            _task.prefix, T5_VOCABULARY, key_map=_task.key_map)
for _name, (_demo_name, _corpora) in _TRANSLATION_CORPORA.items():
  _source = seqio.FunctionDataSource(functools.partial(_parallel_text, _corpora),
                                     splits=list(_corpora))
  _register(_name, _source, corpora.TRANSLATE_PREFIX, T5_VOCABULARY)
  _register(_demo_name, _source, corpora.TRANSLATE_PREFIX, DEMO_VOCABULARY)
_register(TFDS_TASKS["cnn_dailymail"].files_task,
          seqio.FunctionDataSource(_cnn_dailymail_file, splits=["validation"]),
          SUMMARIZE_PREFIX, T5_VOCABULARY)
_WMT_CORPORA = _TRANSLATION_CORPORA[TFDS_TASKS["wmt_ende"].files_task][1]
LANGUAGE_MODEL_TASKS = ("wmt_en_prompts_demo",)
_register_prompts(LANGUAGE_MODEL_TASKS[0],
                  seqio.FunctionDataSource(functools.partial(_parallel_text, _WMT_CORPORA),
                                           splits=list(_WMT_CORPORA)),
                  DEMO_VOCABULARY)

TASK_NAMES = tuple(sorted([*TFDS_TASKS, *_TRANSLATION_CORPORA,
                           *(demo for demo, _ in _TRANSLATION_CORPORA.values()),
                           TFDS_TASKS["cnn_dailymail"].files_task, *LANGUAGE_MODEL_TASKS]))


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
  dataset = _get_dataset(task, split, task_feature_lengths)
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  examples = []
  for example in dataset.as_numpy_iterator():
    examples.append({
        key: (value.decode("utf-8") if isinstance(value, bytes) else value.tolist())
        for key, value in example.items()
        if key in ("inputs", "targets", "inputs_pretokenized", "targets_pretokenized")})
  return examples


def _get_dataset(task: seqio.Task | seqio.Mixture, split: str,
                 task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
  """The split, in order, read once (nothing cached); for a TFDS task, from `tfds_data_dir`
  where one is bound."""
  source = getattr(task, "source", None)
  reads_tfds = isinstance(source, seqio.TfdsDataSource)
  directory = gin_utils.configured(tfds_data_dir)()
  if reads_tfds and directory is not None:
    seqio.set_tfds_data_dir_override(directory)
  try:
    return task.get_dataset(sequence_length=dict(task_feature_lengths), split=split,
                            shuffle=False, use_cached=False, num_epochs=1, seed=0,
                            try_in_mem_cache=False)
  except AssertionError:  # TFDS's "could not find data" for a dataset not prepared
    if not reads_tfds:
      raise
    name = source.tfds_dataset.name
    where = directory or "TFDS's data directory ($TFDS_DATA_DIR, default ~/tensorflow_datasets)"
    to = f" --data_dir={directory}" if directory else ""
    raise FileNotFoundError(
        f"TFDS dataset {name} (task {task.name!r}) is not prepared in {where}: prepare it with "
        f"`tfds build {name}{to}`, or give --tfds_data_dir where it is prepared (task "
        f"'{TFDS_TASKS[task.name].files_task}' reads local text files instead)") from None


def settings_read_by(name: str) -> list[Callable[..., Any]]:
  """The functions of this module whose gin bindings reading the task or mixture `name` uses
  (what a run reading it reaches, for `gin_utils.check_bindings_take_effect`): where its data is
  (`tfds_data_dir` for a TFDS task, `data_dir` for a file task) and `t5_vocabulary_file` where
  it uses the T5 vocabulary."""
  task = get_task(name)
  settings = []
  for member in getattr(task, "tasks", [task]):
    reads_tfds = isinstance(member.source, seqio.TfdsDataSource)
    settings.append(tfds_data_dir if reads_tfds else data_dir)
    if member.output_features["inputs"].vocabulary is T5_VOCABULARY:
      settings.append(t5_vocabulary_file)
  return list(dict.fromkeys(settings))


def output_vocabularies(name: str) -> dict[str, seqio.Vocabulary]:
  """{'inputs': ..., 'targets': ...}: the vocabularies of a task's features."""
  task = get_task(name)
  return {feature: task.output_features[feature].vocabulary for feature in ("inputs", "targets")}
