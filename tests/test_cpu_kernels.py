"""The CPU small-row matmul kernel (spec_decode.t5.cpu_kernels): values, bit-identical rows,
gating, gradients, vmap, and the fallback to XLA's dot when it cannot be built."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.t5 import cpu_kernels

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU kernel")


@pytest.fixture(scope="module")
def kernel():
  if not cpu_kernels.available():
    pytest.skip("the kernel could not be built here (no g++ or no AVX2/FMA)")
  return jax.jit(cpu_kernels.small_rows_matmul)


@pytest.mark.parametrize("k,n", [(64, 1024), (37, 1000), (300, 5), (129, 263), (8, 1)])
def test_equals_numpy_and_rows_are_independent_of_the_row_count(kernel, k, n):
  rng = np.random.default_rng(k * n)
  x = rng.standard_normal((16, k), dtype=np.float32)
  w = rng.standard_normal((k, n), dtype=np.float32)
  alone = [np.asarray(kernel(x[r:r + 1], w)) for r in range(16)]
  for m in range(1, 17):
    assert cpu_kernels.kernel_applies(jnp.asarray(x[:m]), jnp.asarray(w)) == (m > 1)
    got = np.asarray(kernel(x[:m], w))
    np.testing.assert_allclose(got, x[:m].astype(np.float64) @ w, rtol=1e-5, atol=1e-5 * k)
    np.testing.assert_array_equal(got, np.concatenate(alone[:m]))


def test_leading_axes_gating_and_xla_dots(kernel):
  x = jnp.ones((2, 3, 8))
  w = jnp.ones((8, 5))
  assert cpu_kernels.kernel_applies(x, w)
  np.testing.assert_array_equal(jax.jit(cpu_kernels.dense_product)(x, w), np.full((2, 3, 5), 8))
  assert not cpu_kernels.kernel_applies(jnp.ones((1, 8)), w)
  assert not cpu_kernels.kernel_applies(jnp.ones((17, 8)), w)
  assert not cpu_kernels.kernel_applies(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
  # Fresh functions: jit caches a trace per function, and the choice is made when tracing.
  with cpu_kernels.xla_dots():
    assert not cpu_kernels.kernel_applies(x, w)
    assert "custom_call" not in jax.jit(lambda x, w: cpu_kernels.dense_product(x, w)).lower(
        x, w).as_text()
  assert "custom_call" in jax.jit(lambda x, w: cpu_kernels.dense_product(x, w)).lower(
      x, w).as_text()


def test_gradients_and_vmap(kernel):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((3, 16), dtype=np.float32))
  w = jnp.asarray(rng.standard_normal((16, 24), dtype=np.float32))

  def loss(product, x, w):
    return jnp.sum(jnp.sin(product(x, w)))

  got = jax.grad(lambda x, w: loss(kernel, x, w), argnums=(0, 1))(x, w)
  want = jax.grad(lambda x, w: loss(jnp.dot, x, w), argnums=(0, 1))(x, w)
  for g, v in zip(got, want):
    np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)
  batched = jax.vmap(kernel, in_axes=(0, None))(jnp.stack([x, 2 * x]), w)
  np.testing.assert_allclose(batched, jnp.stack([x @ w, 2 * x @ w]), rtol=1e-5, atol=1e-5)


def test_falls_back_to_xla_with_one_warning_when_it_cannot_be_built(monkeypatch, tmp_path):
  monkeypatch.setattr(cpu_kernels, "_loaded", None)
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  x, w = jnp.ones((2, 8)), jnp.ones((8, 5))
  with pytest.warns(RuntimeWarning, match="unavailable"):
    assert not cpu_kernels.kernel_applies(x, w)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert not cpu_kernels.kernel_applies(x, w)
    np.testing.assert_array_equal(jax.jit(cpu_kernels.dense_product)(x, w), np.full((2, 5), 8.0))
  monkeypatch.setattr(cpu_kernels, "_loaded", None)


def test_switched_off_by_the_environment(monkeypatch):
  monkeypatch.setenv(cpu_kernels.DISABLE_VARIABLE, "0")
  assert not cpu_kernels.kernel_applies(jnp.ones((2, 8)), jnp.ones((8, 5)))


def test_builds_into_the_cache_once(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  try:
    library = cpu_kernels._build()  # pylint: disable=protected-access
  except RuntimeError as error:
    pytest.skip(f"no kernel build here: {error}")
  assert library.startswith(str(tmp_path)) and library.endswith(".so")
  built = (tmp_path / "spec_decode" / "cpu_kernels")
  assert [p.name for p in built.iterdir()] == [library.rsplit("/", 1)[1]]
  mtime = built.joinpath(library.rsplit("/", 1)[1]).stat().st_mtime_ns
  assert cpu_kernels._build() == library  # pylint: disable=protected-access
  assert built.joinpath(library.rsplit("/", 1)[1]).stat().st_mtime_ns == mtime
