"""N-gram drafts on disk: an `engine.ngram.NGramModel` as one `.npz` file (numpy's archive).

Its arrays are the model's fields (`unigram_log_probs [V]`, `successors [V, K]`,
`successor_counts [V, K]`, `smoothing []`) and `format` = FORMAT, which tells the file from
other archives. `python -m spec_decode.data.ngrams` writes one from text.
"""

import os

import jax.numpy as jnp
import numpy as np

from spec_decode.engine import ngram

FORMAT = "spec_decode.ngram.v1"
SUFFIX = ".npz"
_FIELDS = ("unigram_log_probs", "successors", "successor_counts", "smoothing")


def is_ngram_file(path: str) -> bool:
  """Whether `path` names an n-gram draft file (by its suffix: the file may not exist yet)."""
  return str(path).endswith(SUFFIX)


def save(path: str, model: ngram.NGramModel) -> None:
  """Writes `model` to `path` (a .npz name), whole or not at all (a temporary file renamed)."""
  if not is_ngram_file(path):
    raise ValueError(f"an n-gram draft file's name ends in {SUFFIX}: {path}")
  temporary = f"{path}.partial{SUFFIX}"
  np.savez(temporary, format=np.asarray(FORMAT),
           **{name: np.asarray(getattr(model, name)) for name in _FIELDS})
  os.replace(temporary, path)


def load(path: str) -> ngram.NGramModel:
  """The n-gram draft at `path`; FileNotFoundError or ValueError naming the file."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"n-gram draft file not found: {path}")
  try:
    with np.load(path) as archive:
      arrays = {name: archive[name] for name in archive.files}
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: not a readable .npz archive ({e})") from None
  if str(arrays.get("format")) != FORMAT or set(_FIELDS) - set(arrays):
    raise ValueError(f"{path}: not an n-gram draft file (written by "
                     "`python -m spec_decode.data.ngrams`)")
  return ngram.NGramModel(**{name: jnp.asarray(arrays[name]) for name in _FIELDS})
