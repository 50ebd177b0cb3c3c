"""The platform of a program (`platforms.Platform`) comes from the devices it is compiled for,
never from the host's backend: CPU devices get the CPU's products (the small-row kernel on one
device only), TPU devices XLA's products with the decoder's projections taking the kernels as
stored, GPU devices plain XLA, whatever `jax.default_backend()` says; and the TPU's products
decode the same tokens as the CPU's."""

import dataclasses
import pathlib
import re

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from packaging import specifiers

import tiny_t5
from spec_decode import core
from spec_decode.checkpoints import t5x_format
from spec_decode.runtime import decode_layout, partitioning, platforms
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


# Sampled at 0.1: a random tiny model's logits span so little that at temperature 1 even its
# decoder projections scaled by 3 leave every sampled token as it was; at 0.1 a 5% change moves
# a tenth of them.
@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_the_tpus_products_decode_what_the_cpus_do(monkeypatch, temperature):
  """`spec_decode.infer`'s compiled decode (`DecodeLayout.partition_predict`) of a tiny float32
  pair, run on this CPU with the TPU's products (`TPU_OPS`) in place of the CPU's (the
  small-row kernel, the few-query attention loops): the same tokens, greedy and sampled with a
  fixed rng. What a TPU program computes is the decode the CPU tests check token for token.
  (The T5X hook's decode takes its products from the same `Platform.ops`.)"""
  target, draft = (tiny_t5.tiny_config(512, shrink)
                   for shrink in (tiny_t5.SHRINK, tiny_t5.DRAFT_SHRINK))
  decoder = core.Decoder.create("speculative_sample", network.Transformer(target),
                                network.Transformer(draft), gamma=3, temperature=temperature)
  inputs = np.random.default_rng(0).integers(3, 512, (4, 10)).astype(np.int32)
  inputs[:, 7:] = [1, 0, 0]  # EOS, then padding
  batch = {"encoder_input_tokens": inputs, "decoder_input_tokens": np.zeros((4, 12), np.int32)}

  def decode(ops: network.Ops) -> np.ndarray:
    layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=(1, 1)),
                                         target, draft)
    assert layout.platform.module(target).ops == ops
    decodes, _ = layout.partition_predict(decoder, eos_id=1)(
        layout.put_params("target", t5x_format.random_params(target, 1)),
        layout.put_params("draft", t5x_format.random_params(draft, 2)),
        layout.put_batch(batch), layout.put_replicated(jax.random.PRNGKey(7)))
    return np.asarray(decodes)

  cpu = decode(platforms.Platform("cpu").ops())
  monkeypatch.setattr(platforms.Platform, "ops",
                      lambda self, dtype=jnp.float32: platforms.TPU_OPS)
  np.testing.assert_array_equal(decode(platforms.TPU_OPS), cpu)
  assert len(np.unique(cpu)) > 3  # tokens decoded, not padding alone
