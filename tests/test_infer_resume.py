"""`python -m spec_decode.infer` stopped at any moment and rerun: the same final outputs.

A tiny random target/draft pair with the demo's vocabulary decodes the demo's 30 bundled
sentences in 15 batches of 2, committing a chunk every 3 batches. Runs are killed with SIGKILL by
a driver that wraps the chunk writer (before the first chunk, between chunks, in the middle of a
chunk's write) and stopped by SIGTERM; the final predictions.jsonl and summary.json of the
resumed run must equal an uninterrupted run's, greedy and sampled. A different run in an
unfinished output dir is refused in one line naming what differs, `--restart` starts over, and a
finished run is replaced. The subprocesses share a JAX compilation cache.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import tiny_t5
from spec_decode.infer import chunks as infer_chunks
from spec_decode.infer import outputs as infer_outputs

# The slow tier (runs killed and resumed as subprocesses).
pytestmark = pytest.mark.slow

INPUT_FILE = tiny_t5.REPO_ROOT / "spec_decode" / "assets" / "demo" / "examples.en"
NUM_BATCHES, PERIOD = 15, 3
# Summary fields that are times (or derived from times): they differ from run to run.
TIMED = {"compile_seconds", "wall_seconds", "tokens_per_second", "run_seconds", "baseline",
         "speedup", "costs", "predicted_speedup_this_machine", "predicted_speedup_v1"}

# Runs infer.main with infer_outputs.write_atomically wrapped: the KILL_AT-th chunk written in
# this run kills the process with SIGKILL before it is written ('before'), after ('after') or
# with half of it in its temporary file ('during'), or sends SIGTERM after it ('sigterm').
DRIVER = """
import os, signal, sys
from spec_decode import infer
from spec_decode.infer import outputs as infer_outputs
kill_at, mode = int(os.environ["KILL_AT"]), os.environ["KILL_MODE"]
original, written = infer_outputs.write_atomically, [0]
def write(path, text):
  if path.parent.name != "chunks" or path.name == "run.json":
    return original(path, text)
  written[0] += 1
  if written[0] == kill_at and mode == "during":
    (path.parent / f".{path.name}.cut").write_text(text[:len(text) // 2])
  if written[0] == kill_at and mode in ("before", "during"):
    os.kill(os.getpid(), signal.SIGKILL)
  original(path, text)
  if written[0] == kill_at:
    os.kill(os.getpid(), signal.SIGKILL if mode == "after" else signal.SIGTERM)
infer_outputs.write_atomically = write
sys.exit(infer.main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
  directory = tmp_path_factory.mktemp("resume")
  vocab_size = 8000  # the demo vocabulary's
  target = tiny_t5.write_model(directory, "target",
                               tiny_t5.tiny_config(vocab_size, tiny_t5.SHRINK), seed=1)
  draft = tiny_t5.write_model(directory, "draft",
                              tiny_t5.tiny_config(vocab_size, tiny_t5.DRAFT_SHRINK), seed=2)
  return tiny_t5.write_run_gin(directory / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE,
                               0, {"inputs": 24, "targets": 8}, batch_size=2,
                               extra=f"CHECKPOINT_PERIOD = {PERIOD}")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("jax_cache")


def _infer(run_gin, cache_dir, out, temperature, kill=None, extra=()):
  """A `spec_decode.infer` subprocess (through DRIVER when `kill` = (mode, nth chunk))."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  program = ["-m", "spec_decode.infer"]
  if kill is not None:
    program = ["-c", DRIVER]
    env.update(KILL_MODE=kill[0], KILL_AT=str(kill[1]))
  return subprocess.run(
      [sys.executable, *program, f"--gin_file={run_gin}", f"--input_file={INPUT_FILE}",
       f"--gin.TEMPERATURE={temperature}", f"--gin.INFER_OUTPUT_DIR='{out}'", *extra],
      env=env, cwd=tiny_t5.REPO_ROOT, capture_output=True, text=True, timeout=600)


def _outputs(out: pathlib.Path):
  records = (out / infer_outputs.PREDICTIONS_FILE).read_text(encoding="utf-8")
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  return records, {name: value for name, value in summary.items() if name not in TIMED}


def _chunks(out: pathlib.Path, decoder="decoder"):
  return sorted(path.name for path in (out / infer_chunks.CHUNK_DIR).glob(f"{decoder}.*"))


def _chunk_name(decoder, first, end):
  return f"{decoder}.{first:06d}-{end:06d}.json"


@pytest.fixture(scope="module")
def uninterrupted(run_gin, cache_dir, tmp_path_factory):
  """{temperature: (predictions.jsonl text, summary without times)} of uninterrupted runs."""
  outputs = {}
  for temperature in (0.0, 1.0):
    out = tmp_path_factory.mktemp("whole") / "out"
    run = _infer(run_gin, cache_dir, out, temperature)
    assert run.returncode == 0, run.stderr
    outputs[temperature] = _outputs(out)
  return outputs


def test_uninterrupted_runs_commit_every_chunk(uninterrupted):
  greedy, sampled = uninterrupted[0.0], uninterrupted[1.0]
  assert len(greedy[0].splitlines()) == len(sampled[0].splitlines()) == 30
  assert greedy[1]["identical_outputs"] is True
  assert greedy[0] != sampled[0]  # the sampled run samples


def test_sigkill_before_between_and_during_chunks_then_resume(run_gin, cache_dir, uninterrupted,
                                                             tmp_path):
  out = tmp_path / "out"
  run = _infer(run_gin, cache_dir, out, 0.0, kill=("before", 1))
  assert run.returncode == -signal.SIGKILL
  assert _chunks(out) == [] and not (out / infer_outputs.PREDICTIONS_FILE).exists()

  run = _infer(run_gin, cache_dir, out, 0.0, kill=("after", 2))  # between chunks 2 and 3
  assert run.returncode == -signal.SIGKILL
  assert _chunks(out) == [_chunk_name("decoder", 0, 3), _chunk_name("decoder", 3, 6)]

  run = _infer(run_gin, cache_dir, out, 0.0, kill=("during", 2))  # in the write of 9-12
  assert run.returncode == -signal.SIGKILL
  assert "decoder: 6 of 15 batches committed by an earlier run" in run.stdout
  assert _chunks(out) == [_chunk_name("decoder", first, first + 3) for first in (0, 3, 6)]
  assert (out / infer_chunks.CHUNK_DIR / f".{_chunk_name('decoder', 9, 12)}.cut").exists()

  run = _infer(run_gin, cache_dir, out, 0.0)
  assert run.returncode == 0, run.stderr
  assert "decoder: 9 of 15 batches committed by an earlier run" in run.stdout
  assert _outputs(out) == uninterrupted[0.0]
  assert not list((out / infer_chunks.CHUNK_DIR).glob(".*"))  # the cut write is gone
  assert len(_chunks(out, "baseline")) == NUM_BATCHES // PERIOD


def test_sigterm_commits_and_a_sampled_run_resumes_to_the_same_outputs(
    run_gin, cache_dir, uninterrupted, tmp_path):
  out = tmp_path / "out"
  run = _infer(run_gin, cache_dir, out, 1.0, kill=("sigterm", 2))
  assert run.returncode == 128 + signal.SIGTERM
  message = run.stderr.strip().splitlines()[-1]
  assert message.startswith("spec_decode.infer: stopped by SIGTERM after 6 of 15 batches")
  assert "rerun the same command to resume" in message
  assert _chunks(out) == [_chunk_name("decoder", 0, 3), _chunk_name("decoder", 3, 6)]
  assert not (out / infer_outputs.PREDICTIONS_FILE).exists()

  run = _infer(run_gin, cache_dir, out, 1.0, kill=("after", 3))  # a SIGKILL on top
  assert run.returncode == -signal.SIGKILL

  run = _infer(run_gin, cache_dir, out, 1.0)
  assert run.returncode == 0, run.stderr
  assert _outputs(out) == uninterrupted[1.0]


def test_a_changed_config_is_refused_in_an_unfinished_run(run_gin, cache_dir, uninterrupted,
                                                           tmp_path):
  out = tmp_path / "out"
  run = _infer(run_gin, cache_dir, out, 0.0, kill=("after", 1))
  assert run.returncode == -signal.SIGKILL
  before = sorted(path.name for path in (out / infer_chunks.CHUNK_DIR).iterdir())

  for extra, field in (([], "decode_settings.temperature (0.0, now 1.0)"),
                       (["--gin.SEED=1", "--gin.TEMPERATURE=0.0"], "seed (0, now 1)"),
                       (["--gin.NUM_EXAMPLES=20", "--gin.TEMPERATURE=0.0"],
                        "num_examples (30, now 20)")):
    run = _infer(run_gin, cache_dir, out, 1.0, extra=extra)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0].startswith(f"spec_decode.infer: error: INFER_OUTPUT_DIR {out} holds an "
                               f"unfinished run with another {field}"), lines
    assert "--restart" in lines[0]
  assert sorted(path.name for path in (out / infer_chunks.CHUNK_DIR).iterdir()) == before

  run = _infer(run_gin, cache_dir, out, 1.0, extra=["--restart"])
  assert run.returncode == 0, run.stderr
  assert "committed by an earlier run" not in run.stdout
  stored = json.loads((out / infer_chunks.CHUNK_DIR / infer_chunks.RUN_FILE).read_text())
  assert stored["decode_settings"]["temperature"] == 1.0
  assert _outputs(out) == uninterrupted[1.0]

  # A finished run protects nothing unfinished: another run replaces it.
  run = _infer(run_gin, cache_dir, out, 0.0)
  assert run.returncode == 0, run.stderr
  assert (f"INFER_OUTPUT_DIR {out} holds a finished run with another "
          "decode_settings.temperature: replacing it") in run.stdout
  assert _outputs(out) == uninterrupted[0.0]
