"""Accelerator topologies a decode can be compiled for from any host (`python -m
spec_decode.aot --topology=...`), and the published figures of their chips.

A TPU topology is described to XLA's TPU compiler by libtpu's compile-only client
(`jax.experimental.topologies.get_topology_desc`): its devices are real `TpuDevice`s of that
slice, none of them attached, so a `Mesh` over them builds real XLA:TPU executables on a host
without a TPU (`pip install "jax[tpu]"` brings libtpu on Python 3.12). A GPU topology is
described to XLA:GPU by JAX's CUDA plugin from a target description of the GPU (compute
capability, memory, bandwidth), with no GPU and no driver (`pip install "jax[cuda13]"`; the
plugin's driver-version check is skipped, since no driver is used). XLA:GPU gives memory but
no cost analysis for such programs.

Names: Cloud TPU's (`v4-8`: 8 TensorCores = 4 v4 chips, one device per chip as JAX sees a v4
in megacore mode; `v5litepod-8` = `v5e-8`: 8 chips), or libtpu's own `<generation>:<chips per
axis>` (`v4:1x1x1`: one v4 chip, the paper's Table 2 setting; `v4:2x2x4`: 16 chips on 4 hosts);
GPUs as `h200` (one) or `h200:8` (eight on one host).

Chip figures (`Chip`) are Google's published per-chip peak numbers (HBM capacity, HBM
bandwidth, bfloat16 FLOP/s): a roofline's bounds, not measurements.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import jax

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One chip generation: libtpu's name and its published peak figures."""
  generation: str  # libtpu's topology prefix: 'v4', 'v5e', 'v5p', 'v6e'
  kind: str  # as JAX names its devices, e.g. 'TPU v4'
  hbm_bytes: int
  hbm_bytes_per_second: float
  bf16_flops_per_second: float
  megacore: bool  # two TensorCores seen as one device
  chips_per_host: tuple[int, int, int]  # the largest block of chips one host drives
  platform: str = "tpu"
  # XLA:GPU's description of the device (its GpuTargetConfig, text format), for GPUs.
  gpu_target_config: str = ""


# NVIDIA's published H200 SXM figures: 141 GB HBM3e at 4.8 TB/s, 989 dense bf16 TFLOP/s, 132
# SMs of compute capability 9.0 (Hopper's per-SM limits).
H200_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 4800000000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 141000000000 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 }
device_description_str: "NVIDIA H200"
"""


CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GIB, 1200e9, 275e12, True, (2, 2, 1)),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GIB, 819e9, 197e12, False, (2, 4, 1)),
    "v5p": Chip("v5p", "TPU v5", 95 * GIB, 2765e9, 459e12, True, (2, 2, 1)),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GIB, 1640e9, 918e12, False, (2, 4, 1)),
    "h200": Chip("h200", "NVIDIA H200", 141 * 10**9, 4.8e12, 989e12, False, (8, 1, 1),
                 platform="gpu", gpu_target_config=H200_TARGET_CONFIG),
}

# Cloud TPU names -> libtpu topology names.
NAMED = {
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2",
    "v6e-1": "v6e:1x1", "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4",
}
NAMED.update({name.replace("v5e-", "v5litepod-"): value for name, value in NAMED.items()
              if name.startswith("v5e-")})


@dataclasses.dataclass(frozen=True)
class Topology:
  """A slice: its chip, the chips along each axis, and how many hosts drive them."""
  name: str  # as given
  chip: Chip
  shape: tuple[int, ...]  # chips per axis, e.g. (2, 2, 1)

  @property
  def num_chips(self) -> int:
    return math.prod(self.shape)

  @property
  def chips_per_host_bounds(self) -> tuple[int, int, int]:
    shape = tuple(self.shape) + (1,) * (3 - len(self.shape))
    return tuple(min(n, bound) for n, bound in zip(shape, self.chip.chips_per_host))

  @property
  def num_hosts(self) -> int:
    return self.num_chips // math.prod(self.chips_per_host_bounds)

  @property
  def libtpu_name(self) -> str:
    return f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"

  def devices(self) -> list[jax.Device]:
    """The topology's devices from a compile-only client (one per chip)."""
    if self.chip.platform == "gpu":
      return self._gpu_devices()
    # libtpu probes the host for a TPU unless told what it is; the compile-only client needs
    # none, and the probe's warnings would bury the report.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{self.chip.generation}-8")
    # libtpu lets one process at a time hold it (a lockfile) to guard a chip; a compile-only
    # client holds no chip, so several may compile at once (parallel tests, a plan beside aot).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    options = {"chip_config_name": "megacore"} if self.chip.megacore else {}
    try:
      description = topologies.get_topology_desc(
          platform="tpu", topology_name=self.libtpu_name,
          chips_per_host_bounds=self.chips_per_host_bounds, num_slices=1,
          wrap=(False, False, False), **options)
    except Exception as error:  # pylint: disable=broad-except  (libtpu's errors vary by release)
      raise ValueError(f"cannot describe TPU topology {self.name} ({self.libtpu_name}): "
                       f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; "
                       "the TPU compiler comes with `pip install \"jax[tpu]\"` (Python 3.12+)"
                       ) from None
    devices = list(description.devices)
    if len(devices) != self.num_chips:
      raise ValueError(f"libtpu describes {self.libtpu_name} with {len(devices)} devices, "
                       f"expected {self.num_chips} (one per chip)")
    return devices


  def _gpu_devices(self) -> list[jax.Device]:
    # No driver is used: its version check would refuse to load the plugin without one. JAX
    # loads the plugin when its backends first start, so this holds where the topology is asked
    # for first (the command does so before anything else touches JAX's devices).
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    try:
      description = topologies.get_topology_desc(
          platform="cuda", target_config=self.chip.gpu_target_config,
          topology=f"1x1x{self.num_chips}")
    except Exception as error:  # pylint: disable=broad-except  (the plugin's errors vary)
      raise ValueError(f"cannot describe GPU topology {self.name}: "
                       f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; "
                       "XLA:GPU comes with `pip install \"jax[cuda13]\"`") from None
    return list(description.devices)


def topology(name: str) -> Topology:
  """The `Topology` of a Cloud TPU name (`v4-8`) or a libtpu name (`v4:2x2x1`); ValueError
  naming the known ones otherwise."""
  spec = NAMED.get(name, name)
  gpu = re.fullmatch(r"(h200)(?::(\d+))?", spec)
  if gpu:
    return Topology(name, CHIPS[gpu.group(1)], (int(gpu.group(2) or 1),))
  match = re.fullmatch(r"(v\d+[a-z]?):(\d+(?:x\d+){1,2})", spec)
  if not match or match.group(1) not in CHIPS:
    raise ValueError(f"unknown topology {name!r}: give a Cloud TPU name ({', '.join(NAMED)}) "
                     f"or <generation>:<chips per axis> with a generation of "
                     f"{', '.join(CHIPS)} (e.g. v4:1x1x1)")
  chip = CHIPS[match.group(1)]
  shape = tuple(int(n) for n in match.group(2).split("x"))
  if len(shape) != (3 if chip.megacore else 2) or min(shape) < 1:
    raise ValueError(f"a {chip.generation} topology has {3 if chip.megacore else 2} axes of at "
                     f"least one chip, got {spec!r}")
  return Topology(name, chip, shape)
