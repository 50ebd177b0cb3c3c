"""On a multi-device mesh, partitioned functions keep XLA's dot (no CPU kernel custom call, which
GSPMD could not split); unpartitioned ones in the same process still use the kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from spec_decode import partitioning
from spec_decode.t5 import cpu_kernels


def test_partitioned_dense_products_use_xla_dots():
  if jax.default_backend() != "cpu" or not cpu_kernels.available():
    pytest.skip("no CPU kernel here")
  partitioner = partitioning.PjitPartitioner(num_partitions=4)
  x, w = jnp.ones((4, 64)), jnp.ones((64, 128))
  split = NamedSharding(partitioner.mesh, PartitionSpec(None, "model"))
  partitioned = partitioner.partition(lambda x, w: cpu_kernels.dense_product(x, w),
                                      (partitioner.replicated, split), partitioner.replicated)
  assert "custom_call" not in partitioned.lower(x, w).as_text()
  np.testing.assert_array_equal(partitioned(x, jax.device_put(w, split)), np.full((4, 128), 64))
  # A committed sharded argument under a plain jit: the abstract value names the mesh.
  plain = jax.jit(lambda x, w: cpu_kernels.dense_product(x, w))
  assert "custom_call" not in plain.lower(x, jax.device_put(w, split)).as_text()
  assert "custom_call" in jax.jit(lambda x, w: cpu_kernels.dense_product(x, w)).lower(
      x, w).as_text()
