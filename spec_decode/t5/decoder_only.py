"""T5X's decoder-only language model (`t5x/examples/decoder_only/network.py`): its config
(`DecoderOnlyConfig`), attention mask, prompt lengths and `DecoderOnlyTransformer`, the shared
decoder stack of `spec_decode.t5.layers` without cross-attention. Its contract:
`spec_decode.t5.network`'s docstring; callers import it from there.
"""

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
from flax import linen as nn

from spec_decode.t5.layers import DecodeCache, DecoderStack, _activation_dtype, _mask_to_bias
from spec_decode.t5.ops import Array, Ops


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
