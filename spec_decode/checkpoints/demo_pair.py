"""The shipped demo target/draft pair: storage format, loader and exporter.

Contract:
- Files live in the package, `spec_decode/assets/demo/`: `target.safetensors`,
  `draft.safetensors` and the shared vocabulary `spm_ende_8k.model` (T5 conventions:
  pad 0, eos 1, unk 2, no bos). See `MODEL_CARD.md` there.
- A `.safetensors` file holds one model's params as float16 tensors keyed by their T5X path
  (`token_embedder/embedding`, `encoder/layers_0/attention/query/kernel`, ...; kernels are
  T5X's 2-D [in, out]) and, in its metadata under "t5_config", the `network.T5Config` fields
  as JSON. float16 halves the size against float32 (the pair must stay under 40 MB) and
  keeps 3 more mantissa bits than bfloat16; export checks every value is in float16's range.
- `load_model(name_or_path)` -> `(network.T5Config, params)` with params a nested dict of
  float32 numpy arrays, ready for `network.Transformer(config).apply({'params': params}, ...)`
  and `spec_decode.checkpoints.t5x_format.save_t5x`. `name_or_path` is "target", "draft" or a file path.
- `save_model(params, config, path)` writes one; `spec_decode.training.export_demo` is the
  command that exports a trainer checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import flax.traverse_util
import numpy as np
import safetensors
from safetensors import numpy as safetensors_numpy

from spec_decode import paths
from spec_decode.t5 import network

ASSET_DIR = paths.DEMO_ASSETS
VOCAB_PATH = ASSET_DIR / "spm_ende_8k.model"
_CONFIG_KEY = "t5_config"
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def config_to_json(config: network.T5Config) -> str:
  fields = dataclasses.asdict(config)
  fields["dtype"] = np.dtype(config.dtype).name
  fields["mlp_activations"] = list(config.mlp_activations)
  return json.dumps(fields, sort_keys=True)


def config_from_json(text: str) -> network.T5Config:
  return network.T5Config(**json.loads(text))


def save_model(params: Any, config: network.T5Config, path: str | os.PathLike) -> None:
  """Writes params (a nested dict of arrays) as float16 safetensors with the config."""
  flat = {}
  for keys, value in flax.traverse_util.flatten_dict(params).items():
    value = np.asarray(value, np.float32)
    if np.max(np.abs(value)) >= _FLOAT16_MAX:
      raise ValueError(f"{'/'.join(keys)} exceeds float16's range")
    flat["/".join(keys)] = value.astype(np.float16)
  safetensors_numpy.save_file(flat, str(path), metadata={_CONFIG_KEY: config_to_json(config)})


# The shipped models, by name.
MODEL_NAMES = ("target", "draft")


def model_file(name_or_path: str | os.PathLike) -> pathlib.Path:
  """The file of a shipped model ("target"/"draft"), or the path given."""
  if str(name_or_path) in MODEL_NAMES:
    return ASSET_DIR / f"{name_or_path}.safetensors"
  return pathlib.Path(name_or_path)


def read_config(name_or_path: str | os.PathLike) -> network.T5Config:
  """The config of a shipped ("target"/"draft") or given model file (no weight is read)."""
  with safetensors.safe_open(str(model_file(name_or_path)), framework="np") as f:
    return config_from_json(f.metadata()[_CONFIG_KEY])


def load_model(name_or_path: str | os.PathLike) -> tuple[network.T5Config, dict[str, Any]]:
  """Reads a shipped ("target"/"draft") or given model file into float32 T5X-named params."""
  path = model_file(name_or_path)
  with safetensors.safe_open(str(path), framework="np") as f:
    metadata = f.metadata()
    flat = {key: f.get_tensor(key) for key in f.keys()}
  params = flax.traverse_util.unflatten_dict(
      {tuple(key.split("/")): value.astype(np.float32) for key, value in flat.items()})
  return config_from_json(metadata[_CONFIG_KEY]), params
