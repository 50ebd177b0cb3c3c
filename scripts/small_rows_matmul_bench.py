"""Go/no-go timing of the small-row matmul kernel (spec_decode/t5/small_rows_matmul.cc) against
XLA:CPU's dot, both under the CPU platform's compiler options (`platforms.Platform`).

For each T5.1.1-large weight shape [K, n] and m rows, one jitted function chains `copies` dots of
x [m, K] against distinct weights (over 96 MiB in all, so weights come from memory as in a decode
step, not from L3); each dot's input depends on the previous output so they run in sequence. All
(shape, m, implementation) cases are timed interleaved, `--repetitions` rounds; the median per
dot is printed with kernel/XLA ratios and v(m) = t(m) / t(1). Also checks the kernel against
np.dot and that rows of an m-row call equal the same rows computed alone, bit for bit.

  PYTHONPATH=. python scripts/small_rows_matmul_bench.py [--repetitions 15]

Measured (2-core EPYC, AVX2, shared with other jobs: load average 4-5; 11 repetitions), kernel
time / XLA time per dot, m = 1, 2, 4, 8:
  [1024, 1024]   1.55  0.85  0.72  0.82
  [1024, 2816]   1.29  0.69  0.55  0.87
  [2816, 1024]   1.27  1.13  0.66  0.78
  [1024, 32128]  1.77  0.78  0.61  0.72
so `spec_decode.t5.cpu_kernels` uses the kernel for 2..16 rows and leaves one row to XLA's
matrix-vector product. Ratios move by +-0.15 between runs on this loaded machine.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.runtime import platforms

SHAPES = [(1024, 1024), (1024, 2816), (2816, 1024), (1024, 32128)]
ROWS = [1, 2, 4, 8]


def _load_kernel() -> None:
  source = os.path.join(os.path.dirname(__file__), "..", "spec_decode", "t5",
                        "small_rows_matmul.cc")
  library = os.path.join(tempfile.mkdtemp(), "small_rows_matmul.so")
  subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-isystem",
                  jax.ffi.include_dir(), source, "-o", library], check=True)
  handler = ctypes.cdll.LoadLibrary(library).SmallRowsMatmul
  jax.ffi.register_ffi_target("bench_small_rows_matmul", jax.ffi.pycapsule(handler), platform="cpu")


def kernel_dot(x, w):
  return jax.ffi.ffi_call("bench_small_rows_matmul",
                          jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32))(x, w)


def chained(dot):
  def run(x, ws):
    y = None
    for w in ws:
      y = dot(x if y is None else x + 1e-30 * y[:, :1], w)
    return y
  return run


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repetitions", type=int, default=15)
  args = parser.parse_args()
  _load_kernel()
  rng = np.random.default_rng(0)
  options = platforms.Platform.default().compiler_options()

  # Correctness: np.dot to tolerance, rows bit-identical between 1-row and m-row calls.
  for k, n in [(1024, 1024), (37, 1000), (300, 5), (64, 263), (1024, 32128)]:
    w = rng.standard_normal((k, n), dtype=np.float32)
    x = rng.standard_normal((16, k), dtype=np.float32)
    for m in range(1, 17):
      got = np.asarray(jax.jit(kernel_dot)(x[:m], w))
      np.testing.assert_allclose(got, x[:m].astype(np.float64) @ w, rtol=1e-4,
                                 atol=1e-4 * np.sqrt(k))
      alone = np.concatenate([np.asarray(jax.jit(kernel_dot)(x[r:r + 1], w)) for r in range(m)])
      assert np.array_equal(got, alone), (k, n, m)
  print("correctness: ok (np.dot tolerance, rows bit-identical for m=1..16)", flush=True)

  cases = {}
  for k, n in SHAPES:
    copies = max(1, -(-96 * 2**20 // (4 * k * n)))
    ws = [jnp.asarray(rng.standard_normal((k, n), dtype=np.float32)) for _ in range(copies)]
    for m in ROWS:
      x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
      for name, dot in (("xla", jnp.dot), ("kernel", kernel_dot)):
        f = jax.jit(chained(dot), compiler_options=options).lower(x, ws).compile()
        f(x, ws).block_until_ready()
        cases[(k, n, m, name)] = (f, x, ws, copies, [])
  for _ in range(args.repetitions):
    for (f, x, ws, copies, times) in cases.values():
      start = time.perf_counter()
      f(x, ws).block_until_ready()
      times.append((time.perf_counter() - start) / copies)
  med = {key: float(np.median(c[4])) for key, c in cases.items()}
  print(f"load average {os.getloadavg()}; median us per dot; ratio = kernel / xla")
  for k, n in SHAPES:
    for m in ROWS:
      x_, k_ = med[(k, n, m, "xla")], med[(k, n, m, "kernel")]
      gbs = 4 * k * n / k_ / 1e9
      print(f"[{m:2d},{k}]x[{k},{n}]: xla {x_*1e6:8.1f} (v {x_/med[(k, n, 1, 'xla')]:.2f})  "
            f"kernel {k_*1e6:8.1f} (v {k_/med[(k, n, 1, 'kernel')]:.2f}, {gbs:.1f} GB/s)  "
            f"ratio {k_/x_:.2f}", flush=True)


if __name__ == "__main__":
  sys.exit(main())
