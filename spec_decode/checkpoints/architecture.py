"""A T5 checkpoint's architecture, told by its parameters' shapes (T5X checkpoints carry no
config): what the T5X hook and `formats.checkpoint_config` read a draft's config from."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from spec_decode.checkpoints import t5x_format
from spec_decode.t5.network import T5Config


def t5x_param_shapes(path: str) -> Any:
  """The parameters of a T5X checkpoint, opened, not read (leaves with `.shape`): what
  `config_from_params` needs."""
  return t5x_format.open_t5x_params(path, None)


def config_from_params(params: Mapping[str, Any], like: T5Config, source: str) -> T5Config:
  """The config of a T5 checkpoint from its parameters' shapes (any leaves with `.shape`).
  What shapes cannot tell comes from `like` (the target's): the activation dtype, dropout, and
  the MLP activations when the draft has as many MLP branches (else T5 1.0's relu or T5.1.1's
  gated gelu). ValueError when `params` are not a T5's."""
  try:
    vocab_size, emb_dim = params["token_embedder"]["embedding"].shape
    num_heads, num_buckets = params["encoder"]["relpos_bias"]["rel_embedding"].shape
    first_layer = params["encoder"]["layers_0"]
    mlp = first_layer["mlp"]
    head_dim = first_layer["attention"]["query"]["kernel"].shape[1] // num_heads
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{source}: not a T5 checkpoint (no parameter {e})") from None
  mlp_branches = sorted(name for name in mlp if name.startswith("wi"))
  if len(mlp_branches) == len(like.mlp_activations):
    activations = like.mlp_activations
  else:
    activations = ("relu",) if len(mlp_branches) == 1 else ("gelu", "linear")
  config = dataclasses.replace(
      like, vocab_size=vocab_size, emb_dim=emb_dim, num_heads=num_heads,
      num_encoder_layers=sum(name.startswith("layers_") for name in params["encoder"]),
      num_decoder_layers=sum(name.startswith("layers_") for name in params["decoder"]),
      head_dim=head_dim, mlp_dim=mlp[mlp_branches[0]]["kernel"].shape[1],
      mlp_activations=activations,
      logits_via_embedding="logits_dense" not in params["decoder"],
      relative_attention_num_buckets=num_buckets)
  t5x_format.check_params(t5x_format.expected_param_shapes(config), params, source)
  return config
