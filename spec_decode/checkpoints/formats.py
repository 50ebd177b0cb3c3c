"""A checkpoint of any format this package reads, located, identified and read for a network
(`network.Network`: a T5, or from a T5X checkpoint a decoder-only model): `locate` (which
format a path is, once: a `Checkpoint`), `load_params` (its parameters, checked against the
network), `checkpoint_config` (its network config, no weight read), `load_model` (both, for a
checkpoint whose config is not given). Both readers take a path or a `Checkpoint`: a run locates
each checkpoint once and hands the `Checkpoint` on (a Hub id is looked up, a T5X step folder
probed, only there).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Any

from spec_decode import paths
from spec_decode.checkpoints import architecture
from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import demo_pair
from spec_decode.checkpoints import hf_format
from spec_decode.checkpoints import hf_hub
from spec_decode.checkpoints import storage
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

Params = Any

# T5Config fields that do not change what a checkpoint computes (precision, training only).
_NON_ARCHITECTURE_FIELDS = ("dtype", "float32_attention_logits", "dropout_rate")


def check_same_architecture(expected: network.NetworkConfig, found: network.NetworkConfig,
                            source: str) -> None:
  """ValueError, naming `source`, when `found` computes something else than `expected`: every
  field but precision and dropout (`_NON_ARCHITECTURE_FIELDS`) must agree."""
  if type(found) is not type(expected):
    raise ValueError(f"{source}: the checkpoint is a {type(found).__name__} model's, the model "
                     f"a {type(expected).__name__}'s")
  differences = [
      f"{field.name} {getattr(found, field.name)!r} (model: {getattr(expected, field.name)!r})"
      for field in dataclasses.fields(expected)
      if field.name not in _NON_ARCHITECTURE_FIELDS
      and getattr(found, field.name) != getattr(expected, field.name)]
  if differences:
    raise ValueError(f"{source}: the checkpoint's config differs from the model's: "
                     + ", ".join(differences))


# The Orbax item in which T5X's Orbax checkpoint manager keeps a step's train state
# (`checkpoint_N/state`: an Orbax `_METADATA` tree, parameters under 'target').
T5X_ORBAX_STATE_ITEM = "state"


def t5x_orbax_state_item(path: str) -> str:
  """`path`/state when `path` is a step directory T5X's Orbax checkpoint manager wrote, else
  `path`: the folder `t5x_format.load_t5x` reads a T5X checkpoint from."""
  item = posixpath.join(path.rstrip("/"), T5X_ORBAX_STATE_ITEM)
  return item if storage.read_file(posixpath.join(item, "_METADATA")) is not None else path


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A located checkpoint: `path` as given (what messages name), its `kind` and the `resolved`
  path its reader opens (see `locate`)."""
  path: str
  kind: str
  resolved: str


def locate(path: str | Checkpoint) -> Checkpoint:
  """The checkpoint `load_params` reads at `path` (a `Checkpoint` passes through): kind 'hf' (a
  Hugging Face folder with config.json, or a Hub id `hf://ORG/NAME[@REVISION]` resolved to its
  folder in the Hub's cache: `hf_hub`), 'demo' (a .safetensors file) or 't5x' (anything else: a
  T5X checkpoint, legacy or Orbax; for a step directory T5X's Orbax checkpoint manager wrote,
  its `state` item). FileNotFoundError when a local path or a Hub model does not exist."""
  if isinstance(path, Checkpoint):
    return path
  if hf_hub.is_hub_id(path):
    return Checkpoint(path, "hf", hf_hub.hub_folder(path))
  resolved = paths.resolve(path)
  if not resolved.startswith("gs://") and not os.path.exists(resolved):
    raise FileNotFoundError(f"checkpoint not found: {path}")
  if os.path.isfile(os.path.join(resolved, "config.json")):
    return Checkpoint(path, "hf", resolved)
  if resolved.endswith(".safetensors"):
    return Checkpoint(path, "demo", resolved)
  return Checkpoint(path, "t5x", t5x_orbax_state_item(resolved))


def load_params(module: network.Network, path: str | Checkpoint,
                dtype: Any = None) -> Params:
  """Parameters for `module` from a checkpoint, checked against it (every path and shape), with
  floating-point leaves cast to `dtype` when given, as numpy arrays in host memory (see
  `decode_layout.restore_params` for a restore straight into a mesh's shards).

  `path`: a T5X checkpoint (directory, its `checkpoint` file, or a msgpack file; local or
  gs://), a Hugging Face T5 folder (with config.json) or Hub id (`hf://ORG/NAME`), or a
  `.safetensors` file of the shipped demo format (`demo_pair`). The configs of
  the last two must match the module's.
  """
  checkpoint = locate(path)
  kind, resolved, path = checkpoint.kind, checkpoint.resolved, checkpoint.path
  with checkpoint_faults.reading(path):
    if kind == "hf":
      found, params = hf_format.load_hf(resolved)
      check_same_architecture(module.config, found, path)
    elif kind == "demo":
      found, params = demo_pair.load_model(resolved)
      check_same_architecture(module.config, found, path)
    else:
      params = t5x_format.load_t5x(resolved)
  t5x_format.check_params(t5x_format.expected_param_shapes(module.config), params, path)
  checkpoint_faults.check_finite_params(params, path)
  return params if dtype is None else t5x_format.cast_floats(params, dtype)


def checkpoint_config(path: str | Checkpoint,
                      like: network.NetworkConfig) -> network.NetworkConfig:
  """The network config of a checkpoint `load_params` reads, without reading its weights: a
  Hugging Face folder's config.json, a demo .safetensors file's header, or a T5X checkpoint's
  parameter shapes (`architecture.config_from_params`, what shapes cannot tell from `like`).
  The activation dtype is always `like`'s."""
  checkpoint = locate(path)
  kind, resolved, path = checkpoint.kind, checkpoint.resolved, checkpoint.path
  with checkpoint_faults.reading(path):
    if kind == "hf":
      found = hf_format.read_hf_config(resolved)
    elif kind == "demo":
      found = demo_pair.read_config(resolved)
    else:
      return architecture.config_from_params(architecture.t5x_param_shapes(resolved), like, path)
  return dataclasses.replace(found, dtype=like.dtype)


def load_model(path: str | Checkpoint, like: network.NetworkConfig
               ) -> tuple[network.NetworkConfig, Params]:
  """The config (`checkpoint_config`, what it cannot tell from `like`) and parameters
  (`load_params`) of a checkpoint of `like`'s family: what a trainer starts from or distills
  on. `path` may also name a shipped demo model ("target", "draft": `demo_pair.model_file`)."""
  if not isinstance(path, Checkpoint) and str(path) in demo_pair.MODEL_NAMES:
    path = str(demo_pair.model_file(path))
  checkpoint = locate(path)
  config = checkpoint_config(checkpoint, like)
  return config, load_params(network.module_of(config), checkpoint)
