"""A checkpoint's architecture, told by its parameters' shapes (T5X checkpoints carry no
config): what the T5X hook and `formats.checkpoint_config` read a draft's config from. A T5
encoder-decoder's tree gives a `T5Config`, T5X's decoder-only tree (no encoder, the embedding
under `decoder/token_embedder`) a `DecoderOnlyConfig`."""

from __future__ import annotations

from typing import Any, Mapping

from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

# What shapes cannot tell, taken from the config a checkpoint is read "like" (the target's).
_UNSHAPED_FIELDS = ("dtype", "dropout_rate", "float32_attention_logits",
                    "relative_attention_max_distance")
_FAMILY_NAMES = ("an encoder-decoder (T5)", "a decoder-only")


def t5x_param_shapes(path: str) -> Any:
  """The parameters of a T5X checkpoint, opened, not read (leaves with `.shape`): what
  `config_from_params` needs."""
  return t5x_format.open_t5x_params(path, None)


def _mlp_activations(mlp: Mapping[str, Any], like: network.NetworkConfig) -> tuple[str, ...]:
  """`like`'s activations when the checkpoint has as many MLP branches, else T5 1.0's relu or
  T5.1.1's gated gelu."""
  num_branches = sum(name.startswith("wi") for name in mlp)
  if num_branches == len(like.mlp_activations):
    return tuple(like.mlp_activations)
  return ("relu",) if num_branches == 1 else ("gelu", "linear")


def _num_layers(stack: Mapping[str, Any]) -> int:
  return sum(name.startswith("layers_") for name in stack)


def config_from_params(params: Mapping[str, Any], like: network.NetworkConfig,
                       source: str) -> network.NetworkConfig:
  """The config of a T5 or decoder-only checkpoint of `like`'s family from its parameters'
  shapes (any leaves with `.shape`). What shapes cannot tell comes from `like` (the target's):
  the activation dtype, dropout, float32 attention logits, the relative-position distance, and
  the MLP activations when the checkpoint has as many MLP branches (else T5 1.0's relu or
  T5.1.1's gated gelu). ValueError, naming `source`, when `params` are of the other family
  than `like` (a draft must be of its target's) or of neither."""
  decoder_only = "encoder" not in params and "token_embedder" in params.get("decoder", {})
  if decoder_only != network.is_decoder_only(like) and ("encoder" in params or decoder_only):
    raise ValueError(f"{source}: {_FAMILY_NAMES[decoder_only]} checkpoint, but the target is "
                     f"{_FAMILY_NAMES[network.is_decoder_only(like)]} model: a draft must be "
                     "of its target's family")
  try:
    if decoder_only:
      stack = params["decoder"]
      embedding = stack["token_embedder"]["embedding"]
      attention_name = "self_attention"
    else:
      stack = params["encoder"]
      embedding = params["token_embedder"]["embedding"]
      attention_name = "attention"
    vocab_size, emb_dim = embedding.shape
    num_heads, num_buckets = stack["relpos_bias"]["rel_embedding"].shape
    first_layer = stack["layers_0"]
    mlp = first_layer["mlp"]
    head_dim = first_layer[attention_name]["query"]["kernel"].shape[1] // num_heads
    mlp_dim = mlp["wi" if "wi" in mlp else "wi_0"]["kernel"].shape[1]
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{source}: not a T5 or decoder-only checkpoint (no parameter {e})"
                     ) from None
  shared = dict(vocab_size=vocab_size, emb_dim=emb_dim, num_heads=num_heads, head_dim=head_dim,
                mlp_dim=mlp_dim, mlp_activations=_mlp_activations(mlp, like),
                logits_via_embedding="logits_dense" not in params["decoder"],
                relative_attention_num_buckets=num_buckets,
                **{name: getattr(like, name) for name in _UNSHAPED_FIELDS})
  if decoder_only:
    config = network.DecoderOnlyConfig(num_layers=_num_layers(params["decoder"]), **shared)
  else:
    config = network.T5Config(num_encoder_layers=_num_layers(params["encoder"]),
                              num_decoder_layers=_num_layers(params["decoder"]), **shared)
  t5x_format.check_params(t5x_format.expected_param_shapes(config), params, source)
  return config
