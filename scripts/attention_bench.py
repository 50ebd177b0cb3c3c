"""Timing of few-query attention on XLA:CPU: the einsums (`network.einsum_attention_*`) against
the multiply-reduce loops (`cpu_kernels.few_query_attention_*`, forced for every query count),
under the CPU platform's compiler options (`platforms.Platform`).

Each case is a jitted loop of decode calls over a stack of layers, each writing its queries'
keys and values into a [1, L, H, 64] cache held in the loop state (the cache's own layout, as
in a decode) and attending to it; the time per layer and call is the best of 7 runs.

  PYTHONPATH=. python scripts/attention_bench.py

What it decided (`cpu_kernels.FEW_QUERIES` = 3) is in docs/PERFORMANCE.md.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.runtime import platforms
from spec_decode.t5 import cpu_kernels
from spec_decode.t5 import network

HEAD_DIM = 64
CASES = [(4, 64), (12, 128), (12, 512), (16, 512)]  # (heads, cache length): demo, base, large
QUERIES = [1, 2, 3, 4, 8]
LAYERS, CALLS = 6, 20


def loops_logits(query, key):
  return jnp.moveaxis(jnp.sum(query[:, :, None] * key[:, None], axis=-1), 3, 1)


def loops_mix(weights, value):
  return jnp.sum(jnp.moveaxis(weights, 1, 3)[..., None] * value[:, None], axis=2)


def time_per_layer(heads: int, length: int, queries: int, loops: bool) -> float:
  logits_fn, mix_fn = ((loops_logits, loops_mix) if loops else
                       (network.einsum_attention_logits, network.einsum_attention_mix))
  rng = np.random.default_rng(0)
  caches = [jnp.asarray(rng.standard_normal((1, length, heads, HEAD_DIM)), jnp.float32)
            for _ in range(2 * LAYERS)]
  fed = jnp.asarray(rng.standard_normal((1, queries, heads, HEAD_DIM)), jnp.float32)

  def run(caches, fed):
    def call(i, caches):
      x, new = fed, []
      for layer in range(LAYERS):
        where = (0, i % (length - queries), 0, 0)
        key = jax.lax.dynamic_update_slice(caches[2 * layer], x, where)
        value = jax.lax.dynamic_update_slice(caches[2 * layer + 1], x, where)
        x = mix_fn(jax.nn.softmax(logits_fn(x, key)), value)
        new += [key, value]
      return new
    return jax.lax.fori_loop(0, CALLS, call, caches)

  run = jax.jit(run, compiler_options=platforms.Platform.default().compiler_options())
  jax.block_until_ready(run(caches, fed))
  best = float("inf")
  for _ in range(7):
    start = time.perf_counter()
    jax.block_until_ready(run(caches, fed))
    best = min(best, time.perf_counter() - start)
  return best / CALLS / LAYERS * 1e6


def main() -> None:
  print(f"us per layer and call, einsum -> loops (FEW_QUERIES = {cpu_kernels.FEW_QUERIES})")
  for heads, length in CASES:
    cells = [f"q={q}: {time_per_layer(heads, length, q, False):6.1f} -> "
             f"{time_per_layer(heads, length, q, True):6.1f}" for q in QUERIES]
    print(f"H={heads:2d} L={length:3d}  " + " | ".join(cells))


if __name__ == "__main__":
  main()
