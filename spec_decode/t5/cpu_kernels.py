"""The network's products on XLA:CPU (`cpu_ops`), among them a small-row matmul called from
XLA as an FFI custom call: `dense_product`, and its transposed form for a tied embedding:
`embedding_product`.

`network.Transformer` takes its products as an injected `network.Ops` (default plain XLA); the
program's platform (`spec_decode.runtime.platforms.Platform`, from the devices it is compiled for)
picks `cpu_ops(dtype, small_rows_kernel=...)` on CPU and plain XLA elsewhere: this module
offers the CPU's products, it does not decide where they run.

Why: a batch-1 decode call of k = 1..16 tokens multiplies k activation rows by each weight
matrix and is bound by reading the weights, so k rows should cost about what one row costs.
XLA:CPU's dot does not get there (see `platforms` and the verify_cost bench suite);
`small_rows_matmul.cc` reads each weight element once for all rows (measured: the docstring of
scripts/small_rows_matmul_bench.py).

Contract:
  * `dense_product(x [..., K], w [K, n]) -> [..., n]`: `jnp.dot(x, w)`, by the kernel when
    `kernel_applies(x, w)`, else by XLA. Decided at trace time.
  * `embedding_product(x [..., K], embedding [n, K]) -> [..., n]`: `jnp.dot(x, embedding.T)`,
    by the transposed kernel under the same condition. Why a second kernel: XLA:CPU's dot of
    2..8 rows against a transposed [n, K] matrix is over ten times slower than the kernel on a
    pre-transposed copy (measured at [8000, 128] and [32128, 512], with the CPU platform's
    compiler options), and a transposed copy per call would read the matrix twice.
  * `kernel_applies(x, w)`: x and w are float32, w is 2-D, x has `MIN_ROWS`..`MAX_ROWS` rows
    (the product of its leading axes), kernels are not switched off (`SPEC_DECODE_CPU_KERNELS=0`
    or `xla_dots()`), and the kernel is available (compiled and registered on first use).
  * `small_rows_matmul(x [m, K], w [K, n]) -> [m, n]` and
    `small_rows_matmul_transposed(x [m, K], w [n, K]) -> [m, n]`: the kernels themselves, any m
    (need `available()`). Their rows are bit-identical whatever the row count: row r of an
    m-row product equals the 1-row product of x[r] (each output element is computed by the
    same fused multiply-adds in the same order; small_rows_matmul.cc says which). They agree
    with XLA's dot to float rounding. Differentiable
    (forward and reverse: the tangents are XLA dots); under `vmap` it runs once per batch
    element.
  * One row stays with XLA's matrix-vector product, measured faster than the kernel's
    (scripts/small_rows_matmul_bench.py), so a 1-token and a k-token call do not share the
    bit-identity above (they do not elsewhere either: attention of up to `FEW_QUERIES`
    queries has its own code path).
  * Partitioning: a custom call is opaque to GSPMD, which would gather a model-split weight
    onto every device to run it, and inside `jax.jit` a traced value does not say how
    `in_shardings` split it. So a program of several devices gets `cpu_ops` without the kernel
    (`small_rows_kernel=False`: the platform decides), every product XLA's dot.
  * Compilation: on first use, `g++` (or `$CXX`) builds the kernel with -O3 -march=native into
    `$XDG_CACHE_HOME/spec_decode/cpu_kernels` (default ~/.cache/...), one file per hash of the
    source, flags, compiler version, jaxlib version and CPU flags, written under a temporary
    name and renamed into place, so concurrent processes never load a partial file. Without a
    compiler, on a CPU without AVX2/FMA, or on any build or load failure, one warning and XLA's
    dot from then on. `require()` tells the two apart: `Unsupported` where the host lacks what
    the kernel needs, the build's or load's own error where the kernel itself failed.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib

from spec_decode.t5 import network

MIN_ROWS = 2  # one row: XLA's matrix-vector product (see the module docstring)
MAX_ROWS = 16
# Attention of up to this many queries as multiply-reduce loops (`few_query_attention_logits`).
FEW_QUERIES = 3
TARGET_NAME = "spec_decode_small_rows_matmul"
TRANSPOSED_TARGET_NAME = "spec_decode_small_rows_matmul_transposed"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_rows_matmul.cc")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
DISABLE_VARIABLE = "SPEC_DECODE_CPU_KERNELS"  # "0": XLA's dot everywhere

_xla_dots = contextvars.ContextVar("spec_decode_xla_dots", default=False)
_load_lock = threading.Lock()
_loaded: bool | None = None  # None: not tried yet
_failure: Exception | None = None  # why the load failed


class Unsupported(RuntimeError):
  """This host cannot build the kernel: no C++ compiler, or not an x86-64 CPU with AVX2 and
  FMA."""


@contextlib.contextmanager
def xla_dots() -> Iterator[None]:
  """Within this context, functions traced use XLA's dot (e.g. the benchmark's 'XLA defaults'
  reference). Applies at trace time: an already compiled function keeps its choice."""
  token = _xla_dots.set(True)
  try:
    yield
  finally:
    _xla_dots.reset(token)


def kernel_applies(x: jax.Array, w: jax.Array) -> bool:
  """Whether `dense_product(x, w)` uses the kernel (see the module docstring)."""
  rows = math.prod(x.shape[:-1])
  if (_xla_dots.get() or os.environ.get(DISABLE_VARIABLE) == "0"
      or w.ndim != 2 or not MIN_ROWS <= rows <= MAX_ROWS
      or x.dtype != jnp.float32 or w.dtype != jnp.float32):
    return False
  return available()


def few_query_attention_logits(query: jax.Array, key: jax.Array) -> jax.Array:
  """`network.einsum_attention_logits`, as a multiply-reduce over D for up to `FEW_QUERIES`
  queries (the einsum for more).

  Why: an attention of few queries (a baseline or draft step, a verification call at gamma <=
  2) as two einsums is two small batched dots that first copy the cached keys and values into
  head-major order, every layer, every call (a T5.1.1-large step: 96 such copies); the loops
  read the cache in its own layout. They read it once per query, so past a few queries the
  dots win (scripts/attention_bench.py)."""
  if query.shape[1] > FEW_QUERIES:
    return network.einsum_attention_logits(query, key)
  # [B,q,1,H,D] x [B,1,kv,H,D] -> [B,q,kv,H] -> [B,H,q,kv]
  return jnp.moveaxis(jnp.sum(query[:, :, None] * key[:, None], axis=-1), 3, 1)


def few_query_attention_mix(weights: jax.Array, value: jax.Array) -> jax.Array:
  """`network.einsum_attention_mix`, as a multiply-reduce over kv for up to `FEW_QUERIES`
  queries (why: `few_query_attention_logits`)."""
  if weights.shape[2] > FEW_QUERIES:
    return network.einsum_attention_mix(weights, value)
  # [B,H,q,kv] -> [B,q,kv,H,1] x [B,1,kv,H,D] -> [B,q,H,D]
  return jnp.sum(jnp.moveaxis(weights, 1, 3)[..., None] * value[:, None], axis=2)


def cpu_ops(dtype: Any = jnp.float32, small_rows_kernel: bool = True) -> network.Ops:
  """The products on XLA:CPU of a network of activation dtype `dtype`: with
  `small_rows_kernel`, `dense_product` and `embedding_product` (which keep XLA's dot where the
  kernel does not apply); for float32 networks only, the few-query attention loops: in bfloat16
  they would not round as T5X's einsums do."""
  products = {}
  if small_rows_kernel:
    products.update(dense_product=dense_product, embedding_product=embedding_product)
  if jnp.dtype(dtype) == jnp.float32:
    products.update(attention_logits=few_query_attention_logits,
                    attention_mix=few_query_attention_mix)
  return network.Ops(**products)


def available() -> bool:
  """Whether the kernel is built and registered (building it on the first call)."""
  return _load()


def require() -> None:
  """Builds and registers the kernel (once); raises `Unsupported` where this host lacks what it
  needs, and the build's or load's own error where the kernel failed on a host that has it."""
  if not _load():
    raise _failure


def dense_product(x: jax.Array, w: jax.Array) -> jax.Array:
  """`jnp.dot(x [..., K], w [K, n])` -> [..., n], by the kernel where it applies."""
  if not kernel_applies(x, w):
    return jnp.dot(x, w)
  rows = x.reshape(-1, x.shape[-1])
  return small_rows_matmul(rows, w).reshape(x.shape[:-1] + (w.shape[1],))


def embedding_product(x: jax.Array, embedding: jax.Array) -> jax.Array:
  """`jnp.dot(x [..., K], embedding [n, K].T)` -> [..., n], by the kernel where it applies."""
  if not kernel_applies(x, embedding):
    return network.transposed_dot(x, embedding)
  rows = x.reshape(-1, x.shape[-1])
  return small_rows_matmul_transposed(rows, embedding).reshape(x.shape[:-1] + embedding.shape[:1])


@jax.custom_jvp
def small_rows_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """x [m, K] @ w [K, n] -> [m, n] float32 by the kernel (`available()` must be True)."""
  return jax.ffi.ffi_call(TARGET_NAME, jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), x.dtype),
                          vmap_method="sequential")(x, w)


@small_rows_matmul.defjvp
def _small_rows_matmul_jvp(primals, tangents):
  # Tangents are linear in (dx, dw): XLA dots, which JAX also knows how to transpose.
  (x, w), (dx, dw) = primals, tangents
  return small_rows_matmul(x, w), jnp.dot(dx, w) + jnp.dot(x, dw)


@jax.custom_jvp
def small_rows_matmul_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
  """x [m, K] @ w [n, K].T -> [m, n] float32 by the kernel (`available()` must be True)."""
  return jax.ffi.ffi_call(TRANSPOSED_TARGET_NAME,
                          jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), x.dtype),
                          vmap_method="sequential")(x, w)


@small_rows_matmul_transposed.defjvp
def _small_rows_matmul_transposed_jvp(primals, tangents):
  (x, w), (dx, dw) = primals, tangents
  return small_rows_matmul_transposed(x, w), jnp.dot(dx, w.T) + jnp.dot(x, dw.T)


def _load() -> bool:
  """Compiles (or finds in the cache), loads and registers the kernel once per process; False
  (after one warning) on failure."""
  global _loaded, _failure
  with _load_lock:
    if _loaded is None:
      try:
        library = ctypes.cdll.LoadLibrary(_build())
        for name, handler in ((TARGET_NAME, library.SmallRowsMatmul),
                              (TRANSPOSED_TARGET_NAME, library.SmallRowsMatmulTransposed)):
          jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
        _loaded = True
      except Exception as error:  # pylint: disable=broad-except  (any failure: XLA's dot)
        warnings.warn(f"spec_decode: the CPU small-row matmul kernel is unavailable ({error}); "
                      "dense layers use XLA's dot", RuntimeWarning, stacklevel=2)
        _loaded, _failure = False, error
    return _loaded


def _build() -> str:
  """Path of the compiled kernel for this source, compiler, jaxlib and CPU, building it if
  the cache does not have it."""
  compiler = shutil.which(os.environ.get("CXX") or "g++")
  if not compiler:
    raise Unsupported(f"no C++ compiler ({os.environ.get('CXX') or 'g++'} not found; $CXX "
                      "names another)")
  _check_cpu()
  version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True,
                           timeout=60).stdout
  with open(SOURCE, "rb") as source:
    key = hashlib.sha256(source.read())
  for part in (compiler, version, " ".join(FLAGS), jaxlib.__version__, _cpu_flags()):
    key.update(b"\0" + part.encode())
  directory = os.path.join(os.environ.get("XDG_CACHE_HOME")
                           or os.path.join(os.path.expanduser("~"), ".cache"),
                           "spec_decode", "cpu_kernels")
  library = os.path.join(directory, f"small_rows_matmul-{key.hexdigest()[:20]}.so")
  if os.path.exists(library):
    return library
  os.makedirs(directory, exist_ok=True)
  handle, partial = tempfile.mkstemp(suffix=".so.partial", dir=directory)
  os.close(handle)
  try:
    built = subprocess.run([compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), SOURCE, "-o",
                            partial], capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
      raise RuntimeError(f"{compiler} failed: {built.stderr.strip()[-2000:]}")
    os.replace(partial, library)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return library


def _check_cpu() -> None:
  """Raises `Unsupported` where the CPU cannot run the kernel's AVX2/FMA code (flags
  unreadable: left to the compiler)."""
  machine = platform.machine().lower()
  if machine not in ("x86_64", "amd64"):
    raise Unsupported(f"the kernel is x86-64 AVX2/FMA code; this CPU is {machine}")
  flags = _cpu_flags().split()
  missing = [flag for flag in ("avx2", "fma") if flags and flag not in flags]
  if missing:
    raise Unsupported(f"this CPU lacks {', '.join(missing)}")


def _cpu_flags() -> str:
  """The CPU's feature flags (-march=native depends on them), '' where unreadable."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
      return next((line for line in cpuinfo if line.startswith("flags")), "")
  except OSError:
    return ""
