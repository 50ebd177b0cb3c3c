"""The demo pair's storage round-trips, and the shipped files match configs/demo/*.gin."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import data
from spec_decode import demo_pair
from spec_decode import network

TINY = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                        num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                        mlp_activations=("gelu", "linear"), dropout_rate=0.0)


def test_round_trip(tmp_path):
  tokens = jnp.ones((1, 4), jnp.int32)
  params = network.Transformer(TINY).init(jax.random.PRNGKey(0), tokens, tokens, tokens)["params"]
  demo_pair.save_model(params, TINY, tmp_path / "m.safetensors")
  config, loaded = demo_pair.load_model(tmp_path / "m.safetensors")
  assert config == dataclasses.replace(TINY, dtype="float32")
  flat, flat_loaded = (jax.tree_util.tree_leaves_with_path(p) for p in (params, loaded))
  for (path, value), (loaded_path, loaded_value) in zip(flat, flat_loaded, strict=True):
    assert path == loaded_path
    assert loaded_value.dtype == np.float32
    np.testing.assert_array_equal(loaded_value, np.asarray(value).astype(np.float16))


@pytest.mark.parametrize("name", ["target", "draft"])
def test_shipped_model_matches_gin(name):
  path = demo_pair.ASSET_DIR / f"{name}.safetensors"
  if not path.exists():
    pytest.skip(f"{path} not shipped")
  config, params = demo_pair.load_model(name)
  gin_config = demo_pair.config_from_gin(str(data.REPO_ROOT / "configs" / "demo" / f"{name}.gin"))
  assert config == gin_config
  expected = jax.eval_shape(network.Transformer(config).init, jax.random.PRNGKey(0),
                            *(jnp.ones((1, 4), jnp.int32),) * 3)["params"]
  assert jax.tree_util.tree_structure(expected) == jax.tree_util.tree_structure(params)
  for want, got in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(params)):
    assert want.shape == got.shape and got.dtype == np.float32
