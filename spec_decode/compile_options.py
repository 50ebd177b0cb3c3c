"""XLA compile options for decoding, chosen per backend: `decode_compiler_options()`.

On XLA:CPU (jaxlib 0.10) a dot of k = 2..8 activation rows against a weight matrix (the
target's (gamma+1)-token verification call, the draft's 2-token catch-up) is handed to
YNNPACK by default (a `__ynn_fusion` custom fusion), while a 1-row dot (a baseline step) goes
to XLA's own matrix-vector path. Profiled at T5.1.1-base/-large, float32, batch 1 (see the
README's Performance section): the YNNPACK dots are over 90% of a k = 8 call and run at about
half the speed of XLA's Eigen dot on the same [k, E] x [E, F] shapes, so on CPU the decoders
compile with YNNPACK's dot fusion off (`xla_cpu_experimental_ynn_fusion_type` empty). Results
agree with the default to float rounding (a different summation order); the parameters,
their layout and the cache are untouched.

Other backends get no options (their compilers reject these names). An option this jaxlib does
not know is dropped (checked once by compiling a trivial function), so an older or newer jaxlib
decodes with its defaults rather than failing. Explicit options (e.g. the benchmark's
`BenchConfig.compiler_options`) are merged on top by `merged(...)`.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp

# Measured to pay on XLA:CPU; see the module docstring.
CPU_DECODE_OPTIONS: Mapping[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.lru_cache(maxsize=None)
def _supported(backend: str, items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
  """The options among `items` that this jaxlib's compiler for `backend` accepts."""
  kept = []
  for name, value in items:
    try:
      probe = jax.device_put(jnp.zeros((2,), jnp.float32), jax.devices(backend)[0])
      jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(probe).compile()
    except Exception:  # pylint: disable=broad-except  (unknown option or value: drop it)
      continue
    kept.append((name, value))
  return tuple(kept)


def decode_compiler_options(backend: str | None = None) -> dict[str, Any]:
  """XLA options for compiling a decoder on `backend` (default: JAX's default backend)."""
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return {}
  return dict(_supported(backend, tuple(sorted(CPU_DECODE_OPTIONS.items()))))


def merged(compiler_options: Mapping[str, Any] | None = None,
           xla_defaults: bool = False) -> dict[str, Any]:
  """`decode_compiler_options()` with `compiler_options` on top; with `xla_defaults`, only
  `compiler_options` (what XLA alone would do: the reference the benchmark compares with)."""
  base = {} if xla_defaults else decode_compiler_options()
  return {**base, **dict(compiler_options or {})}
