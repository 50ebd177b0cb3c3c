"""T5 parameters in and out of T5X checkpoints, and the parameter tree both formats share.

Parameters are the `params` collection of `spec_decode.t5.network.Transformer`: a nested dict
with T5X's names (`token_embedder/embedding [V,E]`, `encoder/layers_0/attention/query/kernel
[E,H*D]`, ..., `decoder/logits_dense/kernel [E,V]`) whose leaves are numpy arrays.

T5X (`load_t5x`, `restore_t5x_state`, `save_t5x`; `open_t5x_params` + `read_slice` for reading
arrays slice by slice, as `spec_decode.runtime.decode_layout` restores into shards)
  * Legacy layout: a `checkpoint_N/` directory (or its `checkpoint` file, or a bare msgpack
    file) holding flax msgpack `{'version': 3, 'optimizer': {'target': params, 'state': ...}}`.
    A leaf is an inline array, or a TensorStore zarr spec dict whose `kvstore.path` is
    relative to the checkpoint directory (drivers `file`/`gfile`/`gcs`; `gs://bucket/...`
    directories are read with TensorStore's gcs driver). Arrays whose `.zarray` is missing
    are read from the spec's own metadata (T5X's test data is distributed that way).
  * Orbax layout: a step directory with either a msgpack `checkpoint` whose leaves are
    `PLACEHOLDER://<name>` (one zarr array directory `<name>/` each) or an Orbax `_METADATA`
    tree (zarr arrays, possibly inside an OCDBT database). A `<name>/` without `.zarray` can
    only be read with a `template` giving each leaf's shape and dtype.
  * `save_t5x` writes the legacy layout with gzip zarr arrays and relative paths, as T5X's
    `Checkpointer` does, and `{'step': step}` as the optimizer state: T5X's inference
    (`InferenceState`) and `load_t5x_checkpoint` read it; resuming training needs the
    optimizer's slots, which are not written.

Hugging Face checkpoints: `spec_decode.checkpoints.hf_format`.

`expected_param_shapes(config)` is the parameter tree's shapes; `random_params(config, seed,
dtype, on_device)` draws values of those shapes (for benchmarks and tests).

Mismatches are errors: `check_params` names the first missing, unexpected or misshapen
parameter path (with both shapes); missing files raise FileNotFoundError naming the path.
"""

from __future__ import annotations

import functools
import json
import math
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from flax import serialization
from flax.core import unfreeze

from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import storage
from spec_decode.t5 import network
from spec_decode.t5.network import T5Config

Params = dict[str, Any]
KeyPath = tuple[str, ...]

T5X_VERSION = 3
# T5X keeps each TensorStore chunk at or below 64 MiB.
_MAX_CHUNK_BYTES = 64 * 1024 * 1024
_ORBAX_PLACEHOLDER = "PLACEHOLDER://"
_ZARR_METADATA_KEYS = (".zarray", "zarr.json")  # zarr v2, zarr v3
LAYER_NORM_EPSILON = 1e-6  # network.py's RMS-norm epsilon, the only one it supports


# --------------------------------------------------------------------------- trees


def flatten_params(tree: Mapping[str, Any], prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
  """(path, leaf) pairs of a nested mapping, depth first in key order; empty mappings and
  TensorStore spec dicts are leaves."""
  for key in sorted(tree):
    value = tree[key]
    if isinstance(value, Mapping) and value and not _is_tensorstore_spec(value):
      yield from flatten_params(value, prefix + (str(key),))
    else:
      yield prefix + (str(key),), value


def unflatten_params(items: Mapping[KeyPath, Any]) -> dict:
  tree: dict = {}
  for path, value in items.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _name(path: KeyPath) -> str:
  return "/".join(path)


def expected_param_shapes(config: network.NetworkConfig) -> Params:
  """The network's parameter tree for `config` (a T5 or a decoder-only model's), as
  jax.ShapeDtypeStruct leaves (no compute)."""
  # Encoder input, decoder input and targets; a decoder-only model takes no encoder input.
  tokens = (jnp.ones((1, 1), jnp.int32),) * (2 if network.is_decoder_only(config) else 3)
  variables = jax.eval_shape(
      lambda: network.module_of(config).init(jax.random.PRNGKey(0), *tokens))
  return unfreeze(variables["params"])


def random_params(config: T5Config, seed: int, dtype: Any = None,
                  on_device: bool = False) -> Params:
  """Random parameters of `config`'s shapes: floating leaves in `dtype` (default float32).

  Layer-norm scales (the 1-D leaves) are 1 + N(0, 1), so that every parameter matters; every
  other leaf is N(0, 1/fan_in) with fan_in its first axis, so activations stay of order 1.
  By default drawn by numpy (nothing is compiled; the tests pin these values): T5.1.1-large's
  780M values take seconds, where a compiled `init` would take minutes. With `on_device` the
  same law is drawn by `jax.random` on JAX's default device, leaf by leaf, and the leaves are
  jax.Arrays there: an accelerator draws T5.1.1-XXL's 11B values in seconds, where numpy takes
  minutes and the host would then copy them over. The benchmark needs only the shapes, the
  tests also values that exercise every parameter.
  """
  shapes = expected_param_shapes(config)
  if on_device:
    keys = iter(jax.random.split(jax.random.PRNGKey(seed),
                                 len(jax.tree_util.tree_leaves(shapes))))
    return jax.tree_util.tree_map(
        lambda leaf: _device_leaf(next(keys), tuple(leaf.shape), jnp.dtype(dtype or jnp.float32)),
        shapes)
  rng = np.random.default_rng(seed)

  def draw(leaf: jax.ShapeDtypeStruct) -> np.ndarray:
    offset, scale = _random_law(leaf.shape)
    return (offset + rng.standard_normal(leaf.shape) * scale).astype(np.float32)

  params = jax.tree_util.tree_map(draw, shapes)
  # A cast copies: none when float32 is asked for (T5.1.1-large's is 3 GB).
  return params if dtype is None or jnp.dtype(dtype) == np.float32 else cast_floats(params, dtype)


def _random_law(shape: tuple[int, ...]) -> tuple[float, float]:
  """(offset, scale) of `random_params`' law for a leaf of `shape`: offset + scale N(0, 1)."""
  return (1.0, 1.0) if len(shape) == 1 else (0.0, 1.0 / np.sqrt(shape[0]))


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _device_leaf(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  offset, scale = _random_law(shape)
  # Drawn in float32 and rounded once, as the numpy path's values are.
  return (offset + scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def check_params(expected: Mapping[str, Any], params: Mapping[str, Any], source: str) -> None:
  """Raises ValueError unless `params` has exactly `expected`'s paths and shapes.

  `expected` is any nested mapping whose leaves have `.shape` (e.g. `expected_param_shapes`);
  `source` names where `params` came from, for the message. The first offending path, in
  sorted order, is reported: missing, unexpected, or with both shapes when they differ.
  """
  want = {path: tuple(leaf.shape) for path, leaf in flatten_params(expected)}
  got = {path: tuple(np.shape(leaf)) for path, leaf in flatten_params(params)}
  for path in sorted(set(want) | set(got)):
    if path not in got:
      raise ValueError(f"{source}: missing parameter {_name(path)} "
                       f"(expected shape {want[path]})")
    if path not in want:
      raise ValueError(f"{source}: unexpected parameter {_name(path)} "
                       f"with shape {got[path]}")
    if got[path] != want[path]:
      raise ValueError(f"{source}: parameter {_name(path)} has shape {got[path]}, "
                       f"expected {want[path]}")


def cast_floats(tree: Params, dtype: Any) -> Params:
  """Casts the floating-point leaves of `tree` to `dtype` (e.g. 'bfloat16', as T5X's infer does
  on restore); integer leaves are kept."""
  dtype = jnp.dtype(dtype)

  def cast(leaf: np.ndarray) -> np.ndarray:
    return leaf.astype(dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf
  return unflatten_params({path: cast(leaf) for path, leaf in flatten_params(tree)})


def _is_tensorstore_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and "driver" in value and "metadata" in value


def _to_json(value: Any) -> Any:
  """msgpack-restored spec fields (numpy arrays and scalars) as plain JSON values."""
  if isinstance(value, Mapping):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, (list, tuple)):
    return [_to_json(v) for v in value]
  if isinstance(value, np.generic):
    return value.item()
  return value


# --------------------------------------------------------------------------- zarr arrays


def _sniff_compressor(chunk: bytes) -> dict | None:
  """zarr compressor spec from a chunk's magic bytes (gzip, zstd) or None for raw bytes."""
  if chunk.startswith(b"\x1f\x8b"):
    return {"id": "gzip"}
  if chunk.startswith(b"\x28\xb5\x2f\xfd"):
    return {"id": "zstd"}
  return None


def _read_zarr(array_spec: dict, where: str, template: Any = None) -> np.ndarray:
  """Reads the zarr array of `array_spec` (its kvstore is the array's directory).

  With zarr metadata stored (`.zarray`, or zarr v3's `zarr.json`), that is authoritative
  (as in T5X, the spec's chunking and compressor are dropped). Without it, the spec's
  `metadata` and `dtype` describe the array; failing those, `template` (shape and dtype)
  does, with a single chunk whose compressor is recognized from its bytes.
  """
  kvstore = ts.KvStore.open(array_spec["kvstore"]).result()
  keys = [key.decode() for key in kvstore.list().result()]
  if not keys:
    raise FileNotFoundError(f"{where}: no array data at {array_spec['kvstore']}")
  spec = dict(array_spec)
  metadata = dict(spec.get("metadata", {}))
  if any(key in keys for key in _ZARR_METADATA_KEYS):
    metadata.pop("chunks", None)
    metadata.pop("compressor", None)
    spec["metadata"] = metadata
    store = ts.open(spec, open=True).result()
  else:
    if "shape" not in metadata:
      if template is None:
        raise ValueError(
            f"{where}: {array_spec['kvstore']} has no .zarray and the checkpoint does "
            "not describe the array; pass a template with its shape and dtype")
      shape = [int(n) for n in template.shape]
      chunk_key = ".".join(["0"] * max(len(shape), 1))
      if keys != [chunk_key]:
        raise ValueError(f"{where}: cannot infer the chunking of {sorted(keys)} without "
                         ".zarray")
      chunk = kvstore.read(chunk_key).result().value
      metadata.update(shape=shape, chunks=shape or [], compressor=_sniff_compressor(chunk))
      spec["dtype"] = jnp.dtype(template.dtype).name
    spec["metadata"] = metadata
    # The zarr driver would otherwise insist on reading the missing .zarray.
    store = ts.open(spec, open=True, assume_metadata=True).result()
  if "shape" in metadata and list(store.shape) != list(metadata["shape"]):
    raise ValueError(f"{where}: stored shape {list(store.shape)} differs from the "
                     f"checkpoint's {list(metadata['shape'])}")
  if template is not None and tuple(store.shape) != tuple(template.shape):
    raise ValueError(f"{where}: shape {tuple(store.shape)}, template expects "
                     f"{tuple(template.shape)}")
  return np.asarray(store.read().result())


def _legacy_array_spec(spec: Mapping[str, Any], directory: str, where: str) -> dict:
  """A T5X msgpack spec with its relative path resolved against the checkpoint directory."""
  spec = _to_json(spec)
  if spec.get("dtype") == "uint16" or spec.get("metadata", {}).get("dtype") == "<u2":
    raise ValueError(f"{where}: uint16 arrays come from T5X checkpoint version 2 (bfloat16 "
                     "stored as uint16), which is not supported")
  kvstore = spec.pop("kvstore", None) or {}
  # TensorStore < 0.1.14 wrote the path at the top level of the spec.
  relative = kvstore.get("path", spec.pop("path", None))
  if relative is None or kvstore.get("driver", "file") not in ("file", "gfile", "gcs"):
    raise ValueError(f"{where}: unsupported TensorStore spec {spec | {'kvstore': kvstore}}")
  # Written paths are relative, and a gcs spec's bucket is a placeholder: the
  # checkpoint's own location decides both (as T5X does when restoring).
  spec["kvstore"] = storage.kvstore(directory, relative)
  return spec


# --------------------------------------------------------------------------- T5X restore


def _locate_t5x(path: str) -> tuple[str, bytes | None, bytes | None]:
  """(checkpoint directory, msgpack bytes or None, Orbax _METADATA bytes or None)."""
  path = os.fspath(path)
  is_gcs = storage.gcs(path) is not None
  if not is_gcs and os.path.isfile(path):
    with open(path, "rb") as f:
      return os.path.dirname(os.path.abspath(path)), f.read(), None
  if not is_gcs and not os.path.exists(path):
    raise FileNotFoundError(f"T5X checkpoint not found: {path}")
  directory = path.rstrip("/")
  msgpack_bytes = storage.read_bytes(directory, "checkpoint")
  metadata_bytes = storage.read_bytes(directory, "_METADATA") if msgpack_bytes is None else None
  if msgpack_bytes is None and metadata_bytes is None:
    if is_gcs:
      parent, name = directory.rsplit("/", 1)
      msgpack_bytes = storage.read_bytes(parent, name)
      if msgpack_bytes is not None:
        return parent, msgpack_bytes, None
    raise FileNotFoundError(
        f"no T5X checkpoint at {path}: expected a 'checkpoint' msgpack file or an Orbax "
        "'_METADATA' file there")
  return directory, msgpack_bytes, metadata_bytes


def _optimizer_state(contents: Mapping[str, Any], where: str) -> Mapping[str, Any]:
  """The `{'target': ..., 'state': ...}` part of a restored T5X checkpoint tree."""
  if "version" in contents:
    version = int(contents["version"])
    if version < 2:
      raise ValueError(f"{where}: T5X checkpoint version {version} is not supported")
    return contents["optimizer"]
  for key in ("optimizer", "_optimizer"):  # legacy without version / Orbax TrainState
    if key in contents:
      return contents[key]
  if "target" in contents:  # a plain flax optimizer state dict, or an InferenceState
    return contents
  raise ValueError(f"{where}: not a T5X checkpoint (top-level keys {sorted(contents)})")


def _orbax_metadata_tree(metadata_bytes: bytes, directory: str) -> dict:
  """The Orbax `_METADATA` tree with each array leaf replaced by its zarr spec."""
  metadata = json.loads(metadata_bytes)
  base = storage.kvstore(directory)
  driver = "zarr3" if metadata.get("use_zarr3") else "zarr"
  items = {}
  for entry in metadata["tree_metadata"].values():
    keys = tuple(str(k["key"]) for k in entry["key_metadata"])
    name = ".".join(keys)
    if metadata.get("use_ocdbt"):
      kvstore = {"driver": "ocdbt", "base": base, "path": name + "/"}
    else:
      kvstore = storage.kvstore(directory, name)
    items[keys] = {"driver": driver, "kvstore": kvstore, "metadata": {},
                   "value_type": entry["value_metadata"]["value_type"]}
  return unflatten_params(items)


def _restore(path: str, template: Mapping[str, Any] | None, only_target: bool,
             zarr_array: Callable[[dict, str, Any], Any] | None = None) -> dict[str, Any]:
  """The checkpoint's state with every zarr-stored leaf given to `zarr_array(spec, where,
  template)` (default `_read_zarr`: read whole) and inline arrays as numpy arrays."""
  zarr_array = zarr_array or _read_zarr
  directory, msgpack_bytes, metadata_bytes = _locate_t5x(path)
  where = os.fspath(path)
  if msgpack_bytes is not None:
    if msgpack_bytes.startswith(b"model_checkpoint_path"):
      raise ValueError(f"{where} is a TensorFlow (Mesh TF) checkpoint, not a T5X one")
    try:
      contents = serialization.msgpack_restore(msgpack_bytes)
    except Exception as e:  # msgpack raises a zoo of exception types on garbage
      raise ValueError(f"{where}: not a msgpack T5X checkpoint ({e})") from e
  else:
    with checkpoint_faults.reading(posixpath.join(directory, "_METADATA")):
      contents = _orbax_metadata_tree(metadata_bytes, directory)
  if not isinstance(contents, Mapping):
    raise ValueError(f"{where}: not a T5X checkpoint")
  state = _optimizer_state(contents, where)
  if only_target:
    if not isinstance(state.get("target"), Mapping) or not state["target"]:
      raise ValueError(f"{where}: the checkpoint has no parameters (optimizer.target)")
    state = {"target": state["target"]}
  templates = dict(flatten_params(template)) if template is not None else {}

  def read(leaf_path: KeyPath, leaf: Any) -> Any:
    where_leaf = f"{where}: {_name(leaf_path)}"
    leaf_template = templates.get(leaf_path)
    if isinstance(leaf, str) and leaf.startswith(_ORBAX_PLACEHOLDER):
      spec = {"driver": "zarr", "metadata": {},
              "kvstore": storage.kvstore(directory, leaf[len(_ORBAX_PLACEHOLDER):])}
    elif _is_tensorstore_spec(leaf):
      if "value_type" in leaf:  # from an Orbax _METADATA tree
        spec = {k: v for k, v in leaf.items() if k != "value_type"}
      else:
        spec = _legacy_array_spec(leaf, directory, where_leaf)
    elif isinstance(leaf, (np.ndarray, np.generic)):
      return np.asarray(leaf)
    else:
      return leaf
    with checkpoint_faults.reading(where, _name(leaf_path[1:] if only_target else leaf_path)):
      return zarr_array(spec, where_leaf, leaf_template)

  return unflatten_params({p: read(p, leaf) for p, leaf in flatten_params(state)})


def restore_t5x_state(path: str, template: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Every array of a T5X checkpoint: `{'target': params, 'state': optimizer state}`.

  `path`: a checkpoint directory (legacy or Orbax), its `checkpoint` file, or a bare msgpack
  file. `template`: optional tree like the result whose leaves have `.shape`/`.dtype`,
  needed only for Orbax arrays stored without `.zarray`.
  """
  return _restore(path, template, only_target=False)


def load_t5x(path: str, dtype: Any = None, template: Mapping[str, Any] | None = None) -> Params:
  """The parameters (`optimizer.target`) of a T5X checkpoint as a nested dict of numpy arrays.

  `dtype`: cast floating parameters to it after reading (T5X's inference restores in
  bfloat16). `template`: params-shaped tree of `.shape`/`.dtype` leaves (for Orbax arrays
  stored without `.zarray`; see `restore_t5x_state`). Optimizer slots are not read.
  """
  params = _restore(path, {"target": template} if template is not None else None,
                    only_target=True)["target"]
  return cast_floats(params, dtype) if dtype is not None else params


# --------------------------------------------------------------------------- T5X, sliced reads


def _open_zarr(spec: dict, where: str, template: Any) -> ts.TensorStore | np.ndarray:
  """The zarr array of `spec`, opened (nothing read yet) by its stored metadata. An array stored
  without metadata (see the module docstring) is read whole by `_read_zarr` instead."""
  kvstore = ts.KvStore.open(spec["kvstore"]).result()
  if any(kvstore.read(key).result().state == "value" for key in _ZARR_METADATA_KEYS):
    # As in T5X, the stored metadata is authoritative over the spec's chunking and compressor.
    return ts.open({"driver": spec["driver"], "kvstore": spec["kvstore"]}, open=True).result()
  return _read_zarr(spec, where, template)


def open_t5x_params(path: str, template: Params | None) -> Params:
  """The parameters of a T5X checkpoint (any layout `load_t5x` reads), each an
  opened TensorStore, or a numpy array where only a whole read is possible (inline msgpack
  arrays, zarr arrays stored without metadata; `template` as in `load_t5x`)."""
  return _restore(path, {"target": template} if template is not None else None,
                  only_target=True, zarr_array=_open_zarr)["target"]


def read_slice(array: ts.TensorStore | np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
  """array[index] of what `open_t5x_params` opened, read now."""
  if isinstance(array, ts.TensorStore):
    return np.asarray(array[index].read().result())
  return array[index]


# --------------------------------------------------------------------------- T5X save


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """A chunk shape dividing `shape` evenly with at most _MAX_CHUNK_BYTES per chunk."""
  chunks = list(shape)
  while math.prod(chunks) * itemsize > _MAX_CHUNK_BYTES:
    # Shrink the currently largest dimension to its next smaller divisor of the full size.
    axis = max(range(len(chunks)), key=lambda i: chunks[i])
    chunks[axis] = max(d for d in range(1, chunks[axis]) if shape[axis] % d == 0)
  return chunks


def save_t5x(params: Mapping[str, Any], directory: str, step: int, *,
             inline: bool = False) -> str:
  """Writes `params` as T5X legacy checkpoint `directory/checkpoint_{step}`; returns that path.

  Arrays go to gzip zarr arrays named like T5X's (`target.encoder.layers_0...`) with
  relative paths in the msgpack file, or inline into it when `inline`. The directory is
  written under a temporary name and renamed when complete, as T5X does.
  """
  if storage.gcs(os.fspath(directory)):
    raise ValueError(f"save_t5x writes local directories only, got {directory}")
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"step must be a non-negative int, got {step!r}")
  leaves = list(flatten_params(params))
  if not leaves:
    raise ValueError("save_t5x: params is empty")
  final_dir = os.path.join(os.fspath(directory), f"checkpoint_{int(step)}")
  if os.path.exists(final_dir):
    raise FileExistsError(f"checkpoint already exists: {final_dir}")
  tmp_dir = f"{final_dir}.tmp-{time.time_ns()}"
  os.makedirs(tmp_dir)
  try:
    written = {}
    for path, leaf in leaves:
      array = np.asarray(leaf)
      if inline:
        written[path] = array
        continue
      name = ".".join(("target",) + path)
      spec = {"driver": "zarr", "dtype": array.dtype.name,
              "kvstore": {"driver": "file", "path": name},
              "metadata": {"compressor": {"id": "gzip"}, "shape": list(array.shape),
                           "chunks": _chunk_shape(array.shape, array.dtype.itemsize)}}
      store = ts.open(dict(spec, kvstore=storage.kvstore(tmp_dir, name)), create=True).result()
      store.write(array).result()
      written[path] = spec
    contents = {"version": T5X_VERSION,
                "optimizer": {"target": unflatten_params(written),
                              "state": {"step": np.int32(step)}}}
    with open(os.path.join(tmp_dir, "checkpoint"), "wb") as f:
      f.write(serialization.msgpack_serialize(contents))
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  os.rename(tmp_dir, final_dir)
  return final_dir
