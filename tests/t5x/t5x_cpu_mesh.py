"""`CpuMeshPartitioner`: T5X's PjitPartitioner whose mesh, on simulated CPU devices, is
(data, model) = (devices / num_partitions, num_partitions) as T5X lays out TPUs; T5X's own CPU
mesh puts every device on 'model' whatever num_partitions says. Bound by the sharded runs' gin."""

import jax
import numpy as np
from jax.sharding import Mesh
from t5x import partitioning


class CpuMeshPartitioner(partitioning.PjitPartitioner):

  @property
  def mesh(self) -> Mesh:
    devices = np.asarray(jax.devices()).reshape(-1, self._num_partitions)
    return Mesh(devices, ["data", "model"])
