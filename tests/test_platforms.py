"""The platform of a program (`platforms.Platform`) comes from the devices it is compiled for,
never from the host's backend: CPU devices get the CPU's products (the small-row kernel on one
device only), TPU devices XLA's products with the decoder's projections taking the kernels as
stored, GPU devices plain XLA, whatever `jax.default_backend()` says."""

import dataclasses
import pathlib
import re

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from packaging import specifiers

from spec_decode.runtime import platforms
from spec_decode.t5 import cpu_kernels, network

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest
# The JAX versions setup.py admits (jax and jaxlib are released together).
SUPPORTED_JAX = specifiers.SpecifierSet(re.search(
    r'"jax(>=[^"]+)"', (pathlib.Path(__file__).resolve().parents[1] / "setup.py").read_text())[1])


@dataclasses.dataclass(frozen=True)
class Device:
  """What `Platform.of_devices` reads of a device: its platform's name."""
  platform: str


def test_the_devices_decide_not_the_host():
  """Whatever the host's backend (this suite's CPU, a GPU or a TPU host), each kind of device
  gets its own products: at least two of the three kinds below are not the host's."""
  tpu = platforms.Platform.of_devices([Device("tpu")] * 4)
  assert tpu == platforms.Platform("tpu", 4)
  assert tpu.ops() == tpu.ops("bfloat16") == platforms.TPU_OPS
  # XLA's products, the decoder's attention projections taking the kernels as stored
  # (tests/test_aot.py compiles both for a v4 chip).
  assert platforms.TPU_OPS == network.Ops(decoder_projection=network.kernel_first_dot)
  assert tpu.compiler_options() == {}
  for name in ("cuda", "rocm"):
    gpu = platforms.Platform.of_devices([Device(name)])
    assert gpu == platforms.Platform("gpu", 1) and gpu.ops() == network.Ops()
    assert gpu.compiler_options() == {}
  cpu = platforms.Platform.of_devices([Device("cpu")])
  assert cpu.ops() == cpu_kernels.cpu_ops()
  assert cpu.ops().dense_product is cpu_kernels.dense_product
  assert cpu.ops("bfloat16") == cpu_kernels.cpu_ops("bfloat16")
  several = platforms.Platform.of_devices([Device("cpu")] * 2)
  assert several.ops() == cpu_kernels.cpu_ops(small_rows_kernel=False)


def test_the_module_computes_with_the_platforms_products():
  config = network.T5Config(vocab_size=8, emb_dim=4, num_heads=1, num_encoder_layers=1,
                            num_decoder_layers=1, head_dim=4, mlp_dim=8)
  tpu = platforms.Platform("tpu", 2)
  assert tpu.module(config).ops == platforms.TPU_OPS
  cpu = platforms.Platform("cpu")
  assert cpu.module(network.Transformer(config)).ops == cpu_kernels.cpu_ops()


def test_compiler_options_are_the_cpus_own_and_merge_under_explicit_ones():
  cpu = platforms.Platform("cpu")
  own = cpu.compiler_options()
  # Every jaxlib setup.py admits (both ends are tested) must keep every option: one dropped
  # there would silently give up the speed docs/PERFORMANCE.md measured it to bring. Only
  # another jaxlib may drop what its compiler does not accept (see the module docstring).
  if jaxlib.__version__ in SUPPORTED_JAX:
    assert own == dict(platforms.CPU_DECODE_OPTIONS)
  else:
    assert set(own) <= set(platforms.CPU_DECODE_OPTIONS)
  assert cpu.merged({"xla_cpu_enable_fast_math": False}) == {
      **own, "xla_cpu_enable_fast_math": False}
  assert cpu.merged({"a": 1}, xla_defaults=True) == {"a": 1}
  assert platforms.Platform("tpu").merged({"a": 1}) == {"a": 1}


def test_bad_platforms_are_one_line_errors():
  with pytest.raises(ValueError, match="one platform"):
    platforms.Platform.of_devices([Device("cpu"), Device("tpu")])
  with pytest.raises(ValueError, match="one platform"):
    platforms.Platform.of_devices([])
  with pytest.raises(ValueError, match="platform must be one of"):
    platforms.Platform("ipu")


def test_the_tpus_decoder_projection_is_the_dense_product():
  """`kernel_first_dot` (the TPU's decoder projections) computes `jnp.dot`'s product, for the
  decode's [B, k, E] rows and a single row alike."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 16))
  kernel = jax.random.normal(jax.random.PRNGKey(1), (16, 12))
  for rows in (x, x[:, :1], x[0, 0]):
    np.testing.assert_allclose(network.kernel_first_dot(rows, kernel), jnp.dot(rows, kernel),
                               rtol=1e-5, atol=1e-5)
