"""What a newcomer meets at the command line: one flag style, one place per setting, bindings
that cannot take effect refused, and every mistake as one line naming it before anything
compiles, with nothing written.

Runs on the shipped demo config and a tiny pair on the demo vocabulary: no ../shared needed.
"""

import json
import os
import pathlib
import stat
import subprocess
import sys

import gin
import pytest

import tiny_t5
from spec_decode import bench
from spec_decode import infer
from spec_decode.infer import outputs as infer_outputs
from spec_decode import paths
from spec_decode import plan
from spec_decode.training import train

PROGRAMS = {"spec_decode.infer": infer.main, "spec_decode.plan": plan.main,
            "spec_decode.bench": bench.main, "spec_decode.training.train": train.main}


@pytest.fixture
def run_cli(capsys):
  """main(args) of a program in this process: (status, stdout, stderr lines)."""

  def run(program, args):
    try:
      status = PROGRAMS[program](args)
    finally:
      gin.clear_config()
    captured = capsys.readouterr()
    return status, captured.out, captured.err.strip().splitlines()

  return run


def _assert_error(result, program, message, output_dir=None):
  status, _, stderr = result
  assert status == 2, stderr
  assert len(stderr) == 1 and stderr[0].startswith(f"{program}: error: "), stderr
  assert message in stderr[0], stderr[0]
  if output_dir is not None:
    assert not pathlib.Path(output_dir).exists()


@pytest.fixture(scope="module")
def pair_run_gin(tmp_path_factory):
  """A run config of a tiny target/draft pair on the demo vocabulary (greedy, gamma 3)."""
  directory = tmp_path_factory.mktemp("cli")
  target, draft = tiny_t5.write_pair(directory, vocab_size=8000)
  return tiny_t5.write_run_gin(directory / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE, 0,
                               {"inputs": 16, "targets": 8}, batch_size=2)


def test_decode_setting_bound_on_the_command_line_takes_effect(pair_run_gin, run_cli, tmp_path):
  long_text = " ".join(["word"] * 200)
  out = tmp_path / "out"
  status, stdout, stderr = run_cli("spec_decode.infer", [
      f"--gin_file={pair_run_gin}", "--gin.GAMMA=5",
      "--text=A dog runs.", f"--text={long_text}", f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 0, stderr
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert summary["decode_settings"]["gamma"] == 5
  assert summary["drafted_tokens"] <= 5 * summary["target_calls"]
  assert summary["drafted_tokens"] > 3 * summary["target_calls"]  # gamma 3 could not draft this
  # The long input was cut, with a warning that says so; the echo is shortened.
  assert any(line.startswith("warning: 1 of 2 inputs are longer than "
                             "TASK_FEATURE_LENGTHS['inputs'] = 16 tokens") for line in stderr)
  assert long_text not in stdout and "…" in stdout
  # What the run means, on screen: target calls saved, the measured v, the paper's prediction.
  assert "fewer target calls than the baseline" in stdout
  assert "6-token target call costs" in stdout and "(TPU/GPU at batch 1" in stdout
  assert {"c", "v"} <= set(summary["costs"]) and summary["predicted_speedup_v1"] > 0
  # Outputs are readable by others, as files usually are (umask), not 0600.
  umask = os.umask(0)
  os.umask(umask)
  for name in (infer_outputs.PREDICTIONS_FILE, infer_outputs.SUMMARY_FILE):
    assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("binding, message", [
    ("--gin.UNUSED_SETTING=5", "gin binding of macro UNUSED_SETTING cannot take effect"),
    ("--gin.GAMMA=0", "gamma must be an integer >= 1, got 0"),
    ("--gin.DECODE_LOOP='beam'", "unknown decode loop 'beam'; registered: "),
    ("--gin.CHECKPOINT_PATH=/x", "strings need inner quotes: --gin.CHECKPOINT_PATH=\"'/x'\""),
    ("--gin.INFER_OUTPUT_DIR=out/x",
     "strings need inner quotes: --gin.INFER_OUTPUT_DIR=\"'out/x'\""),
])
def test_bad_bindings(binding, message, run_cli, tmp_path):
  _assert_error(run_cli("spec_decode.infer", [binding, f"--gin.INFER_OUTPUT_DIR='{tmp_path}/o'"]
                        if "INFER_OUTPUT_DIR" not in binding else [binding]),
                "spec_decode.infer", message, tmp_path / "o")


def test_a_setting_the_decode_loop_does_not_take_cannot_take_effect(pair_run_gin, run_cli,
                                                                   tmp_path):
  _assert_error(run_cli("spec_decode.infer", [
      f"--gin_file={pair_run_gin}", "--text=Hi", "--gin.DECODE_LOOP='temperature_sample'",
      "--gin.COMPARE_WITH_BASELINE=False", f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'o'}'"]),
      "spec_decode.infer", "decode loop 'temperature_sample' takes no setting 'draft_policy', "
      "'gamma', 'verifier'",
      tmp_path / "o")


@pytest.mark.parametrize("program, extra", [("spec_decode.infer", []),
                                            ("spec_decode.plan", []),
                                            ("spec_decode.bench", []),
                                            ("spec_decode.training.train", ["--model_dir=x"])])
def test_missing_gin_file(program, extra, run_cli):
  _assert_error(run_cli(program, ["--gin_file=configs/nope.gin", *extra]), program,
                "gin file not found: configs/nope.gin")


@pytest.mark.parametrize("program", ["spec_decode.infer", "spec_decode.plan"])
@pytest.mark.parametrize("harness, row", [
    ("configs/table2/spec_decode.gin", "configs/table2/ende_small_t0.gin"),
    ("configs/table2/spec_decode.gin", "configs/table2/lookup/cnndm_t0.gin"),
    ("configs/table2/t5_1_0/spec_decode.gin", "configs/table2/t5_1_0/ende_small_t0.gin"),
    ("configs/table3/spec_decode.gin", "configs/table3/gpt_like_lm_t0.gin")])
def test_a_table_row_without_its_harness_says_which_to_give(program, harness, row, run_cli):
  """A row sets macros only; without the harness that binds the model and the run, the error
  names the harness (spec_decode.aot reads its config as plan does)."""
  _assert_error(run_cli(program, [f"--gin_file={row}"]), program,
                f"{row} binds no model: give its runner's harness first, "
                f"--gin_file={harness} --gin_file={row}")


@pytest.mark.parametrize("program", ["spec_decode.infer", "spec_decode.plan",
                                     "spec_decode.training.train", "spec_decode.bench"])
def test_every_program_shows_the_gin_flags(program):
  run = subprocess.run([sys.executable, "-m", program, "--help"], capture_output=True,
                       text=True, cwd=paths.ROOT, timeout=300)
  assert run.returncode == 0, run.stderr
  for flag in ("--gin_file", "--gin.NAME=VALUE", "--gin_bindings", "--gin_search_paths"):
    assert flag in run.stdout, (flag, run.stdout)


def test_output_dir_problems_are_found_before_anything_runs(run_cli, tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  _assert_error(run_cli("spec_decode.infer", [f"--gin.INFER_OUTPUT_DIR='{a_file}'"]),
                "spec_decode.infer", f"INFER_OUTPUT_DIR {a_file} exists and is not a directory")
  _assert_error(run_cli("spec_decode.infer", [f"--gin.INFER_OUTPUT_DIR='{a_file}/out'"]),
                "spec_decode.infer", f"INFER_OUTPUT_DIR {a_file}/out is under {a_file}, which "
                "is a file")
  assert a_file.read_text() == ""


def test_multi_process_flags_are_checked(run_cli, tmp_path):
  out = tmp_path / "out"
  _assert_error(run_cli("spec_decode.infer", ["--process_count=2",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", "--process_count needs --multiprocess_gpu", out)
  _assert_error(run_cli("spec_decode.infer", ["--multiprocess_gpu", "--process_count=2",
                                              "--process_index=2", "--coordinator_address=x:1",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", "--process_index=2 is not in 0..1 (--process_count=2)", out)
  # No coordinator given and none detected: JAX's own error, as one line.
  _assert_error(run_cli("spec_decode.infer", ["--multiprocess_gpu", "--process_count=2",
                                              "--process_index=0",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", "--multiprocess_gpu: JAX's distributed system did not "
                "start: ", out)


def test_input_file_problems_name_the_file(run_cli, tmp_path):
  bad = tmp_path / "bad.en"
  bad.write_bytes(b"fine line\nbad \xff\xfe line\n")
  empty = tmp_path / "empty.en"
  empty.write_text("\n  \n")
  out = tmp_path / "out"
  _assert_error(run_cli("spec_decode.infer", [f"--input_file={bad}",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", f"input file {bad}, line 2: not UTF-8", out)
  _assert_error(run_cli("spec_decode.infer", [f"--input_file={empty}",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", f"input file {empty} is empty", out)


def test_data_dir_applies_to_a_config_that_imports_no_task(run_cli, tmp_path):
  """The demo config imports no task: --data_dir still binds the file tasks' data root."""
  missing, out = tmp_path / "no_data", tmp_path / "out"
  _assert_error(run_cli("spec_decode.infer", [
      "--gin.MIXTURE_OR_TASK_NAME='tatoeba_ende_demo'", "--gin.infer.DatasetConfig.input_file=None",
      f"--data_dir={missing}", f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", f"data directory not found: {missing}", out)


@pytest.mark.parametrize("which", ["target", "draft"])
def test_truncated_safetensors_checkpoint(which, run_cli, tmp_path):
  truncated = tmp_path / f"{which}.safetensors"
  truncated.write_bytes((paths.DEMO_ASSETS / f"{which}.safetensors").read_bytes()[:2**20])
  macro = {"target": "CHECKPOINT_PATH",
           "draft": "DRAFT_CHECKPOINT_PATH"}[which]
  out = tmp_path / "out"
  _assert_error(run_cli("spec_decode.infer", [f"--gin.{macro}='{truncated}'",
                                              f"--gin.INFER_OUTPUT_DIR='{out}'"]),
                "spec_decode.infer", f"checkpoint {truncated} cannot be read: truncated, corrupt "
                "or not a checkpoint of its format (SafetensorError", out)


def test_train_names_a_missing_corpus(run_cli, tmp_path):
  _assert_error(run_cli("spec_decode.training.train", [
      "--gin_file=configs/train/tiny.gin", f"--model_dir={tmp_path / 'm'}",
      f"--gin.train.train.data_root='{tmp_path / 'no_data'}'"]),
      "spec_decode.training.train", f"{tmp_path / 'no_data'}")
