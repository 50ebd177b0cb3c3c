"""`python -m t5x.infer` and `python -m t5x.eval` end to end with the T5X hook. A tiny T5X run
(a random tiny T5.1.1 saved as T5X's own test checkpoint is, greedy
`t5x.decoding.temperature_sample`, a seqio task of six sentences) made speculative by adding
configs/t5x/speculative_infer.gin (or, for t5x.eval, speculative.gin) and a draft checkpoint
predicts what the same run predicts with T5X's own sampler, with the speculative counters in
t5x.infer's outputs, in float32 and in bfloat16, and with target and draft in the Orbax format
T5X writes by default, and so does the token-tree loop (configs/t5x/speculative_tree.gin, in
float32 and in bfloat16);
with T5X's beam_search (4 beams, alpha 0.6) it predicts what T5X's beam search predicts; so it does on 8 simulated CPU devices with T5X's partitioner at
num_partitions 2 and 4 (the target's parameters model-sharded, the draft's replicated, or
sharded with SHARD_DRAFT); bad settings fail in one line before anything is restored or
compiled.

Every run is a subprocess (~10 s to import T5X, 20-40 s in all); runs are module fixtures shared
by the assertions.
"""

import concurrent.futures
import dataclasses
import glob
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest

pytest.importorskip("t5x.infer",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_setup  # pylint: disable=g-import-not-at-top
import t5x_tasks  # pylint: disable=g-import-not-at-top
import xla_flags  # pylint: disable=g-import-not-at-top

# The slow tier (python -m t5x.infer and t5x.eval as subprocesses).
pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
# The runs' model: the tiny T5.1.1 with 128 ids, seqio's test vocabulary (126 ids) padded as T5
# pads its own. With T5's 32128 ids a random model's tokens are ones no prompt holds: no lookup
# draft would ever match.
RUN_CONFIG = dataclasses.replace(t5x_setup.TINY, vocab_size=128)
# A draft of another vocabulary, refused.
OTHER_VOCABULARY = dataclasses.replace(t5x_setup.TINY_DRAFT, vocab_size=256)
SIMULATED_DEVICES = 8
GAMMA = 3
# A T5X user's tiny T5.1.1 model on the test task: T5X's model gin, greedy temperature_sample.
# Included by the run files below, after T5X's run defaults, which it overrides.
TINY_MODEL_GIN = t5x_setup.t5_1_1_model_gin(
    RUN_CONFIG, task_name=t5x_tasks.TASK_NAME, inputs_length=24, targets_length=12,
    imports="from t5x import decoding\nfrom t5x import models\n") + """
models.EncoderDecoderModel.decode_fn = @decoding.temperature_sample
decoding.temperature_sample.temperature = 0.0
utils.DatasetConfig.batch_size = 4
utils.RestoreCheckpointConfig.dtype = 'float32'
"""
# t5x.infer of the tiny model, with token ids written next to the text.
TINY_INFER_GIN = """
from __gin__ import dynamic_registration
import __main__ as infer_script

include 't5x/configs/runs/infer.gin'
include '{directory}/tiny_model.gin'

infer_script.infer.write_fn = @infer_script.write_inferences_to_file
infer_script.write_inferences_to_file.output_ids = True
"""
TINY_EVAL_GIN = """
include 't5x/configs/runs/eval.gin'
include '{directory}/tiny_model.gin'
"""
SHARDED_RUN_GIN = """
from __gin__ import dynamic_registration
import __main__ as infer_script
from t5x import partitioning
import t5x_cpu_mesh

infer_script.infer.partitioner = @t5x_cpu_mesh.CpuMeshPartitioner()
t5x_cpu_mesh.CpuMeshPartitioner:
  num_partitions = {num_partitions}
  logical_axis_rules = @partitioning.standard_logical_axis_rules()
"""
# The same model evaluated as T5 usually is: T5X's beam_search (its default decode_fn), brevity
# alpha 0.6, 4 beams.
BEAM_SEARCH_GIN = """
from __gin__ import dynamic_registration
from t5x import decoding
from t5x import models

models.EncoderDecoderModel.decode_fn = @decoding.beam_search
decoding.beam_search.alpha = 0.6
models.EncoderDecoderModel.default_decoder_params = @models.DecoderParams()
models.DecoderParams.num_decodes = 4
"""
# Sharded runs: name -> num_partitions (on 8 devices); the second also shards the draft.
SHARDED_RUNS = {"sharded_2": 2, "sharded_4_shard_draft": 4}
# Runs that must fail: name -> (bindings, the one line expected on stderr).
BAD_RUNS = {
    "bad_other_vocabulary": (
        ("DRAFT_CHECKPOINT_PATH='{other_vocabulary}'",),
        f"ValueError: target and draft vocabularies differ: the target has "
        f"{RUN_CONFIG.vocab_size} ids, the draft {OTHER_VOCABULARY.vocab_size}"),
    "bad_missing_draft": (("DRAFT_CHECKPOINT_PATH='/nonexistent/checkpoint_1'",),
                          "ValueError: draft checkpoint not found: /nonexistent/checkpoint_1"),
    "bad_gamma_0": (("GAMMA=0",), "ValueError: gamma must be an integer >= 1, got 0"),
    "bad_lookup_with_draft": (
        ("DRAFT_SOURCE='lookup'",),
        "ValueError: DRAFT_SOURCE 'lookup' uses no draft model: unset DRAFT_CHECKPOINT_PATH (the "
        "draft would be ignored)"),
    "bad_lookup_ngram_0": (("DRAFT_SOURCE='lookup+model'", "LOOKUP_MAX_NGRAM=0"),
                           "ValueError: lookup max_ngram must be an integer >= 1, got 0"),
    "bad_ngram_draft": (("DRAFT_SOURCE='ngram'",),
                        "ValueError: DRAFT_SOURCE 'ngram' runs in spec_decode.infer; the T5X hook "
                        "takes 'model', 'lookup' or 'lookup+model'"),
}
# The same run in bfloat16, as T5X's t5_1_1 gins and infer run it: activations and restored
# parameters in bfloat16. 48 target tokens: with 12, a network rounding unlike T5X's (this one
# before it rounded as T5X does) still predicted the same 6 examples; with 48 it does not.
BFLOAT16 = ("network.T5Config.dtype='bfloat16'", "utils.RestoreCheckpointConfig.dtype='bfloat16'",
            "TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 48}")
# Runs with n-gram lookup drafts: alone (no draft checkpoint at all), and beside the draft.
LOOKUP_RUNS = {"lookup": ("DRAFT_SOURCE='lookup'", "DRAFT_CHECKPOINT_PATH=None"),
               "lookup_model": ("DRAFT_SOURCE='lookup+model'", "LOOKUP_MIN_NGRAM=1")}
# The token-tree loop (configs/t5x/speculative_tree.gin), greedy: the draft's 2 likeliest
# children per node, 2 deep. GAMMA None again: run_t5x binds the chain's.
TREE_RUN = dict(gin_files=(pathlib.Path("configs/t5x/speculative_tree.gin"),),
                bindings=("TREE_BRANCHING=(2, 2)", "TREE_RULE='most_likely'", "GAMMA=None"))
# A tree chosen per row instead: the draft's 3 likeliest paths at each of 3 depths.
CHOSEN_TREE_RUN = dict(gin_files=TREE_RUN["gin_files"],
                       bindings=("TREE_BRANCHING=None", "TREE_WIDTHS=(3, 3, 3)",
                                 "TREE_RULE='most_likely'", "GAMMA=None"))
STATS = ("alpha", "tokens_per_target_call", "target_calls", "draft_calls", "drafted_tokens",
         "accepted_tokens", "generated_tokens", "scores")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Any]:
  """The runs' gin files, a target of RUN_CONFIG as T5X's test checkpoint holds one (T5X's
  initialization, arrays inline), and a draft (a noisy copy of it) saved by T5X's Checkpointer."""
  directory = tmp_path_factory.mktemp("t5x_runs")
  (directory / "tiny_model.gin").write_text(TINY_MODEL_GIN)
  (directory / "tiny_infer.gin").write_text(TINY_INFER_GIN.format(directory=directory))
  (directory / "tiny_eval.gin").write_text(TINY_EVAL_GIN.format(directory=directory))
  (directory / "beam_search.gin").write_text(BEAM_SEARCH_GIN)
  target_params = t5x_setup.initial_variables(RUN_CONFIG, seed=t5x_setup.TINY_SEED)["params"]
  target = pathlib.Path(t5x_setup.save_checkpoint(directory / "target", RUN_CONFIG, target_params,
                                                  inline=True))
  draft_params = t5x_setup.perturbed(target_params, relative_noise=0.3, seed=1)
  draft = t5x_setup.save_checkpoint(directory / "draft", RUN_CONFIG, draft_params)
  # The same target and draft as T5X's Orbax checkpoint manager writes them.
  target_orbax = t5x_setup.save_orbax_checkpoint(directory / "target_orbax", RUN_CONFIG,
                                                 target_params)
  draft_orbax = t5x_setup.save_orbax_checkpoint(directory / "draft_orbax", RUN_CONFIG,
                                                draft_params)
  other_vocabulary = t5x_setup.save_checkpoint(
      directory / "other_vocabulary", OTHER_VOCABULARY,
      t5x_setup.initial_variables(OTHER_VOCABULARY, seed=5)["params"])
  for num_partitions in SHARDED_RUNS.values():
    (directory / f"sharded_{num_partitions}.gin").write_text(
        SHARDED_RUN_GIN.format(num_partitions=num_partitions))
  return {"directory": directory, "target": target, "target_params": target_params,
          "draft": pathlib.Path(draft), "draft_params": draft_params,
          "other_vocabulary": pathlib.Path(other_vocabulary),
          "target_orbax": pathlib.Path(target_orbax), "draft_orbax": pathlib.Path(draft_orbax)}


def run_t5x(setup: dict[str, pathlib.Path], name: str, *, speculative: bool,
            script: str = "infer", bindings: tuple[str, ...] = (),
            gin_files: tuple[pathlib.Path, ...] = (),
            devices: int = 1) -> subprocess.CompletedProcess:
  """`python -m t5x.<script>` of the tiny run, made speculative by spec_decode's gin file as a
  user does (then `gin_files`, `bindings`); output in <tmp>/name."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(t5x_setup.REPO_ROOT), str(HERE)]))
  if devices > 1:
    env["XLA_FLAGS"] = xla_flags.with_devices(devices, env.get("XLA_FLAGS", ""))
  command = [sys.executable, "-m", f"t5x.{script}", f"--gin_search_paths={t5x_setup.REPO_ROOT}",
             f"--gin_file={setup['directory'] / f'tiny_{script}.gin'}"]
  if speculative:
    spec_gin = {"infer": "speculative_infer.gin", "eval": "speculative.gin"}[script]
    command += [f"--gin_file=configs/t5x/{spec_gin}",
                f"--gin.DRAFT_CHECKPOINT_PATH='{setup['draft']}'", f"--gin.GAMMA={GAMMA}"]
  output_dir = {"infer": "INFER_OUTPUT_DIR", "eval": "EVAL_OUTPUT_DIR"}[script]
  command += [f"--gin_file={gin_file}" for gin_file in gin_files]
  command += [f"--gin.CHECKPOINT_PATH='{setup['target']}'",
              f"--gin.{output_dir}='{setup['directory'] / name}'",
              *(f"--gin.{binding}" for binding in bindings)]
  return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                        check=False)


def outputs(setup: dict[str, pathlib.Path], name: str) -> list[dict]:
  (path,) = glob.glob(str(setup["directory"] / name / f"{t5x_tasks.TASK_NAME}-*.jsonl-?????-of-?????"))
  with open(path) as f:
    return [json.loads(line) for line in f]


def _succeeded(run: subprocess.CompletedProcess) -> None:
  assert run.returncode == 0, run.stderr[-5000:]


@pytest.fixture(scope="module")
def runs(setup) -> dict[str, subprocess.CompletedProcess]:
  """Every run of this module, a few at a time (each is mostly one busy core)."""
  directory = setup["directory"]
  arguments = {
      "baseline": dict(speculative=False),
      "speculative": dict(speculative=True),
      "eval": dict(speculative=True, script="eval"),
      **{name: dict(speculative=True, devices=SIMULATED_DEVICES,
                    gin_files=(directory / f"sharded_{num_partitions}.gin",),
                    bindings=(f"SHARD_DRAFT={name.endswith('shard_draft')}",))
         for name, num_partitions in SHARDED_RUNS.items()},
      **{name: dict(speculative=True,
                    bindings=tuple(b.format(other_vocabulary=setup["other_vocabulary"])
                                   for b in bindings))
         for name, (bindings, _) in BAD_RUNS.items()},
      **{name: dict(speculative=True, bindings=bindings) for name, bindings in LOOKUP_RUNS.items()},
      "tree": dict(speculative=True, **TREE_RUN),
      "tree_chosen": dict(speculative=True, **CHOSEN_TREE_RUN),
      "orbax": dict(speculative=True,
                    bindings=(f"CHECKPOINT_PATH='{setup['target_orbax']}'",
                              f"DRAFT_CHECKPOINT_PATH='{setup['draft_orbax']}'")),
  }
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
    futures = {name: pool.submit(run_t5x, setup, name, **kwargs)
               for name, kwargs in arguments.items()}
    return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def baseline(setup, runs) -> list[dict]:
  _succeeded(runs["baseline"])
  return outputs(setup, "baseline")


@pytest.fixture(scope="module")
def speculative(setup, runs) -> list[dict]:
  _succeeded(runs["speculative"])
  return outputs(setup, "speculative")


def test_speculative_run_predicts_what_t5x_predicts(baseline, speculative):
  assert len(baseline) == t5x_tasks.NUM_EXAMPLES
  assert ([example["prediction_tokens"] for example in speculative]
          == [example["prediction_tokens"] for example in baseline])
  assert ([example["prediction"] for example in speculative]
          == [example["prediction"] for example in baseline])


def _assert_same_params(read, expected) -> None:
  read = jax.tree_util.tree_leaves_with_path(read)
  expected = jax.tree_util.tree_leaves_with_path(expected)
  assert [key for key, _ in read] == [key for key, _ in expected]
  for (key, value), (_, want) in zip(read, expected):
    np.testing.assert_array_equal(np.asarray(value), np.asarray(want), err_msg=str(key))


def test_orbax_draft_reads_what_t5x_wrote(setup):
  """The hook reads a draft T5X's Orbax checkpoint manager wrote: its shapes (for its config)
  and its parameters, as T5X was given them."""
  from spec_decode.t5x import speculative as hook  # pylint: disable=g-import-not-at-top
  path = str(setup["draft_orbax"])
  _assert_same_params(hook.read_draft_params(path), setup["draft_params"])
  shapes = jax.tree_util.tree_leaves_with_path(hook.read_draft_params(path, shapes_only=True))
  assert [(key, tuple(leaf.shape)) for key, leaf in shapes] == [
      (key, np.shape(want)) for key, want in jax.tree_util.tree_leaves_with_path(
          setup["draft_params"])]


def test_standalone_runner_reads_what_t5x_wrote_with_orbax(setup):
  """spec_decode.infer's reader takes the same Orbax step directory (`formats.load_params`)."""
  from spec_decode.checkpoints import formats  # pylint: disable=g-import-not-at-top
  from spec_decode.t5 import network  # pylint: disable=g-import-not-at-top
  from spec_decode.t5x import speculative as hook  # pylint: disable=g-import-not-at-top
  config = hook.config_from_t5x(RUN_CONFIG)
  _assert_same_params(formats.load_params(network.Transformer(config), str(setup["draft_orbax"])),
                      setup["draft_params"])
  assert formats.checkpoint_config(str(setup["draft_orbax"]), config) == config


def test_orbax_target_and_draft_predict_what_t5x_predicts(setup, runs, baseline):
  """t5x.infer restores the Orbax target with T5X's Orbax checkpoint manager, the hook adds the
  Orbax draft; greedy, the outputs are T5X's own sampler's on the legacy checkpoint."""
  _succeeded(runs["orbax"])
  orbax = outputs(setup, "orbax")
  assert ([example["prediction_tokens"] for example in orbax]
          == [example["prediction_tokens"] for example in baseline])
  assert sum(example["aux"]["accepted_tokens"] for example in orbax) > 0


def baseline_and_speculative(setup, suffix: str, bindings: tuple[str, ...] = (),
                             speculative_bindings: tuple[str, ...] = (),
                             **kwargs) -> dict[str, list[dict]]:
  """The baseline and the speculative run with `bindings` and `kwargs` (of `run_t5x`), side by
  side, output in <name>_<suffix>: name -> outputs."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    futures = {name: pool.submit(run_t5x, setup, f"{name}_{suffix}", speculative=speculative,
                                 bindings=bindings + (speculative_bindings if speculative else ()),
                                 **kwargs)
               for name, speculative in (("baseline", False), ("speculative", True))}
    done = {name: future.result() for name, future in futures.items()}
  for run in done.values():
    _succeeded(run)
  return {name: outputs(setup, f"{name}_{suffix}") for name in done}


@pytest.fixture(scope="module")
def bfloat16_runs(setup) -> dict[str, list[dict]]:
  """The baseline, the speculative run and the token-tree run in bfloat16 (run apart from `runs`,
  so these tests can run alone): name -> outputs."""
  runs = baseline_and_speculative(setup, "bfloat16", bindings=BFLOAT16)
  tree = run_t5x(setup, "tree_bfloat16", speculative=True, gin_files=TREE_RUN["gin_files"],
                 bindings=BFLOAT16 + TREE_RUN["bindings"])
  _succeeded(tree)
  return {**runs, "tree": outputs(setup, "tree_bfloat16")}


@pytest.mark.parametrize("name", ["speculative", "tree"])
def test_bfloat16_speculative_run_predicts_what_t5x_predicts(setup, bfloat16_runs, name):
  baseline, speculative = bfloat16_runs["baseline"], bfloat16_runs[name]
  assert len(baseline) == t5x_tasks.NUM_EXAMPLES
  assert ([example["prediction_tokens"] for example in speculative]
          == [example["prediction_tokens"] for example in baseline])
  assert ([example["prediction"] for example in speculative]
          == [example["prediction"] for example in baseline])
  assert sum(example["aux"]["accepted_tokens"] for example in speculative) > 0
  for name in bfloat16_runs:  # both ran in bfloat16 (T5X's operative config)
    config = (setup["directory"] / f"{name}_bfloat16" / "config.gin").read_text()
    assert "network.T5Config.dtype = 'bfloat16'" in config, config
    assert "utils.RestoreCheckpointConfig.dtype = 'bfloat16'" in config, config


@pytest.fixture(scope="module")
def beam_search_runs(setup) -> dict[str, list[dict]]:
  """T5X's beam-search run and the same run with the speculative gin file added (run apart
  from `runs`, so these tests can run alone): name -> outputs. The draft is the target itself,
  whose trees always hold the target's beams (the noisy-copy draft rarely covers all 4 beams
  of this random tiny model: no fewer target calls to see)."""
  return baseline_and_speculative(
      setup, "beam_search", gin_files=(setup["directory"] / "beam_search.gin",),
      speculative_bindings=(f"DRAFT_CHECKPOINT_PATH='{setup['target']}'",))


def test_beam_search_run_predicts_what_t5x_beam_search_predicts(setup, beam_search_runs,
                                                               baseline):
  beam, speculative = beam_search_runs["baseline"], beam_search_runs["speculative"]
  assert len(beam) == t5x_tasks.NUM_EXAMPLES
  assert ([example["prediction_tokens"] for example in speculative]
          == [example["prediction_tokens"] for example in beam])
  # Beam search chose other outputs than greedy decoding somewhere: the beams mattered.
  assert ([example["prediction_tokens"] for example in beam]
          != [example["prediction_tokens"] for example in baseline])
  target_calls = sum(example["aux"]["target_calls"] for example in speculative)
  assert target_calls < sum(example["aux"]["beam_steps"] for example in speculative)
  config = (setup["directory"] / "speculative_beam_search" / "config.gin").read_text()
  assert "decoding.beam_search.alpha = 0.6" in config, config


def test_speculative_counters_are_in_the_outputs(speculative):
  for example in speculative:
    aux = example["aux"]
    assert set(STATS) <= set(aux), aux
    assert 0.0 <= aux["alpha"] <= 1.0
    assert aux["target_calls"] >= 1 and aux["draft_calls"] >= aux["target_calls"]
    assert aux["accepted_tokens"] <= aux["drafted_tokens"] <= GAMMA * aux["target_calls"]
    assert aux["tokens_per_target_call"] == pytest.approx(
        aux["generated_tokens"] / aux["target_calls"])
  assert sum(example["aux"]["accepted_tokens"] for example in speculative) > 0


def _partition_specs(model_info: pathlib.Path) -> dict[str, str]:
  """Parameter name -> the partition spec T5X's partitioner gave it (T5X's model-info.txt)."""
  specs = {}
  for line in model_info.read_text().splitlines():
    match = re.match(r"Variable (state/)?(target/)?(\S+)\s.*partition spec \((.*)\)", line)
    if match and not match.group(1):
      specs[match.group(3)] = match.group(4)
  return specs


@pytest.mark.parametrize("name", sorted(SHARDED_RUNS))
def test_sharded_runs_predict_the_same(setup, runs, baseline, name):
  """8 devices: data-parallel 8 / num_partitions times, model-parallel num_partitions times; the
  partition specs are those T5X's partitioner computed (model-info.txt), which its restore and
  its compiled infer step use."""
  _succeeded(runs[name])
  assert ([example["prediction_tokens"] for example in outputs(setup, name)]
          == [example["prediction_tokens"] for example in baseline])
  specs = _partition_specs(setup["directory"] / name / "model-info.txt")
  shard_draft = name.endswith("shard_draft")
  for param in ("decoder/layers_0/mlp/wi_0/kernel", "encoder/layers_1/attention/out/kernel",
                "token_embedder/embedding", "decoder/logits_dense/kernel"):
    assert "'model'" in specs[param], specs
    assert ("'model'" in specs[f"speculative_draft/{param}"]) == shard_draft, specs


def test_speculative_eval_predicts_what_t5x_infer_predicts(setup, runs, baseline):
  _succeeded(runs["eval"])
  (path,) = glob.glob(str(setup["directory"] / "eval" / "inference_eval" /
                          f"{t5x_tasks.TASK_NAME}-??????.jsonl"))
  with open(path) as f:
    predictions = [json.loads(line)["prediction"] for line in f]
  assert predictions == [example["prediction"] for example in baseline]


@pytest.mark.parametrize("name", sorted(BAD_RUNS))
def test_bad_settings_fail_in_one_line_before_compiling(setup, runs, name):
  run = runs[name]
  assert run.returncode != 0
  assert BAD_RUNS[name][1] in run.stderr.splitlines(), run.stderr[-3000:]
  # T5X writes model-info.txt once the model is built, before restoring and compiling.
  assert not (setup["directory"] / name / "model-info.txt").exists()


@pytest.mark.parametrize("name", sorted(LOOKUP_RUNS))
def test_lookup_runs_predict_what_t5x_predicts(setup, runs, baseline, name):
  """t5x.infer with lookup drafts (DRAFT_CHECKPOINT_PATH unset for the lookup alone) predicts
  T5X's own greedy outputs, and its counters say where the drafts came from."""
  _succeeded(runs[name])
  examples = outputs(setup, name)
  assert ([example["prediction_tokens"] for example in examples]
          == [example["prediction_tokens"] for example in baseline])
  lookup_drafted = sum(example["aux"]["lookup_drafted_tokens"] for example in examples)
  drafted = sum(example["aux"]["drafted_tokens"] for example in examples)
  assert lookup_drafted > 0
  if name == "lookup":
    assert lookup_drafted == drafted
    assert sum(example["aux"]["draft_calls"] for example in examples) > 0
    # No draft parameters were declared, restored or placed.
    assert "speculative_draft" not in (setup["directory"] / name / "model-info.txt").read_text()
  else:
    assert drafted > lookup_drafted


@pytest.mark.parametrize("name,shape", [("tree", "TREE_BRANCHING = (2, 2)"),
                                        ("tree_chosen", "TREE_WIDTHS = (3, 3, 3)")])
def test_tree_run_predicts_what_t5x_predicts(setup, runs, baseline, name, shape):
  """t5x.infer with the token-tree loop selected by its gin file (a fixed tree, a tree chosen
  per row) predicts T5X's own greedy outputs, and the run's operative config binds the tree."""
  _succeeded(runs[name])
  examples = outputs(setup, name)
  assert ([example["prediction_tokens"] for example in examples]
          == [example["prediction_tokens"] for example in baseline])
  assert sum(example["aux"]["accepted_tokens"] for example in examples) > 0
  config = (setup["directory"] / name / "config.gin").read_text()
  for bound in ("DECODE_LOOP = 'speculative_tree_sample'", shape,
                "'tree_branching': %TREE_BRANCHING", "'tree_widths': %TREE_WIDTHS",
                "'tree_rule': %TREE_RULE", "'lookup_branches': %LOOKUP_BRANCHES",
                "'lookup_depth': %LOOKUP_DEPTH"):
    assert bound in config, config
