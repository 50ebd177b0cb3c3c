"""Tiny T5X models and checkpoints for the T5X hook's tests (imports t5x: import it after
`pytest.importorskip("t5x")`).

`TINY` is the config of T5X's own tiny T5.1.1 test checkpoint (`test_t5_tiny.checkpoint_0` in
T5X's repository); `write_tiny_checkpoint` writes one like it: T5X's initialization saved by
T5X's `Checkpointer`, the arrays inside the msgpack file. `t5x_model(config)` is a
`t5x.models.EncoderDecoderModel` over T5X's own network (`t5x.examples.t5.network`) decoding
with `t5x.decoding.temperature_sample` (greedy by default), or for a config of T5X's decoder-only
network a `t5x.models.DecoderOnlyModel` over it; `initial_variables` initializes either
with T5X, `save_checkpoint` and `save_orbax_checkpoint` save parameters with T5X's own
checkpointers. The vocabulary is the small SentencePiece model seqio ships for its own tests:
the models are random, so no test needs the real T5 vocabulary's pieces.
"""

import dataclasses
import functools
import pathlib

import flax.core
import jax
import numpy as np
import seqio
import seqio.test_utils
from t5x import checkpoints as t5x_checkpoints
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x import partitioning as t5x_partitioning
from t5x import train_state as t5x_train_state
from t5x.examples.t5 import network as t5x_network

import t5x_decoder_only

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# seqio's test SentencePiece model (26 pieces, pad 0, EOS 1, unk 2, as T5's), in seqio's wheel.
VOCAB_FILE = pathlib.Path(seqio.test_utils.TEST_DATA_DIR) / "sentencepiece" / "sentencepiece.model"
T5_EXTRA_IDS = 100
# The seed of the tiny checkpoint's initialization.
TINY_SEED = 0

TINY = t5x_network.T5Config(
    vocab_size=32128, dtype="float32", emb_dim=8, num_heads=4, num_encoder_layers=2,
    num_decoder_layers=2, head_dim=3, mlp_dim=16, mlp_activations=("gelu", "linear"),
    dropout_rate=0.0, logits_via_embedding=False)
# Drafts differ from every target (so drafts get rejected): narrower, one layer each.
TINY_DRAFT = dataclasses.replace(TINY, emb_dim=6, num_heads=2, num_encoder_layers=1,
                                 num_decoder_layers=1, mlp_dim=12)
INPUT_SHAPES = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}


def vocabulary() -> seqio.SentencePieceVocabulary:
  return seqio.SentencePieceVocabulary(str(VOCAB_FILE), extra_ids=T5_EXTRA_IDS)


def t5x_model(config, temperature: float = 0.0, decode_fn=None,
              inputs_bidirectional_attention: bool = False) -> t5x_models.BaseTransformerModel:
  """T5X's model and network, decoding with T5X's temperature_sample (greedy by default; else
  from the whole distribution at `temperature`), or with `decode_fn`: an EncoderDecoderModel
  for a T5 `T5Config`, else a DecoderOnlyModel over T5X's decoder-only network
  (`t5x_decoder_only`) for its `TransformerConfig`, a prefix LM with
  `inputs_bidirectional_attention`."""
  vocab = vocabulary()
  decode_fn = decode_fn or functools.partial(t5x_decoding.temperature_sample,
                                             temperature=temperature, topk=0)
  if isinstance(config, t5x_network.T5Config):
    return t5x_models.EncoderDecoderModel(t5x_network.Transformer(config), vocab, vocab,
                                          optimizer_def=None, decode_fn=decode_fn)
  return t5x_models.DecoderOnlyModel(
      t5x_decoder_only.network().DecoderWrapper(config), vocab, optimizer_def=None,
      decode_fn=decode_fn, inputs_bidirectional_attention=inputs_bidirectional_attention)


def initial_variables(config, seed: int) -> dict:
  """T5X's initialization of its network: {'params': ..., 'params_axes': ...}."""
  init = functools.partial(t5x_model(config).get_initial_variables, input_shapes=INPUT_SHAPES)
  # Jitted: op by op, initializing even a tiny T5 takes seconds.
  return flax.core.unfreeze(jax.jit(init)(jax.random.PRNGKey(seed)))


def perturbed(params: dict, relative_noise: float, seed: int) -> dict:
  """`params` with Gaussian noise of `relative_noise` times each leaf's standard deviation: a
  draft that agrees with its target often but not always."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(treedef, [
      leaf + relative_noise * np.std(leaf) * rng.standard_normal(leaf.shape).astype(leaf.dtype)
      for leaf in map(np.asarray, leaves)])


def _inference_state(config, params: dict) -> t5x_train_state.InferenceState:
  axes = jax.eval_shape(lambda: initial_variables(config, 0))["params_axes"]
  variables = {"params": params, "params_axes": axes}
  return t5x_train_state.InferenceState.create(flax.core.freeze(variables))


class _UnpartitionedPartitioner(t5x_partitioning.PjitPartitioner):
  """No array partitioned: T5X's Checkpointer then writes every array into the msgpack file
  rather than to TensorStore, the layout of T5X's own tiny test checkpoint."""

  def get_mesh_axes(self, train_state: t5x_train_state.TrainState) -> t5x_train_state.TrainState:
    return jax.tree_util.tree_map(lambda _: None, train_state)


def save_checkpoint(directory: pathlib.Path, config, params: dict, *,
                    inline: bool = False) -> str:
  """Saves `params` of a T5X network of `config` with T5X's Checkpointer (the legacy format: a
  msgpack file and, unless `inline`, one TensorStore array per parameter); returns the
  checkpoint's directory."""
  state = _inference_state(config, params)
  partitioner = (_UnpartitionedPartitioner if inline else t5x_partitioning.PjitPartitioner)(
      num_partitions=1)
  t5x_checkpoints.Checkpointer(state, partitioner, str(directory)).save(state)
  return str(directory / "checkpoint_0")


def write_tiny_checkpoint(directory: pathlib.Path) -> pathlib.Path:
  """A tiny T5.1.1 checkpoint as T5X's own test data holds it: `TINY` initialized by T5X
  (`TINY_SEED`), saved by T5X's Checkpointer with the arrays inline; returns its msgpack file
  (directory/checkpoint_0/checkpoint)."""
  params = initial_variables(TINY, seed=TINY_SEED)["params"]
  return pathlib.Path(save_checkpoint(directory, TINY, params, inline=True)) / "checkpoint"


def save_orbax_checkpoint(directory: pathlib.Path, config: t5x_network.T5Config,
                          params: dict) -> str:
  """Saves `params` of a T5X network of `config` with T5X's Orbax checkpoint manager (what T5X
  writes by default); returns the checkpoint's directory."""
  state = _inference_state(config, params)
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  directory.mkdir(parents=True)  # else the manager writes beside it
  manager = t5x_checkpoints.OrbaxCheckpointManagerInterface(str(directory), state, partitioner)
  manager.save(state)
  manager.wait_until_finished()
  return str(directory / "checkpoint_0")


def load_params(path: str) -> dict:
  """A T5X checkpoint's parameters, read by T5X."""
  return t5x_checkpoints.load_t5x_checkpoint(path)["target"]


def t5_1_1_model_gin(config: t5x_network.T5Config, *, task_name: str, inputs_length: int,
                     targets_length: int, imports: str = "") -> str:
  """A T5X user's tiny T5.1.1 model gin on a test task: T5X's t5_1_1/base.gin with `config`'s
  dimensions in float32, seqio's test vocabulary, no dropout; `imports`, more gin import lines.
  The caller appends its own bindings."""
  return f"""
from __gin__ import dynamic_registration
import seqio
from t5x import utils
from t5x.examples.t5 import network
import t5x_tasks
{imports}
include 't5x/examples/t5/t5_1_1/base.gin'

DROPOUT_RATE = 0.0
seqio.SentencePieceVocabulary.sentencepiece_model_file = '{VOCAB_FILE}'
seqio.SentencePieceVocabulary.extra_ids = {T5_EXTRA_IDS}
network.T5Config:
  dtype = 'float32'
  vocab_size = {config.vocab_size}
  emb_dim = {config.emb_dim}
  num_heads = {config.num_heads}
  num_encoder_layers = {config.num_encoder_layers}
  num_decoder_layers = {config.num_decoder_layers}
  head_dim = {config.head_dim}
  mlp_dim = {config.mlp_dim}

MIXTURE_OR_TASK_NAME = '{task_name}'
TASK_FEATURE_LENGTHS = {{'inputs': {inputs_length}, 'targets': {targets_length}}}
"""
