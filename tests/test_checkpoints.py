"""spec_decode.checkpoints.t5x_format: T5X legacy/Orbax reading, T5X writing, HF parity, errors."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from flax import serialization

import shared_data
from hf_utils import HF_CONFIGS, hf_model_and_params, needs_hf
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import hf_format
from spec_decode.t5.network import T5Config, Transformer

try:
  import torch
  import transformers
except ImportError:
  torch = transformers = None  # the tests that use them are marked needs_hf

# T5X's own test checkpoints of a toy dense layer (t5x/testdata in T5X's repository), as the
# developers' data folder holds them.
T5X_TOY = shared_data.SHARED / "t5x"
# The model of T5X's tiny test checkpoint (tests/t5x/t5x_setup.TINY, in T5X's own terms).
TINY_T5X_CONFIG = T5Config(
    vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16,
    mlp_activations=("gelu", "linear"), num_encoder_layers=2, num_decoder_layers=2,
    logits_via_embedding=False)
# The same architecture with a small vocabulary, for tests that need no reference files.
SMALL_CONFIG = dataclasses.replace(TINY_T5X_CONFIG, vocab_size=128)


def _require(path: Path) -> Path:
  if not path.exists():
    pytest.skip(shared_data.missing("T5X's own test checkpoints (t5x/testdata in T5X's "
                                    "repository)"))
  return path


def _leaves(tree) -> dict:
  """{key path: leaf}, flattened by JAX rather than by the module under test; TensorStore
  spec dicts are leaves."""
  leaves = jax.tree_util.tree_leaves_with_path(
      tree, is_leaf=lambda node: isinstance(node, dict) and "driver" in node)
  return {tuple(key.key for key in path): leaf for path, leaf in leaves}


def _assert_trees_equal(actual, expected):
  actual, expected = _leaves(actual), _leaves(expected)
  assert actual.keys() == expected.keys()
  for path, value in expected.items():
    assert actual[path].dtype == value.dtype, path
    np.testing.assert_array_equal(actual[path], value, err_msg=str(path))


@pytest.fixture(scope="module")
def t5x_written(tmp_path_factory) -> dict:
  """T5X's tiny T5.1.1 as T5X's own checkpointers write it: 'inline' (legacy msgpack with the
  arrays inside, the layout of T5X's test checkpoint: its msgpack file), 'tensorstore' (legacy
  msgpack, one TensorStore array per parameter: its directory) and 'orbax' (its step
  directory); 'params' are the parameters T5X was given."""
  pytest.importorskip("t5x.checkpoints",
                      reason="needs t5x, installed from its repository (README: Tests)")
  import t5x_setup  # pylint: disable=g-import-not-at-top (imports t5x)
  directory = tmp_path_factory.mktemp("t5x_written")
  params = t5x_setup.initial_variables(t5x_setup.TINY, seed=t5x_setup.TINY_SEED)["params"]
  return {"inline": t5x_setup.write_tiny_checkpoint(directory / "inline"),
          "tensorstore": Path(t5x_setup.save_checkpoint(directory / "tensorstore", t5x_setup.TINY,
                                                        params)),
          "orbax": Path(t5x_setup.save_orbax_checkpoint(directory / "orbax", t5x_setup.TINY,
                                                        params)),
          "params": jax.tree_util.tree_map(np.asarray, params)}


@pytest.fixture(scope="module")
def tiny_params(t5x_written):
  return t5x_format.load_t5x(str(t5x_written["inline"]))


def test_t5x_written_checkpoints_read_as_t5x_wrote_them(t5x_written, tiny_params):
  """Every format T5X's checkpointers write reads back as the parameters T5X was given (an
  Orbax step directory through its 'state' item, where T5X's manager keeps the train state)."""
  _assert_trees_equal(tiny_params, t5x_written["params"])
  _assert_trees_equal(t5x_format.load_t5x(str(t5x_written["tensorstore"])),
                      t5x_written["params"])
  orbax_state = t5x_written["orbax"] / "state"
  assert (orbax_state / "_METADATA").is_file()
  _assert_trees_equal(t5x_format.load_t5x(str(orbax_state)), t5x_written["params"])


@pytest.fixture(scope="module")
def small_params():
  """Random normal numpy arrays in SMALL_CONFIG's parameter tree (cheaper than init)."""
  rng = np.random.default_rng(0)
  return jax.tree_util.tree_map(
      lambda leaf: rng.standard_normal(leaf.shape).astype(leaf.dtype),
      t5x_format.expected_param_shapes(SMALL_CONFIG))


# --------------------------------------------------------------------------- T5X reading


def test_t5x_tiny_checkpoint_matches_network_tree_and_runs(tiny_params):
  tokens = jnp.ones((1, 1), jnp.int32)
  model = Transformer(TINY_T5X_CONFIG)
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, tokens, tokens))
  expected = {path: (leaf.shape, leaf.dtype) for path, leaf in _leaves(expected["params"]).items()}
  loaded = {path: (leaf.shape, leaf.dtype) for path, leaf in _leaves(tiny_params).items()}
  assert loaded == expected

  encoder_tokens = jnp.array([[37, 629, 19, 1627, 5, 1, 0, 0]])
  decoder_input = jnp.array([[0, 37, 629, 19]])
  decoder_target = jnp.array([[37, 629, 19, 1]])
  logits = jax.jit(model.apply)({"params": tiny_params}, encoder_tokens, decoder_input,
                                decoder_target)
  assert logits.shape == (1, 4, 32128)
  assert np.isfinite(np.asarray(logits)).all()
  assert float(jnp.std(logits)) > 0


def test_load_t5x_accepts_directory_or_file_and_casts(t5x_written, tiny_params, tmp_path):
  checkpoint_dir = tmp_path / "checkpoint_0"
  checkpoint_dir.mkdir()
  os.symlink(t5x_written["inline"], checkpoint_dir / "checkpoint")
  _assert_trees_equal(t5x_format.load_t5x(str(checkpoint_dir)), tiny_params)
  _assert_trees_equal(t5x_format.load_t5x(str(checkpoint_dir / "checkpoint")), tiny_params)

  bf16 = t5x_format.load_t5x(str(t5x_written["inline"]), dtype=jnp.bfloat16)
  for path, leaf in _leaves(tiny_params).items():
    assert _leaves(bf16)[path].dtype == jnp.bfloat16
    np.testing.assert_array_equal(_leaves(bf16)[path], leaf.astype(jnp.bfloat16))


def test_tensorstore_and_orbax_toy_checkpoints_agree():
  """T5X's repository's own test files, as stored there (no .zarray files in the Orbax one)."""
  legacy = t5x_format.restore_t5x_state(str(_require(T5X_TOY / "tiny_t5" / "checkpoint_1")))
  # The legacy msgpack describes every array itself; this is the content T5X's test expects.
  assert legacy["target"] == {}
  state = legacy["state"]
  assert int(state["step"]) == 1 and int(state["param_states"]["step"]) == 1
  np.testing.assert_array_equal(state["param_states"]["bias"], np.ones(5, np.float32))
  assert state["param_states"]["kernel"].shape == (10, 5)
  assert state["param_states"]["kernel"].dtype == np.float64
  assert 0 < state["param_states"]["kernel"].min() < state["param_states"]["kernel"].max() < 1

  orbax_dir = str(_require(T5X_TOY / "tiny_orbax" / "1"))
  # Its array directories carry no .zarray here, so their shapes/dtypes must be supplied.
  with pytest.raises(ValueError, match="template"):
    t5x_format.restore_t5x_state(orbax_dir)
  template = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  orbax = t5x_format.restore_t5x_state(orbax_dir, template={"state": template})
  _assert_trees_equal(orbax["state"], state)


def test_orbax_metadata_layout(small_params, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  tree = {"_optimizer": {"target": small_params, "state": {"step": np.int32(3)}}}
  for use_ocdbt, use_zarr3 in ((True, False), (False, False), (True, True)):
    directory = tmp_path / f"ocdbt_{use_ocdbt}_zarr3_{use_zarr3}" / "3"
    checkpointer = ocp.Checkpointer(
        ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3))
    checkpointer.save(directory, args=ocp.args.PyTreeSave(tree))
    _assert_trees_equal(t5x_format.load_t5x(str(directory)), small_params)
    assert int(t5x_format.restore_t5x_state(str(directory))["state"]["step"]) == 3


def test_gcs_and_legacy_spec_paths_resolve_against_the_checkpoint():
  spec = {"driver": "zarr", "dtype": "float32",
          "kvstore": {"driver": "gfile", "path": "target.encoder.encoder_norm.scale/"},
          "metadata": {"chunks": np.array([8]), "compressor": {"id": "gzip"}, "shape": [8]}}
  remote = t5x_format._legacy_array_spec(spec, "gs://bucket/run/checkpoint_5", "x")
  assert remote["kvstore"] == {"driver": "gcs", "bucket": "bucket",
                               "path": "run/checkpoint_5/target.encoder.encoder_norm.scale/"}
  assert remote["metadata"]["chunks"] == [8]
  # Written on GCS (placeholder bucket), read from a local copy.
  gcs_written = dict(spec, kvstore={"driver": "gcs", "bucket": "t5x-dummy-bucket",
                                    "path": "target.x"})
  local = t5x_format._legacy_array_spec(gcs_written, "/ckpt/checkpoint_5", "x")
  assert local["kvstore"] == {"driver": "file", "path": "/ckpt/checkpoint_5/target.x/"}
  # TensorStore < 0.1.14 kept the path at the top level.
  old = {"driver": "zarr", "dtype": "float32", "path": "target.x", "metadata": {"shape": [8]}}
  assert t5x_format._legacy_array_spec(old, "/ckpt", "x")["kvstore"]["path"] == "/ckpt/target.x/"


# --------------------------------------------------------------------------- T5X writing


def _t5x_style_read(checkpoint_dir: Path, spec: dict) -> np.ndarray:
  """Opens an array the way T5X's restore does: the spec's chunking and compressor are
  dropped, the relative path is joined to the checkpoint directory, the .zarray rules."""
  spec = t5x_format._to_json(spec)
  del spec["metadata"]["chunks"], spec["metadata"]["compressor"]
  spec["kvstore"] = {"driver": "file", "path": str(checkpoint_dir / spec["kvstore"]["path"])}
  return ts.open(spec, open=True).result().read().result()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_save_t5x_round_trip_in_t5x_layout(small_params, tmp_path, dtype):
  params = t5x_format.cast_floats(small_params, dtype)
  written = Path(t5x_format.save_t5x(params, str(tmp_path), 12))
  assert written == tmp_path / "checkpoint_12"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_12"]  # no temp dir left
  _assert_trees_equal(t5x_format.load_t5x(str(written)), params)

  contents = serialization.msgpack_restore((written / "checkpoint").read_bytes())
  assert contents["version"] == 3
  assert int(contents["optimizer"]["state"]["step"]) == 12
  specs = _leaves(contents["optimizer"]["target"])
  assert specs.keys() == _leaves(params).keys()
  for path, spec in specs.items():
    assert spec["kvstore"]["path"] == ".".join(("target",) + path)  # relative, T5X naming
    assert spec["dtype"] == jnp.dtype(dtype).name
    np.testing.assert_array_equal(_t5x_style_read(written, spec), _leaves(params)[path])


def test_save_t5x_inline_and_missing_zarray(small_params, tmp_path):
  inline = Path(t5x_format.save_t5x(small_params, str(tmp_path), 1, inline=True))
  assert [p.name for p in inline.iterdir()] == ["checkpoint"]
  _assert_trees_equal(t5x_format.load_t5x(str(inline)), small_params)
  bf16 = t5x_format.cast_floats(small_params, jnp.bfloat16)
  inline_bf16 = t5x_format.save_t5x(bf16, str(tmp_path), 4, inline=True)
  _assert_trees_equal(t5x_format.load_t5x(inline_bf16), bf16)

  stripped = Path(t5x_format.save_t5x(small_params, str(tmp_path), 2))
  for zarray in stripped.glob("*/.zarray"):
    zarray.unlink()
  _assert_trees_equal(t5x_format.load_t5x(str(stripped)), small_params)

  with pytest.raises(FileExistsError, match="checkpoint_2"):
    t5x_format.save_t5x(small_params, str(tmp_path), 2)
  with pytest.raises(ValueError, match="step"):
    t5x_format.save_t5x(small_params, str(tmp_path), -1)


# --------------------------------------------------------------------------- errors


def test_missing_checkpoint_and_array_are_named(small_params, tmp_path):
  missing = tmp_path / "checkpoint_7"
  with pytest.raises(FileNotFoundError, match=str(missing)):
    t5x_format.load_t5x(str(missing))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match=f"no T5X checkpoint at {empty}"):
    t5x_format.load_t5x(str(empty))

  written = Path(t5x_format.save_t5x(small_params, str(tmp_path), 3))
  shutil.rmtree(written / "target.encoder.layers_1.mlp.wo.kernel")
  with pytest.raises(FileNotFoundError, match="encoder/layers_1/mlp/wo/kernel"):
    t5x_format.load_t5x(str(written))

  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_format.load_hf(str(empty))
  (empty / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
  with pytest.raises(ValueError, match=r"missing T5 config fields \['vocab_size', 'd_kv'"):
    hf_format.load_hf(str(empty))
  hf_config = {"model_type": "t5", "vocab_size": 32, "d_model": 8, "d_kv": 2, "d_ff": 16,
               "num_layers": 1, "num_heads": 4}
  (empty / "config.json").write_text(json.dumps(hf_config))
  with pytest.raises(FileNotFoundError, match=f"model.safetensors .* in {empty}"):
    hf_format.load_hf(str(empty))


def test_shape_mismatch_names_path_and_both_shapes(small_params):
  wider = dataclasses.replace(SMALL_CONFIG, mlp_dim=32)
  with pytest.raises(ValueError) as error:
    t5x_format.check_params(t5x_format.expected_param_shapes(wider), small_params, "small")
  message = str(error.value)
  # Sorted paths: the first mismatching one is the decoder's first gated MLP input.
  assert "small: parameter decoder/layers_0/mlp/wi_0/kernel" in message
  assert "(8, 16)" in message and "(8, 32)" in message

  expected = t5x_format.expected_param_shapes(SMALL_CONFIG)
  t5x_format.check_params(expected, small_params, "small")
  pruned = {**small_params, "decoder": {k: v for k, v in small_params["decoder"].items()
                                       if k != "logits_dense"}}
  with pytest.raises(ValueError, match="missing parameter decoder/logits_dense/kernel"):
    t5x_format.check_params(expected, pruned, "small")
  extra = {**small_params, "extra": {"kernel": np.zeros((2, 2))}}
  with pytest.raises(ValueError, match=r"unexpected parameter extra/kernel with shape \(2, 2\)"):
    t5x_format.check_params(expected, extra, "small")


# --------------------------------------------------------------------------- Hugging Face


def _relative_error(actual, expected) -> float:
  return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def _inputs(vocab_size: int):
  """Encoder tokens (second row padded), decoder inputs starting at 0, nonzero targets.

  Lengths beyond 20 reach the logarithmic and the saturated relative-position buckets.
  """
  rng = np.random.default_rng(1)
  encoder = rng.integers(2, vocab_size, (2, 26))
  encoder[1, 17:] = 0
  target = rng.integers(2, vocab_size, (2, 23))
  decoder_input = np.concatenate([np.zeros((2, 1), target.dtype), target[:, :-1]], axis=1)
  return encoder, decoder_input, target


def _hf_outputs(model, encoder, decoder_input):
  with torch.no_grad():
    mask = torch.tensor(encoder > 0)
    encoded = model.encoder(input_ids=torch.tensor(encoder), attention_mask=mask)
    logits = model(input_ids=torch.tensor(encoder), attention_mask=mask,
                   decoder_input_ids=torch.tensor(decoder_input)).logits
  return encoded.last_hidden_state.numpy(), logits.numpy()


@needs_hf
@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_parity(tmp_path, name):
  hf_model, config, params = hf_model_and_params(tmp_path, name, seed=3)
  hf = HF_CONFIGS[name]
  assert config.emb_dim == hf["d_model"] and config.head_dim == hf["d_kv"]
  assert config.num_heads * config.head_dim != config.emb_dim
  assert config.logits_via_embedding == hf["tie_word_embeddings"]
  assert config.mlp_activations == {"relu": ("relu",), "gated-gelu": ("gelu", "linear")}[
      hf["feed_forward_proj"]]

  encoder, decoder_input, target = _inputs(config.vocab_size)
  hf_encoded, hf_logits = _hf_outputs(hf_model, encoder, decoder_input)
  model = Transformer(config)

  @jax.jit  # one compilation is much cheaper than op-by-op dispatch on CPU
  def forward(params, encoder, decoder_input, target):
    return (model.apply({"params": params}, encoder, method=Transformer.encode),
            model.apply({"params": params}, encoder, decoder_input, target))

  encoded, logits = map(np.asarray, forward(params, encoder, decoder_input, target))
  real = encoder > 0  # padded encoder positions are unspecified in both
  assert _relative_error(encoded[real], hf_encoded[real]) <= 1e-4
  assert _relative_error(logits, hf_logits) <= 1e-4


@needs_hf
@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_save_hf_round_trip(tmp_path, name):
  hf_model, config, params = hf_model_and_params(tmp_path / "original", name, seed=4)
  saved = tmp_path / "saved"
  hf_format.save_hf(config, params, str(saved))
  reloaded_config, reloaded = hf_format.load_hf(str(saved))
  assert reloaded_config == config
  _assert_trees_equal(reloaded, params)

  encoder, decoder_input, _ = _inputs(config.vocab_size)
  hf_reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(saved)).eval()
  np.testing.assert_array_equal(_hf_outputs(hf_reloaded, encoder, decoder_input)[1],
                                _hf_outputs(hf_model, encoder, decoder_input)[1])


@needs_hf
def test_load_hf_pytorch_bin_with_tied_copies(tmp_path):
  hf_model, config, params = hf_model_and_params(tmp_path / "safetensors", "t5_1_0", seed=5)
  folder = tmp_path / "bin"
  folder.mkdir()
  shutil.copy(tmp_path / "safetensors" / "config.json", folder)
  # A full state dict also holds encoder/decoder embed_tokens and lm_head (all tied).
  torch.save(hf_model.state_dict(), folder / "pytorch_model.bin")
  bin_config, bin_params = hf_format.load_hf(str(folder))
  assert bin_config == config
  _assert_trees_equal(bin_params, params)


@needs_hf
def test_load_hf_head_follows_the_model_file(tmp_path):
  # An untied config built by transformers as is: transformers 5 shares lm_head with the
  # embedding (and leaves it out of the file), transformers 4 keeps it separate.
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(**HF_CONFIGS["t5_1_1"]))
  model.save_pretrained(tmp_path)
  config, params = hf_format.load_hf(str(tmp_path))
  assert not config.logits_via_embedding
  np.testing.assert_array_equal(params["decoder"]["logits_dense"]["kernel"],
                                model.lm_head.weight.detach().numpy().T)


@needs_hf
def test_load_hf_errors(tmp_path):
  _, _, _ = hf_model_and_params(tmp_path, "t5_1_1", seed=6)
  config_path = tmp_path / "config.json"
  hf_config = json.loads(config_path.read_text())
  config_path.write_text(json.dumps({**hf_config, "d_ff": 30}))
  with pytest.raises(ValueError) as error:
    hf_format.load_hf(str(tmp_path))
  assert "decoder/layers_0/mlp/wi_0/kernel" in str(error.value)
  assert "(12, 28)" in str(error.value) and "(12, 30)" in str(error.value)

  config_path.write_text(json.dumps({**hf_config, "feed_forward_proj": "gelu"}))
  with pytest.raises(ValueError, match="feed_forward_proj 'gelu'"):
    hf_format.load_hf(str(tmp_path))
  config_path.write_text(json.dumps({**hf_config, "model_type": "bart"}))
  with pytest.raises(ValueError, match="model_type is 'bart'"):
    hf_format.load_hf(str(tmp_path))


def test_random_params_in_a_dtype_and_drawn_on_the_device():
  config = T5Config(vocab_size=96, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                    num_encoder_layers=2, num_decoder_layers=2,
                    mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  shapes = t5x_format.expected_param_shapes(config)
  host = dict(t5x_format.flatten_params(t5x_format.random_params(config, 0)))
  # In a dtype: the float32 draw rounded once, the same values the float32 draw gives.
  for path, leaf in t5x_format.flatten_params(t5x_format.random_params(config, 0, "bfloat16")):
    assert leaf.dtype == jnp.bfloat16, path
    np.testing.assert_array_equal(leaf, host[path].astype(jnp.bfloat16), err_msg=str(path))

  device = dict(t5x_format.flatten_params(
      t5x_format.random_params(config, 0, "bfloat16", on_device=True)))
  assert {p: l.shape for p, l in device.items()} == {
      p: l.shape for p, l in t5x_format.flatten_params(shapes)}
  assert all(isinstance(leaf, jax.Array) and leaf.dtype == jnp.bfloat16
             for leaf in device.values())
  again = dict(t5x_format.flatten_params(
      t5x_format.random_params(config, 0, "bfloat16", on_device=True)))
  other = dict(t5x_format.flatten_params(
      t5x_format.random_params(config, 1, "bfloat16", on_device=True)))
  path = ("token_embedder", "embedding")
  np.testing.assert_array_equal(device[path], again[path])  # a seed gives the same values
  assert not np.array_equal(np.asarray(device[path]), np.asarray(other[path]))
  # The same law as numpy's: norms 1 + N(0, 1), every other leaf N(0, 1 / fan_in), and no two
  # leaves alike (each has its own key).
  norms = np.concatenate([np.asarray(l, np.float32) for l in device.values() if l.ndim == 1])
  kernels = np.concatenate([np.asarray(l, np.float32).ravel() * np.sqrt(l.shape[0])
                            for l in device.values() if l.ndim > 1])
  assert norms.size > 300 and kernels.size > 50_000
  assert abs(norms.mean() - 1) < 0.15 and abs(norms.std() - 1) < 0.15
  assert abs(kernels.mean()) < 0.02 and abs(kernels.std() - 1) < 0.02
  firsts = {float(np.asarray(l, np.float32).ravel()[0]) for l in device.values()}
  assert len(firsts) > len(device) // 2
