"""Sharded decoding on a ('data', 'model') device mesh, in T5X's partitioning vocabulary.

Contract
--------
Mesh (`make_mesh`): two axes, ('data', 'model'). `num_partitions` (T5X's name) is the size of
'model' and 'data' takes the remaining devices (devices // num_partitions); or an explicit
`mesh_shape=(data, model)` uses the first data * model devices. Too many partitions for the
devices, or a count that does not divide them, is a ValueError.

Logical axis rules (`standard_logical_axis_rules`, T5X's defaults): batch->data, vocab->model,
mlp->model, heads->model, joined_kv->model, kv->None, embed->None (embed->data in the 2-D
parameter-partitioning variant), length->None, relpos_buckets->None. A logical name without a
rule is an error, never silently replicated.

Shardings (all `NamedSharding`s on the mesh):
  * parameters, from the flax `params_axes` collection the network's `init` returns
    (e.g. `mlp/wi_0/kernel [E, mlp]` is ('embed', 'mlp') -> P(None, 'model'));
  * decode caches, from `network.cache_logical_axes`: self-attention K/V [B, L, H, D] are
    ('batch', 'length', 'heads', 'kv') -> P('data', None, 'model', None), cross-attention K/V
    [B, H, D, Le] ('batch', 'heads', 'kv', 'length') -> P('data', 'model', None, None);
  * batches: the leading axis is 'batch' -> P('data').
Before anything is traced or compiled, every split dimension is checked: a mesh axis that does
not divide it (heads, mlp_dim, the vocabulary, the batch, ...) is a ValueError naming the logical
axis, its size, the mesh axis and its size.

Decoding and restoring on such a mesh: `spec_decode.runtime.decode_layout`.

Multi-host: the entry point starts JAX's distributed system before anything touches JAX's
devices (`spec_decode.infer`: T5X's --multiprocess_gpu flags, or a cluster's environment);
this module never does. Each process then builds the same global mesh, reads only its own shards, and gets its own shards of the outputs
(gather them with `jax.experimental.multihost_utils.process_allgather`). tests/sharding runs
`spec_decode.infer` as 2 processes of 4 CPU devices (T5X's --multiprocess_gpu flags).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import unfreeze
from flax.linen import partitioning as nn_partitioning
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from spec_decode.runtime import platforms
from spec_decode.t5 import network

MESH_AXES = ("data", "model")
LogicalAxisRules = Sequence[tuple[str, str | Sequence[str] | None]]
Params = Any
AnyMesh = Mesh | AbstractMesh


# --------------------------------------------------------------------------- rules


def standard_logical_axis_rules(
    parameter_partitioning_dims: int = 1,
    additional_rules: LogicalAxisRules | None = None) -> list[tuple[str, Any]]:
  """T5X's standard rules for a T5 model: logical axis name -> mesh axis (or None).

  `parameter_partitioning_dims=2` also splits parameters' 'embed' axis over 'data' (T5X's 2-D
  parameter partitioning, for models whose parameters do not fit the 'model' axis alone).
  `additional_rules` are appended (lower priority), as in T5X.
  """
  if parameter_partitioning_dims not in (1, 2):
    raise ValueError(f"parameter_partitioning_dims must be 1 or 2, got "
                     f"{parameter_partitioning_dims!r}")
  rules = [
      ("batch", "data"),
      ("vocab", "model"),
      ("mlp", "model"),
      ("heads", "model"),
      ("joined_kv", "model"),
      ("kv", None),
      ("embed", "data" if parameter_partitioning_dims == 2 else None),
      ("length", None),
      ("relpos_buckets", None),
  ]
  return rules + list(additional_rules or ())


def replicated_parameter_rules(rules: LogicalAxisRules) -> list[tuple[str, Any]]:
  """`rules` with every logical axis but 'batch' unsplit: parameters replicated on every device,
  caches and activations still split over the batch (the default for a draft model)."""
  return [(name, mesh_axes if name == "batch" else None) for name, mesh_axes in rules]


def check_rules(rules: LogicalAxisRules) -> None:
  for rule in rules:
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"a logical axis rule is (logical name, mesh axis or None), got {rule!r}")
    mesh_axes = rule[1]
    names = () if mesh_axes is None else (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
    unknown = [name for name in names if name not in MESH_AXES]
    if unknown:
      raise ValueError(f"rule {rule!r} names mesh axes {unknown}; the mesh axes are {MESH_AXES}")


def logical_to_mesh_spec(logical_axes: PartitionSpec | Sequence[str | None],
                         rules: LogicalAxisRules) -> PartitionSpec:
  """A PartitionSpec of logical names -> one of mesh axes (flax's priority-ordered lookup)."""
  known = {name for name, _ in rules}
  unknown = [name for name in logical_axes if name is not None and name not in known]
  if unknown:
    raise ValueError(f"logical axes {unknown} have no partitioning rule (rules: {list(rules)})")
  return nn_partitioning.logical_to_mesh_axes(tuple(logical_axes), list(rules))


# --------------------------------------------------------------------------- mesh


def _positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return int(value)


def mesh_shape_for(num_devices: int, num_partitions: int | None = None,
                   mesh_shape: Sequence[int] | None = None) -> tuple[int, int]:
  """The (data, model) shape that `num_partitions` or `mesh_shape` asks of `num_devices`."""
  if (num_partitions is None) == (mesh_shape is None):
    raise ValueError(f"give exactly one of num_partitions or mesh_shape, got "
                     f"num_partitions={num_partitions!r}, mesh_shape={mesh_shape!r}")
  if num_partitions is not None:
    model = _positive_int("num_partitions", num_partitions)
    if model > num_devices:
      raise ValueError(f"num_partitions={model} needs at least {model} devices, but only "
                       f"{num_devices} are available")
    if num_devices % model:
      raise ValueError(f"num_partitions={model} does not divide the {num_devices} devices "
                       "into equal model-parallel groups")
    return num_devices // model, model
  if len(mesh_shape) != 2:
    raise ValueError(f"mesh_shape is (data, model), got {tuple(mesh_shape)!r}")
  data, model = (_positive_int(f"mesh_shape[{i}]", n) for i, n in enumerate(mesh_shape))
  if data * model > num_devices:
    raise ValueError(f"mesh_shape ({data}, {model}) needs {data * model} devices, but only "
                     f"{num_devices} are available")
  return data, model


def make_mesh(num_partitions: int | None = None, mesh_shape: Sequence[int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The ('data', 'model') mesh over `devices` (default: all of JAX's devices, every process)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape_for(len(devices), num_partitions, mesh_shape)
  # create_device_mesh lays 'model' along the fastest interconnect of the physical topology.
  return Mesh(mesh_utils.create_device_mesh(shape, devices[:math.prod(shape)]), MESH_AXES)


# --------------------------------------------------------------------------- shardings


def _is_spec(x: Any) -> bool:
  return isinstance(x, PartitionSpec)


@dataclasses.dataclass(frozen=True)
class Indivisible:
  """A logical axis whose size the mesh axes it is split over do not divide."""
  logical_axis: str
  size: int
  mesh_axes: tuple[str, ...]
  parts: int
  example: str  # one leaf with this axis: its path and shape

  def __str__(self) -> str:
    return (f"logical axis '{self.logical_axis}' of size {self.size} is split over mesh axis "
            f"{'x'.join(self.mesh_axes)} of size {self.parts}, which does not divide it "
            f"(e.g. {self.example})")


def indivisible_axes(shapes: Any, logical_axes: Any, rules: LogicalAxisRules,
                     mesh: AnyMesh) -> list[Indivisible]:
  """Every (logical axis, size) of `shapes` that the mesh cannot split evenly, once each.

  `shapes`: a pytree of leaves with `.shape`; `logical_axes`: the same tree with PartitionSpecs
  of logical names.
  """
  flat_shapes, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  flat_axes = treedef.flatten_up_to(logical_axes)
  problems: dict[tuple, Indivisible] = {}
  for (path, leaf), axes in zip(flat_shapes, flat_axes):
    shape = tuple(leaf.shape)
    name = f"{jax.tree_util.keystr(path)} {list(shape)}"
    if len(axes) != len(shape):
      raise ValueError(f"{name}: logical axes {axes} do not match the shape")
    for size, logical, mesh_axes in zip(shape, axes, logical_to_mesh_spec(axes, rules)):
      if mesh_axes is None:
        continue
      mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
      parts = math.prod(mesh.shape[axis] for axis in mesh_axes)
      if size % parts:
        key = (logical, size, mesh_axes)
        problems.setdefault(key, Indivisible(logical, size, mesh_axes, parts, name))
  return list(problems.values())


def check_divisible(shapes: Any, logical_axes: Any, rules: LogicalAxisRules,
                    mesh: AnyMesh, what: str) -> None:
  """Raises ValueError listing every `indivisible_axes` problem; `what` names the tree in the
  message (a plural: "parameters")."""
  problems = indivisible_axes(shapes, logical_axes, rules, mesh)
  if problems:
    raise ValueError(f"mesh {dict(mesh.shape)} does not fit the {what}:\n  "
                     + "\n  ".join(map(str, problems)))


def logical_shardings(mesh: AnyMesh, logical_axes: Any, rules: LogicalAxisRules,
                      shapes: Any = None, what: str = "arrays") -> Any:
  """Tree of PartitionSpecs of logical names -> tree of NamedShardings; checks `shapes` first."""
  if shapes is not None:
    check_divisible(shapes, logical_axes, rules, mesh, what)
  return jax.tree_util.tree_map(
      lambda axes: NamedSharding(mesh, logical_to_mesh_spec(axes, rules)), logical_axes,
      is_leaf=_is_spec)


def params_logical_axes(params_axes: Mapping[str, Any]) -> Params:
  """The flax `params_axes` collection -> the params tree of logical PartitionSpecs."""
  return unfreeze(nn_partitioning.get_axis_names(params_axes))


def abstract_params(config: network.NetworkConfig) -> tuple[Params, Params]:
  """(parameter ShapeDtypeStructs, parameter logical axes) of `config` (a T5 or a decoder-only
  model's); nothing is allocated."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  variables = jax.eval_shape(
      lambda t: network.module_of(config).init(jax.random.PRNGKey(0),
                                               *network.init_arguments(config, t)), tokens)
  return unfreeze(variables["params"]), params_logical_axes(variables["params_axes"])


def abstract_decode_cache(config: network.NetworkConfig, batch_size: int, input_length: int,
                          max_decode_len: int, params: Params | None = None
                          ) -> network.DecodeCache:
  """ShapeDtypeStructs of `network.init_decode_cache` for [batch_size, input_length] encoder
  inputs, or a decoder-only model's [batch_size, max_decode_len] prompt buffer (`params`: the
  abstract parameters of `config`, when already at hand)."""
  if params is None:
    params, _ = abstract_params(config)
  prefill_length = max_decode_len if network.is_decoder_only(config) else input_length
  init = functools.partial(network.init_decode_cache, config, max_decode_len=max_decode_len)
  return jax.eval_shape(init, params,
                        jax.ShapeDtypeStruct((batch_size, prefill_length), jnp.int32))


# --------------------------------------------------------------------------- partitioner


class PjitPartitioner:
  """T5X-style partitioner: a ('data', 'model') mesh, logical axis rules, and `partition`.

  Give `num_partitions` (the 'model' size; 'data' takes the remaining devices) or
  `mesh_shape=(data, model)`; `logical_axis_rules` defaults to `standard_logical_axis_rules()`.
  """

  def __init__(self, num_partitions: int | None = None, mesh_shape: Sequence[int] | None = None,
               logical_axis_rules: LogicalAxisRules | None = None,
               devices: Sequence[jax.Device] | None = None):
    rules = standard_logical_axis_rules() if logical_axis_rules is None else logical_axis_rules
    rules = tuple(tuple(rule) for rule in rules)
    check_rules(rules)
    self._mesh = make_mesh(num_partitions, mesh_shape, devices)
    self._rules = rules

  @property
  def mesh(self) -> Mesh:
    return self._mesh

  @property
  def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
    return self._rules

  def sharding(self, logical_axes: PartitionSpec | Sequence[str | None],
               rules: LogicalAxisRules | None = None) -> NamedSharding:
    """The NamedSharding of one array with these logical axes."""
    return NamedSharding(self._mesh, logical_to_mesh_spec(logical_axes, rules or self._rules))

  @property
  def batch_sharding(self) -> NamedSharding:
    """Leading axis split over 'batch' (a prefix: fits a batch of any rank, or a tree of them)."""
    return self.sharding(PartitionSpec("batch"))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self._mesh, PartitionSpec())

  def logical_shardings(self, logical_axes: Any, shapes: Any = None,
                        rules: LogicalAxisRules | None = None, what: str = "arrays") -> Any:
    """See the module-level `logical_shardings`; `rules` default to the partitioner's."""
    return logical_shardings(self._mesh, logical_axes, rules or self._rules, shapes, what)

  def params_shardings(self, params_axes: Mapping[str, Any], params_shapes: Any = None,
                       rules: LogicalAxisRules | None = None) -> Params:
    """Shardings of a params tree from its flax `params_axes` collection (checked against
    `params_shapes` when given)."""
    return self.logical_shardings(params_logical_axes(params_axes), params_shapes, rules,
                                  what="parameters")

  def cache_shardings(self, cache: network.DecodeCache,
                      rules: LogicalAxisRules | None = None) -> network.DecodeCache:
    """Shardings of a decode cache (arrays or ShapeDtypeStructs), checked against its shapes."""
    return self.logical_shardings(network.cache_logical_axes(cache), cache, rules,
                                  what="decode cache")

  def partition(self, fn: Callable, in_shardings: Any, out_shardings: Any,
                static_argnums: int | Sequence[int] = (),
                donate_argnums: int | Sequence[int] = (),
                compiler_options: Mapping[str, Any] | None = None) -> Callable:
    """`jax.jit(fn)` with explicit shardings on this mesh (T5X's `partition`, under jit's names).

    Shardings inside `fn` must be NamedShardings (e.g. from `sharding`): no mesh context is set.
    Compiled with the mesh platform's options (`platforms.Platform.compiler_options`: every
    caller partitions a decoder), `compiler_options` merged on top.
    """
    return jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                   static_argnums=static_argnums, donate_argnums=donate_argnums,
                   compiler_options=platforms.Platform.of_mesh(self._mesh).merged(
                       compiler_options))
