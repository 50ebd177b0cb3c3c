"""A broken target or draft checkpoint through `spec_decode.infer`: one line naming the file (and
the parameter), before anything is compiled, nothing written.

Every format the runner reads (T5X legacy msgpack with inline arrays or TensorStore arrays,
Orbax, the demo's .safetensors, a Hugging Face folder) truncated or corrupted, a file of another
format, and a NaN planted in one parameter (read slice by slice from TensorStore, and whole from
a Hugging Face folder), as the target and as the draft of a tiny random pair with the demo's
vocabulary.
"""

import copy
import json
import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import tiny_t5
from spec_decode.bench import steadiness
from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import demo_pair
from spec_decode.checkpoints import hf_format

PARAMETER = "decoder/layers_0/mlp/wo/kernel"
ARRAY_DIR = "target.decoder.layers_0.mlp.wo.kernel"  # where save_t5x stores PARAMETER


def _truncate(path: pathlib.Path, keep: float = 0.5) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:int(len(data) * keep)])


def _legacy_inline_truncated(model, directory):
  path = pathlib.Path(t5x_format.save_t5x(model.params, str(directory), 1, inline=True))
  _truncate(path / "checkpoint")
  return path, f"{path}: not a msgpack T5X checkpoint (Unpack failed"


def _legacy_index_truncated(model, directory):
  path = pathlib.Path(t5x_format.save_t5x(model.params, str(directory), 1))
  _truncate(path / "checkpoint")
  return path, f"{path}: not a msgpack T5X checkpoint (Unpack failed"


def _tensorstore_chunk_truncated(model, directory):
  path = pathlib.Path(t5x_format.save_t5x(model.params, str(directory), 1))
  _truncate(path / ARRAY_DIR / "0.0")
  return path, (f"checkpoint {path}, parameter {PARAMETER}, cannot be read: truncated, corrupt "
                f"or not a checkpoint of its format (ValueError: ")


def _tensorstore_metadata_corrupt(model, directory):
  path = pathlib.Path(t5x_format.save_t5x(model.params, str(directory), 1))
  (path / ARRAY_DIR / ".zarray").write_text("{\"zarr_format\": 2, ")
  return path, f"checkpoint {path}, parameter {PARAMETER}, cannot be read"


def _orbax_metadata_truncated(model, directory):
  ocp = pytest.importorskip("orbax.checkpoint")
  path = directory / "1"
  ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(
      path, args=ocp.args.PyTreeSave({"_optimizer": {"target": model.params,
                                                     "state": {"step": np.int32(1)}}}))
  _truncate(path / "_METADATA")
  return path, f"checkpoint {path}/_METADATA cannot be read: truncated, corrupt"


def _demo_safetensors_truncated(model, directory):
  directory.mkdir(parents=True)
  path = directory / "model.safetensors"
  demo_pair.save_model(model.params, model.config, path)
  _truncate(path)
  return path, f"checkpoint {path} cannot be read: truncated, corrupt or not a checkpoint of " \
               "its format (SafetensorError: "


def _hf_weights_truncated(model, directory):
  shutil.copytree(model.hf_folder, directory)
  _truncate(directory / "model.safetensors")
  return directory, f"checkpoint {directory / 'model.safetensors'} cannot be read"


def _hf_config_corrupt(model, directory):
  shutil.copytree(model.hf_folder, directory)
  (directory / "config.json").write_text("{\"model_type\": \"t5\",")
  return directory, f"checkpoint {directory / 'config.json'} cannot be read"


def _another_format(model, directory):
  del model
  directory.mkdir(parents=True)
  path = directory / "notes.txt"
  path.write_text("not a checkpoint\n")
  return path, f"{path}: not a msgpack T5X checkpoint"


def _with_nan(model):
  params = copy.deepcopy(model.params)
  params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"][3, 1] = np.nan
  return params


NAN_MESSAGE = f"parameter {PARAMETER} has 1 non-finite value (NaN or infinity), the first at " \
              "index (3, 1)"


def _nan_in_tensorstore(model, directory):
  path = pathlib.Path(t5x_format.save_t5x(_with_nan(model), str(directory), 1))
  return path, f"checkpoint {path}: {NAN_MESSAGE}"


def _nan_in_hf_folder(model, directory):
  hf_format.save_hf(model.config, _with_nan(model), str(directory))
  return directory, f"checkpoint {directory}: {NAN_MESSAGE}"


FAULTS = {fault.__name__.lstrip("_"): fault for fault in (
    _legacy_inline_truncated, _legacy_index_truncated, _tensorstore_chunk_truncated,
    _tensorstore_metadata_corrupt, _orbax_metadata_truncated, _demo_safetensors_truncated,
    _hf_weights_truncated, _hf_config_corrupt, _another_format, _nan_in_tensorstore,
    _nan_in_hf_folder)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pair")
  target = tiny_t5.write_model(directory, "target", tiny_t5.tiny_config(8000, tiny_t5.SHRINK), 1)
  draft = tiny_t5.write_model(directory, "draft",
                              tiny_t5.tiny_config(8000, tiny_t5.DRAFT_SHRINK), 2)
  run_gin = tiny_t5.write_run_gin(directory / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE,
                                  0, {"inputs": 16, "targets": 8}, batch_size=2)
  return {"target": target, "draft": draft, "run_gin": run_gin}


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_broken_checkpoint_is_named_in_one_line_before_compiling(pair, role, fault, tmp_path,
                                                                   capsys):
  path, message = FAULTS[fault](pair[role], tmp_path / "checkpoint")
  macro = {"target": "CHECKPOINT_PATH", "draft": "DRAFT_CHECKPOINT_PATH"}[role]
  out = tmp_path / "out"
  with steadiness.CompileCounter() as compiles:
    status, stderr = tiny_t5.run_infer_main(
        [f"--gin_file={pair['run_gin']}", "--text=Two dogs play in the snow.",
         f"--gin.{macro}='{path}'", f"--gin.INFER_OUTPUT_DIR='{out}'"], capsys)
  assert status == 2 and len(stderr) == 1, stderr
  assert stderr[0].startswith(f"spec_decode.infer: error: {message}"), stderr[0]
  assert compiles.by_name["jit(predict)"] == 0
  assert not out.exists()


def test_reading_names_the_file_once_and_keeps_missing_files_as_they_are():
  with pytest.raises(ValueError) as error:
    with checkpoint_faults.reading("/c/outer"):
      with checkpoint_faults.reading("/c/outer/inner.bin", "a/b"):
        raise RuntimeError("Unpack failed: incomplete input [tensorstore_spec='{...}']")
  assert str(error.value) == (
      "checkpoint /c/outer/inner.bin, parameter a/b, cannot be read: truncated, corrupt or not "
      "a checkpoint of its format (RuntimeError: Unpack failed: incomplete input)")
  with pytest.raises(FileNotFoundError, match="^gone$"):
    with checkpoint_faults.reading("/c"):
      raise FileNotFoundError("gone")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_check_finite_finds_nan_and_infinity_in_every_float_dtype(dtype):
  array = np.zeros((2, 3), np.float32)
  checkpoint_faults.check_finite(array.astype(dtype), "p", "c")
  array[1, 2] = np.inf
  array[0, 1] = np.nan
  if dtype == "int32":  # integers cannot hold either
    checkpoint_faults.check_finite(np.zeros((2, 3), dtype), "p", "c")
    return
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  cast = array.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
  with pytest.raises(ValueError, match=r"^checkpoint c: parameter p has 2 non-finite values "
                                       r"\(NaN or infinity\), the first at index \(0, 1\)$"):
    checkpoint_faults.check_finite(cast, "p", "c")
  tree = {"a": {"b": np.ones(2, np.float32), "c": cast}, "spec": {"driver": "zarr"}}
  with pytest.raises(ValueError, match="parameter a/c has 2"):
    checkpoint_faults.check_finite_params(tree, "c")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_check_finite_params_checks_arrays_on_devices(dtype):
  """Restored parameters (T5X's checkpointers return jax.Arrays) are checked where they live,
  named and counted as on the host."""
  array = np.zeros((3, 4), np.float32)
  tree = {"a": {"b": jnp.ones(2, dtype), "c": jnp.asarray(array, dtype)},
          "step": jnp.zeros((), jnp.int32)}
  checkpoint_faults.check_finite_params(tree, "c")
  array[2, 1] = np.inf
  array[1, 3] = np.nan
  tree["a"]["c"] = jnp.asarray(array, dtype)
  with pytest.raises(ValueError, match=r"^checkpoint c: parameter a/c has 2 non-finite values "
                                       r"\(NaN or infinity\), the first at index \(1, 3\)$"):
    checkpoint_faults.check_finite_params(tree, "c")
