"""The engine's own kernels per iteration of the speculative loop (`bench.kernels`), pinned at
the demo pair's size so that they cannot grow unnoticed; the counter itself on small modules."""

import jax
import jax.numpy as jnp
import pytest

from spec_decode import bench
from spec_decode.bench import kernels

# Kernels one iteration (gamma 2: the catch-up and one draft-loop call) executes outside the
# model calls, compiled as infer and the benchmark compile it, per JAX release (each XLA fuses
# and names kernels its own way). Before the greedy token comparison, the per-decode uniforms,
# the two-level draw and few-query attention: 591 greedy, 1178 at temperature 1 (jax 0.10, CPU).
PINNED_ENGINE_KERNELS = {(0, 10): {0.0: 80, 1.0: 200}, (0, 12): {0.0: 105, 1.0: 225}}
MARGIN = 1.1  # a patch release may fuse a little differently
JAX_RELEASE = tuple(int(part) for part in jax.__version__.split(".")[:2])


@pytest.fixture(scope="module")
def demo_decoders():
  if not bench.demo_files_exist():
    pytest.skip("the shipped demo pair's weights are not in this checkout")
  if jax.default_backend() != "cpu":
    pytest.skip("pinned for XLA:CPU's compilation")
  if JAX_RELEASE not in PINNED_ENGINE_KERNELS:
    pytest.skip(f"kernel counts are pinned for jax {sorted(PINNED_ENGINE_KERNELS)}, not "
                f"{jax.__version__}")
  pair = bench.shipped_pair(["A man is riding a bicycle."], "translate English to German: ",
                            64, 64, "demo")
  from spec_decode.runtime import platforms
  return bench.PairDecoders(pair, platforms.Platform.default().compiler_options())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_kernels_per_iteration_are_pinned(demo_decoders, temperature):
  variant = bench.Variant(temperature, 2)
  loop = kernels.loop_kernels(demo_decoders.lower_loop(variant, 0, 1).compile().as_text())
  count = loop.kernels(draft_loop_iterations=1)
  assert count.engine <= PINNED_ENGINE_KERNELS[JAX_RELEASE][temperature] * MARGIN, count
  # The counter sees both model calls of the body and the draft's loop.
  assert count.model > 100 and loop.calls_model
  assert any(nested.calls_model for nested in loop.nested)


def test_the_counter_separates_loops_and_trip_counts():
  """A loop of two model-free body kernels around a fixed 5-trip loop: the known trip count
  multiplies the inner loop; a loop with a data-dependent end counts per given iteration."""

  def fixed(x):
    return jax.lax.fori_loop(0, 5, lambda i, y: jnp.sin(y) * 2 + i, x)

  def outer(x):
    return jax.lax.while_loop(lambda y: y[0] < 100, lambda y: fixed(jnp.cos(y)) + 1, x)

  text = jax.jit(outer).lower(jnp.zeros(3)).compile().as_text()
  loop = kernels.loop_kernels(text)
  assert not loop.calls_model
  (inner,) = loop.nested
  assert inner.trip_count == 5
  assert loop.kernels(0).engine == loop.per_iteration.engine + 5 * inner.per_iteration.engine
  with pytest.raises(ValueError, match="no while loop"):
    kernels.loop_kernels(jax.jit(jnp.sin).lower(jnp.zeros(3)).compile().as_text())


# A loop body as XLA:CPU prints it: a model fusion (its op_name in the network), a dot and a
# reduction XLA rewrote (no source location left) fed by it, an engine fusion, and a copy of the
# loop state.
BODY = """HloModule m

%body (p: (f32[4], f32[4])) -> (f32[4], f32[4]) {
  %p = (f32[4], f32[4]) parameter(0)
  %state = f32[4]{0} get-tuple-element(%p), index=0
  %weights = f32[4]{0} get-tuple-element(%p), index=1
  %layer = f32[4]{0} fusion(%state), kind=kLoop, calls=%f, metadata={op_name="jit(run)/while/body/Transformer.decode_chunk/decoder/mul"}
  %view = f32[4]{0} bitcast(%layer)
  %dot.1 = f32[4]{0} dot(%view, %weights), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %wrapped_reduce-window = f32[1]{0} fusion(%dot.1), kind=kLoop, calls=%g
  %pick = f32[4]{0} fusion(%wrapped_reduce-window, %state), kind=kLoop, calls=%h, metadata={op_name="jit(run)/while/body/argmax"}
  %copy.1 = f32[4]{0} copy(%weights)
  ROOT %t = (f32[4], f32[4]) tuple(%pick, %copy.1)
}

%cond (q: (f32[4], f32[4])) -> pred[] {
  %q = (f32[4], f32[4]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: (f32[4], f32[4])) -> (f32[4], f32[4]) {
  %x = (f32[4], f32[4]) parameter(0)
  ROOT %w = (f32[4], f32[4]) while(%x), condition=%cond, body=%body
}
"""


def test_kernels_that_xla_left_unnamed_belong_to_what_feeds_them():
  loop = kernels.loop_kernels(BODY)
  # The model: the layer, the dot and the split reduction it feeds; the engine: the argmax
  # fusion, the copy of loop state and the while's own dispatch.
  assert loop.per_iteration == kernels.Count(engine=3, model=3)
