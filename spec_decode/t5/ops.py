"""The products a network computes with (`Ops`) and the products of plain XLA they default to
or may be set to; the platform of the program that runs a model picks them
(`spec_decode.runtime.platforms`)."""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def einsum_attention_logits(query: Array, key: Array) -> Array:
  """query [B,q,H,D], key [B,kv,H,D] -> logits [B,H,q,kv] (T5X's einsum)."""
  return jnp.einsum("bqhd,bkhd->bhqk", query, key)


def einsum_attention_mix(weights: Array, value: Array) -> Array:
  """weights [B,H,q,kv], value [B,kv,H,D] -> [B,q,H,D] (T5X's einsum)."""
  return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def transposed_dot(x: Array, embedding: Array) -> Array:
  """x [..., E] @ embedding [V, E]^T -> [..., V] (T5X's tied-embedding `attend`)."""
  return jnp.dot(x, embedding.T)


def kernel_first_dot(x: Array, kernel: Array) -> Array:
  """`jnp.dot(x [..., K], kernel [K, N])` as kernel^T x (the kernel the left operand, the result
  [N, ...] moved back): the same up to float rounding, but XLA:TPU reads the kernel as stored."""
  return jnp.moveaxis(jax.lax.dot_general(kernel, x, (((0,), (x.ndim - 1,)), ((), ()))), 0, -1)


@dataclasses.dataclass(frozen=True)
class Ops:
  """The products the network computes with, injected as flax's examples inject `dot_general`
  (`spec_decode.runtime.platforms.Platform.ops` picks them); the default is plain XLA, T5X's own.

  `dense_product(x [..., K], w [K, N]) -> [..., N]`: every `Dense` layer's product.
  `embedding_product(x [..., E], embedding [V, E]) -> [..., V]`: a tied embedding as the
  output projection (`transposed_dot`).
  `attention_logits(query, key)`, `attention_mix(weights, value)`: the two attention products,
  with `einsum_attention_logits`' and `einsum_attention_mix`' shapes and results up to float
  rounding.
  `decoder_projection`: `dense_product` (None: the same) for a decoder layer's self-attention
  query, key, value and cross-attention query: the decode loop's few rows, for which XLA:TPU
  would hoist a transposed copy of each kernel out of the loop, live through it (3 GiB for
  T5.1.1-XXL on one v4 chip; TPU programs take `kernel_first_dot`: docs/TPU_COMPILE.md).
  """

  dense_product: Callable[[Array, Array], Array] = jnp.dot
  embedding_product: Callable[[Array, Array], Array] = transposed_dot
  attention_logits: Callable[[Array, Array], Array] = einsum_attention_logits
  attention_mix: Callable[[Array, Array], Array] = einsum_attention_mix
  decoder_projection: Callable[[Array, Array], Array] | None = None
