"""T5 parameters in and out of Hugging Face checkpoints (`load_hf`, `save_hf`).

`T5ForConditionalGeneration` folders: `config.json` and `model.safetensors`,
`pytorch_model.bin`, or their sharded `*.index.json` forms. Parameters are
`spec_decode.checkpoints.t5x_format`' tree (T5X's names). PyTorch linear weights [out, in] are
transposed to kernels [in, out]; relative-attention tables [buckets, H] become [H, buckets].
Tied (T5 1.0) models scale the decoder output by 1/sqrt(d_model) before the shared embedding
(`logits_via_embedding=True`); untied (T5.1.1) models have `lm_head` (`decoder/logits_dense`).
torch is imported only for `.bin` files. A checkpoint that does not match its config names the
first offending parameter path (`t5x_format.check_params`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import t5x_format
from spec_decode.t5.network import T5Config

Params = dict[str, Any]
KeyPath = tuple[str, ...]

# HF feed-forward activation <-> T5X activation name (network.py uses flax.linen's, whose
# gelu is the tanh approximation, HF's "gelu_new"; HF's plain "gelu" is exact erf).
_HF_TO_T5X_ACTIVATION = {"relu": "relu", "gelu_new": "gelu", "silu": "silu"}
_T5X_TO_HF_ACTIVATION = {v: k for k, v in _HF_TO_T5X_ACTIVATION.items()}
_HF_REQUIRED_CONFIG_KEYS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
# Copies of `shared.weight` that HF may also store.
_HF_EMBEDDING_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Present in some HF checkpoints though no layer uses it.
_HF_UNUSED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


def _hf_activations(feed_forward_proj: str) -> tuple[str, ...]:
  gated = feed_forward_proj.startswith("gated-")
  name = feed_forward_proj.removeprefix("gated-")
  name = "gelu_new" if feed_forward_proj == "gated-gelu" else name  # HF's own special case
  if name not in _HF_TO_T5X_ACTIVATION:
    raise ValueError(f"unsupported feed_forward_proj {feed_forward_proj!r} (supported: "
                     f"{sorted(_HF_TO_T5X_ACTIVATION)}, optionally 'gated-')")
  return (_HF_TO_T5X_ACTIVATION[name], "linear") if gated else (_HF_TO_T5X_ACTIVATION[name],)


def _hf_feed_forward_proj(activations: tuple[str, ...]) -> str:
  first = _T5X_TO_HF_ACTIVATION.get(activations[0]) if activations else None
  if first is not None and len(activations) == 1:
    return first
  if first is not None and len(activations) == 2 and activations[1] == "linear":
    # HF reads "gated-gelu" as the tanh-approximate gelu ("gelu_new"), like T5X's "gelu".
    return "gated-gelu" if first == "gelu_new" else f"gated-{first}"
  raise ValueError(f"mlp_activations {activations} have no Hugging Face T5 equivalent")


def _hf_name_map(config: T5Config) -> list[tuple[str, KeyPath, bool]]:
  """(HF weight name, T5X param path, transpose?) for every weight except the logits head."""
  names: list[tuple[str, KeyPath, bool]] = [
      ("shared.weight", ("token_embedder", "embedding"), False),
      ("encoder.final_layer_norm.weight", ("encoder", "encoder_norm", "scale"), False),
      ("decoder.final_layer_norm.weight", ("decoder", "decoder_norm", "scale"), False),
  ]
  mlp = ["wi"] if len(config.mlp_activations) == 1 else [
      f"wi_{i}" for i in range(len(config.mlp_activations))]
  projections = {"q": "query", "k": "key", "v": "value", "o": "out"}
  stacks = {
      "encoder": (config.num_encoder_layers,
                  [("SelfAttention", "attention", "pre_attention_layer_norm"),
                   (None, "mlp", "pre_mlp_layer_norm")]),
      "decoder": (config.num_decoder_layers,
                  [("SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
                   ("EncDecAttention", "encoder_decoder_attention",
                    "pre_cross_attention_layer_norm"),
                   (None, "mlp", "pre_mlp_layer_norm")]),
  }
  for stack, (num_layers, sublayers) in stacks.items():
    names.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                  (stack, "relpos_bias", "rel_embedding"), True))
    for i in range(num_layers):
      for j, (hf_attention, t5x_block, t5x_norm) in enumerate(sublayers):
        hf = f"{stack}.block.{i}.layer.{j}"
        t5x = (stack, f"layers_{i}")
        names.append((f"{hf}.layer_norm.weight", t5x + (t5x_norm, "scale"), False))
        if hf_attention is None:
          names += [(f"{hf}.DenseReluDense.{w}.weight", t5x + ("mlp", w, "kernel"), True)
                    for w in mlp + ["wo"]]
        else:
          names += [(f"{hf}.{hf_attention}.{p}.weight",
                     t5x + (t5x_block, projections[p], "kernel"), True)
                    for p in projections]
  return names


def _read_hf_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
  """All tensors of an HF model folder as numpy arrays, and the file(s) they came from."""
  def load_safetensors(file: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(file)

  def load_torch(file: str) -> dict[str, np.ndarray]:
    import ml_dtypes
    import torch
    tensors = torch.load(file, map_location="cpu", weights_only=True)
    # numpy has no bfloat16; going through float32 is exact.
    return {name: t.float().numpy().astype(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16
            else t.numpy() for name, t in tensors.items()}

  for filename, loader in (("model.safetensors", load_safetensors),
                           ("pytorch_model.bin", load_torch)):
    single = os.path.join(directory, filename)
    index = single + ".index.json"
    if os.path.isfile(single):
      with checkpoint_faults.reading(single):
        return loader(single), single
    if os.path.isfile(index):
      with open(index) as f, checkpoint_faults.reading(index):
        shards = sorted(set(json.load(f)["weight_map"].values()))
      weights = {}
      for shard in shards:
        shard_path = os.path.join(directory, shard)
        if not os.path.isfile(shard_path):
          raise FileNotFoundError(f"shard {shard_path} listed in {index} is missing")
        with checkpoint_faults.reading(shard_path):
          weights.update(loader(shard_path))
      return weights, index
  raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin (or sharded index) in "
                          f"{directory}")


def read_hf_config(path: str) -> T5Config:
  """The network config of a Hugging Face `T5ForConditionalGeneration` folder (config.json
  alone is read)."""
  directory = os.fspath(path)
  config_path = os.path.join(directory, "config.json")
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"no Hugging Face config.json at {config_path}")
  with open(config_path) as f, checkpoint_faults.reading(config_path):
    hf = json.load(f)
  if hf.get("model_type") != "t5":
    raise ValueError(f"{config_path}: model_type is {hf.get('model_type')!r}, not 't5'")
  missing = [key for key in _HF_REQUIRED_CONFIG_KEYS if key not in hf]
  if missing:
    raise ValueError(f"{config_path}: missing T5 config fields {missing}")
  if hf.get("layer_norm_epsilon", t5x_format.LAYER_NORM_EPSILON) != t5x_format.LAYER_NORM_EPSILON:
    raise ValueError(f"{config_path}: layer_norm_epsilon {hf['layer_norm_epsilon']} is not "
                     f"supported (the network uses {t5x_format.LAYER_NORM_EPSILON})")
  # Tied T5 1.0 models scale the decoder output by 1/sqrt(d_model); transformers 5 calls
  # that `scale_decoder_outputs`, transformers 4 derives it from `tie_word_embeddings`.
  scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
  config = T5Config(
      vocab_size=hf["vocab_size"], emb_dim=hf["d_model"], num_heads=hf["num_heads"],
      num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      head_dim=hf["d_kv"], mlp_dim=hf["d_ff"],
      mlp_activations=_hf_activations(hf.get("feed_forward_proj", "relu")),
      dropout_rate=hf.get("dropout_rate", 0.1), logits_via_embedding=bool(scaled),
      relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf.get("relative_attention_max_distance", 128))
  return config


def load_hf(path: str, dtype: Any = None) -> tuple[T5Config, Params]:
  """Config and parameters of a Hugging Face `T5ForConditionalGeneration` folder.

  `dtype` optionally casts the parameters (otherwise they keep the stored dtype).
  """
  directory = os.fspath(path)
  config = read_hf_config(directory)
  scaled = config.logits_via_embedding
  weights, source = _read_hf_weights(directory)
  unused = set(weights) - set(_HF_UNUSED)
  params = {}
  for hf_name, t5x_path, transpose in _hf_name_map(config):
    if hf_name not in weights:
      raise ValueError(f"{source}: missing weight {hf_name}")
    value = weights[hf_name]
    params[t5x_path] = np.ascontiguousarray(value.T) if transpose else value
    unused.discard(hf_name)
  embedding = weights["shared.weight"]
  for copy in _HF_EMBEDDING_COPIES:
    if copy in weights and not np.array_equal(weights[copy], embedding):
      raise ValueError(f"{source}: {copy} differs from shared.weight; untied input "
                       "embeddings are not supported")
    unused.discard(copy)
  lm_head = weights.get("lm_head.weight")
  unused.discard("lm_head.weight")
  if scaled:
    if lm_head is not None and not np.array_equal(lm_head, embedding):
      raise ValueError(f"{source}: lm_head.weight differs from shared.weight while the "
                       "config scales decoder outputs (tied embeddings); not supported")
  else:
    # transformers 5 drops lm_head.weight from the file when it equals shared.weight.
    head = embedding if lm_head is None else lm_head
    params[("decoder", "logits_dense", "kernel")] = np.ascontiguousarray(head.T)
  if unused:
    raise ValueError(f"{source}: unexpected weights {sorted(unused)[:5]} for a T5 model")
  params = t5x_format.unflatten_params(params)
  t5x_format.check_params(t5x_format.expected_param_shapes(config), params, source)
  return config, (t5x_format.cast_floats(params, dtype) if dtype is not None else params)


def save_hf(config: T5Config, params: Mapping[str, Any], path: str) -> None:
  """Writes `path/config.json` and `path/model.safetensors` (a Hugging Face T5 folder).

  `transformers.T5ForConditionalGeneration.from_pretrained(path)` then computes the same
  function as `Transformer(config)` with `params`; `load_hf(path)` returns them exactly.
  """
  from safetensors.numpy import save_file

  t5x_format.check_params(t5x_format.expected_param_shapes(config), params, "save_hf params")
  flat = {p: np.asarray(leaf) for p, leaf in t5x_format.flatten_params(params)}
  weights = {hf_name: np.ascontiguousarray(flat[t5x_path].T if transpose else flat[t5x_path])
             for hf_name, t5x_path, transpose in _hf_name_map(config)}
  if not config.logits_via_embedding:
    weights["lm_head.weight"] = np.ascontiguousarray(
        flat[("decoder", "logits_dense", "kernel")].T)
  hf_config = {
      "architectures": ["T5ForConditionalGeneration"],
      "model_type": "t5",
      "vocab_size": config.vocab_size,
      "d_model": config.emb_dim,
      "d_kv": config.head_dim,
      "d_ff": config.mlp_dim,
      "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
      "num_heads": config.num_heads,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "dropout_rate": config.dropout_rate,
      "layer_norm_epsilon": t5x_format.LAYER_NORM_EPSILON,
      "feed_forward_proj": _hf_feed_forward_proj(config.mlp_activations),
      "tie_word_embeddings": bool(config.logits_via_embedding),
      "is_encoder_decoder": True,
      "pad_token_id": 0,
      "eos_token_id": 1,
      "decoder_start_token_id": 0,
  }
  directory = os.fspath(path)
  os.makedirs(directory, exist_ok=True)
  save_file(weights, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
