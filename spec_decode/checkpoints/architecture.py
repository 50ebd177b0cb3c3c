"""A T5X checkpoint's architecture, told by its parameters' shapes (T5X checkpoints carry no
config): what the T5X hook and `formats.checkpoint_config` read a draft's config from. Both
families of T5X's networks are read: T5 encoder-decoders (`network.T5Config`) and decoder-only
language models (`network.DecoderOnlyConfig`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

_FAMILY_NAMES = ("an encoder-decoder (T5)", "a decoder-only")


def t5x_param_shapes(path: str) -> Any:
  """The parameters of a T5X checkpoint, opened, not read (leaves with `.shape`): what
  `config_from_params` needs."""
  return t5x_format.open_t5x_params(path, None)


def _is_decoder_only(params: Mapping[str, Any]) -> bool | None:
  """Whether a parameter tree is a decoder-only model's (its embedding inside `decoder`) or a
  T5's (an `encoder`); None when it is neither."""
  if "encoder" in params:
    return False
  decoder = params.get("decoder")
  if isinstance(decoder, Mapping) and "token_embedder" in decoder:
    return True
  return None


def config_from_params(params: Mapping[str, Any], like: network.NetworkConfig,
                       source: str) -> network.NetworkConfig:
  """The config of a T5X checkpoint of `like`'s family from its parameters' shapes (any leaves
  with `.shape`). What shapes cannot tell comes from `like` (the target's): the activation
  dtype, dropout, the relative-position distance, and the MLP activations when the draft has
  as many MLP branches (else T5 1.0's relu or T5.1.1's gated gelu). ValueError when `params`
  are of the other family, or not a T5X network's."""
  decoder_only = network.is_decoder_only(like)
  found = _is_decoder_only(params)
  if found is not None and found != decoder_only:
    raise ValueError(f"{source}: {_FAMILY_NAMES[found]} checkpoint, but the target is "
                     f"{_FAMILY_NAMES[decoder_only]} model: a draft must be of its target's "
                     f"family")
  try:
    # A decoder-only model's embedding is its decoder's, a T5's shared one at the top; heads,
    # buckets and sizes are read from the decoder's (its only stack), or the encoder's.
    embedder = (params["decoder"] if decoder_only else params)["token_embedder"]
    stack = params["decoder" if decoder_only else "encoder"]
    attention = "self_attention" if decoder_only else "attention"
    vocab_size, emb_dim = embedder["embedding"].shape
    num_heads, num_buckets = stack["relpos_bias"]["rel_embedding"].shape
    first_layer = stack["layers_0"]
    mlp = first_layer["mlp"]
    head_dim = first_layer[attention]["query"]["kernel"].shape[1] // num_heads
    layers = {name: sum(key.startswith("layers_") for key in params[name])
              for name in ("decoder",) + (() if decoder_only else ("encoder",))}
  except (KeyError, TypeError, ValueError) as e:
    kind = "decoder-only" if decoder_only else "T5"
    raise ValueError(f"{source}: not a {kind} checkpoint (no parameter {e})") from None
  mlp_branches = sorted(name for name in mlp if name.startswith("wi"))
  if len(mlp_branches) == len(like.mlp_activations):
    activations = like.mlp_activations
  else:
    activations = ("relu",) if len(mlp_branches) == 1 else ("gelu", "linear")
  if decoder_only:
    depth = {"num_layers": layers["decoder"]}
  else:
    depth = {"num_encoder_layers": layers["encoder"], "num_decoder_layers": layers["decoder"]}
  config = dataclasses.replace(
      like, vocab_size=vocab_size, emb_dim=emb_dim, num_heads=num_heads, head_dim=head_dim,
      mlp_dim=mlp[mlp_branches[0]]["kernel"].shape[1], mlp_activations=activations,
      logits_via_embedding="logits_dense" not in params["decoder"],
      relative_attention_num_buckets=num_buckets, **depth)
  t5x_format.check_params(t5x_format.expected_param_shapes(config), params, source)
  return config
