"""T5 encoder-decoder (T5 1.0 and T5.1.1) and T5X's decoder-only language model in Flax linen,
with T5X's parameter trees.

Contract
--------
`Transformer(config)` reproduces T5X's `t5x/examples/t5/network.py` model: the same
parameter paths, the same 2-D `[in, out]` kernels, the same logical axis names
(`init` returns a `params_axes` collection next to `params`), no biases, RMS layer norm
(eps 1e-6), one relative-position table per stack, and no 1/sqrt(head_dim) on the
attention logits at run time (T5 folds it into the query initializer).
  * T5 1.0:  `mlp_activations=('relu',)`, `logits_via_embedding=True`
             (logits = decoder output @ embedding.T / sqrt(emb_dim)).
  * T5.1.1:  `mlp_activations=('gelu', 'linear')` (gated, tanh-approximate gelu),
             `logits_via_embedding=False` (separate `decoder/logits_dense`).
In bfloat16 (`dtype`) it rounds where T5X's network rounds: embeddings, relative-position
biases and masks in `dtype`; layer norms in float32, rounded, then scaled in `dtype`; attention
logits and softmax in `dtype` unless `float32_attention_logits`; logits in float32. Its cached
calls, 1 or k tokens, give T5X's 1-token `decode=True` logits: every bfloat16 activation
bit-identical, the float32 logits up to the accumulation order of the last projection
(tests/t5x/test_t5x_bfloat16.py).
`Transformer(config, ops)`: `ops` (`Ops`, default plain XLA) are the products it computes with,
chosen by the platform of the program that runs it (`spec_decode.runtime.platforms`); this module
knows no backend.

Shapes: B batch, Le encoder length, Ld decoder length, L cache length (max_decode_len),
k tokens per decode call, E emb_dim, H num_heads, D head_dim, V vocab_size.
  * `Transformer.__call__(encoder_input_tokens [B,Le], decoder_input_tokens [B,Ld],
    decoder_target_tokens [B,Ld]) -> logits [B,Ld,V] float32` (teacher forcing).
    Token id 0 is padding: encoder tokens == 0 are never attended to; as in T5X,
    decoder positions whose target is 0 are masked as well (their logits are meaningless).
  * `Transformer.encode(encoder_input_tokens) -> encoded [B,Le,E]`.
  * `Transformer.decode(encoded, encoder_input_tokens, decoder_input_tokens,
    decoder_target_tokens) -> logits [B,Ld,V]` (T5X's argument order).

Incremental decoding honours the engine's model contract (written once, in
`spec_decode/engine/contract.py`) with an explicit cache pytree, a dict whose every leaf has
the batch as its leading axis:
    {'cache_index': int32 [B],              # next position to write, per row
     'encoder_mask': bool [B, Le],          # True at real (non-padding) encoder tokens
     'layers_{i}': {                        # one per decoder layer
         'self_attention': {'cached_key': [B, L, H, D], 'cached_value': [B, L, H, D]},
         'encoder_decoder_attention': {'cached_key': [B, Le, H, D],
                                       'cached_value': [B, Le, H, D]}}}
`init_decode_cache` runs the encoder once and fills the cross-attention keys/values;
`make_tokens_to_logits` returns the engine's `tokens_to_logits(state)`, whose new cache has
`cache_index = cur_index + k` (`state.cur_index` always wins over the cached one).
`cache_logical_axes` names the axes of every cache leaf for sharding.

`DecoderOnlyTransformer(DecoderOnlyConfig)` is T5X's `t5x/examples/decoder_only` model (its
parameter tree, its prefix-LM attention, its prompt prefill): the same decoder stack without
cross-attention and with its own embedding (see its docstring). Its cache is the one above
without `encoder_mask` and cross-attention entries, prefilled with a prompt instead of an
encoder's input (`init_decode_cache`); `Network` is either model.
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
from jax.sharding import PartitionSpec

Array = jax.Array
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


def einsum_attention_logits(query: Array, key: Array) -> Array:
  """query [B,q,H,D], key [B,kv,H,D] -> logits [B,H,q,kv] (T5X's einsum)."""
  return jnp.einsum("bqhd,bkhd->bhqk", query, key)


def einsum_attention_mix(weights: Array, value: Array) -> Array:
  """weights [B,H,q,kv], value [B,kv,H,D] -> [B,q,H,D] (T5X's einsum)."""
  return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def transposed_dot(x: Array, embedding: Array) -> Array:
  """x [..., E] @ embedding [V, E]^T -> [..., V] (T5X's tied-embedding `attend`)."""
  return jnp.dot(x, embedding.T)


@dataclasses.dataclass(frozen=True)
class Ops:
  """The products the network computes with, injected as flax's examples inject `dot_general`:
  this module knows no backend, the platform of the program that runs a model picks them
  (`spec_decode.runtime.platforms.Platform.ops`).
  The default is plain XLA, T5X's own ops.

  `dense_product(x [..., K], w [K, N]) -> [..., N]`: every `Dense` layer's product.
  `embedding_product(x [..., E], embedding [V, E]) -> [..., V]`: a tied embedding as the
  output projection (`transposed_dot`).
  `attention_logits(query, key)`, `attention_mix(weights, value)`: the two attention products,
  with `einsum_attention_logits`' and `einsum_attention_mix`' shapes and results up to float
  rounding.
  """

  dense_product: Callable[[Array, Array], Array] = jnp.dot
  embedding_product: Callable[[Array, Array], Array] = transposed_dot
  attention_logits: Callable[[Array, Array], Array] = einsum_attention_logits
  attention_mix: Callable[[Array, Array], Array] = einsum_attention_mix


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
  """T5 attention with kernels query/key/value [E, H*D] and out [H*D, E]."""

  config: T5Config
  ops: Ops = Ops()

  def setup(self):
    cfg = self.config
    dtype = _activation_dtype(cfg)
    joined_kv = cfg.num_heads * cfg.head_dim
    kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")

    def query_init(key, shape, param_dtype=jnp.float32):
      # T5 never scales logits by 1/sqrt(head_dim); the scale lives in the query weights,
      # divided (as T5X does) by sqrt(head_dim) rounded to the activation dtype.
      return kernel_init(key, shape, param_dtype) / jnp.sqrt(cfg.head_dim).astype(dtype)

    projection = functools.partial(Dense, joined_kv, ("embed", "joined_kv"), dtype=dtype,
                                   product=self.ops.dense_product)
    self.query = projection(query_init)
    self.key = projection(kernel_init)
    self.value = projection(kernel_init)
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


class EncoderLayer(nn.Module):
  """Pre-norm self-attention block and MLP block, each with a residual connection."""

  config: T5Config
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, x: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    h = LayerNorm(_activation_dtype(cfg), name="pre_attention_layer_norm")(x)
    attention = MultiHeadAttention(cfg, self.ops, name="attention")
    key, value = attention.project_key_value(h)
    h = attention.attend(attention.project_query(h), key, value, bias, deterministic)
    x = x + _residual_dropout(cfg)(h, deterministic=deterministic)
    h = LayerNorm(_activation_dtype(cfg), name="pre_mlp_layer_norm")(x)
    h = MlpBlock(cfg, self.ops, name="mlp")(h, deterministic)
    return x + _residual_dropout(cfg)(h, deterministic=deterministic)


class EncoderStack(nn.Module):
  """Encoder stack: embedded tokens [B,Le,E] -> encoded [B,Le,E]."""

  config: T5Config
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, embedded: Array, encoder_mask: Array, deterministic: bool) -> Array:
    """`encoder_mask` [B, Le] is True at real tokens."""
    cfg = self.config
    positions = jnp.arange(embedded.shape[1])[None]
    relative_bias = RelativePositionBias(cfg, bidirectional=True, name="relpos_bias")(
        positions, positions)
    bias = relative_bias + _mask_to_bias(
        encoder_mask[:, None, :, None] & encoder_mask[:, None, None, :], _activation_dtype(cfg))
    x = _residual_dropout(cfg)(embedded, deterministic=deterministic)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, self.ops, name=f"layers_{i}")(x, bias, deterministic)
    x = LayerNorm(_activation_dtype(cfg), name="encoder_norm")(x)
    return _residual_dropout(cfg)(x, deterministic=deterministic)


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
    self.self_attention = MultiHeadAttention(cfg, self.ops)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = LayerNorm(dtype)
      self.encoder_decoder_attention = MultiHeadAttention(cfg, self.ops)
    self.pre_mlp_layer_norm = LayerNorm(dtype)
    self.mlp = MlpBlock(cfg, self.ops)
    self.residual_dropout = _residual_dropout(cfg)

  def cross_key_value(self, encoded: Array) -> tuple[Array, Array]:
    """encoded [B,Le,E] -> this layer's cross-attention keys, values [B,Le,H,D]."""
    return self.encoder_decoder_attention.project_key_value(encoded)

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
          self.encoder_decoder_attention.project_query(h), *cross_key_value, cross_bias,
          deterministic)
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
    """encoded [B,Le,E] -> per layer (keys, values) [B,Le,H,D]."""
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


class Transformer(nn.Module):
  """T5 encoder-decoder; see the module docstring for the methods' contracts. `ops`: the
  products it computes with (`Ops`; default plain XLA), not part of its parameters."""

  config: T5Config
  ops: Ops = Ops()

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, dtype=_activation_dtype(cfg),
                                product=self.ops.embedding_product)
    # The attribute names, not the classes', name the parameter tree (T5X's 'encoder', 'decoder').
    self.encoder = EncoderStack(cfg, self.ops)
    self.decoder = DecoderStack(cfg, embedder=self.token_embedder, ops=self.ops)

  def encode(self, encoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
    """[B,Le] int tokens (0 = padding) -> encoded [B,Le,E]."""
    return self.encoder(self.token_embedder(encoder_input_tokens), encoder_input_tokens > 0,
                        deterministic=not enable_dropout)

  def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Array, enable_dropout: bool = False) -> Array:
    """Teacher-forced decoder: -> float32 logits [B,Ld,V]; encoder tokens only give the mask."""
    dtype = _activation_dtype(self.config)
    positions = jnp.arange(decoder_input_tokens.shape[1])[None]
    target_valid = decoder_target_tokens > 0
    causal = positions[:, :, None] >= positions[:, None, :]
    self_bias = self.decoder.relpos_bias(positions, positions) + _mask_to_bias(
        (causal & target_valid[:, :, None] & target_valid[:, None, :])[:, None], dtype)
    cross_bias = _mask_to_bias(
        (target_valid[:, :, None] & (encoder_input_tokens > 0)[:, None, :])[:, None], dtype)
    logits, _ = self.decoder(decoder_input_tokens, self_bias,
                             self.decoder.cross_key_values(encoded), cross_bias,
                             deterministic=not enable_dropout)
    return logits

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Array, enable_dropout: bool = False,
               decode: bool = False) -> Array:
    """Teacher-forced logits [B,Ld,V]. `decode` exists for T5X call compatibility only:
    incremental decoding goes through `init_decode_cache` / `make_tokens_to_logits`."""
    if decode:
      raise ValueError("Transformer keeps no flax 'cache' collection; use init_decode_cache() "
                       "and make_tokens_to_logits() for incremental decoding.")
    encoded = self.encode(encoder_input_tokens, enable_dropout=enable_dropout)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                       decoder_target_tokens, enable_dropout=enable_dropout)

  def init_cache(self, encoder_input_tokens: Array, max_decode_len: int) -> DecodeCache:
    """Runs the encoder once and builds the decode cache (layout in the module docstring)."""
    encoded = self.encode(encoder_input_tokens)
    batch = encoder_input_tokens.shape[0]
    cache: DecodeCache = {
        "cache_index": jnp.zeros((batch,), jnp.int32),
        "encoder_mask": encoder_input_tokens > 0,
        **self.decoder.empty_cache(batch, max_decode_len),
    }
    for i, (key, value) in enumerate(self.decoder.cross_key_values(encoded)):
      cache[f"layers_{i}"] = dict(
          cache[f"layers_{i}"],
          encoder_decoder_attention={"cached_key": key, "cached_value": value})
    return cache

  def decode_chunk(self, cache: DecodeCache, cur_index: Array, tokens: Array,
                   token_positions: Array | None = None, token_mask: Array | None = None,
                   logits_index: Array | None = None) -> tuple[Array, DecodeCache]:
    """`DecoderStack.decode_chunk`: the engine's model contract."""
    return self.decoder.decode_chunk(cache, cur_index, tokens, token_positions, token_mask,
                                     logits_index)


# --------------------------------------------------------------------------- decoder-only


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Hyperparameters of a decoder-only language model; field names and defaults follow T5X's
  `t5x.examples.decoder_only.network.TransformerConfig` (whose relative-position buckets and
  distance are fixed at 32 and 128: fields here, with those defaults).
  `float32_attention_logits` as in `T5Config`."""

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  float32_attention_logits: bool = False

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))

  @property
  def num_decoder_layers(self) -> int:
    """The layer count under the name the shared `DecoderStack` reads."""
    return self.num_layers


def decoder_only_mask(decoder_target_tokens: Array,
                      decoder_causal_attention: Array | None = None,
                      decoder_segment_ids: Array | None = None) -> Array:
  """T5X's decoder-only attention mask [B, 1, Ld, Ld] (bool): causal, or bidirectional among
  the positions `decoder_causal_attention` marks (a prefix LM's inputs), between positions
  whose target is not padding, within one segment of a packed row."""
  positions = jnp.arange(decoder_target_tokens.shape[1])
  mask = positions[None, :, None] >= positions[None, None, :]
  if decoder_causal_attention is not None:
    prefix = decoder_causal_attention > 0
    mask = mask | (prefix[:, :, None] & prefix[:, None, :])
  valid = decoder_target_tokens > 0
  mask = mask & valid[:, :, None] & valid[:, None, :]
  if decoder_segment_ids is not None:
    mask = mask & (decoder_segment_ids[:, :, None] == decoder_segment_ids[:, None, :])
  return mask[:, None]


def prompt_lengths(prompt: Array) -> Array:
  """[B] the prompt tokens of each row of `prompt` [B, L] (BOS at position 0, then the prompt,
  then 0s): T5X's `inputs_lengths`, the position where decoding starts."""
  return jnp.sum(prompt[:, 1:] != 0, axis=-1).astype(jnp.int32)


class DecoderOnlyTransformer(nn.Module):
  """T5X's decoder-only language model (`t5x/examples/decoder_only/network.py`'s
  `DecoderWrapper`) with its parameter tree: `decoder/{token_embedder, relpos_bias,
  layers_i/{pre_self_attention_layer_norm, self_attention, pre_mlp_layer_norm, mlp},
  decoder_norm, logits_dense}`, computing and rounding as `Transformer`'s decoder does (T5X's
  decoder-only layers are its T5 layers without cross-attention).
  `inputs_bidirectional_attention` (T5X's `DecoderOnlyModel` argument): a prefix LM, whose
  prompt positions attend to each other both ways.

  `__call__(decoder_input_tokens [B,Ld], decoder_target_tokens [B,Ld], decoder_segment_ids,
  decoder_positions, decoder_causal_attention) -> logits [B,Ld,V]` (teacher forcing, T5X's
  arguments; `decoder_positions` are not read, as in T5X).
  `init_cache(prompt [B,L], max_decode_len)`: the prefill, T5X's `_compute_kv_cache`: `prompt`
  holds BOS = 0 then each row's prompt tokens then 0s (T5X's `decoder_input_tokens *
  decoder_causal_attention`); the cache holds the self-attention keys and values of positions
  < `prompt_lengths(prompt)` (each row's decoding starts at its last prompt token, whose logits
  pick the first output token) and `cache_index` = those lengths. Cache layout: the encoder-
  decoder's without `encoder_mask` and cross-attention entries. `decode_chunk`: the model
  contract, as `Transformer`'s.
  """

  config: DecoderOnlyConfig
  ops: Ops = Ops()
  inputs_bidirectional_attention: bool = False

  def setup(self):
    self.decoder = DecoderStack(self.config, embedder=None, ops=self.ops, cross_attention=False)

  def __call__(self, decoder_input_tokens: Array, decoder_target_tokens: Array,
               decoder_segment_ids: Array | None = None, decoder_positions: Array | None = None,
               decoder_causal_attention: Array | None = None, *, enable_dropout: bool = False,
               decode: bool = False) -> Array:
    del decoder_positions  # T5X's network takes them and does not read them either
    if decode:
      raise ValueError("DecoderOnlyTransformer keeps no flax 'cache' collection; use "
                       "init_decode_cache() and make_tokens_to_logits() for decoding.")
    dtype = _activation_dtype(self.config)
    positions = jnp.arange(decoder_input_tokens.shape[1])[None]
    if not self.inputs_bidirectional_attention:
      decoder_causal_attention = None
    mask = decoder_only_mask(decoder_target_tokens, decoder_causal_attention,
                             decoder_segment_ids)
    self_bias = self.decoder.relpos_bias(positions, positions) + _mask_to_bias(mask, dtype)
    logits, _ = self.decoder(decoder_input_tokens, self_bias,
                             deterministic=not enable_dropout)
    return logits

  def init_cache(self, prompt: Array, max_decode_len: int) -> DecodeCache:
    """The prefill (see the class docstring)."""
    if prompt.shape[1] > max_decode_len:
      raise ValueError(f"a prompt buffer of {prompt.shape[1]} positions does not fit a decode "
                       f"of {max_decode_len}")
    # A shorter buffer is the same prompt: padded, its queries and keys span the whole cache.
    prompt = jnp.pad(prompt.astype(jnp.int32), ((0, 0), (0, max_decode_len - prompt.shape[1])))
    batch, length = prompt.shape
    lengths = prompt_lengths(prompt)
    positions = jnp.arange(length)
    # T5X's prefill mask: the prompt region (positions <= length) with its own targets, causal
    # or both ways; its keys and values below `length` are the ones the decode reads.
    region = (positions[None] <= lengths[:, None]).astype(jnp.int32)
    mask = decoder_only_mask(region, region if self.inputs_bidirectional_attention else None)
    self_bias = self.decoder.relpos_bias(positions[None], positions[None]) + _mask_to_bias(
        mask, _activation_dtype(self.config))
    cache = self.decoder.empty_cache(batch, max_decode_len)
    _, cache = self.decoder.run_cached(cache, prompt, self_bias,
                                       jnp.broadcast_to(positions, (batch, length)))
    return {"cache_index": lengths, **cache}

  def decode_chunk(self, cache: DecodeCache, cur_index: Array, tokens: Array,
                   token_positions: Array | None = None, token_mask: Array | None = None,
                   logits_index: Array | None = None) -> tuple[Array, DecodeCache]:
    """`DecoderStack.decode_chunk`: the engine's model contract."""
    return self.decoder.decode_chunk(cache, cur_index, tokens, token_positions, token_mask,
                                     logits_index)


Network = Transformer | DecoderOnlyTransformer
NetworkConfig = T5Config | DecoderOnlyConfig
NETWORKS = (Transformer, DecoderOnlyTransformer)


def module_of(config: NetworkConfig) -> Network:
  """The network of a config: `Transformer` of a `T5Config`, `DecoderOnlyTransformer` of a
  `DecoderOnlyConfig`."""
  if isinstance(config, T5Config):
    return Transformer(config)
  if isinstance(config, DecoderOnlyConfig):
    return DecoderOnlyTransformer(config)
  raise ValueError(f"not a network config: {config!r}")


def is_decoder_only(module_or_config: Network | NetworkConfig) -> bool:
  """Whether a network (or config) is a decoder-only language model, whose cache is prefilled
  with a prompt instead of an encoder's input."""
  return isinstance(module_or_config, (DecoderOnlyTransformer, DecoderOnlyConfig))


def init_arguments(module_or_config: Network | NetworkConfig, tokens: Any) -> tuple[Any, ...]:
  """The token arguments of the network's `init` (teacher-forced `__call__`), every one
  `tokens`: (encoder input, decoder input, decoder target), or a decoder-only model's (decoder
  input, decoder target)."""
  return (tokens,) * (2 if is_decoder_only(module_or_config) else 3)


def decode_length(module_or_config: Network | NetworkConfig, input_length: int,
                  target_length: int) -> int:
  """The decoder length of seqio's features for task feature lengths {'inputs': input_length,
  'targets': target_length}: an encoder-decoder decodes `target_length` positions, a
  decoder-only model `input_length + target_length` (the prompt then its continuation,
  `seqio.DecoderFeatureConverter`'s concatenated features)."""
  if is_decoder_only(module_or_config):
    return input_length + target_length
  return target_length


# --------------------------------------------------------------------------- decoding API


def _as_module(module_or_config: Network | NetworkConfig) -> Network:
  if isinstance(module_or_config, (T5Config, DecoderOnlyConfig)):
    return module_of(module_or_config)
  return module_or_config


def init_decode_cache(module_or_config: Network | NetworkConfig, params: Any,
                      prefill_tokens: Array, max_decode_len: int) -> DecodeCache:
  """A cache for `max_decode_len` positions: an encoder-decoder encodes `prefill_tokens`, its
  encoder input [B,Le], once; a decoder-only model prefills its prompt [B,L]
  (`DecoderOnlyTransformer.init_cache`).

  `params` is the `params` collection (not the `{'params': ...}` wrapper).
  """
  return _as_module(module_or_config).apply(
      {"params": params}, prefill_tokens, max_decode_len, method="init_cache")


def make_tokens_to_logits(config_or_module: Network | NetworkConfig, params: Any
                          ) -> Callable[[Any], tuple[Array, DecodeCache]]:
  """Returns the engine's `tokens_to_logits(state) -> (logits [B,k,V] float32, new_cache)`.

  Reads `state.cur_index` [B], `state.cur_token` [B,k], `state.cache`, in a tree call
  `state.token_positions` and `state.token_mask`, and `state.logits_index` where given;
  jit- and while_loop-safe for a static k.
  """
  module = _as_module(config_or_module)

  def tokens_to_logits(state: Any) -> tuple[Array, DecodeCache]:
    return module.apply({"params": params}, state.cache, state.cur_index.astype(jnp.int32),
                        state.cur_token, state.token_positions, state.token_mask,
                        state.logits_index, method="decode_chunk")

  return tokens_to_logits


def cache_logical_axes(cache: DecodeCache) -> DecodeCache:
  """A pytree like `cache` whose leaves are PartitionSpecs of logical axis names."""

  def axes(path: tuple, leaf: Array) -> PartitionSpec:
    name = path[-1].key
    if name == "cache_index":
      return PartitionSpec("batch")
    if name == "encoder_mask":
      return PartitionSpec("batch", "length")
    if name in ("cached_key", "cached_value"):
      return PartitionSpec("batch", "length", "heads", "kv")
    raise ValueError(f"Unknown decode cache leaf {jax.tree_util.keystr(path)} {leaf.shape}.")

  return jax.tree_util.tree_map_with_path(axes, cache)
