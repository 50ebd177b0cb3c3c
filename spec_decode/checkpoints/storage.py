"""Where checkpoints and vocabularies live: local files and gs:// objects, read alike (the latter
through TensorStore's gcs driver), and the TensorStore kvstore spec of either."""

from __future__ import annotations

import os
import posixpath
import re

import tensorstore as ts


def gcs(path: str) -> tuple[str, str] | None:
  """(bucket, key prefix) of a gs:// path, else None."""
  match = re.fullmatch(r"gs://([^/]+)/?(.*)", path, re.DOTALL)
  return (match.group(1), match.group(2).strip("/")) if match else None


def kvstore(directory: str, relative: str = "") -> dict:
  """TensorStore kvstore spec of the directory `relative` under `directory` (local or gs://)."""
  location = gcs(directory)
  if location:
    bucket, prefix = location
    return {"driver": "gcs", "bucket": bucket,
            "path": posixpath.join(prefix, relative).strip("/") + "/"}
  return {"driver": "file", "path": os.path.join(directory, relative).rstrip("/") + "/"}


# How long a gs:// file (an index, metadata, a vocabulary: small files, read before any array)
# may take. Without network or credentials TensorStore waits minutes, for the metadata server
# of a Google Cloud VM, before it says so; a run is answered within this bound instead.
GCS_WAIT_SECONDS = 30


def read_bytes(directory: str, key: str) -> bytes | None:
  """Contents of file `key` in `directory`, or None when it does not exist. A gs:// file that
  does not come within GCS_WAIT_SECONDS is a ValueError naming it."""
  if not gcs(directory):
    path = os.path.join(directory, key)
    if not os.path.isfile(path):
      return None
    with open(path, "rb") as f:
      return f.read()
  try:
    result = ts.KvStore.open(kvstore(directory)).result(timeout=GCS_WAIT_SECONDS).read(
        key).result(timeout=GCS_WAIT_SECONDS)
  except TimeoutError:
    raise ValueError(f"{posixpath.join(directory, key)}: no answer from Google Cloud Storage "
                     f"in {GCS_WAIT_SECONDS} s (no network, or no credentials: run `gcloud "
                     "auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS)"
                     ) from None
  return result.value if result.state == "value" else None


def read_file(path: str) -> bytes | None:
  """Contents of a local or gs:// file, or None when it does not exist."""
  return read_bytes(posixpath.dirname(path) if gcs(path) else os.path.dirname(path),
                    posixpath.basename(path))
