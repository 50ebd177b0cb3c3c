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
         'encoder_decoder_attention': {'cached_key': [B, H, D, Le],
                                       'cached_value': [B, H, D, Le]}}}
The cross-attention keys/values are held length-minor, as XLA:TPU's prefill writes them
(`layers.to_cross_cache`). `init_decode_cache` runs the encoder once and fills them;
`make_tokens_to_logits` returns the engine's `tokens_to_logits(state)`, whose new cache has
`cache_index = cur_index + k` (`state.cur_index` always wins over the cached one).
`cache_logical_axes` names the axes of every cache leaf for sharding.

`DecoderOnlyTransformer(DecoderOnlyConfig)` is T5X's `t5x/examples/decoder_only` model (its
parameter tree, its prefix-LM attention, its prompt prefill): the same decoder stack without
cross-attention and with its own embedding (see its docstring). Its cache is the one above
without `encoder_mask` and cross-attention entries, prefilled with a prompt instead of an
encoder's input (`init_decode_cache`); `Network` is either model.

The layers are in `spec_decode.t5.layers`, the products they compute with in
`spec_decode.t5.ops` and the decoder-only model in `spec_decode.t5.decoder_only`, as T5X splits
its own; this module holds the encoder-decoder and the API both models share, and is where every
name above is imported from.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec

# The layers and the decoder-only model live in their own modules, as T5X splits its own; they
# are imported from here under the names every caller uses (`network.T5Config`, ...).
from spec_decode.t5.decoder_only import (  # pylint: disable=unused-import
    DecoderOnlyConfig, DecoderOnlyTransformer, decoder_only_mask, prompt_lengths)
from spec_decode.t5.layers import (  # pylint: disable=unused-import
    DecodeCache, DecoderLayer, DecoderStack, Dense, Embed, Initializer, LAYER_NORM_EPSILON,
    LayerNorm, MASKED_BIAS, MlpBlock, MultiHeadAttention, RelativePositionBias, T5Config,
    relative_position_bucket, _activation_dtype, _mask_to_bias, _residual_dropout)
from spec_decode.t5.ops import (  # pylint: disable=unused-import
    Array, Ops, einsum_attention_logits, einsum_attention_mix, kernel_first_dot, transposed_dot)


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
      if path[-2].key == "encoder_decoder_attention":
        return PartitionSpec("batch", "heads", "kv", "length")
      return PartitionSpec("batch", "length", "heads", "kv")
    raise ValueError(f"Unknown decode cache leaf {jax.tree_util.keystr(path)} {leaf.shape}.")

  return jax.tree_util.tree_map_with_path(axes, cache)
