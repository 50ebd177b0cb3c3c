"""The CPU small-row matmul kernel (spec_decode.t5.cpu_kernels): values, bit-identical rows,
gating, gradients, vmap, the fallback to XLA's dot when it cannot be built, and the decode calls
that use it (infer's and the benchmark's, through the decode layout; models' default calls)
while a plain network does not."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import core

from spec_decode.runtime import decode_layout

from spec_decode.runtime import partitioning

from spec_decode.runtime import platforms
from spec_decode.engine import decoding
from spec_decode.t5 import cpu_kernels, network

pytestmark = [pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU kernel"),
              pytest.mark.newest]  # at the newest supported JAX too (pytest.ini: the tiers)


def require_kernel() -> None:
  """Builds the kernel, or skips where the host lacks what it needs (a C++ compiler, an x86-64
  CPU with AVX2 and FMA); a kernel that fails to build or load where it has them fails."""
  try:
    cpu_kernels.require()
  except cpu_kernels.Unsupported as error:
    pytest.skip(f"the CPU kernel cannot be built here: {error}")


@pytest.fixture(scope="module")
def kernel():
  require_kernel()
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


@pytest.mark.parametrize("k,n", [(128, 1000), (37, 263), (8, 1), (300, 5)])
def test_transposed_kernel_equals_numpy_and_rows_are_independent_of_the_row_count(kernel, k, n):
  """`embedding_product` (x @ w[n, K].T, a tied embedding's output projection): values, and
  each row of an m-row call bit-identical to the row computed alone, K multiple of 8 or not."""
  del kernel
  transposed = jax.jit(cpu_kernels.small_rows_matmul_transposed)
  rng = np.random.default_rng(k + n)
  x = rng.standard_normal((16, k), dtype=np.float32)
  w = rng.standard_normal((n, k), dtype=np.float32)
  alone = [np.asarray(transposed(x[r:r + 1], w)) for r in range(16)]
  for m in range(1, 17):
    got = np.asarray(transposed(x[:m], w))
    np.testing.assert_allclose(got, x[:m].astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5 * k)
    np.testing.assert_array_equal(got, np.concatenate(alone[:m]))
  x3 = jnp.asarray(x[:6].reshape(2, 3, k))
  assert "custom_call" in jax.jit(cpu_kernels.embedding_product).lower(x3, w).as_text()
  np.testing.assert_allclose(jax.jit(cpu_kernels.embedding_product)(x3, w),
                             np.asarray(x3) @ w.T, rtol=1e-5, atol=1e-5 * k)
  assert "custom_call" not in jax.jit(cpu_kernels.embedding_product).lower(x[:1], w).as_text()


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
  transposed = cpu_kernels.small_rows_matmul_transposed
  got = jax.grad(lambda x, w: loss(transposed, x, w.T), argnums=(0, 1))(x, w)
  for g, v in zip(got, want):
    np.testing.assert_allclose(g, v, rtol=1e-5, atol=1e-5)


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
    with pytest.raises(cpu_kernels.Unsupported, match="no C.. compiler"):
      cpu_kernels.require()
  monkeypatch.setattr(cpu_kernels, "_loaded", None)


def test_a_kernel_that_does_not_compile_is_an_error_not_a_missing_compiler(monkeypatch, tmp_path):
  """On a host that can build the kernel, a source that fails to compile is the kernel's
  error, which `require()` raises (its tests fail), not `Unsupported` (they would skip)."""
  require_kernel()
  broken = tmp_path / "small_rows_matmul.cc"
  broken.write_text("this is not C++;\n")
  monkeypatch.setattr(cpu_kernels, "SOURCE", str(broken))
  monkeypatch.setattr(cpu_kernels, "_loaded", None)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  with pytest.warns(RuntimeWarning, match="unavailable"):
    with pytest.raises(RuntimeError, match="failed") as raised:
      cpu_kernels.require()
  assert not isinstance(raised.value, cpu_kernels.Unsupported)


def test_switched_off_by_the_environment(monkeypatch):
  monkeypatch.setenv(cpu_kernels.DISABLE_VARIABLE, "0")
  assert not cpu_kernels.kernel_applies(jnp.ones((2, 8)), jnp.ones((8, 5)))


def test_builds_into_the_cache_once(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  try:
    library = cpu_kernels._build()  # pylint: disable=protected-access
  except cpu_kernels.Unsupported as error:
    pytest.skip(f"the CPU kernel cannot be built here: {error}")
  assert library.startswith(str(tmp_path)) and library.endswith(".so")
  built = (tmp_path / "spec_decode" / "cpu_kernels")
  assert [p.name for p in built.iterdir()] == [library.rsplit("/", 1)[1]]
  mtime = built.joinpath(library.rsplit("/", 1)[1]).stat().st_mtime_ns
  assert cpu_kernels._build() == library  # pylint: disable=protected-access
  assert built.joinpath(library.rsplit("/", 1)[1]).stat().st_mtime_ns == mtime


TINY = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                        num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)


def lowered_decode_call(model_calls: core.ModelCalls, module: network.Transformer,
                        num_tokens: int) -> str:
  """StableHLO of one cached decode call of `num_tokens` tokens for 2 rows, its cache and
  step function from `model_calls` (a `core.ModelCalls`)."""
  tokens = jnp.ones((2, 5), jnp.int32)
  params = module.init(jax.random.PRNGKey(0), tokens, tokens, tokens)["params"]

  def call(params, encoder_tokens):
    cache = model_calls.init_cache("target", module, params, encoder_tokens, 8)
    tokens_to_logits = model_calls.tokens_to_logits("target", module, params)
    state = decoding.DecodingState(
        cur_index=jnp.zeros((2,), jnp.int32), cur_token=jnp.full((2, num_tokens), 3),
        sequences=jnp.zeros((2, 8), jnp.int32), cache=cache)
    return tokens_to_logits(state)[0]

  return jax.jit(call).lower(params, tokens).as_text()


class PlainNetworkCalls(core.NetworkCalls):
  """`core.NetworkCalls` without the backend's ops: the network as it is."""

  def init_cache(self, role, module, params, encoder_input_tokens, max_decode_len):
    del role
    return network.init_decode_cache(module, params, encoder_input_tokens, max_decode_len)

  def tokens_to_logits(self, role, module, params):
    del role
    return network.make_tokens_to_logits(module, params)


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_decode_calls_on_cpu_use_the_kernel_and_a_plain_network_does_not(kernel, num_tokens):
  """Every runner decodes through the core's model calls (infer and the benchmark through the
  decode layout, the models and the T5X hook through `core.NetworkCalls`), which run every model
  with their platform's products (one CPU device: `cpu_ops` with the kernel): 2 rows x k tokens
  (2..16 rows) go through the kernel; the network alone (`network.Ops()`, plain XLA) never
  calls it."""
  del kernel
  module = network.Transformer(TINY)
  assert module.ops == network.Ops()
  assert platforms.Platform.default().module(module).ops == cpu_kernels.cpu_ops()
  layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=(1, 1)), TINY)
  for model_calls in (layout, core.NETWORK_CALLS):
    assert cpu_kernels.TARGET_NAME in lowered_decode_call(model_calls, module, num_tokens)
  assert cpu_kernels.TARGET_NAME not in lowered_decode_call(PlainNetworkCalls(), module,
                                                            num_tokens)
  # A tied embedding as the output projection (T5 1.0): the transposed kernel, k >= 2 rows.
  tied = network.Transformer(dataclasses.replace(TINY, logits_via_embedding=True))
  assert (cpu_kernels.TRANSPOSED_TARGET_NAME
          in lowered_decode_call(core.NETWORK_CALLS, tied, num_tokens))
  assert cpu_kernels.TRANSPOSED_TARGET_NAME not in lowered_decode_call(PlainNetworkCalls(), tied,
                                                                       num_tokens)


def test_cpu_ops_follow_the_activation_dtype():
  """A bfloat16 network keeps T5X's attention einsums (whose rounding the loops would not
  reproduce) and the kernel where a product is float32 (its logits); without the kernel, XLA's
  products with the float32 attention loops."""
  assert cpu_kernels.cpu_ops().attention_logits is cpu_kernels.few_query_attention_logits
  assert cpu_kernels.cpu_ops().embedding_product is cpu_kernels.embedding_product
  no_kernel = cpu_kernels.cpu_ops(small_rows_kernel=False)
  assert no_kernel.dense_product is network.Ops().dense_product
  assert no_kernel.embedding_product is network.Ops().embedding_product
  assert no_kernel.attention_logits is cpu_kernels.few_query_attention_logits
  bfloat16 = cpu_kernels.cpu_ops("bfloat16")
  assert bfloat16.dense_product is cpu_kernels.dense_product
  assert bfloat16.embedding_product is cpu_kernels.embedding_product
  assert bfloat16.attention_logits is network.einsum_attention_logits
  assert bfloat16.attention_mix is network.einsum_attention_mix


@pytest.mark.parametrize("num_queries", [1, 2, cpu_kernels.FEW_QUERIES, cpu_kernels.FEW_QUERIES + 1])
def test_few_query_attention_loops_compute_the_einsums(num_queries):
  rng = np.random.default_rng(num_queries)
  query = jnp.asarray(rng.standard_normal((2, num_queries, 3, 4)), jnp.float32)
  key = jnp.asarray(rng.standard_normal((2, 7, 3, 4)), jnp.float32)
  weights = jax.nn.softmax(network.einsum_attention_logits(query, key))
  np.testing.assert_allclose(cpu_kernels.few_query_attention_logits(query, key),
                             network.einsum_attention_logits(query, key), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(cpu_kernels.few_query_attention_mix(weights, key),
                             network.einsum_attention_mix(weights, key), rtol=1e-5, atol=1e-6)
  # Up to FEW_QUERIES queries the loops (no dot reads the cache), past them the einsums.
  jaxpr = str(jax.make_jaxpr(cpu_kernels.few_query_attention_logits)(query, key))
  jaxpr += str(jax.make_jaxpr(cpu_kernels.few_query_attention_mix)(weights, key))
  assert ("dot_general" in jaxpr) == (num_queries > cpu_kernels.FEW_QUERIES)
