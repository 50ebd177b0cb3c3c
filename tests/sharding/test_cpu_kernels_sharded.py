"""In a process with several devices (here 8 simulated CPU devices) the CPU kernel never
applies: GSPMD could not split its custom call and would gather model-split weights onto every
device, and a traced value does not say how jit's in_shardings split it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from spec_decode import decode_layout, partitioning
from spec_decode.t5 import cpu_kernels, network


def test_dense_products_use_xla_dots_with_several_devices():
  if jax.default_backend() != "cpu" or not cpu_kernels.available():
    pytest.skip("no CPU kernel here")
  assert jax.device_count() > 1
  x, w = jnp.ones((4, 64)), jnp.ones((64, 128))
  assert not cpu_kernels.kernel_applies(x, w)
  partitioner = partitioning.PjitPartitioner(num_partitions=4)
  split = NamedSharding(partitioner.mesh, PartitionSpec(None, "model"))
  partitioned = partitioner.partition(lambda x, w: cpu_kernels.dense_product(x, w),
                                      (partitioner.replicated, split), partitioner.replicated)
  lowered = partitioned.lower(x, w).as_text()
  assert "custom_call" not in lowered and "dot_general" in lowered
  np.testing.assert_array_equal(partitioned(x, jax.device_put(w, split)), np.full((4, 128), 64))
  assert "custom_call" not in jax.jit(cpu_kernels.dense_product).lower(x, w).as_text()


def test_decode_calls_through_the_layout_use_xla_dots_with_several_devices():
  """infer's and the benchmark's decode calls (the decode layout's model calls, the CPU ops
  chosen) on a 2 x 2 mesh: the kernel stays out, the products are XLA's dots."""
  if jax.default_backend() != "cpu" or not cpu_kernels.available():
    pytest.skip("no CPU kernel here")
  import test_cpu_kernels  # pylint: disable=g-import-not-at-top  (tests/ is on the path)
  layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=(2, 2)),
                                       test_cpu_kernels.TINY)
  lowered = test_cpu_kernels.lowered_decode_call(
      layout, network.Transformer(test_cpu_kernels.TINY), num_tokens=3)
  assert cpu_kernels.TARGET_NAME not in lowered and "dot_general" in lowered
