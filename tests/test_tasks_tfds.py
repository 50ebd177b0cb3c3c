"""The paper's tasks from TFDS (`spec_decode.data.tasks`: wmt_ende, cnn_dailymail), offline: TFDS's
own mock (`tfds.testing.mock_data`) stands in for the prepared datasets and records which dataset,
version and split each task asks for; a dataset not prepared is one line saying how to prepare
it, from `tasks.load_examples` and from `python -m spec_decode.infer`."""

import gin
import pytest

import shared_data
import tiny_t5
from spec_decode.t5 import vocab

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top,wrong-import-position

needs_vocabulary = pytest.mark.skipif(not tiny_t5.T5_VOCAB_FILE.is_file(),
                                      reason=shared_data.missing("the T5 vocabulary"))
LENGTHS = {"inputs": 64, "targets": 32}
# Two examples per task, under the TFDS dataset's own feature names.
EXAMPLES = {
    "wmt_ende": [{"en": "The house is wonderful.", "de": "Das Haus ist wunderbar."},
                 {"en": "Good morning.", "de": "Guten Morgen."}],
    "cnn_dailymail": [{"article": "A cat sat on a mat all day.", "highlights": "Cat sits.\nMat.",
                       "id": "a", "publisher": "cnn"},
                      {"article": "Rain fell in London.", "highlights": "Rain.",
                       "id": "b", "publisher": "dm"}],
}
# What T5 1.0 was trained with (its Hugging Face config's task_specific_params).
T5_PREFIXES = {"wmt_ende": "translate English to German: ", "cnn_dailymail": "summarize: "}
INPUT_KEY = {"wmt_ende": "en", "cnn_dailymail": "article"}
TARGET_KEY = {"wmt_ende": "de", "cnn_dailymail": "highlights"}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _mock(task_name, requests):
  """TFDS mocked to serve EXAMPLES[task_name], recording (dataset, config, version, split)."""

  def as_dataset(builder, split, **kwargs):
    del kwargs
    config = builder.builder_config.name if builder.builder_config else None
    requests.append((builder.name, config, str(builder.version), str(split)))
    rows = EXAMPLES[task_name]
    return tf.data.Dataset.from_tensor_slices({key: [row[key] for row in rows]
                                               for key in rows[0]})

  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


@needs_vocabulary
@pytest.mark.parametrize("task_name, split, dataset", [
    ("wmt_ende", "test", ("wmt_t2t_translate", "de-en", "1.0.0", "test")),  # newstest2014
    ("wmt_ende", "validation", ("wmt_t2t_translate", "de-en", "1.0.0", "validation")),
    ("cnn_dailymail", "test", ("cnn_dailymail", None, "3.4.0", "test")),
])
def test_task_reads_t5s_tfds_dataset(task_name, split, dataset, tmp_path):
  gin.parse_config(["from __gin__ import dynamic_registration",
                    "from spec_decode.data import tasks",
                    f"tasks.t5_vocabulary_file.path = '{tiny_t5.T5_VOCAB_FILE}'",
                    f"tasks.tfds_data_dir.path = '{tmp_path}'"])
  requests = []
  with _mock(task_name, requests):
    examples = tasks.load_examples(task_name, split, LENGTHS)
  assert requests == [dataset]
  t5 = vocab.t5_vocabulary(str(tiny_t5.T5_VOCAB_FILE))
  assert len(examples) == len(EXAMPLES[task_name])
  for example, row in zip(examples, EXAMPLES[task_name]):
    source = T5_PREFIXES[task_name] + row[INPUT_KEY[task_name]]
    assert example["inputs_pretokenized"] == source
    assert example["targets_pretokenized"] == row[TARGET_KEY[task_name]]
    assert example["inputs"] == t5.encode(source) + [1]
    assert example["targets"] == t5.encode(row[TARGET_KEY[task_name]]) + [1]


@pytest.mark.parametrize("task_name, tfds_name", [
    ("wmt_ende", "wmt_t2t_translate/de-en:1.0.0"), ("cnn_dailymail", "cnn_dailymail:3.4.0")])
def test_a_dataset_not_prepared_says_how_to_prepare_it(task_name, tfds_name, tmp_path):
  gin.parse_config(["from __gin__ import dynamic_registration",
                    "from spec_decode.data import tasks",
                    f"tasks.tfds_data_dir.path = '{tmp_path}'"])
  with pytest.raises(FileNotFoundError) as error:
    tasks.load_examples(task_name, "test", LENGTHS, num_examples=1)
  message = str(error.value)
  assert "\n" not in message
  assert f"`tfds build {tfds_name} --data_dir={tmp_path}`" in message
  assert f"'{task_name}_files'" in message and f"{task_name}_files" in tasks.TASK_NAMES


@needs_vocabulary
def test_infer_names_a_dataset_not_prepared_in_one_line(tmp_path, capsys):
  from spec_decode import infer  # pylint: disable=g-import-not-at-top
  target, draft = tiny_t5.write_pair(tmp_path)
  run_gin = tiny_t5.write_run_gin(tmp_path / "run.gin", target, draft, tiny_t5.T5_VOCAB_FILE, 100,
                                  {"inputs": 16, "targets": 8}, batch_size=1)
  out = tmp_path / "out"
  status = infer.main([f"--gin_file={run_gin}", "--gin.MIXTURE_OR_TASK_NAME='wmt_ende'",
                       f"--gin.INFER_OUTPUT_DIR='{out}'",
                       f"--tfds_data_dir={tmp_path / 'tfds'}"])
  stderr = capsys.readouterr().err.strip().splitlines()
  assert status == 2
  assert stderr == [f"spec_decode.infer: error: TFDS dataset wmt_t2t_translate/de-en:1.0.0 "
                    f"(task 'wmt_ende') is not prepared in {tmp_path / 'tfds'}: prepare it with "
                    f"`tfds build wmt_t2t_translate/de-en:1.0.0 --data_dir={tmp_path / 'tfds'}`, "
                    f"or give --tfds_data_dir where it is prepared (task 'wmt_ende_files' reads "
                    f"local text files instead)"]
  assert not out.exists()


@needs_vocabulary
def test_a_tfds_directory_without_a_tfds_task_cannot_take_effect(tmp_path, capsys):
  from spec_decode import infer  # pylint: disable=g-import-not-at-top
  target, draft = tiny_t5.write_pair(tmp_path)
  run_gin = tiny_t5.write_run_gin(tmp_path / "run.gin", target, draft, tiny_t5.T5_VOCAB_FILE, 100,
                                  {"inputs": 16, "targets": 8}, batch_size=1)
  status = infer.main([f"--gin_file={run_gin}", "--gin.MIXTURE_OR_TASK_NAME='wmt_ende_files'",
                       f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'",
                       f"--tfds_data_dir={tmp_path / 'tfds'}"])
  assert status == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "spec_decode.infer: error: gin binding of tasks.tfds_data_dir.{path} cannot take effect: "
      "nothing this run calls uses it"]
