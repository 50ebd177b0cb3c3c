"""`python -m t5x.infer` and `python -m t5x.eval` of a T5X decoder-only language model with the
T5X hook. A tiny T5X decoder-only run (T5X's `DecoderOnlyModel` over T5X's own network,
`DecoderWrapper`, with a tiny `TransformerConfig`, greedy `t5x.decoding.temperature_sample`, the
seqio task of `t5x_tasks` through `seqio.DecoderFeatureConverter`: prompts of different lengths)
made speculative by adding configs/t5x/speculative_decoder_only_infer.gin (for t5x.eval,
speculative_decoder_only.gin) and a draft checkpoint predicts what the same run predicts with
T5X's own sampler: in float32 as a causal LM and in bfloat16 as a prefix LM, each also with the
token-tree loop (configs/t5x/speculative_tree.gin), sharded over a
(data 2, model 2) mesh of 4 CPU devices with the draft sharded too, and through t5x.eval. Target
and draft are checkpoints T5X's Checkpointer wrote, restored by T5X (the target) and by the hook
(the draft) into the hook's decoder-only network. Every run is a subprocess, as a user's.
"""

import concurrent.futures
import glob
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("t5x.infer",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_decoder_only  # pylint: disable=g-import-not-at-top
import t5x_setup  # pylint: disable=g-import-not-at-top
import t5x_tasks  # pylint: disable=g-import-not-at-top
import xla_flags  # pylint: disable=g-import-not-at-top
from test_t5x_runs import (SHARDED_RUN_GIN, TINY_EVAL_GIN, TINY_INFER_GIN,  # pylint: disable=g-import-not-at-top
                           TREE_RUN, _partition_specs)

# The slow tier (python -m t5x.infer as subprocesses).
pytestmark = pytest.mark.slow

HERE = pathlib.Path(__file__).resolve().parent
GAMMA = 3
# A T5X user's tiny decoder-only model on the test task, written as T5X's decoder-only model gin
# files are (t5x/examples/decoder_only/models/base.gin), greedy: T5X's temperature_sample with
# topk 1. 128 ids: seqio's test vocabulary (126) padded.
TINY_MODEL_GIN = f"""
from __gin__ import dynamic_registration
import seqio
from t5x import adafactor
from t5x import decoding
from t5x import models
from t5x import utils
from t5x.examples.decoder_only import network
import t5x_tasks

VOCABULARY = @seqio.SentencePieceVocabulary()
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{t5x_setup.VOCAB_FILE}'
seqio.SentencePieceVocabulary.extra_ids = {t5x_setup.T5_EXTRA_IDS}
OPTIMIZER = @adafactor.Adafactor()

MODEL = @models.DecoderOnlyModel()
models.DecoderOnlyModel:
  module = @network.DecoderWrapper()
  vocabulary = %VOCABULARY
  optimizer_def = %OPTIMIZER
  decode_fn = @decoding.temperature_sample
decoding.temperature_sample.topk = 1
network.DecoderWrapper.config = @network.TransformerConfig()
network.TransformerConfig:
  vocab_size = 128
  dtype = 'float32'
  emb_dim = 16
  num_heads = 4
  num_layers = 2
  head_dim = 4
  mlp_dim = 32
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
  logits_via_embedding = False

MIXTURE_OR_TASK_NAME = '{t5x_tasks.TASK_NAME}'
TASK_FEATURE_LENGTHS = {{'inputs': 24, 'targets': 12}}
utils.DatasetConfig.batch_size = 4
utils.RestoreCheckpointConfig.dtype = 'float32'
"""
# The run in bfloat16 (activations and restored parameters, as T5X's own gins run it), as a
# prefix LM (its prompts attend both ways).
BFLOAT16_PREFIX_LM = ("network.TransformerConfig.dtype='bfloat16'",
                      "utils.RestoreCheckpointConfig.dtype='bfloat16'",
                      "models.DecoderOnlyModel.inputs_bidirectional_attention=True")
# The sharded run: 4 CPU devices as (data 2, model 2), the draft sharded like the target.
SHARDED = dict(devices=4, num_partitions=2)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Any]:
  """The runs' gin files, a random target and a draft (a noisy copy of it), both written by
  T5X's Checkpointer."""
  network = t5x_decoder_only.network()
  directory = tmp_path_factory.mktemp("t5x_decoder_only_runs")
  (directory / "tiny_model.gin").write_text(TINY_MODEL_GIN)
  (directory / "tiny_infer.gin").write_text(TINY_INFER_GIN.format(directory=directory))
  (directory / "tiny_eval.gin").write_text(TINY_EVAL_GIN.format(directory=directory))
  (directory / "sharded.gin").write_text(
      SHARDED_RUN_GIN.format(num_partitions=SHARDED["num_partitions"]))
  config = network.TransformerConfig(
      vocab_size=128, dtype="float32", emb_dim=16, num_heads=4, num_layers=2, head_dim=4,
      mlp_dim=32, mlp_activations=("gelu", "linear"), dropout_rate=0.0,
      logits_via_embedding=False)
  target_params = t5x_setup.initial_variables(config, seed=0)["params"]
  draft_params = t5x_setup.perturbed(target_params, relative_noise=0.3, seed=1)
  return {"directory": directory,
          "target": t5x_setup.save_checkpoint(directory / "target", config, target_params),
          "draft": t5x_setup.save_checkpoint(directory / "draft", config, draft_params)}


def run_t5x(setup: dict[str, Any], name: str, *, speculative: bool, script: str = "infer",
            bindings: tuple[str, ...] = (), gin_files: tuple[pathlib.Path, ...] = (),
            sharded: bool = False) -> subprocess.CompletedProcess:
  """`python -m t5x.<script>` of the tiny run, made speculative by spec_decode's gin file as a
  user does (then `gin_files`, `bindings`; `sharded`: on SHARDED's mesh); output in
  <tmp>/name."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(t5x_setup.REPO_ROOT), str(HERE)]))
  command = [sys.executable, "-m", f"t5x.{script}",
             f"--gin_search_paths={t5x_setup.REPO_ROOT}",
             f"--gin_file={setup['directory'] / f'tiny_{script}.gin'}"]
  if speculative:
    spec_gin = {"infer": "speculative_decoder_only_infer.gin",
                "eval": "speculative_decoder_only.gin"}[script]
    command += [f"--gin_file=configs/t5x/{spec_gin}",
                f"--gin.DRAFT_CHECKPOINT_PATH='{setup['draft']}'", f"--gin.GAMMA={GAMMA}"]
  if sharded:
    env["XLA_FLAGS"] = xla_flags.with_devices(SHARDED["devices"], env.get("XLA_FLAGS", ""))
    command += [f"--gin_file={setup['directory'] / 'sharded.gin'}", "--gin.SHARD_DRAFT=True"]
  output_dir = {"infer": "INFER_OUTPUT_DIR", "eval": "EVAL_OUTPUT_DIR"}[script]
  command += [f"--gin_file={gin_file}" for gin_file in gin_files]
  command += [f"--gin.CHECKPOINT_PATH='{setup['target']}'",
              f"--gin.{output_dir}='{setup['directory'] / name}'",
              *(f"--gin.{binding}" for binding in bindings)]
  return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600,
                        check=False)


VARIANTS = {"float32": (), "bfloat16_prefix_lm": BFLOAT16_PREFIX_LM}


@pytest.fixture(scope="module")
def runs(setup) -> dict[str, subprocess.CompletedProcess]:
  """Every run of this module, a few at a time (each is mostly one busy core): per variant T5X's
  own and the speculative one, the sharded and the t5x.eval speculative runs (float32)."""
  arguments = {
      **{f"{variant}_{speculative}": dict(speculative=speculative, bindings=bindings)
         for variant, bindings in VARIANTS.items() for speculative in (False, True)},
      "sharded": dict(speculative=True, sharded=True),
      "eval": dict(speculative=True, script="eval"),
      **{f"tree_{variant}": dict(speculative=True, gin_files=TREE_RUN["gin_files"],
                                 bindings=TREE_RUN["bindings"] + bindings)
         for variant, bindings in VARIANTS.items()},
  }
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
    futures = {name: pool.submit(run_t5x, setup, name, **kwargs)
               for name, kwargs in arguments.items()}
    return {name: future.result() for name, future in futures.items()}


def _succeeded(run: subprocess.CompletedProcess) -> None:
  assert run.returncode == 0, run.stderr[-5000:]


def outputs(setup: dict[str, Any], name: str) -> list[dict]:
  (path,) = glob.glob(str(setup["directory"] / name /
                          f"{t5x_tasks.TASK_NAME}-*.jsonl-?????-of-?????"))
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_speculative_run_predicts_what_t5x_predicts(setup, runs, variant):
  for speculative in (False, True):
    _succeeded(runs[f"{variant}_{speculative}"])
  baseline, speculative = (outputs(setup, f"{variant}_{name}") for name in (False, True))
  assert len(baseline) == t5x_tasks.NUM_EXAMPLES
  assert ([example["prediction_tokens"] for example in speculative]
          == [example["prediction_tokens"] for example in baseline])
  assert ([example["prediction"] for example in speculative]
          == [example["prediction"] for example in baseline])
  assert all(len(example["prediction_tokens"]) > 1 for example in baseline), baseline
  assert sum(example["aux"]["accepted_tokens"] for example in speculative) > 0
  config = (setup["directory"] / f"{variant}_True" / "config.gin").read_text()
  assert "speculative.speculative_version.model = @models.DecoderOnlyModel()" in config, config
  for binding in VARIANTS[variant]:  # both ran as bound (T5X's operative config)
    name, value = binding.split("=")
    for run in (False, True):
      config = (setup["directory"] / f"{variant}_{run}" / "config.gin").read_text()
      assert f"{name} = {value}" in config, config


def test_sharded_run_predicts_what_t5x_predicts(setup, runs):
  """4 devices, data-parallel 2 and model-parallel 2, target and draft split as T5X's
  partitioner says (its model-info.txt, which its restore and compiled infer step use)."""
  _succeeded(runs["sharded"])
  _succeeded(runs["float32_False"])
  assert ([example["prediction_tokens"] for example in outputs(setup, "sharded")]
          == [example["prediction_tokens"] for example in outputs(setup, "float32_False")])
  specs = _partition_specs(setup["directory"] / "sharded" / "model-info.txt")
  for param in ("decoder/layers_0/mlp/wi_0/kernel", "decoder/layers_1/self_attention/out/kernel",
                "decoder/token_embedder/embedding", "decoder/logits_dense/kernel"):
    assert "'model'" in specs[param], specs
    assert "'model'" in specs[f"speculative_draft/{param}"], specs


def test_speculative_eval_predicts_what_t5x_infer_predicts(setup, runs):
  _succeeded(runs["eval"])
  _succeeded(runs["float32_False"])
  (path,) = glob.glob(str(setup["directory"] / "eval" / "inference_eval" /
                          f"{t5x_tasks.TASK_NAME}-??????.jsonl"))
  with open(path) as f:
    predictions = [json.loads(line)["prediction"] for line in f]
  assert predictions == [example["prediction"] for example in outputs(setup, "float32_False")]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tree_run_predicts_what_t5x_predicts(setup, runs, variant):
  """The token-tree loop on the language model (float32 causal, bfloat16 prefix LM): T5X's
  greedy outputs of the same variant."""
  _succeeded(runs[f"tree_{variant}"])
  _succeeded(runs[f"{variant}_False"])
  examples = outputs(setup, f"tree_{variant}")
  assert ([example["prediction_tokens"] for example in examples]
          == [example["prediction_tokens"] for example in outputs(setup, f"{variant}_False")])
  assert sum(example["aux"]["accepted_tokens"] for example in examples) > 0
  config = (setup["directory"] / f"tree_{variant}" / "config.gin").read_text()
  assert "DECODE_LOOP = 'speculative_tree_sample'" in config, config
  for binding in VARIANTS[variant]:
    name, value = binding.split("=")
    assert f"{name} = {value}" in config, config
