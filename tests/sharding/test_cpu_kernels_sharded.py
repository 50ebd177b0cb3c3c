"""A program of several devices (here 8 simulated CPU devices) never gets the CPU kernel: GSPMD
could not split its custom call and would gather model-split weights onto every device, and a
traced value does not say how jit's in_shardings split it. Its platform decides
(`platforms.Platform`), from the devices the program is compiled for."""

import jax
import pytest

from spec_decode.runtime import decode_layout, partitioning, platforms
from spec_decode.t5 import cpu_kernels, network

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest


def test_several_cpu_devices_get_xla_products():
  assert jax.device_count() > 1
  partitioner = partitioning.PjitPartitioner(mesh_shape=(1, 4))
  platform = platforms.Platform.of_mesh(partitioner.mesh)
  assert platform == platforms.Platform("cpu", 4)
  assert platform.ops() == cpu_kernels.cpu_ops(small_rows_kernel=False)
  assert platform.ops().dense_product is network.Ops().dense_product
  # JAX's default devices are all 8: a plain jit there may be handed any of their layouts.
  assert platforms.Platform.default().ops() == cpu_kernels.cpu_ops(small_rows_kernel=False)
  # One device of them, as a 1 x 1 mesh: the kernel.
  one = partitioning.PjitPartitioner(mesh_shape=(1, 1))
  assert platforms.Platform.of_mesh(one.mesh).ops() == cpu_kernels.cpu_ops()


def test_decode_calls_through_the_layout_use_xla_dots_with_several_devices():
  """infer's and the benchmark's decode calls (the decode layout's model calls, the mesh
  platform's products) on a 2 x 2 mesh: the kernel stays out, the products are XLA's dots."""
  import test_cpu_kernels  # pylint: disable=g-import-not-at-top  (tests/ is on the path)
  test_cpu_kernels.require_kernel()
  layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=(2, 2)),
                                       test_cpu_kernels.TINY)
  lowered = test_cpu_kernels.lowered_decode_call(
      layout, network.Transformer(test_cpu_kernels.TINY), num_tokens=3)
  assert cpu_kernels.TARGET_NAME not in lowered and "dot_general" in lowered
