"""The layers both networks are built of, as T5X keeps its own in `t5x/examples/t5/layers.py`:
the hyperparameters (`T5Config`), relative-position buckets, `Dense`, `Embed`, `LayerNorm`,
`RelativePositionBias`, `MultiHeadAttention`, `MlpBlock`, and the decoder layer and stack both
models share (`DecoderLayer`, `DecoderStack`: with cross-attention in `network.Transformer`,
without in `decoder_only.DecoderOnlyTransformer`), computing with the products of
`spec_decode.t5.ops`. What they compute, and the contracts: `spec_decode.t5.network`'s
docstring; callers import them from there.
"""

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from spec_decode.t5.ops import Array, Ops, transposed_dot

Initializer = Callable[..., Array]
DecodeCache = dict[str, Any]

# Additive attention bias for masked positions (T5X's value); exp() of it underflows to 0.
MASKED_BIAS = -1e10
LAYER_NORM_EPSILON = 1e-6


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 model; field names and defaults follow T5X's `T5Config`.

  `dtype` is the activation dtype (a dtype or its name, e.g. 'bfloat16'); parameters
  are always float32 and logits are always float32. `float32_attention_logits` computes the
  attention logits and softmax in float32 whatever `dtype` (T5X's default: in `dtype`).
  """

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  float32_attention_logits: bool = False

  def __post_init__(self):
    # A tuple keeps the frozen config hashable when gin or a caller passes a list.
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))


def _activation_dtype(config: T5Config) -> jnp.dtype:
  return jnp.dtype(config.dtype)


# --------------------------------------------------------------------------- buckets


@functools.lru_cache(maxsize=None)
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """Bucket of every relative position in [-max_distance, max_distance], as int32.

  Beyond +-max_distance the bucket no longer changes, so callers clip into this range.
  """
  relative = np.arange(-max_distance, max_distance + 1)
  distance = -relative  # > 0 when the key lies before the query
  if bidirectional:
    num_buckets //= 2
    offset = np.where(distance < 0, num_buckets, 0)
    distance = np.abs(distance)
  else:
    offset = np.zeros_like(distance)
    distance = np.maximum(distance, 0)
  max_exact = num_buckets // 2
  # float32 throughout, as Mesh TF / T5X / HF compute it: distances such as 16, 32, 64
  # sit exactly on bucket boundaries, where another precision could round differently.
  log_ratio = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(max_exact))
  scaled = log_ratio / np.float32(np.log(max_distance / max_exact)) * np.float32(
      num_buckets - max_exact)
  logarithmic = np.minimum(max_exact + scaled.astype(np.int32), num_buckets - 1)
  return (offset + np.where(distance < max_exact, distance, logarithmic)).astype(np.int32)


def relative_position_bucket(relative_position: Array, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> Array:
  """T5's bucket index in [0, num_buckets) of `key_position - query_position` (any shape)."""
  table = jnp.asarray(_bucket_table(bidirectional, num_buckets, max_distance))
  return table[jnp.clip(relative_position, -max_distance, max_distance) + max_distance]


# --------------------------------------------------------------------------- layers


class Dense(nn.Module):
  """Bias-free `x @ kernel` with a float32 kernel [in, out] carrying logical axis names, both
  cast to `dtype` and multiplied by `product` (`Ops.dense_product`)."""

  features: int
  kernel_axes: tuple[str, str]
  kernel_init: Initializer
  dtype: Any = jnp.float32
  product: Callable[[Array, Array], Array] = jnp.dot

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = nn_partitioning.param_with_axes(
        "kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32,
        axes=self.kernel_axes)
    return self.product(x.astype(self.dtype), kernel.astype(self.dtype))


class Embed(nn.Module):
  """Token embedding [V, E]; `attend` is the transposed (tied) output projection, computed by
  `product` (`Ops.embedding_product`)."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32
  product: Callable[[Array, Array], Array] = transposed_dot

  def setup(self):
    self.embedding = nn_partitioning.param_with_axes(
        "embedding", nn.initializers.normal(stddev=1.0),
        (self.num_embeddings, self.features), jnp.float32, axes=("vocab", "embed"))

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)

  def attend(self, x: Array) -> Array:
    """[..., E] -> float32 [..., V]."""
    return self.product(x.astype(jnp.float32), self.embedding)


class LayerNorm(nn.Module):
  """T5's RMS norm: no mean subtraction, no bias; parameter `scale` [E].

  As T5X's: normalized in float32, rounded to `dtype`, then scaled in `dtype` (in bfloat16 two
  roundings, which T5X's logits carry)."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = x.astype(jnp.float32)
    scale = nn_partitioning.param_with_axes(
        "scale", nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=("embed",))
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    normalized = (x * jax.lax.rsqrt(mean_square + LAYER_NORM_EPSILON)).astype(self.dtype)
    return normalized * scale.astype(self.dtype)


class RelativePositionBias(nn.Module):
  """Per-head attention bias of bucketed relative positions; table `rel_embedding` [H, buckets]."""

  config: T5Config
  bidirectional: bool

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array) -> Array:
    """[b, q] and [b, kv] positions (b is B or 1) -> bias [b, H, q, kv] in the activation
    dtype (T5X rounds the table to it)."""
    cfg = self.config
    table = nn_partitioning.param_with_axes(
        "rel_embedding", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
        (cfg.num_heads, cfg.relative_attention_num_buckets), jnp.float32,
        axes=("heads", "relpos_buckets"))
    buckets = relative_position_bucket(
        key_positions[:, None, :] - query_positions[:, :, None], self.bidirectional,
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
    table = table.astype(_activation_dtype(cfg))
    return jnp.moveaxis(jnp.take(table, buckets, axis=1), 0, 1)


def _mask_to_bias(mask: Array, dtype: Any) -> Array:
  """0 where `mask`, else MASKED_BIAS, in `dtype`: T5X adds its biases in the activation dtype."""
  return jnp.where(mask, 0.0, MASKED_BIAS).astype(dtype)


class MultiHeadAttention(nn.Module):
  """T5 attention with kernels query/key/value [E, H*D] and out [H*D, E]. `decoder_projections`:
  those of 'query', 'key' and 'value' computed by `Ops.decoder_projection` (a decoder layer's)."""

  config: T5Config
  ops: Ops = Ops()
  decoder_projections: tuple[str, ...] = ()

  def setup(self):
    cfg = self.config
    dtype = _activation_dtype(cfg)
    joined_kv = cfg.num_heads * cfg.head_dim
    kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

    def query_init(key, shape, param_dtype=jnp.float32):
      # T5 never scales logits by 1/sqrt(head_dim); the scale lives in the query weights,
      # divided (as T5X does) by sqrt(head_dim) rounded to the activation dtype.
      return kernel_init(key, shape, param_dtype) / jnp.sqrt(cfg.head_dim).astype(dtype)

    def projection(name: str, init: Initializer) -> Dense:
      product = self.ops.decoder_projection if name in self.decoder_projections else None
      return Dense(joined_kv, ("embed", "joined_kv"), init, dtype=dtype,
                   product=product or self.ops.dense_product)

    self.query = projection("query", query_init)
    self.key = projection("key", kernel_init)
    self.value = projection("value", kernel_init)
    self.out = Dense(cfg.emb_dim, ("joined_kv", "embed"), kernel_init, dtype=dtype,
                     product=self.ops.dense_product)
    # Like T5X, one dropout mask per (batch, head, key), shared by all queries.
    self.weights_dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def _split_heads(self, x: Array) -> Array:
    return x.reshape(x.shape[:-1] + (self.config.num_heads, self.config.head_dim))

  def project_query(self, x: Array) -> Array:
    """[B, q, E] -> [B, q, H, D]."""
    return self._split_heads(self.query(x))

  def project_key_value(self, x: Array) -> tuple[Array, Array]:
    """[B, kv, E] -> keys, values [B, kv, H, D]."""
    return self._split_heads(self.key(x)), self._split_heads(self.value(x))

  def attend(self, query: Array, key: Array, value: Array, bias: Array,
             deterministic: bool) -> Array:
    """query [B,q,H,D], key/value [B,kv,H,D] and bias broadcastable to [B,H,q,kv], all in the
    activation dtype -> [B,q,E]. Cast, product and softmax order are T5X's
    `dot_product_attention`: logits and softmax in the activation dtype, or in float32 with
    `float32_attention_logits` (query, key and the rounded bias cast up)."""
    if self.config.float32_attention_logits:
      query, key = query.astype(jnp.float32), key.astype(jnp.float32)
    logits = self.ops.attention_logits(query, key)
    weights = jax.nn.softmax(logits + bias.astype(logits.dtype)).astype(value.dtype)
    weights = self.weights_dropout(weights, deterministic=deterministic)
    mixed = self.ops.attention_mix(weights, value)
    return self.out(mixed.reshape(mixed.shape[:-2] + (-1,)))


def _activation(name: str) -> Callable[[Array], Array]:
  """T5X's naming: 'linear' is the identity, others are flax.linen functions.

  flax's `gelu` is the tanh approximation, which is what T5.1.1 was trained with.
  """
  return (lambda x: x) if name == "linear" else getattr(nn, name)


class MlpBlock(nn.Module):
  """Feed-forward block: `wi` [E, mlp] (or gated `wi_0`, `wi_1`, ...) then `wo` [mlp, E]."""

  config: T5Config
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = _activation_dtype(cfg)
    kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    activations = cfg.mlp_activations
    branches = [
        _activation(name)(Dense(cfg.mlp_dim, ("embed", "mlp"), kernel_init, dtype=dtype,
                                product=self.ops.dense_product,
                                name="wi" if len(activations) == 1 else f"wi_{i}")(x))
        for i, name in enumerate(activations)
    ]
    hidden = functools.reduce(operator.mul, branches)
    hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic=deterministic)
    return Dense(cfg.emb_dim, ("mlp", "embed"), kernel_init, dtype=dtype,
                 product=self.ops.dense_product, name="wo")(hidden)


def _residual_dropout(config: T5Config) -> nn.Dropout:
  # Broadcast along the length axis, as T5X does.
  return nn.Dropout(config.dropout_rate, broadcast_dims=(-2,))


def to_cross_cache(projected: Array) -> Array:
  """Cross-attention keys or values [B,Le,H,D] -> [B,H,D,Le], as the decode cache holds them:
  XLA:TPU's prefill writes them length-minor, and a [B,Le,H,D] cache made it copy them all at
  the decode loop's entry (docs/TPU_COMPILE.md). `from_cross_cache` reads them back."""
  return jnp.transpose(projected, (0, 2, 3, 1))


def from_cross_cache(cached: Array) -> Array:
  return jnp.transpose(cached, (0, 3, 1, 2))


def _overwrite(buffer: Array, entries: Array, positions: Array) -> Array:
  """buffer [B,L,...] with entries [B,q,...] set at positions [B,q]; positions >= L are dropped."""
  # Per row (vmap), so a batch-sharded cache is written where its rows live.
  return jax.vmap(lambda row, new, where: row.at[where].set(new, mode="drop"))(
      buffer, entries.astype(buffer.dtype), positions)


class DecoderLayer(nn.Module):
  """Self-attention, cross-attention (unless `cross_attention` is False: a decoder-only
  layer) and MLP blocks (pre-norm, residual)."""

  config: Any  # T5Config or DecoderOnlyConfig
  ops: Ops = Ops()
  cross_attention: bool = True

  def setup(self):
    cfg = self.config
    dtype = _activation_dtype(cfg)
    self.pre_self_attention_layer_norm = LayerNorm(dtype)
    self.self_attention = MultiHeadAttention(cfg, self.ops, ("query", "key", "value"))
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = LayerNorm(dtype)
      self.encoder_decoder_attention = MultiHeadAttention(cfg, self.ops, ("query",))
    self.pre_mlp_layer_norm = LayerNorm(dtype)
    self.mlp = MlpBlock(cfg, self.ops)
    self.residual_dropout = _residual_dropout(cfg)

  def cross_key_value(self, encoded: Array) -> tuple[Array, Array]:
    """encoded [B,Le,E] -> this layer's cross-attention keys, values as cached, [B,H,D,Le]
    (`to_cross_cache`)."""
    return tuple(map(to_cross_cache, self.encoder_decoder_attention.project_key_value(encoded)))

  def __call__(self, x: Array, self_bias: Array, cross_key_value: tuple[Array, Array] | None,
               cross_bias: Array | None, self_cache: tuple[Array, Array] | None,
               write_positions: Array | None, deterministic: bool, attend_to_fed: bool = False
               ) -> tuple[Array, tuple[Array, Array] | None]:
    """x [B,q,E] -> (x [B,q,E], updated self-attention (keys, values) or None).

    Without `self_cache`, x's own keys/values are attended to (teacher forcing). With a
    cache (keys, values [B,L,H,D]), x's keys/values overwrite the slots
    `write_positions` [B,q] first (out-of-range slots are dropped) and the whole cache
    is attended to, followed, with `attend_to_fed`, by x's own q keys/values (a tree call:
    tokens sharing a position must not read each other's slot); `self_bias` [.., L (+ q)]
    must then mask every slot the queries may not see.
    """
    h = self.pre_self_attention_layer_norm(x)
    key, value = self.self_attention.project_key_value(h)
    if self_cache is not None:
      fed_key, fed_value = key, value
      key = _overwrite(self_cache[0], key, write_positions)
      value = _overwrite(self_cache[1], value, write_positions)
      self_cache = (key, value)
      if attend_to_fed:
        key = jnp.concatenate([key, fed_key.astype(key.dtype)], axis=1)
        value = jnp.concatenate([value, fed_value.astype(value.dtype)], axis=1)
    h = self.self_attention.attend(self.self_attention.project_query(h), key, value, self_bias,
                                   deterministic)
    x = x + self.residual_dropout(h, deterministic=deterministic)

    if self.cross_attention:
      h = self.pre_cross_attention_layer_norm(x)
      h = self.encoder_decoder_attention.attend(
          self.encoder_decoder_attention.project_query(h),
          *map(from_cross_cache, cross_key_value), cross_bias, deterministic)
      x = x + self.residual_dropout(h, deterministic=deterministic)

    h = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.residual_dropout(h, deterministic=deterministic), self_cache


class DecoderStack(nn.Module):
  """Decoder stack plus output projection. `embedder`: the token embedding shared with an
  encoder (T5); None: the stack's own, `token_embedder` (a decoder-only model, whose tree is
  T5X's `decoder/token_embedder`). `cross_attention`: whether its layers attend to an
  encoder."""

  config: Any  # T5Config or DecoderOnlyConfig
  embedder: Embed | None
  ops: Ops = Ops()
  cross_attention: bool = True

  def setup(self):
    cfg = self.config
    if self.embedder is None:
      self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, dtype=_activation_dtype(cfg),
                                  product=self.ops.embedding_product)
    self.relpos_bias = RelativePositionBias(cfg, bidirectional=False)
    self.layers = [DecoderLayer(cfg, self.ops, self.cross_attention)
                   for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = LayerNorm(_activation_dtype(cfg))
    if not cfg.logits_via_embedding:
      self.logits_dense = Dense(
          cfg.vocab_size, ("embed", "vocab"),
          nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"), dtype=jnp.float32,
          product=self.ops.dense_product)
    self.residual_dropout = _residual_dropout(cfg)

  def _embedding(self) -> Embed:
    return self.token_embedder if self.embedder is None else self.embedder

  def cross_key_values(self, encoded: Array) -> list[tuple[Array, Array]]:
    """encoded [B,Le,E] -> per layer (keys, values) as cached, [B,H,D,Le]."""
    return [layer.cross_key_value(encoded) for layer in self.layers]

  def __call__(self, tokens: Array, self_bias: Array,
               cross_key_values: list[tuple[Array, Array]] | None = None,
               cross_bias: Array | None = None,
               self_caches: list[tuple[Array, Array]] | None = None,
               write_positions: Array | None = None, deterministic: bool = True,
               attend_to_fed: bool = False, logits_index: Array | None = None
               ) -> tuple[Array, list]:
    """tokens [B,q] -> (float32 logits [B,q,V], per-layer updated self caches or Nones);
    `cross_key_values`, `cross_bias` only with `cross_attention`; `attend_to_fed` as in
    `DecoderLayer`; with `logits_index` [B], only the logits of token logits_index[b]:
    [B,1,V]."""
    cfg = self.config
    embedder = self._embedding()
    x = self.residual_dropout(embedder(tokens), deterministic=deterministic)
    new_caches = []
    for i, layer in enumerate(self.layers):
      x, new_cache = layer(x, self_bias,
                           None if cross_key_values is None else cross_key_values[i], cross_bias,
                           self_cache=None if self_caches is None else self_caches[i],
                           write_positions=write_positions, deterministic=deterministic,
                           attend_to_fed=attend_to_fed)
      new_caches.append(new_cache)
    if logits_index is not None:
      x = jnp.take_along_axis(x, logits_index[:, None, None], axis=1)
    x = self.residual_dropout(self.decoder_norm(x), deterministic=deterministic)
    if cfg.logits_via_embedding:
      logits = embedder.attend(x) / jnp.sqrt(jnp.float32(cfg.emb_dim))
    else:
      logits = self.logits_dense(x)
    return logits, new_caches

  def empty_cache(self, batch: int, max_decode_len: int) -> DecodeCache:
    """Each layer's empty self-attention cache (no cross-attention entries)."""
    cfg = self.config
    empty = jnp.zeros((batch, max_decode_len, cfg.num_heads, cfg.head_dim), _activation_dtype(cfg))
    return {f"layers_{i}": {"self_attention": {"cached_key": empty, "cached_value": empty}}
            for i in range(cfg.num_decoder_layers)}

  def run_cached(self, cache: DecodeCache, tokens: Array, self_bias: Array,
                 write_positions: Array, attend_to_fed: bool = False,
                 logits_index: Array | None = None) -> tuple[Array, DecodeCache]:
    """A call on the cache: tokens [B,q] written at `write_positions` [B,q] of every layer's
    self-attention cache, `self_bias` masking what each query may see (`DecoderLayer`) ->
    (logits, the cache with its layers' self-attention entries replaced)."""
    layer_caches = [cache[f"layers_{i}"] for i in range(self.config.num_decoder_layers)]
    cross_key_values = cross_bias = None
    if self.cross_attention:
      cross_key_values = [(c["encoder_decoder_attention"]["cached_key"],
                           c["encoder_decoder_attention"]["cached_value"]) for c in layer_caches]
      cross_bias = _mask_to_bias(cache["encoder_mask"][:, None, None, :],
                                 _activation_dtype(self.config))
    logits, new_self = self(
        tokens, self_bias, cross_key_values, cross_bias,
        [(c["self_attention"]["cached_key"], c["self_attention"]["cached_value"])
         for c in layer_caches],
        write_positions=write_positions, attend_to_fed=attend_to_fed, logits_index=logits_index)
    new_cache = dict(cache)
    for i, (key, value) in enumerate(new_self):
      new_cache[f"layers_{i}"] = dict(
          layer_caches[i], self_attention={"cached_key": key, "cached_value": value})
    return logits, new_cache

  def decode_chunk(self, cache: DecodeCache, cur_index: Array, tokens: Array,
                   token_positions: Array | None = None, token_mask: Array | None = None,
                   logits_index: Array | None = None) -> tuple[Array, DecodeCache]:
    """Feeds tokens [B,k] at positions cur_index[b] + j -> (float32 logits [B,k,V], new cache);
    with token_positions [B,k] and token_mask [B,k,k], a tree call; with logits_index [B], the
    logits of fed token logits_index[b] alone, [B,1,V] (the engine's contract)."""
    cache_len = cache["layers_0"]["self_attention"]["cached_key"].shape[1]
    key_positions = jnp.arange(cache_len)[None]
    dtype = _activation_dtype(self.config)
    tree = token_positions is not None
    if tree:
      query_positions = token_positions
      # The cache below cur_index, then the fed tokens themselves, as token_mask says.
      cached = key_positions[:, None, :] < cur_index[:, None, None]
      self_bias = jnp.concatenate([
          self.relpos_bias(query_positions, key_positions) + _mask_to_bias(
              jnp.broadcast_to(cached, token_mask.shape[:2] + (cache_len,))[:, None], dtype),
          self.relpos_bias(query_positions, token_positions) + _mask_to_bias(
              token_mask[:, None], dtype)], axis=-1)
    else:
      query_positions = cur_index[:, None] + jnp.arange(tokens.shape[1])[None]
      # Slots after a query's own position hold future or stale (rolled-back) entries.
      visible = key_positions[:, None, :] <= query_positions[:, :, None]
      self_bias = self.relpos_bias(query_positions, key_positions) + _mask_to_bias(
          visible[:, None], dtype)
    logits, new_cache = self.run_cached(cache, tokens, self_bias, query_positions,
                                        attend_to_fed=tree, logits_index=logits_index)
    return logits, dict(new_cache, cache_index=(cur_index + tokens.shape[1]).astype(jnp.int32))
