"""Decoding on a device mesh: where a decode's parameters, caches and batches live, and the one
place a decode is compiled (mesh, rules and shardings: `spec_decode.runtime.partitioning`).

Decode layout (`decode_layout` -> `DecodeLayout`): the one place a decode is compiled and its
parameters placed, used by `spec_decode.infer` (through `DecodeLayout.partition_predict`, any
`core.Decoder`) and by the benchmark (`spec_decode.bench.decoders`: the decoder's prefill and
loop compiled apart, the caches passing from one to the other in their layouts). A layout is
the decoder's `core.ModelCalls` on the mesh. Target parameters follow the rules;
draft parameters are replicated on every device by default (`replicated_parameter_rules`: a
draft step is latency-bound and must not wait on collectives) or follow their own rules. Each
cache is pinned to its sharding where it is created and after every model call
(`DecodeLayout.init_cache`, `tokens_to_logits` and `pin_cache`), so the
`lax.while_loop` carries both caches in one layout. Per-row writes (the caches' and the engine's
token buffer) are vmapped scatters, which GSPMD keeps on the devices holding the rows: inside
the loop a model call's only collectives are the all-reduces of its 'model'-split matmuls (the
sampling's reductions over 'model'-split logits add theirs), and nothing is permuted or
resharded per step (checked on the compiled HLO of infer's and the
benchmark's loops by tests/sharding). Batches go in split over 'data' (`put_batch`: a batch the
'data' axis does not divide is a ValueError naming it), outputs come out split alike (a call
that returns caches leaves them in their layouts: `DecodeLayout.partition`'s argument and output
kinds) and are fetched by `gather` (`process_allgather`, multi-host safe). The products and
compiler options are the mesh's platform's (`platforms.Platform.of_mesh`), whatever the host: a
layout over a TPU topology described from a CPU host compiles TPU programs
(`python -m spec_decode.aot`); a layout's `compiler_options` go on top (the benchmark's).

Restoring (`DecodeLayout.restore` -> `restore_params`): parameters go straight into their
shards. T5X checkpoints (`restore_sharded`): every array stored as a TensorStore (zarr) array is
read slice by slice, each process reading only the slices its own devices hold, each distinct
slice once and dropped once on its devices, so host memory holds one slice (and the TensorStore
chunk it is read from) at a time, never the whole model. Arrays stored inline in a msgpack file
cannot be read partially: each process reads the whole file, then keeps its slices. Hugging
Face folders and demo .safetensors files are read into host memory whole (`formats.load_params`),
then each device receives only its slices (`put_host`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from flax.core import unfreeze
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec

from spec_decode import core
from spec_decode.runtime import partitioning
from spec_decode.runtime import platforms
from spec_decode.engine import decoding
from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

Params = Any


def _draft_kind(decoder: core.Decoder) -> str | None:
  """How a decode's draft_params are laid out: a draft network's by the draft's rules, an
  n-gram draft's tables replicated (small: O(V K)), none without draft params."""
  if decoder.draft_network is not None:
    return "draft"
  return "replicated" if decoder.takes_draft_params else None


def _batch_axes(leaf: Any) -> PartitionSpec:
  """Logical axes of a batch leaf: 'batch' first, the rest unsplit."""
  return PartitionSpec("batch", *[None] * (len(leaf.shape) - 1))


def put_host(arrays: Any, shardings: Any) -> Any:
  """Host (numpy) arrays -> jax.Arrays laid out by `shardings` (a tree, or one sharding for
  every leaf), each device receiving only its slice: no device ever holds a whole array it
  does not replicate. Every process must pass the same arrays (each keeps its own slices).
  A jax.Array already laid out so is returned as it is."""
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree_util.tree_map(lambda _: shardings, arrays)

  def put(array: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    if isinstance(array, jax.Array) and array.sharding.is_equivalent_to(sharding, array.ndim):
      return array  # already laid out (e.g. on the one device of a 1x1 mesh): no second copy
    array = np.asarray(array)
    return _array_from_slices(array.shape, sharding, lambda index: array[index])

  return jax.tree_util.tree_map(put, arrays, shardings)


def _array_from_slices(shape: tuple[int, ...], sharding: jax.sharding.Sharding,
                       read: Callable[[tuple[slice, ...]], np.ndarray]) -> jax.Array:
  """The jax.Array of `shape` laid out by `sharding` whose slice `index` is `read(index)`.
  Each distinct slice of this process's devices is read once, put on every device holding it,
  and dropped: at most one slice is in host memory at a time (jax.make_array_from_callback
  would hold all of them until the end)."""
  devices_by_slice: dict[tuple, tuple[tuple[slice, ...], list[jax.Device]]] = {}
  for device, index in sharding.addressable_devices_indices_map(shape).items():
    # Slices are unhashable before Python 3.12.
    key = tuple((s.start, s.stop, s.step) for s in index)
    devices_by_slice.setdefault(key, (index, []))[1].append(device)
  shards = []
  for index, devices in devices_by_slice.values():
    data = read(index)
    shards += [jax.device_put(data, device) for device in devices]
  return jax.make_array_from_single_device_arrays(shape, sharding, shards)


def gather(outputs: Any) -> Any:
  """Outputs of a partitioned call (split over 'data') -> whole numpy arrays on every process
  (`process_allgather`: multi-host safe, where `jax.device_get` of a global array is not).
  Each array owns its memory: on one host `process_allgather` may hand back a view of the device
  buffer, and a caller keeping a few rows would keep every output buffer of the call alive."""
  return jax.tree.map(np.array, multihost_utils.process_allgather(outputs, tiled=True))


# The kinds of argument `DecodeLayout.partition` lays out (see there).
ARGUMENT_KINDS = ("target", "draft", None, "batch", "replicated", "pinned")


class _InputsChecked:
  """A jitted decoder whose batch arguments are checked against the mesh before jit sees them
  (jit's own check would name no logical axis)."""

  def __init__(self, jitted: Callable, check: Callable[..., None],
               batch_positions: Sequence[int]):
    self._jitted = jitted
    self._check = check
    self._batch_positions = tuple(batch_positions)

  def __call__(self, *args: Any) -> Any:
    self._check(*(args[i] for i in self._batch_positions))
    return self._jitted(*args)

  def lower(self, *args: Any) -> jax.stages.Lowered:
    self._check(*(args[i] for i in self._batch_positions))
    return self._jitted.lower(*args)


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
  """Where the arrays of a (speculative) decode live on a partitioner's mesh: the one place a
  decode is compiled (`partition`) and its parameters are placed (`restore`, `put_params`).

  Target parameters follow the partitioner's rules, draft parameters `draft_rules`; each model's
  decode cache is pinned to its layout where it is created (`init_cache`) and after every model
  call (`tokens_to_logits`: the layout is a `core.ModelCalls`), so the
  engine's `lax.while_loop` carries it in one layout. Batches are split over 'data'; outputs
  too, unless a call returns caches (`partition`; `gather` fetches outputs). Models compute
  with the mesh's platform's products (`platform`); every decode is compiled with
  `compiler_options` on top of that platform's own.
  """
  partitioner: partitioning.PjitPartitioner
  target: network.NetworkConfig
  draft: network.NetworkConfig | None
  draft_rules: tuple[tuple[str, Any], ...]
  params_shardings: Params
  draft_params_shardings: Params | None
  compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def mesh(self) -> Mesh:
    return self.partitioner.mesh

  @property
  def platform(self) -> platforms.Platform:
    """The platform of the mesh's devices: what the decode's products are chosen for."""
    return platforms.Platform.of_mesh(self.mesh)

  def rules(self, role: str) -> tuple[tuple[str, Any], ...]:
    """The logical axis rules of the 'target' or the 'draft'."""
    if role not in ("target", "draft"):
      raise ValueError(f"role is 'target' or 'draft', got {role!r}")
    return self.partitioner.logical_axis_rules if role == "target" else self.draft_rules

  def pin_cache(self, role: str, cache: network.DecodeCache) -> network.DecodeCache:
    """`cache` constrained to its layout (inside a jitted function); a 'lookup' cache (the rows'
    encoder tokens, `core.LookupDraft`) is split over 'data' like the batch it came from."""
    if role == "lookup":
      return jax.lax.with_sharding_constraint(
          cache, jax.tree_util.tree_map(lambda _: self.partitioner.batch_sharding, cache))
    return jax.lax.with_sharding_constraint(
        cache, self.partitioner.cache_shardings(cache, self.rules(role)))

  def init_cache(self, role: str, module_or_config: network.Network | network.NetworkConfig,
                 params: Params, prefill_tokens: jax.Array, max_decode_len: int
                 ) -> network.DecodeCache:
    """`network.init_decode_cache` of one model, in its layout (inside a jitted function)."""
    return self.pin_cache(role, network.init_decode_cache(
        self.platform.module(module_or_config), params, prefill_tokens, max_decode_len))

  def tokens_to_logits(self, role: str,
                       module_or_config: network.Network | network.NetworkConfig,
                       params: Params) -> Callable:
    """`network.make_tokens_to_logits` of one model, its new cache kept in its layout."""
    tokens_to_logits = network.make_tokens_to_logits(self.platform.module(module_or_config),
                                                     params)

    def pinned_tokens_to_logits(state: decoding.DecodingState):
      logits, new_cache = tokens_to_logits(state)
      return logits, self.pin_cache(role, new_cache)

    return pinned_tokens_to_logits

  def check_batch(self, *batch: Any) -> None:
    """ValueError naming the axis when the 'data' axis does not divide a batch leaf."""
    partitioning.check_divisible(batch, jax.tree_util.tree_map(_batch_axes, batch),
                    self.partitioner.logical_axis_rules, self.mesh, what="inputs")

  def partition(self, fn: Callable, args: Sequence[str | None],
                outputs: str = "batch") -> Callable:
    """`fn` jitted on the mesh, each argument laid out by its kind, one `args` entry each:
      'target', 'draft'  that model's parameters (as `put_params` or `restore` place them);
      None               an absent model's parameters (pass None);
      'batch'            an array or tree of [B, ...] arrays, split over 'data' (`put_batch`),
                         checked by `check_batch` before jit sees it;
      'replicated'       e.g. an rng (`put_replicated`);
      'pinned'           kept where it is: a decode cache another partitioned call returned
                         (`fn` pins it, `pin_cache`, so its loop carries it in its layout).
    `outputs`: 'batch' splits every output over 'data' (fetch them with `gather`); 'pinned'
    leaves each where `fn` pins it (caches made by `init_cache` stay in their layouts: hand
    them to another call as 'pinned')."""
    unknown = [kind for kind in args if kind not in ARGUMENT_KINDS]
    if unknown or outputs not in ("batch", "pinned"):
      raise ValueError(f"argument kinds are {ARGUMENT_KINDS} and outputs 'batch' or 'pinned', "
                       f"got {unknown or [outputs]}")
    batch = self.partitioner.batch_sharding
    # None: jit keeps the argument's own layout ('pinned') or has nothing to lay out (None).
    shardings_by_kind = {"batch": batch, "replicated": self.partitioner.replicated}
    in_shardings = tuple(self._shardings(kind) if kind in ("target", "draft")
                         else shardings_by_kind.get(kind) for kind in args)
    jitted = self.partitioner.partition(fn, in_shardings,
                                        batch if outputs == "batch" else None,
                                        compiler_options=self.compiler_options)
    return _InputsChecked(jitted, self.check_batch,
                          [i for i, kind in enumerate(args) if kind == "batch"])

  def partition_predict(self, decoder: core.Decoder, eos_id: int,
                        num_decodes: int = 1) -> Callable:
    """`decoder.predict` (`num_decodes` per input, the best kept) partitioned, each cache
    pinned to its layout: a function (params, draft_params, batch, rng) -> (decodes [B, L],
    aux), draft_params None unless the decoder uses a draft. Give arguments placed by
    `restore`/`put_params`, `put_batch` and `put_replicated`."""

    def predict(params, draft_params, batch, rng):
      return decoder.predict(params, draft_params, batch, eos_id, rng, num_decodes=num_decodes,
                             calls=self)

    return self.partition(predict, ("target", _draft_kind(decoder),
                                    "batch", "replicated"))

  def put_params(self, role: str, params: Params) -> Params:
    """Host parameters of the 'target' or 'draft' -> their layout, slice by slice."""
    return put_host(params, self._shardings(role))

  def put_batch(self, batch: Any) -> Any:
    """A host batch (a tree of [B, ...] arrays, the same on every process) split over 'data'."""
    self.check_batch(batch)
    return put_host(batch, self.partitioner.batch_sharding)

  def put_replicated(self, arrays: Any) -> Any:
    """Host arrays (e.g. an rng) replicated on every device."""
    return put_host(arrays, self.partitioner.replicated)

  def restore(self, role: str, module: network.Network, path: str | formats.Checkpoint,
              dtype: Any = None) -> Params:
    """The 'target's or 'draft's parameters from a checkpoint, straight into their layout (see
    `restore_params`)."""
    config = self.target if role == "target" else self.draft
    if module.config != config:
      raise ValueError(f"the {role} module's config is not the layout's")
    return restore_params(module, path, self._shardings(role), dtype)

  def _shardings(self, role: str) -> Params:
    self.rules(role)  # checks the role
    shardings = self.params_shardings if role == "target" else self.draft_params_shardings
    if shardings is None:
      raise ValueError("this layout has no draft")
    return shardings


def decode_layout(partitioner: partitioning.PjitPartitioner, target: network.NetworkConfig,
                  draft: network.NetworkConfig | None = None,
                  draft_logical_axis_rules: partitioning.LogicalAxisRules | None = None,
                  compiler_options: Mapping[str, Any] | None = None) -> DecodeLayout:
  """The `DecodeLayout` of `target` (and `draft`) on `partitioner`'s mesh. Draft parameters
  follow `draft_logical_axis_rules`, by default `partitioning.replicated_parameter_rules` of the
  partitioner's (a draft step is latency-bound and must not wait on collectives). Both models'
  parameter shapes are checked against the mesh here (ValueError). `compiler_options`: XLA
  options merged on top of the mesh platform's own (`platforms.Platform.merged`)."""
  rules = partitioner.logical_axis_rules
  draft_rules = tuple(tuple(rule) for rule in
                      (draft_logical_axis_rules or partitioning.replicated_parameter_rules(rules)))
  partitioning.check_rules(draft_rules)

  def shardings(config: network.NetworkConfig,
                model_rules: partitioning.LogicalAxisRules) -> Params:
    shapes, axes = partitioning.abstract_params(config)
    return partitioner.logical_shardings(axes, shapes, model_rules, what="parameters")

  return DecodeLayout(partitioner, target, draft, draft_rules, shardings(target, rules),
                      None if draft is None else shardings(draft, draft_rules),
                      dict(compiler_options or {}))


# --------------------------------------------------------------------------- restore


# The checkpoint layouts are `spec_decode.checkpoints.t5x_format`' business; this section reuses its
# locating and parsing helpers and replaces only the final whole-array read by sliced reads.


def restore_sharded(path: str, shardings: Params, template: Params, dtype: Any = None) -> Params:
  """The parameters of a T5X checkpoint as jax.Arrays laid out by `shardings`.

  `template`: the params tree of ShapeDtypeStructs (e.g. `partitioning.abstract_params(config)[0]`); the
  checkpoint must match it exactly (`t5x_format.check_params`). `shardings`: the same tree of
  Shardings (e.g. `partitioning.PjitPartitioner.params_shardings`). `dtype`: floating parameters are cast to
  it slice by slice (T5X's inference restores in bfloat16). Each process reads only the slices
  its own devices hold, each distinct slice once, one at a time; see the module docstring for
  the layouts that force a whole read.
  """
  source = os.fspath(path)
  arrays = t5x_format.open_t5x_params(path, template)
  t5x_format.check_params(template, arrays, source)
  flat_shardings = dict(t5x_format.flatten_params(unfreeze(shardings)))

  def place(key_path: t5x_format.KeyPath, array: ts.TensorStore | np.ndarray) -> jax.Array:
    stored = jnp.dtype(array.dtype.numpy_dtype if isinstance(array, ts.TensorStore)
                       else array.dtype)
    wanted = dtype if dtype is not None and jnp.issubdtype(stored, jnp.floating) else stored
    name = "/".join(key_path)

    def read(index: tuple[slice, ...]) -> np.ndarray:
      with checkpoint_faults.reading(source, name):
        data = t5x_format.read_slice(array, index)
      checkpoint_faults.check_finite(data, name, source)  # each slice is read once anyway
      return data.astype(wanted, copy=False)

    return _array_from_slices(tuple(array.shape), flat_shardings[key_path], read)

  return t5x_format.unflatten_params(
      {key_path: place(key_path, array) for key_path, array in t5x_format.flatten_params(arrays)})


def restore_params(module: network.Network, path: str | formats.Checkpoint,
                   shardings: Params, dtype: Any = None) -> Params:
  """`module`'s parameters from any checkpoint `formats.load_params` reads, as jax.Arrays laid
  out by `shardings`, no device receiving more than its slices. A T5X checkpoint goes through
  `restore_sharded` (TensorStore arrays read slice by slice: the whole target is never in host
  memory at once); a Hugging Face folder or a demo .safetensors file is read into host memory
  whole (their formats have no sliced reads), then each device gets its slices (`put_host`).
  `dtype`: floating parameters are cast to it."""
  checkpoint = formats.locate(path)
  if checkpoint.kind == "t5x":
    template, _ = partitioning.abstract_params(module.config)
    return restore_sharded(checkpoint.resolved, shardings, template, dtype)
  return put_host(formats.load_params(module, checkpoint, dtype), shardings)
