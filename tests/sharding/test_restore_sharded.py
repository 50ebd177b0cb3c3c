"""`decode_layout.restore_sharded`: T5X checkpoints read straight into their shards (8 devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest

CONFIG = network.T5Config(vocab_size=64, emb_dim=16, num_heads=8, head_dim=2,
                          num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16,
                          mlp_activations=("gelu", "linear"), dropout_rate=0.0)
MLP_KERNEL = ("decoder", "layers_0", "mlp", "wi_0", "kernel")  # [E, mlp]: mlp over 'model'


@pytest.fixture(scope="module")
def setup():
  """(params as numpy, template, shardings on a (2, 4) mesh)."""
  tokens = jnp.ones((1, 1), jnp.int32)
  variables = network.Transformer(CONFIG).init(jax.random.PRNGKey(0), tokens, tokens, tokens)
  template, _ = partitioning.abstract_params(CONFIG)
  partitioner = partitioning.PjitPartitioner(mesh_shape=(2, 4))
  return (jax.device_get(variables["params"]), template,
          partitioner.params_shardings(variables["params_axes"], template))


def _leaf(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _assert_restored(restored, params, shardings, dtype=None):
  flat_restored = jax.tree_util.tree_leaves_with_path(restored)
  flat_params = jax.tree_util.tree_leaves(params)
  flat_shardings = jax.tree_util.tree_leaves(shardings)
  assert len(flat_restored) == len(flat_params)
  for (path, array), expected, sharding in zip(flat_restored, flat_params, flat_shardings):
    expected = np.asarray(expected, dtype or expected.dtype)
    assert array.sharding == sharding, jax.tree_util.keystr(path)
    assert array.dtype == expected.dtype
    for shard in array.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index])


@pytest.mark.parametrize("inline", [False, True], ids=["tensorstore", "inline"])
def test_restores_each_leaf_into_its_shards(setup, tmp_path, inline):
  params, template, shardings = setup
  path = t5x_format.save_t5x(params, str(tmp_path), step=3, inline=inline)
  restored = decode_layout.restore_sharded(path, shardings, template)
  _assert_restored(restored, params, shardings)
  kernel = _leaf(restored, MLP_KERNEL)
  assert kernel.addressable_shards[0].data.shape == (CONFIG.emb_dim, CONFIG.mlp_dim // 4)


def test_tensorstore_arrays_are_read_slice_by_slice(setup, tmp_path, monkeypatch):
  """Exactly the distinct device slices are read, each once: a 'model'-split kernel in four
  quarters (each shared by its two 'data' replicas), a replicated scale once for 8 devices."""
  params, template, shardings = setup
  path = t5x_format.save_t5x(params, str(tmp_path), step=1)
  reads = []
  read_slice = t5x_format.read_slice

  def recording_read_slice(array, index):
    assert isinstance(array, ts.TensorStore)  # opened, never read whole up front
    data = read_slice(array, index)
    reads.append(data.shape)
    return data

  monkeypatch.setattr(t5x_format, "read_slice", recording_read_slice)
  decode_layout.restore_sharded(path, shardings, template)
  expected = []
  for leaf, sharding in zip(jax.tree_util.tree_leaves(template),
                            jax.tree_util.tree_leaves(shardings)):
    distinct = {str(index) for index in sharding.devices_indices_map(leaf.shape).values()}
    expected += [sharding.shard_shape(leaf.shape)] * len(distinct)
  assert sorted(reads) == sorted(expected)
  assert reads.count((CONFIG.emb_dim, CONFIG.mlp_dim // 4)) >= 4  # e.g. mlp/wi_0/kernel


def test_casts_floating_parameters(setup, tmp_path):
  params, template, shardings = setup
  path = t5x_format.save_t5x(params, str(tmp_path), step=0)
  restored = decode_layout.restore_sharded(path, shardings, template, dtype=jnp.bfloat16)
  _assert_restored(restored, params, shardings, dtype=jnp.bfloat16)


def test_checkpoint_must_match_the_template(setup, tmp_path):
  params, template, shardings = setup
  params = jax.tree_util.tree_map(lambda x: x, params)
  params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"] = np.zeros((3, 3), np.float32)
  path = t5x_format.save_t5x(params, str(tmp_path), step=0)
  with pytest.raises(ValueError, match=r"decoder/layers_0/mlp/wo/kernel has shape \(3, 3\), "
                                       r"expected \(16, 16\)"):
    decode_layout.restore_sharded(path, shardings, template)
