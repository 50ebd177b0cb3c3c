"""Tests of spec_decode.t5.network: T5X tree, gin configs, relative buckets, cached decoding."""

import math

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from spec_decode import paths
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.engine.decoding import DecodingState

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest

CONFIG_DIR = paths.CONFIGS / "models"

FAMILIES = {
    "t5_1_0": dict(mlp_activations=("relu",), logits_via_embedding=True),
    "t5_1_1": dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False),
}

# Inputs shared by the decoding tests (fixed shapes, so each jitted function compiles once).
# Row 0 of the encoder input is padded; every decoder target is non-zero.
ENCODER_TOKENS = jnp.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2]], jnp.int32)
DECODER_INPUTS = jnp.array([[0, 5, 6, 7, 8, 9], [0, 11, 12, 13, 14, 15]], jnp.int32)
DECODER_TARGETS = jnp.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], jnp.int32)
BATCH, DECODE_LEN = DECODER_INPUTS.shape
CACHE_LEN = 8
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def tiny_config(family: str) -> network.T5Config:
  # num_heads * head_dim != emb_dim, and few buckets so that distances of a few
  # positions already fall into the logarithmic buckets.
  fields = dict(vocab_size=23, emb_dim=8, num_heads=3, head_dim=4, mlp_dim=7,
                num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                relative_attention_num_buckets=8, relative_attention_max_distance=12)
  return network.T5Config(**fields, **FAMILIES[family])


def init_shapes(module: network.Transformer):
  tokens = jnp.ones((1, 3), jnp.int32)
  return jax.eval_shape(lambda: module.init(jax.random.key(0), tokens, tokens, tokens))


# ------------------------------------------------------------------ parameters and gin


GIN_PARAMETER_COUNTS = {
    "t5_1_1/small.gin": 76_961_152,
    "t5_1_1/base.gin": 247_577_856,
    "t5_1_1/large.gin": 783_150_080,
    "t5_1_1/xl.gin": 2_849_757_184,
    "t5_1_1/xxl.gin": 11_135_332_352,
    "t5_1_0/small.gin": 60_506_624,
    "t5_1_0/base.gin": 222_903_552,
    "t5_1_0/large.gin": 737_668_096,
    "t5_1_0/3B.gin": 2_851_598_336,
    "t5_1_0/11B.gin": 11_307_321_344,
}


@pytest.mark.parametrize("config_file", sorted(GIN_PARAMETER_COUNTS))
def test_gin_config_parameter_counts(config_file):
  gin.clear_config()
  try:
    gin.parse_config_file(str(CONFIG_DIR / config_file))
    module = gin.get_configurable(network.Transformer)()  # config comes from the gin binding
  finally:
    gin.clear_config()
  assert module.config.vocab_size == 32128
  assert module.config.logits_via_embedding == config_file.startswith("t5_1_0")
  params = init_shapes(module)["params"]
  assert sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params)) == (
      GIN_PARAMETER_COUNTS[config_file])


def expected_tree(family: str, vocab: int, emb: int, joined_kv: int, heads: int, buckets: int,
                  mlp: int, encoder_layers: int, decoder_layers: int) -> dict:
  """T5X's parameter paths -> (shape, logical axes), written out from T5X's layers/network."""
  norm = ((emb,), ("embed",))
  qkv = ((emb, joined_kv), ("embed", "joined_kv"))
  out = ((joined_kv, emb), ("joined_kv", "embed"))
  gated = family == "t5_1_1"
  wi_names = ["wi_0", "wi_1"] if gated else ["wi"]

  def attention(prefix):
    return {f"{prefix}/{name}/kernel": qkv for name in ("query", "key", "value")} | {
        f"{prefix}/out/kernel": out}

  def mlp_block(prefix):
    tree = {f"{prefix}/{name}/kernel": ((emb, mlp), ("embed", "mlp")) for name in wi_names}
    tree[f"{prefix}/wo/kernel"] = ((mlp, emb), ("mlp", "embed"))
    return tree

  tree = {
      "token_embedder/embedding": ((vocab, emb), ("vocab", "embed")),
      "encoder/relpos_bias/rel_embedding": ((heads, buckets), ("heads", "relpos_buckets")),
      "encoder/encoder_norm/scale": norm,
      "decoder/relpos_bias/rel_embedding": ((heads, buckets), ("heads", "relpos_buckets")),
      "decoder/decoder_norm/scale": norm,
  }
  for i in range(encoder_layers):
    layer = f"encoder/layers_{i}"
    tree[f"{layer}/pre_attention_layer_norm/scale"] = norm
    tree[f"{layer}/pre_mlp_layer_norm/scale"] = norm
    tree |= attention(f"{layer}/attention") | mlp_block(f"{layer}/mlp")
  for i in range(decoder_layers):
    layer = f"decoder/layers_{i}"
    for name in ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm",
                 "pre_mlp_layer_norm"):
      tree[f"{layer}/{name}/scale"] = norm
    tree |= attention(f"{layer}/self_attention") | attention(f"{layer}/encoder_decoder_attention")
    tree |= mlp_block(f"{layer}/mlp")
  if gated:
    tree["decoder/logits_dense/kernel"] = ((emb, vocab), ("embed", "vocab"))
  return tree


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parameter_tree_and_logical_axes(family):
  config = network.T5Config(vocab_size=19, emb_dim=10, num_heads=2, head_dim=3, mlp_dim=6,
                            num_encoder_layers=2, num_decoder_layers=3, **FAMILIES[family])
  variables = init_shapes(network.Transformer(config))
  expected = expected_tree(family, vocab=19, emb=10, joined_kv=6, heads=2, buckets=32, mlp=6,
                           encoder_layers=2, decoder_layers=3)

  shapes = {path: leaf.shape for path, leaf in flatten_dict(variables["params"], sep="/").items()}
  assert shapes == {path: shape for path, (shape, _) in expected.items()}
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(variables["params"]))
  # flax.linen.partitioning stores the names of `<param>` under `<param>_axes`.
  axes = {path.removesuffix("_axes"): meta.names
          for path, meta in flatten_dict(variables["params_axes"], sep="/").items()}
  assert axes == {path: names for path, (_, names) in expected.items()}


# ------------------------------------------------------------------ relative positions


def reference_bucket(relative_position: int, bidirectional: bool, num_buckets: int,
                     max_distance: int) -> int:
  """T5's bucketing in exact arithmetic (boundaries such as distance 16 land as in Mesh TF)."""
  distance = -relative_position
  offset = 0
  if bidirectional:
    num_buckets //= 2
    offset = num_buckets if distance < 0 else 0
    distance = abs(distance)
  distance = max(distance, 0)
  max_exact = num_buckets // 2
  if distance < max_exact:
    return offset + distance
  steps = math.log(distance / max_exact) / math.log(max_distance / max_exact) * (
      num_buckets - max_exact)
  return offset + min(max_exact + math.floor(steps + 1e-9), num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 12), (64, 256)])
def test_relative_position_bucket(bidirectional, num_buckets, max_distance):
  relative = np.arange(-3 * max_distance, 3 * max_distance + 1)
  expected = [reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative]
  got = network.relative_position_bucket(jnp.asarray(relative), bidirectional, num_buckets,
                                         max_distance)
  np.testing.assert_array_equal(got, expected)


def test_relative_position_bucket_known_values():
  # Encoder (bidirectional): 16 buckets per direction; keys before the query use 0..15.
  relative = jnp.array([0, -1, -7, -8, -15, -16, -32, -64, -127, -128, -1000, 1, 16, 1000])
  np.testing.assert_array_equal(network.relative_position_bucket(relative, True, 32, 128),
                                [0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 15, 17, 26, 31])
  # Decoder (causal): future keys all share bucket 0.
  relative = jnp.array([0, 3, -15, -16, -18, -19, -32, -128, -1000])
  np.testing.assert_array_equal(network.relative_position_bucket(relative, False, 32, 128),
                                [0, 0, 15, 16, 16, 17, 21, 31, 31])


# ------------------------------------------------------------------ decoding


class TinyModel:
  """A tiny model with random parameters and jitted entry points (each compiles once)."""

  def __init__(self, family: str):
    self.config = tiny_config(family)
    module = network.Transformer(self.config)
    self.params = jax.device_put(t5x_format.random_params(self.config, seed=len(family)))
    self.forward = jax.jit(lambda encoder_tokens, decoder_inputs, decoder_targets: module.apply(
        {"params": self.params}, encoder_tokens, decoder_inputs, decoder_targets))
    self.init_cache = jax.jit(lambda encoder_tokens: network.init_decode_cache(
        module, self.params, encoder_tokens, CACHE_LEN))
    self._step = jax.jit(lambda params, state: network.make_tokens_to_logits(
        self.config, params)(state))

  def step(self, cache, cur_index, tokens):
    """One tokens_to_logits call; cur_index is a per-row list."""
    state = DecodingState(cur_index=jnp.asarray(cur_index, jnp.int32),
                          cur_token=jnp.asarray(tokens, jnp.int32),
                          sequences=jnp.zeros((BATCH, CACHE_LEN), jnp.int32), cache=cache)
    return self._step(self.params, state)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request) -> TinyModel:
  return TinyModel(request.param)


# The padding logic is shared by both families: one family spares a compilation.
@pytest.mark.parametrize("tiny", ["t5_1_1"], indirect=True)
def test_encoder_padding_is_ignored(tiny):
  unpadded = tiny.forward(ENCODER_TOKENS[:1, :3], DECODER_INPUTS[:1], DECODER_TARGETS[:1])
  padded = tiny.forward(ENCODER_TOKENS, DECODER_INPUTS, DECODER_TARGETS)[:1]
  np.testing.assert_allclose(padded, unpadded, **TOLERANCE)


def test_cache_layout(tiny):
  cache = tiny.init_cache(ENCODER_TOKENS)
  cfg = tiny.config
  axes = network.cache_logical_axes(cache)
  assert jax.tree.structure(cache) == jax.tree.structure(
      axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  for leaf, names in zip(jax.tree.leaves(cache), jax.tree.leaves(
      axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
    assert leaf.shape[0] == BATCH and names[0] == "batch" and len(names) == leaf.ndim
  np.testing.assert_array_equal(cache["cache_index"], [0, 0])
  np.testing.assert_array_equal(cache["encoder_mask"], ENCODER_TOKENS > 0)
  heads = (cfg.num_heads, cfg.head_dim)
  for i in range(cfg.num_decoder_layers):
    layer = cache[f"layers_{i}"]
    for name in ("cached_key", "cached_value"):
      assert layer["self_attention"][name].shape == (BATCH, CACHE_LEN) + heads
      assert not layer["self_attention"][name].any()
      # Length-minor (network.layers.to_cross_cache).
      assert layer["encoder_decoder_attention"][name].shape == (
          (BATCH,) + heads + ENCODER_TOKENS.shape[1:])


def test_chunked_decode_matches_single_steps_and_teacher_forcing(tiny):
  teacher_forced = tiny.forward(ENCODER_TOKENS, DECODER_INPUTS, DECODER_TARGETS)
  cache = tiny.init_cache(ENCODER_TOKENS)

  first, cache_after_first = tiny.step(cache, [0, 0], DECODER_INPUTS[:, :4])
  second, chunked_cache = tiny.step(cache_after_first, [4, 4], DECODER_INPUTS[:, 4:])
  chunked = jnp.concatenate([first, second], axis=1)
  assert chunked.dtype == jnp.float32
  np.testing.assert_array_equal(chunked_cache["cache_index"], [DECODE_LEN, DECODE_LEN])

  # The same positions one token at a time, inside lax.while_loop as the engine runs it.
  @jax.jit
  def single_steps(params, cache):
    def body(carry):
      i, cache, logits = carry
      state = DecodingState(cur_index=jnp.full((BATCH,), i), cur_token=DECODER_INPUTS[:, i, None],
                            sequences=jnp.zeros((BATCH, CACHE_LEN), jnp.int32), cache=cache)
      step_logits, cache = network.make_tokens_to_logits(tiny.config, params)(state)
      return i + 1, cache, logits.at[:, i].set(step_logits[:, 0])

    logits = jnp.zeros(teacher_forced.shape, jnp.float32)
    return jax.lax.while_loop(lambda carry: carry[0] < DECODE_LEN, body, (0, cache, logits))[1:]

  single_cache, single = single_steps(tiny.params, cache)

  np.testing.assert_allclose(chunked, teacher_forced, **TOLERANCE)
  np.testing.assert_allclose(single, teacher_forced, **TOLERANCE)
  for chunked_leaf, single_leaf in zip(jax.tree.leaves(chunked_cache),
                                       jax.tree.leaves(single_cache)):
    np.testing.assert_allclose(chunked_leaf, single_leaf, **TOLERANCE)


def test_rollback_never_reads_stale_entries(tiny):
  cache = tiny.init_cache(ENCODER_TOKENS)
  _, cache = tiny.step(cache, [0, 0], DECODER_INPUTS[:, :2])
  # Write positions 2..5, then roll back to position 3 and write two other tokens.
  rewritten = jnp.array([[21, 22], [19, 18]])
  _, speculated = tiny.step(cache, [2, 2], DECODER_INPUTS[:, 2:])
  logits, _ = tiny.step(speculated, [3, 3], rewritten)

  # Here positions 3..5 held other tokens before the rollback; 3 and 4 are overwritten and 5
  # is stale, so nothing may change at all.
  other_stale = DECODER_INPUTS[:, 2:].at[:, 1:].set(jnp.array([[1, 2, 3], [4, 5, 6]]))
  _, speculated_differently = tiny.step(cache, [2, 2], other_stale)
  logits_differently, _ = tiny.step(speculated_differently, [3, 3], rewritten)
  np.testing.assert_array_equal(logits, logits_differently)

  # And they agree with a model that never saw the rolled-back tokens.
  fresh_inputs = DECODER_INPUTS.at[:, 3:5].set(rewritten)
  fresh = tiny.forward(ENCODER_TOKENS, fresh_inputs, DECODER_TARGETS)
  np.testing.assert_allclose(logits, fresh[:, 3:5], **TOLERANCE)


def test_rows_at_different_positions_are_independent(tiny):
  cache = tiny.init_cache(ENCODER_TOKENS)
  _, cache = tiny.step(cache, [0, 0], DECODER_INPUTS[:, :4])
  # Row 0 rolls back to position 1 while row 1 moves on to position 4.
  tokens = jnp.array([[21, 22], [DECODER_INPUTS[1, 4], DECODER_INPUTS[1, 5]]])
  logits, cache = tiny.step(cache, [1, 4], tokens)
  np.testing.assert_array_equal(cache["cache_index"], [3, 6])

  row0_inputs = DECODER_INPUTS.at[0, 1:3].set(tokens[0])
  teacher_forced = tiny.forward(ENCODER_TOKENS, row0_inputs, DECODER_TARGETS)
  np.testing.assert_allclose(logits[0], teacher_forced[0, 1:3], **TOLERANCE)
  np.testing.assert_allclose(logits[1], teacher_forced[1, 4:6], **TOLERANCE)


def test_writes_beyond_cache_length_are_dropped(tiny):
  cache = tiny.init_cache(ENCODER_TOKENS)
  _, cache = tiny.step(cache, [0, 0], DECODER_INPUTS[:, :4])
  _, cache = tiny.step(cache, [4, 4], DECODER_INPUTS[:, 4:])
  tokens = jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]])
  # Positions 6, 7 fit into the cache (length 8); positions 8, 9 do not.
  overflow_logits, overflow_cache = tiny.step(cache, [6, 6], tokens)
  fitting_logits, fitting_cache = tiny.step(cache, [6, 6], tokens[:, :2])

  np.testing.assert_allclose(overflow_logits[:, :2], fitting_logits, **TOLERANCE)
  for i in range(tiny.config.num_decoder_layers):
    for name in ("cached_key", "cached_value"):
      overflow = overflow_cache[f"layers_{i}"]["self_attention"][name]
      fitting = fitting_cache[f"layers_{i}"]["self_attention"][name]
      before = cache[f"layers_{i}"]["self_attention"][name]
      np.testing.assert_array_equal(overflow[:, :6], before[:, :6])
      # A clipped (instead of dropped) write would put position 8's or 9's entry at 7.
      np.testing.assert_allclose(overflow[:, 6:], fitting[:, 6:], **TOLERANCE)


def test_call_refuses_flax_cache_decoding():
  module = network.Transformer(tiny_config("t5_1_1"))
  with pytest.raises(ValueError, match="init_decode_cache"):
    module.apply({"params": {}}, ENCODER_TOKENS, DECODER_INPUTS, DECODER_TARGETS, decode=True)
