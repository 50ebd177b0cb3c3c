"""Tiny random T5.1.1 target/draft pairs on disk, for the model, infer and config tests.

`write_pair(directory, vocab_size)` writes, for a target and a smaller draft: a model gin file
binding `network.T5Config` (like configs/models/*), a T5X checkpoint (`save_t5x`) and a Hugging
Face folder (`save_hf`), and returns their paths and configs. `SHRINK` are the T5Config fields
that shrink any T5.1.1 config to the tiny target (`DRAFT_SHRINK` to the draft).
`write_model_files` writes the same files for given parameters; `write_run_gin` a
`spec_decode.infer` run config for a pair; `run_infer_main` runs `infer.main` in the test's
process.
"""

import dataclasses
import importlib.util
import pathlib

import gin

import shared_data
from spec_decode import infer
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import hf_format
from spec_decode.t5 import network

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = shared_data.SHARED
T5_VOCAB_FILE = shared_data.T5_VOCAB_FILE
# seqio's test SentencePiece model (26 pieces; pad 0, EOS 1, unk 2, as T5's), in seqio's wheel:
# for tests that bind a T5-style vocabulary but need none of the real one's pieces. Located
# without importing seqio, which imports TensorFlow.
_SEQIO = importlib.util.find_spec("seqio")
T5_STYLE_VOCAB_FILE = (pathlib.Path(_SEQIO.submodule_search_locations[0]) / "test_data" /
                       "sentencepiece" / "sentencepiece.model") if _SEQIO else None
T5_STYLE_VOCAB_PIECES = 26
DEMO_VOCAB_FILE = REPO_ROOT / "spec_decode" / "assets" / "demo" / "spm_ende_8k.model"
T5_VOCAB_SIZE = 32128  # T5.1.1 checkpoints' padded embedding

SHRINK = dict(dtype="float32", emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
              num_decoder_layers=1, mlp_dim=32)
DRAFT_SHRINK = dict(SHRINK, emb_dim=8, mlp_dim=16)


@dataclasses.dataclass(frozen=True)
class TinyModel:
  config: network.T5Config
  params: dict
  gin_file: str
  t5x_checkpoint: str
  hf_folder: str


def tiny_config(vocab_size: int, shrink: dict) -> network.T5Config:
  return network.T5Config(vocab_size=vocab_size, mlp_activations=("gelu", "linear"),
                          dropout_rate=0.0, logits_via_embedding=False, **shrink)


def _gin_text(config: network.T5Config) -> str:
  lines = ["from __gin__ import dynamic_registration", "from spec_decode.t5 import network"]
  for field in dataclasses.fields(config):
    lines.append(f"network.T5Config.{field.name} = {getattr(config, field.name)!r}")
  return "\n".join(lines) + "\n"


def write_model(directory: pathlib.Path, name: str, config: network.T5Config,
                seed: int) -> TinyModel:
  return write_model_files(directory, name, config, t5x_format.random_params(config, seed))


def write_model_files(directory: pathlib.Path, name: str, config: network.T5Config,
                      params: dict) -> TinyModel:
  """`name`.gin, a T5X checkpoint and a Hugging Face folder of the given parameters."""
  directory.mkdir(parents=True, exist_ok=True)
  gin_file = directory / f"{name}.gin"
  gin_file.write_text(_gin_text(config))
  t5x_checkpoint = t5x_format.save_t5x(params, str(directory / f"{name}_t5x"), step=1)
  hf_folder = directory / f"{name}_hf"
  hf_format.save_hf(config, params, str(hf_folder))
  return TinyModel(config, params, str(gin_file), t5x_checkpoint, str(hf_folder))


def write_pair(directory: pathlib.Path, vocab_size: int = T5_VOCAB_SIZE
               ) -> tuple[TinyModel, TinyModel]:
  """(target, draft) with different random weights and shapes, same vocabulary size."""
  return (write_model(directory, "target", tiny_config(vocab_size, SHRINK), seed=1),
          write_model(directory, "draft", tiny_config(vocab_size, DRAFT_SHRINK), seed=2))


def write_run_gin(path: pathlib.Path, target: TinyModel, draft: TinyModel,
                  vocabulary_file: pathlib.Path, extra_ids: int, task_feature_lengths: dict,
                  batch_size: int, extra: str = "") -> str:
  """A `spec_decode.infer` run config for a tiny target/draft pair (T5X checkpoints; greedy,
  gamma 3, compared with the baseline), plus the `extra` gin lines (bindings of the imported
  modules: infer, models, network); returns its path."""
  path.write_text(f"""
include 'configs/runs/infer.gin'
include '{target.gin_file}'
include 'configs/decoding/speculative.gin'
from __gin__ import dynamic_registration
from spec_decode import infer
from spec_decode import models
from spec_decode.t5 import network

VOCABULARY = @models.sentencepiece_vocabulary()
models.sentencepiece_vocabulary.sentencepiece_model_file = '{vocabulary_file}'
models.sentencepiece_vocabulary.extra_ids = {extra_ids}
DRAFT_CHECKPOINT_PATH = '{draft.t5x_checkpoint}'
GAMMA = 3
TEMPERATURE = 0.0
CHECKPOINT_PATH = '{target.t5x_checkpoint}'
TASK_FEATURE_LENGTHS = {task_feature_lengths!r}
BATCH_SIZE = {batch_size}
COMPARE_WITH_BASELINE = True
{extra}
""")
  return str(path)


def run_infer_main(args: list[str], capsys) -> tuple[int, list[str]]:
  """`infer.main(args)` in this process, its gin config cleared after: (exit status, stderr
  lines). `capsys`: pytest's fixture."""
  try:
    status = infer.main(args)
  finally:
    gin.clear_config()
  return status, capsys.readouterr().err.strip().splitlines()
