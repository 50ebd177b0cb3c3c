"""Everything a decode program chooses by the devices it is compiled for: `Platform`.

A program's platform is that of the devices it is compiled for: a mesh's devices
(`Platform.of_mesh`: `spec_decode.infer`, the benchmark and `python -m spec_decode.aot` compile
on a `decode_layout.DecodeLayout`, whose mesh may be a TPU topology described from a CPU host),
or the default devices a plain `jax.jit` runs on (`Platform.default()`: the standalone models,
the T5X hook inside T5X's pjit, `call_costs`). Never the host's backend alone: a TPU program
built on a CPU host gets the TPU's choices and no CPU custom call. This module is the one place
those choices are made; code that runs a model asks its platform.

What a platform chooses:
  * the network's products (`ops(dtype)`, `module(m)`): on CPU `cpu_kernels.cpu_ops` (the
    small-row matmul kernel when the program has one device: a custom call is opaque to GSPMD,
    which would gather a model-split weight onto every device to run it; the few-query
    attention loops for float32 networks); on TPU `TPU_OPS`: XLA's products, the decoder's
    attention projections by `network.kernel_first_dot`, which XLA:TPU computes from the
    kernels as stored where `jnp.dot` of the loop's few rows has it hoist a transposed copy
    of each out of the decode loop, live through the whole decode (docs/TPU_COMPILE.md); plain
    XLA (`network.Ops()`) on GPU;
  * XLA compiler options (`compiler_options()`, `merged(...)`): on CPU, YNNPACK's dot fusion
    off. Why: on XLA:CPU (jaxlib 0.10) a dot of k = 2..8 activation rows against a weight
    matrix (a (gamma+1)-token verification call, the draft's catch-up) goes to YNNPACK by
    default, at about half the speed of XLA's Eigen dot on the same shapes (profiled at
    T5.1.1-base/-large, float32, batch 1: docs/PERFORMANCE.md). Results agree to float
    rounding. An option this jaxlib does not know is dropped (checked once by compiling a
    trivial function), so another jaxlib decodes with its defaults rather than failing. Other
    platforms get no options (their compilers reject these names).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from spec_decode.t5 import cpu_kernels
from spec_decode.t5 import network

PLATFORMS = ("cpu", "gpu", "tpu")
# Measured to pay on XLA:CPU; see the module docstring.
CPU_DECODE_OPTIONS: Mapping[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}
# Compiled to pay on XLA:TPU; see the module docstring.
TPU_OPS = network.Ops(decoder_projection=network.kernel_first_dot)


def _platform_name(device: jax.Device) -> str:
  """'cpu', 'gpu' or 'tpu' ('cuda' and 'rocm' devices are 'gpu')."""
  name = device.platform
  return "gpu" if name in ("cuda", "rocm") else name


@dataclasses.dataclass(frozen=True)
class Platform:
  """The platform of a program's devices: `name` ('cpu', 'gpu' or 'tpu') and how many devices
  the program spans."""
  name: str
  num_devices: int = 1

  def __post_init__(self):
    if self.name not in PLATFORMS:
      raise ValueError(f"platform must be one of {PLATFORMS}, got {self.name!r}")
    if self.num_devices < 1:
      raise ValueError(f"a platform has at least one device, got {self.num_devices}")

  @classmethod
  def of_devices(cls, devices: Iterable[jax.Device]) -> "Platform":
    """The platform of a program compiled for `devices` (all of one platform)."""
    devices = list(devices)
    names = sorted({_platform_name(device) for device in devices})
    if len(names) != 1:
      raise ValueError(f"a program's devices are of one platform, got {names or 'none'}")
    return cls(names[0], len(devices))

  @classmethod
  def of_mesh(cls, mesh: Mesh) -> "Platform":
    return cls.of_devices(mesh.devices.flat)

  @classmethod
  def default(cls) -> "Platform":
    """The platform of a `jax.jit` without shardings: JAX's default devices (all of them,
    since such a jit may be handed arrays laid out over every one, as T5X's pjit does)."""
    return cls.of_devices(jax.devices())

  def ops(self, dtype: Any = jnp.float32) -> network.Ops:
    """The network's products on this platform for activation dtype `dtype`."""
    if self.name == "tpu":
      return TPU_OPS
    if self.name != "cpu":
      return network.Ops()
    return cpu_kernels.cpu_ops(dtype, small_rows_kernel=self.num_devices == 1)

  def module(self, module_or_config: network.Network | network.NetworkConfig
             ) -> network.Network:
    """The module (or the network of the config) computing with this platform's products."""
    if not isinstance(module_or_config, network.NETWORKS):
      module_or_config = network.module_of(module_or_config)
    return module_or_config.clone(ops=self.ops(module_or_config.config.dtype))

  def compiler_options(self) -> dict[str, Any]:
    """XLA options for compiling a decoder on this platform (see the module docstring)."""
    if self.name != "cpu":
      return {}
    return dict(_supported_cpu_options(tuple(sorted(CPU_DECODE_OPTIONS.items()))))

  def merged(self, compiler_options: Mapping[str, Any] | None = None,
             xla_defaults: bool = False) -> dict[str, Any]:
    """`compiler_options()` with `compiler_options` on top; with `xla_defaults`, only
    `compiler_options` (what XLA alone would do: the benchmark's reference)."""
    base = {} if xla_defaults else self.compiler_options()
    return {**base, **dict(compiler_options or {})}


@functools.lru_cache(maxsize=None)
def _supported_cpu_options(items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
  """The options among `items` that this jaxlib's CPU compiler accepts."""
  kept = []
  for name, value in items:
    try:
      probe = jax.device_put(jnp.zeros((2,), jnp.float32), jax.devices("cpu")[0])
      jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(probe).compile()
    except Exception:  # pylint: disable=broad-except  (unknown option or value: drop it)
      continue
    kept.append((name, value))
  return tuple(kept)
