"""A broken draft or target checkpoint through `python -m t5x.infer` with the T5X hook: one line
naming the file (and the parameter); non-finite values found in the draft as the hook's restore
transformation reads it, and in every parameter T5X restores (`speculative.CheckedCheckpointManager`).

The draft is test_t5x_runs's (its target, noisy, saved by T5X's own Checkpointer: a msgpack
index and one TensorStore array per parameter), truncated, or the target given a NaN; the target
is test_t5x_runs's, truncated, or given a NaN and saved by T5X's Checkpointer (TensorStore
arrays) or T5X's Orbax checkpoint manager.
"""

import concurrent.futures
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import pytest

pytest.importorskip("t5x.infer",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_setup  # pylint: disable=g-import-not-at-top
from test_t5x_runs import RUN_CONFIG  # pylint: disable=g-import-not-at-top
from test_t5x_runs import run_t5x  # pylint: disable=g-import-not-at-top
from test_t5x_runs import setup  # pylint: disable=g-import-not-at-top,unused-import (a fixture)
from spec_decode.t5x import speculative  # pylint: disable=g-import-not-at-top

# The slow tier (python -m t5x.infer as subprocesses).
pytestmark = pytest.mark.slow

PARAMETER = "decoder/layers_0/mlp/wo/kernel"
# The target's NaN: where a NaN in the target went unnoticed by the restore transformation.
TARGET_PARAMETER = "decoder/layers_0/self_attention/query/kernel"
ARRAY_DIR = "target.decoder.layers_0.mlp.wo.kernel"  # where T5X's Checkpointer stores PARAMETER


def _truncate(path: pathlib.Path) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


def _draft_with_nan(setup, directory: pathlib.Path) -> str:
  params = jax.tree_util.tree_map(np.array, setup["target_params"])  # writable copies
  params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"][2, 0] = np.nan
  return t5x_setup.save_checkpoint(directory, RUN_CONFIG, params)


def _broken_draft(setup, fault: str, directory: pathlib.Path) -> tuple[str, str]:
  """(the draft's path, the message expected) for a `fault` of a copy of the runs' draft."""
  if fault == "nan":
    path = _draft_with_nan(setup, directory)
    return path, (f"ValueError: checkpoint {path}: parameter {PARAMETER} has 1 non-finite value "
                  "(NaN or infinity), the first at index (2, 0)")
  path = directory / "checkpoint_0"
  shutil.copytree(setup["draft"], path)
  if fault == "truncated_index":
    _truncate(path / "checkpoint")
    return str(path), (f"ValueError: checkpoint {path} cannot be read: truncated, corrupt or not "
                       "a checkpoint of its format (")
  chunk, = [f for f in (path / ARRAY_DIR).iterdir() if not f.name.startswith(".")]
  _truncate(chunk)
  return str(path), f"ValueError: checkpoint {path} cannot be read: truncated, corrupt"


@pytest.mark.parametrize("fault", ["truncated_index", "truncated_array", "nan"])
def test_t5x_infer_names_a_broken_draft_in_one_line(setup, fault, tmp_path):
  path, message = _broken_draft(setup, fault, tmp_path / "draft")
  run = run_t5x(setup, f"broken_{fault}", speculative=True,
                bindings=(f"DRAFT_CHECKPOINT_PATH='{path}'",))
  assert run.returncode != 0
  lines = [line for line in run.stderr.splitlines() if line.startswith(message)]
  assert lines, run.stderr[-3000:]


def test_t5x_infer_names_a_truncated_target(setup, tmp_path):
  target = tmp_path / "target" / "checkpoint_0"
  target.mkdir(parents=True)
  data = (setup["target"] / "checkpoint").read_bytes()
  (target / "checkpoint").write_bytes(data[:len(data) // 2])
  run = run_t5x(setup, "broken_target", speculative=True,
                bindings=(f"CHECKPOINT_PATH='{target}'",))
  assert run.returncode != 0
  assert f"ValueError: checkpoint {target} cannot be read: truncated, corrupt or not a " \
         "checkpoint of its format (ValueError: Unpack failed: incomplete input)" in \
         run.stderr.splitlines(), run.stderr[-3000:]


# How T5X saved the target given a NaN: its Checkpointer with the arrays inline in the msgpack
# file or in TensorStore (its legacy format), or its Orbax checkpoint manager (its default); and
# the TensorStore one restored by the legacy checkpointer t5x.infer uses without `use_orbax`.
TARGET_SAVES = ("inline", "tensorstore", "orbax", "tensorstore_legacy_restore")


@pytest.fixture(scope="module")
def nan_target_runs(setup, tmp_path_factory) -> dict[str, tuple[str, Any]]:
  """t5x.infer of a target with a NaN at TARGET_PARAMETER[1, 3], saved each way of
  TARGET_SAVES (side by side: each run is mostly one busy core importing T5X): way -> (the
  target's path, the run)."""
  params = jax.tree_util.tree_map(np.array, setup["target_params"])  # writable copies
  params["decoder"]["layers_0"]["self_attention"]["query"]["kernel"][1, 3] = np.nan
  directory = tmp_path_factory.mktemp("nan_targets")
  paths = {
      "inline": t5x_setup.save_checkpoint(directory / "inline", RUN_CONFIG, params, inline=True),
      "tensorstore": t5x_setup.save_checkpoint(directory / "tensorstore", RUN_CONFIG, params),
      "orbax": t5x_setup.save_orbax_checkpoint(directory / "orbax", RUN_CONFIG, params)}
  paths["tensorstore_legacy_restore"] = paths["tensorstore"]
  legacy = ("__main__.infer.use_orbax=False",)
  with concurrent.futures.ThreadPoolExecutor(max_workers=len(paths)) as pool:
    futures = {way: pool.submit(run_t5x, setup, f"nan_target_{way}", speculative=True,
                                bindings=(f"CHECKPOINT_PATH='{path}'",
                                          *(legacy if way.endswith("legacy_restore") else ())))
               for way, path in paths.items()}
    return {way: (paths[way], future.result()) for way, future in futures.items()}


@pytest.mark.parametrize("saved_by", TARGET_SAVES)
def test_t5x_infer_names_a_nan_in_the_target(setup, nan_target_runs, saved_by):
  """T5X reads the target's TensorStore and Orbax arrays after the restore transformation; the
  restore's own check names the NaN wherever it was stored, and nothing is predicted."""
  path, run = nan_target_runs[saved_by]
  assert run.returncode != 0
  assert (f"ValueError: checkpoint {path}: parameter {TARGET_PARAMETER} has 1 non-finite value "
          "(NaN or infinity), the first at index (1, 3)") in run.stderr.splitlines(), \
      run.stderr[-3000:]
  assert not list((setup["directory"] / f"nan_target_{saved_by}").glob("*.jsonl*"))


def test_restore_transformation_checks_the_draft(setup, tmp_path):
  """The draft's non-finite values are named with the draft's path, where the transformation
  reads it; the target's arrays it is handed are left to the restore's check."""
  state = {"target": {"decoder": {"layers_0": {"mlp": {"wo": {
      "kernel": np.array([[0.5, 1.0]], np.float32)}}}},
      "encoder": {"spec": {"driver": "zarr", "metadata": {"shape": [2]}}}}, "state": {}}
  path = _draft_with_nan(setup, tmp_path / "nan_draft")
  with pytest.raises(ValueError, match=f"^checkpoint {path}: parameter {PARAMETER} has 1"):
    speculative.restore_draft_params(state, None, draft_checkpoint_path=path)
  restored = speculative.restore_draft_params(state, None,
                                              draft_checkpoint_path=str(setup["draft"]))
  assert speculative.DRAFT_PARAMS_KEY in restored["target"]
