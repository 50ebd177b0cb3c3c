"""Hugging Face Hub model ids as checkpoint paths: `hf://ORG/NAME` or `hf://ORG/NAME@REVISION`
(e.g. `hf://google-t5/t5-small`) names the model's folder in huggingface_hub's cache
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), which `hf_format` reads
like any Hugging Face folder.

The cache is asked first, so a model already there loads without the network (and with
HF_HUB_OFFLINE=1 the network is never asked); otherwise its config.json and weights
(safetensors, else PyTorch .bin) are downloaded into the cache. A missing model, revision or
file is a FileNotFoundError of one line naming the id.
"""

from __future__ import annotations

import glob
import os

SCHEME = "hf://"
CONFIG_FILE = "config.json"
# The weights `hf_format` reads, in the order it prefers them: each entry the files of one
# form (one file, or shards and their index).
WEIGHT_FORMS = (("model.safetensors", "model-*.safetensors", "model.safetensors.index.json"),
                ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json"))


def is_hub_id(path: str) -> bool:
  """Whether `path` names a Hugging Face Hub model (`hf://...`)."""
  return path.startswith(SCHEME)


def _has_any(folder: str, patterns: tuple[str, ...]) -> bool:
  return any(glob.glob(os.path.join(folder, pattern)) for pattern in patterns)


def _snapshot(repo_id: str, revision: str | None, patterns: tuple[str, ...],
              local_files_only: bool) -> str:
  import huggingface_hub  # pylint: disable=g-import-not-at-top (only for hf:// paths)
  return huggingface_hub.snapshot_download(repo_id, revision=revision,
                                           allow_patterns=[CONFIG_FILE, *patterns],
                                           local_files_only=local_files_only)


def _find_or_download(path: str, repo_id: str, revision: str | None) -> str:
  """The snapshot folder holding config.json and one form of weights: from the cache when it
  has them, else downloaded (one form: the first the repository has)."""
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top
  try:
    for local_files_only in (True, False):
      for patterns in WEIGHT_FORMS:
        try:
          folder = _snapshot(repo_id, revision, patterns, local_files_only)
        except errors.LocalEntryNotFoundError:
          if local_files_only:
            break  # not in the cache: download
          raise
        if _has_any(folder, patterns):
          return folder
    return folder  # config.json alone: the caller names what is missing
  except errors.RevisionNotFoundError:
    raise FileNotFoundError(f"Hugging Face model {path}: no such revision on the Hub") from None
  except errors.RepositoryNotFoundError:
    raise FileNotFoundError(f"Hugging Face model {path} not found on the Hub (or not "
                            "accessible with this machine's token)") from None
  except errors.LocalEntryNotFoundError:
    raise FileNotFoundError(f"Hugging Face model {path} is not in the Hub cache "
                            f"({_cache_dir()}) and could not be downloaded (offline, or "
                            "HF_HUB_OFFLINE is set)") from None
  except (errors.HfHubHTTPError, OSError) as e:  # the Hub's reasons span several lines
    raise FileNotFoundError(f"Hugging Face model {path} could not be downloaded "
                            f"({type(e).__name__})") from None


def _cache_dir() -> str:
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  return constants.HF_HUB_CACHE


def hub_folder(path: str) -> str:
  """The local folder of the Hub model `path` (`hf://ORG/NAME[@REVISION]`), holding config.json
  and its weights; FileNotFoundError of one line naming the id and what is missing."""
  repo_id, _, revision = path[len(SCHEME):].partition("@")
  if repo_id.count("/") > 1 or not repo_id.strip("/"):
    raise FileNotFoundError(f"{path} is not a Hugging Face model id (hf://ORG/NAME or "
                            "hf://ORG/NAME@REVISION)")
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise FileNotFoundError(f"{path}: Hub ids need huggingface_hub (pip install "
                            "'spec_decode[hub]')") from None
  folder = _find_or_download(path, repo_id, revision or None)
  if not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
    raise FileNotFoundError(f"Hugging Face model {path} has no {CONFIG_FILE}")
  if not any(_has_any(folder, patterns) for patterns in WEIGHT_FORMS):
    raise FileNotFoundError(f"Hugging Face model {path} has no weights (model.safetensors or "
                            "pytorch_model.bin, or their shards)")
  return folder
