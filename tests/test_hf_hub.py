"""Hugging Face Hub ids (`hf://ORG/NAME[@REVISION]`) as checkpoint paths, offline: the test fills
a Hub cache folder in huggingface_hub's own layout (blobs, snapshots/<commit> linking to them,
refs/main naming the commit) with tiny models and points huggingface_hub at it, offline, so no
network is asked. The Hub id loads what the folder loads; a missing id or file is one line."""

import hashlib
import json
import os
import pathlib

import numpy as np
import pytest

import shared_data
import tiny_t5
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

hub_constants = pytest.importorskip("huggingface_hub.constants")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache: pathlib.Path, repo_id: str, folder: str, files=None) -> None:
  """Caches `files` (default: all) of `folder` as the Hub's revision COMMIT (and main) of
  `repo_id`, laid out as huggingface_hub lays out its cache."""
  repo = cache / f"models--{repo_id.replace('/', '--')}"
  snapshot = repo / "snapshots" / COMMIT
  (repo / "blobs").mkdir(parents=True)
  snapshot.mkdir(parents=True)
  for name in files or sorted(os.listdir(folder)):
    data = pathlib.Path(folder, name).read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(COMMIT)


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
  """An empty Hub cache that huggingface_hub uses, offline."""
  cache = tmp_path / "hub"
  cache.mkdir()
  monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
  monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
  return cache


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return tiny_t5.write_pair(tmp_path_factory.mktemp("models"))


@pytest.mark.slow
@pytest.mark.parametrize("revision", ["", "@" + COMMIT])
def test_a_hub_id_loads_what_its_folder_loads(hub_cache, pair, revision):
  target, _ = pair
  fill_cache(hub_cache, "tiny-org/tiny-t5", target.hf_folder)
  path = f"hf://tiny-org/tiny-t5{revision}"
  like = network.T5Config(**{**vars(target.config), "num_heads": 1})  # shapes must tell the rest
  assert formats.checkpoint_config(path, like) == target.config
  module = network.Transformer(target.config)
  loaded = dict(t5x_format.flatten_params(formats.load_params(module, path)))
  expected = dict(t5x_format.flatten_params(target.params))
  assert loaded.keys() == expected.keys()
  for key, value in expected.items():
    np.testing.assert_array_equal(np.asarray(loaded[key]), np.asarray(value), err_msg=str(key))


def test_a_missing_id_is_one_line(hub_cache, pair):
  fill_cache(hub_cache, "tiny-org/tiny-t5", pair[0].hf_folder)
  with pytest.raises(FileNotFoundError) as error:
    formats.locate("hf://tiny-org/no-such-model")
  assert str(error.value) == (
      f"Hugging Face model hf://tiny-org/no-such-model is not in the Hub cache ({hub_cache}) and "
      "could not be downloaded (offline, or HF_HUB_OFFLINE is set)")
  with pytest.raises(FileNotFoundError, match="hf://tiny-org/tiny-t5@feedface is not in the Hub"):
    formats.locate("hf://tiny-org/tiny-t5@feedface")  # a revision not cached
  with pytest.raises(FileNotFoundError, match="hf://a/b/c is not a Hugging Face model id"):
    formats.locate("hf://a/b/c")


def test_a_missing_file_is_one_line(hub_cache, pair):
  fill_cache(hub_cache, "tiny-org/config-only", pair[0].hf_folder, files=["config.json"])
  with pytest.raises(FileNotFoundError) as error:
    formats.locate("hf://tiny-org/config-only")
  assert str(error.value).startswith("Hugging Face model hf://tiny-org/config-only has no weights")
  weights = [name for name in os.listdir(pair[0].hf_folder) if name != "config.json"]
  fill_cache(hub_cache, "tiny-org/weights-only", pair[0].hf_folder, files=weights)
  with pytest.raises(FileNotFoundError, match="^Hugging Face model hf://tiny-org/weights-only has "
                                              "no config.json$"):
    formats.locate("hf://tiny-org/weights-only")


@pytest.mark.slow
@pytest.mark.skipif(not tiny_t5.T5_VOCAB_FILE.is_file(),
                    reason=shared_data.missing("the T5 vocabulary"))
def test_infer_runs_hub_ids_and_names_a_missing_one(hub_cache, pair, tmp_path, capsys):
  target, draft = pair
  fill_cache(hub_cache, "tiny-org/target", target.hf_folder)
  fill_cache(hub_cache, "tiny-org/draft", draft.hf_folder)
  run_gin = tiny_t5.write_run_gin(tmp_path / "run.gin", target, draft, tiny_t5.T5_VOCAB_FILE, 100,
                                  {"inputs": 16, "targets": 6}, batch_size=1)
  hub = ["--gin.CHECKPOINT_PATH='hf://tiny-org/target'",
         "--gin.DRAFT_CHECKPOINT_PATH='hf://tiny-org/draft'", "--text=The house is wonderful."]
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", *hub, f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"], capsys)
  assert status == 0, stderr
  (record,) = [json.loads(line) for line in
               (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
  assert record["identical"] is True  # greedy: the target alone, token for token

  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", *hub, "--gin.DRAFT_CHECKPOINT_PATH='hf://tiny-org/missing'",
       f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'missing'}'"], capsys)
  assert status == 2
  assert stderr == ["spec_decode.infer: error: Hugging Face model hf://tiny-org/missing is not in "
                    f"the Hub cache ({hub_cache}) and could not be downloaded (offline, or "
                    "HF_HUB_OFFLINE is set)"]
  assert not (tmp_path / "missing").exists()
