"""`python -m spec_decode.infer` end to end on tiny random T5s, and its one-line errors.

The end-to-end runs decode 20 newstest2014 sentences from ../shared (skipped without it): once
from the seqio task with T5X checkpoints, once from a text file with Hugging Face folders. Both
runs' subprocesses share a JAX compilation cache, so the second one compiles nothing new.
"""

import functools
import json
import os
import pathlib
import subprocess
import sys
import time

import gin
import numpy as np
import pytest

import tiny_t5
from spec_decode import infer
from spec_decode.infer import inputs as infer_inputs
from spec_decode.infer import outputs as infer_outputs
from spec_decode import models
from spec_decode.t5 import network
from spec_decode.t5 import vocab

NUM_EXAMPLES = 20
PREFIX = "translate English to German: "
# newstest2014 under the real text (the `real_text` fixture, tests/conftest.py).
WMT_TEST = "wmt_ende/test"


def _run_gin(directory: pathlib.Path, target: tiny_t5.TinyModel, draft: tiny_t5.TinyModel,
             vocabulary_file: pathlib.Path, extra_ids: int, name: str = "run.gin") -> str:
  return tiny_t5.write_run_gin(directory / name, target, draft, vocabulary_file, extra_ids,
                               {"inputs": 48, "targets": 12}, batch_size=8,
                               extra=f"INPUT_PREFIX = '{PREFIX}'")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  directory = tmp_path_factory.mktemp("infer")
  target, draft = tiny_t5.write_pair(directory)
  return directory, target, draft, _run_gin(directory, target, draft, tiny_t5.T5_VOCAB_FILE,
                                            extra_ids=100)


@pytest.fixture(scope="module")
def t5_style_run_gin(setup) -> str:
  """`setup`'s run with seqio's test SentencePiece model as its T5-style vocabulary: for runs
  that fail on their settings before reading any text (and so run without the data folder)."""
  directory, target, draft, _ = setup
  return _run_gin(directory, target, draft, tiny_t5.T5_STYLE_VOCAB_FILE, extra_ids=100,
                  name="run_t5_style.gin")


def _subprocess(args, cache_dir):
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return subprocess.run([sys.executable, "-m", "spec_decode.infer", *args], env=env,
                        cwd=tiny_t5.REPO_ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def end_to_end(setup, tmp_path_factory, real_text):
  """Outputs of the task/T5X run and the text-file/Hugging Face run."""
  directory, target, draft, run_gin = setup
  cache = tmp_path_factory.mktemp("jax_cache")
  outputs = {}
  common = [f"--gin_file={run_gin}", f"--gin.NUM_EXAMPLES={NUM_EXAMPLES}"]
  task_run = _subprocess(common + [
      "--gin.MIXTURE_OR_TASK_NAME='wmt_ende_files'", f"--gin.INFER_OUTPUT_DIR='{directory / 'task'}'"],
      cache)
  text_file = directory / "test20.en"
  with open(real_text / f"{WMT_TEST}.en", encoding="utf-8") as f:
    text_file.write_text("".join(next(f) for _ in range(NUM_EXAMPLES)), encoding="utf-8")
  text_run = _subprocess(common + [
      f"--input_file={text_file}", f"--gin.CHECKPOINT_PATH='{target.hf_folder}'",
      f"--gin.DRAFT_CHECKPOINT_PATH='{draft.hf_folder}'",
      f"--gin.INFER_OUTPUT_DIR='{directory / 'text'}'"], cache)
  for name, run in (("task", task_run), ("text", text_run)):
    assert run.returncode == 0, f"{name} run failed:\n{run.stdout}\n{run.stderr}"
    out = directory / name
    records = [json.loads(line) for line in
               (out / infer_outputs.PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()]
    summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
    outputs[name] = (run.stdout, records, summary)
  return outputs


def _lines(path: pathlib.Path) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [next(f).rstrip("\n") for _ in range(NUM_EXAMPLES)]


@pytest.mark.slow
@pytest.mark.newest
@pytest.mark.parametrize("run", ["task", "text"])
def test_end_to_end_predictions_and_summary(end_to_end, real_text, run):
  stdout, records, summary = end_to_end[run]
  english = _lines(real_text / f"{WMT_TEST}.en")
  assert len(records) == NUM_EXAMPLES
  assert [r["inputs"] for r in records] == [PREFIX + line for line in english]
  if run == "task":
    assert [r["target"] for r in records] == _lines(real_text / f"{WMT_TEST}.de")
  else:
    assert all("target" not in r for r in records)
  for record in records:
    assert isinstance(record["prediction"], str) and isinstance(record["score"], float)
    stats = record["stats"]
    assert set(stats) >= {"target_calls", "draft_calls", "accepted_tokens", "generated_tokens",
                          "alpha"}
    assert 1 <= stats["generated_tokens"] <= 12
    assert stats["accepted_tokens"] <= stats["drafted_tokens"] == 3 * stats["target_calls"]
    # Greedy speculative decoding reproduces the target alone, token for token.
    assert record["identical"] is True
    assert record["baseline_prediction"] == record["prediction"]

  assert summary["num_examples"] == NUM_EXAMPLES and summary["batch_size"] == 8
  assert summary["decode_settings"]["gamma"] == 3
  assert summary["decode_settings"]["temperature"] == 0.0
  for name in ("generated_tokens", "target_calls", "accepted_tokens", "draft_calls"):
    assert summary[name] == sum(r["stats"][name] for r in records), name
  assert summary["alpha"] == pytest.approx(
      sum(r["stats"]["acceptance_sum"] for r in records)
      / sum(r["stats"]["verified_positions"] for r in records))
  assert summary["tokens_per_target_call"] == pytest.approx(
      summary["generated_tokens"] / summary["target_calls"])
  assert summary["speedup"] == pytest.approx(
      summary["baseline"]["wall_seconds"] / summary["wall_seconds"])
  assert summary["identical_outputs"] is True and summary["num_identical"] == NUM_EXAMPLES
  assert "identical output: yes" in stdout and "tokens per target call" in stdout


@pytest.mark.slow
@pytest.mark.newest
def test_task_and_text_file_runs_agree(end_to_end):
  # Same weights (T5X vs Hugging Face files) and same ids (seqio vs our tokenizer).
  assert ([r["prediction"] for r in end_to_end["task"][1]]
          == [r["prediction"] for r in end_to_end["text"][1]])


def test_text_inputs_are_prefixed_trimmed_and_eos_terminated(tmp_path):
  vocabulary = vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))
  module = network.Transformer(tiny_t5.tiny_config(8000, tiny_t5.SHRINK))
  model = models.EncoderDecoderModel(module, vocabulary, vocabulary)
  texts = ["Hello.", "A much longer sentence that will not fit into eight tokens at all."]
  cfg = infer.DatasetConfig(texts=texts, input_prefix="p: ",
                            task_feature_lengths={"inputs": 8, "targets": 4}, batch_size=3)
  examples = infer_inputs.read_examples(cfg, model)
  assert [e.inputs for e in examples] == ["p: " + t for t in texts]
  for example, text in zip(examples, texts):
    expected = vocabulary.encode("p: " + text)[:7] + [1]
    assert example.input_ids == expected and example.target is None
  (batch, num_real), = infer_inputs.make_batches(examples, 3, 8, 4)
  assert num_real == 2 and batch["encoder_input_tokens"].shape == (3, 8)
  np.testing.assert_array_equal(batch["encoder_input_tokens"][2], batch["encoder_input_tokens"][1])
  assert not batch["decoder_input_tokens"].any()


@pytest.fixture
def run_main(capsys):
  """infer.main in this process: (exit status, stderr lines)."""
  return functools.partial(tiny_t5.run_infer_main, capsys=capsys)


def _assert_one_line_error(status, stderr, message, output_dir):
  assert status == 2
  assert len(stderr) == 1 and stderr[0].startswith("spec_decode.infer: error: "), stderr
  assert message in stderr[0]
  assert not output_dir.exists()


def test_unset_required_macro(setup, run_main, tmp_path):
  directory, target, _, _ = setup
  run_gin = directory / "no_checkpoint.gin"
  run_gin.write_text((directory / "run.gin").read_text().replace("\nCHECKPOINT_PATH =", "\n# "))
  status, stderr = run_main([f"--gin_file={run_gin}", "--text=Hello",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, "required gin macro CHECKPOINT_PATH is not set",
                         tmp_path / "out")


def test_unknown_task(real_text, setup, run_main, tmp_path):
  del real_text  # its run reads the T5 vocabulary (and tasks) as tests/conftest.py sets them
  status, stderr = run_main([f"--gin_file={setup[3]}", "--gin.MIXTURE_OR_TASK_NAME='wmt_xx'",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, "unknown seqio task or mixture 'wmt_xx'",
                         tmp_path / "out")


def test_task_with_another_vocabulary(real_text, setup, run_main, tmp_path):
  del real_text  # its run reads the T5 vocabulary (and tasks) as tests/conftest.py sets them
  status, stderr = run_main([f"--gin_file={setup[3]}",
                             "--gin.MIXTURE_OR_TASK_NAME='wmt_ende_demo'",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, "task 'wmt_ende_demo' and the model have different "
                                         "inputs vocabularies", tmp_path / "out")


def test_draft_with_another_vocabulary(real_text, setup, run_main, tmp_path):
  del real_text  # its run reads the T5 vocabulary (and tasks) as tests/conftest.py sets them
  directory = setup[0]
  draft_8k = tiny_t5.write_model(tmp_path / "draft8k", "draft",
                                 tiny_t5.tiny_config(8000, tiny_t5.DRAFT_SHRINK), seed=3)
  status, stderr = run_main([
      f"--gin_file={setup[3]}", "--text=Hello",
      f"--gin.DRAFT_CHECKPOINT_PATH='{draft_8k.t5x_checkpoint}'",
      f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, "target and draft vocabularies differ: the target has "
                                         "32128 ids, the draft 8000", tmp_path / "out")
  assert directory.exists()


@pytest.mark.slow
@pytest.mark.newest
def test_missing_checkpoint_exits_nonzero(real_text, setup, tmp_path):
  del real_text  # its run reads the T5 vocabulary (and tasks) as tests/conftest.py sets them
  run = subprocess.run(
      [sys.executable, "-m", "spec_decode.infer", f"--gin_file={setup[3]}", "--text=Hello",
       f"--gin.CHECKPOINT_PATH='{tmp_path / 'nowhere'}'",
       f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"],
      cwd=tiny_t5.REPO_ROOT, capture_output=True, text=True, timeout=300)
  stderr = run.stderr.strip().splitlines()
  _assert_one_line_error(run.returncode, stderr,
                         f"checkpoint not found: {tmp_path / 'nowhere'}", tmp_path / "out")


SOURCES = {  # task -> (split, source file, target file or jsonl key)
    "wmt_ende_files": ("test", "wmt_ende/test.en", "wmt_ende/test.de"),
    "wmt_ende_demo": ("validation", "wmt_ende/dev.en", "wmt_ende/dev.de"),
    "multi30k_ende": ("train", "multi30k/train.en", "multi30k/train.de"),
    "multi30k_ende_demo": ("test", "multi30k/test.en", "multi30k/test.de"),
    "tatoeba_ende": ("test", "tatoeba_ende/tatoeba.en", "tatoeba_ende/tatoeba.de"),
    "tatoeba_ende_demo": ("test", "tatoeba_ende/tatoeba.en", "tatoeba_ende/tatoeba.de"),
    "cnn_dailymail_files": ("validation", "cnn_dailymail/validation_1000.jsonl", None),
}


@pytest.mark.parametrize("task", sorted(SOURCES))
def test_task_reads_its_files(real_text, task):
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top (TensorFlow)
  split, source, target = SOURCES[task]
  (example,) = tasks.load_examples(task, split, {"inputs": 16, "targets": 8}, num_examples=1)
  data = real_text
  if target is None:
    row = json.loads((data / source).read_text(encoding="utf-8").split("\n")[0])
    first_input, first_target = "summarize: " + row["article"], row["highlights"]
  else:
    first_input = PREFIX + (data / source).read_text(encoding="utf-8").split("\n")[0]
    first_target = (data / target).read_text(encoding="utf-8").split("\n")[0]
  assert example["inputs_pretokenized"] == first_input
  assert example["targets_pretokenized"] == first_target
  vocabulary = vocab.SentencePieceVocabulary(
      str(tiny_t5.DEMO_VOCAB_FILE)) if task.endswith("_demo") else vocab.t5_vocabulary(
          str(tiny_t5.T5_VOCAB_FILE))
  assert example["inputs"] == vocabulary.encode(first_input)[:15] + [1]
  assert example["targets"] == vocabulary.encode(first_target)[:7] + [1]


def test_language_model_prompt_task_cuts_sentences_after_the_prompt(real_text):
  """wmt_en_prompts_demo: each English test sentence longer than the prompt length, its first
  tokens the prompt (no EOS), the rest the targets (EOS appended, trimmed); shorter ones
  left out."""
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top (TensorFlow)
  examples = tasks.load_examples("wmt_en_prompts_demo", "test", {"inputs": 8, "targets": 6},
                                 num_examples=50)
  vocabulary = vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))
  sentences = (real_text / "wmt_ende/test.en").read_text(encoding="utf-8").split("\n")
  expected = [ids for ids in map(vocabulary.encode, sentences) if len(ids) > 8][:50]
  assert len(expected) == 50 and any(len(vocabulary.encode(s)) <= 8 for s in sentences[:60])
  for example, ids in zip(examples, expected):
    assert example["inputs"] == ids[:8]
    assert example["targets"] == ids[8:13] + [1]
    assert example["inputs_pretokenized"] == vocabulary.decode(ids[:8])


def test_task_errors_name_the_problem(real_text, tmp_path):
  del real_text  # tatoeba_ende's files, through the data root tests/conftest.py sets
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top (TensorFlow)
  with pytest.raises(ValueError, match="task 'tatoeba_ende' has no split 'train'"):
    tasks.load_examples("tatoeba_ende", "train", {"inputs": 8, "targets": 8})
  gin.clear_config()
  try:
    gin.parse_config(["from __gin__ import dynamic_registration",
                      "from spec_decode.data import tasks",
                      f"tasks.data_dir.path = '{tmp_path / 'missing'}'"])
    with pytest.raises(FileNotFoundError, match="data directory not found: .*missing"):
      tasks.load_examples("wmt_ende_files", "test", {"inputs": 8, "targets": 8}, num_examples=1)
  finally:
    gin.clear_config()


@pytest.mark.slow
def test_timing_rounds_time_both_decoders_side_by_side(real_text, setup, run_main, tmp_path):
  del real_text  # its run reads the T5 vocabulary (and tasks) as tests/conftest.py sets them
  out = tmp_path / "out"
  status, stderr = run_main([f"--gin_file={setup[3]}", "--text=Hello", "--text=Good morning",
                             "--gin.TIMING_ROUNDS=2", f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 0, stderr
  summary = json.loads((out / "summary.json").read_text())
  timed = summary["side_by_side"]
  assert timed["rounds"] == 2 and timed["decoder"] > 0 and timed["baseline"] > 0
  assert summary["speedup"] == pytest.approx(timed["baseline"] / timed["decoder"])
  assert summary["speedup_one_pass"] == pytest.approx(
      summary["baseline"]["wall_seconds"] / summary["wall_seconds"])
  assert summary["identical_outputs"] is True


def test_an_unreachable_gs_checkpoint_is_one_line_after_a_bounded_wait(
    real_text, setup, run_main, tmp_path, unreachable_gcs):
  del real_text  # its run reads the T5 vocabulary as tests/conftest.py sets it
  start = time.monotonic()
  status, stderr = run_main([f"--gin_file={setup[3]}", "--text=Hello",
                             "--gin.CHECKPOINT_PATH='gs://spec-decode-unreachable/target'",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, "gs://spec-decode-unreachable/target", tmp_path / "out")
  assert f"no answer from Google Cloud Storage in {unreachable_gcs} s" in stderr[0]
  assert time.monotonic() - start < 10 * unreachable_gcs


def test_the_command_line_turning_the_baseline_off_turns_a_configs_timing_off(
    real_text, setup, run_main, tmp_path):
  """A config timing its decoder beside the baseline (as the demo's does) runs without the
  baseline and its rounds when the command line turns the baseline off; a config asking for
  rounds without a baseline stays an error."""
  del real_text  # its run reads the T5 vocabulary as tests/conftest.py sets it
  timed = tmp_path / "timed.gin"
  timed.write_text(f"include '{setup[3]}'\nTIMING_ROUNDS = 2\n")
  out = tmp_path / "out"
  status, stderr = run_main([f"--gin_file={timed}", "--text=Hello",
                             "--gin.COMPARE_WITH_BASELINE=False",
                             f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 0, stderr
  summary = json.loads((out / "summary.json").read_text())
  assert "side_by_side" not in summary and "baseline" not in summary
  inconsistent = tmp_path / "inconsistent.gin"
  inconsistent.write_text(f"include '{timed}'\nCOMPARE_WITH_BASELINE = False\n")
  status, stderr = run_main([f"--gin_file={inconsistent}", "--text=Hello",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out2'}'"])
  _assert_one_line_error(status, stderr, "TIMING_ROUNDS times the decoder beside the baseline",
                         tmp_path / "out2")


@pytest.mark.parametrize("bindings, message", [
    (["--gin.TIMING_ROUNDS=3", "--gin.COMPARE_WITH_BASELINE=False"],
     "TIMING_ROUNDS times the decoder beside the baseline: it needs COMPARE_WITH_BASELINE"),
    (["--gin.TIMING_ROUNDS=-1"], "TIMING_ROUNDS must be an integer >= 0, got -1")])
def test_bad_timing_rounds_are_one_line_errors(t5_style_run_gin, run_main, tmp_path, bindings,
                                               message):
  status, stderr = run_main([f"--gin_file={t5_style_run_gin}", "--text=Hello", *bindings,
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  _assert_one_line_error(status, stderr, message, tmp_path / "out")


def test_a_run_locates_each_checkpoint_once(t5_style_run_gin, run_main, tmp_path, monkeypatch):
  """The target's and the draft's checkpoints are each located once (`formats.locate`: a T5X
  step folder probed, a Hub id looked up), then handed on to every read."""
  from spec_decode.checkpoints import formats  # pylint: disable=g-import-not-at-top
  probed, probe = [], formats.t5x_orbax_state_item
  monkeypatch.setattr(formats, "t5x_orbax_state_item",
                      lambda path: probed.append(path) or probe(path))
  status, stderr = run_main([f"--gin_file={t5_style_run_gin}", "--text=Hello",
                             f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"])
  assert status == 0, stderr
  assert len(probed) == 2 and len(set(probed)) == 2, probed  # the target, the draft
