"""A broken checkpoint named: the file (and the parameter) at fault, in one line.

`reading(path, parameter)` wraps the read of one checkpoint file, or of one parameter's array:
whatever its reader raises on a truncated, corrupt or wrong-format file (msgpack's `Unpack
failed`, TensorStore's decompression errors, safetensors' header errors, a JSON syntax error)
becomes one ValueError naming `path`, the parameter when one is given, and
the reader's own first line. A FileNotFoundError (it names the missing path) and this package's
own ValueErrors about the file (their message starts with `path` or "checkpoint `path`", as
this module's do: nested reads are named once, by the innermost) pass unchanged.

`check_finite(array, parameter, source)` refuses an array holding NaN or infinite values, naming
its parameter path and how many; `check_finite_params` checks every leaf of a parameter tree,
numpy arrays on the host and `jax.Array`s (what T5X's checkpointers restore, sharded) on the
devices holding them, in one compiled reduction. Both run on arrays a restore has read anyway
(one pass over each), so a checkpoint that would decode garbage is refused at restore, before
anything is compiled for decoding.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

# TensorStore appends its whole spec to an error's first line.
_READER_NOISE = (" [tensorstore_spec=", " [source locations=")
_MAX_READER_TEXT = 240


def _reader_text(error: BaseException) -> str:
  text = (str(error).strip().splitlines() or [""])[0] or type(error).__name__
  for noise in _READER_NOISE:
    text = text.split(noise)[0]
  if len(text) > _MAX_READER_TEXT:
    text = text[:_MAX_READER_TEXT - 1] + "…"
  return f"{type(error).__name__}: {text}"


@contextlib.contextmanager
def reading(path: Any, parameter: str | None = None) -> Iterator[None]:
  """Names `path` (and `parameter`) in any error reading it (see the module docstring)."""
  path = str(path)
  try:
    yield
  except FileNotFoundError:
    raise
  except Exception as error:  # pylint: disable=broad-except: readers raise a zoo of types
    if isinstance(error, ValueError) and str(error).startswith((path, f"checkpoint {path}")):
      raise  # this package's own message about the file
    what = f"checkpoint {path}" + (f", parameter {parameter}," if parameter else "")
    raise ValueError(f"{what} cannot be read: truncated, corrupt or not a checkpoint of "
                     f"its format ({_reader_text(error)})") from error


def _refuse(source: str, parameter: str, bad: int, first: tuple[int, ...]) -> None:
  raise ValueError(f"checkpoint {source}: parameter {parameter} has {bad} non-finite "
                   f"value{'s' if bad != 1 else ''} (NaN or infinity), the first at index "
                   f"{first}")


def check_finite(array: Any, parameter: str, source: str) -> None:
  """ValueError naming `parameter` of `source` when `array` holds NaN or infinities."""
  array = np.asarray(array)
  if not jnp.issubdtype(array.dtype, jnp.inexact):
    return
  finite = np.isfinite(array)
  if not finite.all():
    _refuse(source, parameter, int(array.size - np.count_nonzero(finite)),
            tuple(int(i) for i in np.argwhere(~finite)[0]))


@jax.jit
def _nonfinite_counts(arrays: list[jax.Array]) -> list[jax.Array]:
  return [jnp.count_nonzero(~jnp.isfinite(array)) for array in arrays]


@jax.jit
def _first_nonfinite(array: jax.Array) -> jax.Array:
  return jnp.argmax(~jnp.isfinite(array).reshape(-1))


def check_finite_params(params: Mapping[str, Any], source: str) -> None:
  """`check_finite` on every array leaf of a nested parameter mapping, named by its path: numpy
  leaves on the host, floating `jax.Array` leaves where they live (one reduction per array,
  compiled once for the whole tree, so a sharded parameter is never gathered to one host);
  other leaves, such as TensorStore specs not read yet, are skipped."""
  on_devices = []
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(key, "key", key)) for key in key_path)
    if isinstance(leaf, (np.ndarray, np.generic)):
      check_finite(leaf, name, source)
    elif isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.inexact):
      on_devices.append((name, leaf))
  if not on_devices:
    return
  counts = jax.device_get(_nonfinite_counts([leaf for _, leaf in on_devices]))
  for (name, leaf), bad in zip(on_devices, counts):
    if bad:
      first = np.unravel_index(int(jax.device_get(_first_nonfinite(leaf))), leaf.shape)
      _refuse(source, name, int(bad), tuple(int(i) for i in first))
