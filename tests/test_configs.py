"""Every gin file under configs/ parses and binds.

Run configs (those defining MODEL: the demo, and each Table 2 row after spec_decode.infer's
harness configs/table2/spec_decode.gin) are bound for real: their network configs are shrunk by
gin bindings added after parsing, their checkpoint paths are pointed at tiny random checkpoints
of those shrunk configs, and `infer.infer`'s arguments are built (the model, its vocabularies
and draft, the dataset config), the checkpoints restored. The Table 2 rows come twice: the
T5.1.1 rows (configs/table2/) and their T5 1.0 variants (configs/table2/t5_1_0/, after that
folder's harness); Table 3's decoder-only rows (configs/table3/, after its harness) likewise on
tiny language models and n-gram files. Model files build their network.T5Config, training files their `train`
arguments, and run fragments (included by the others) parse. The T5X runner's files
(configs/t5x/, the Table 2 t5x.gin harnesses) need T5X: tests/t5x parses them, the Table 2 rows
through T5X's harnesses among them.
"""

import dataclasses
import importlib
import re

import gin
import numpy as np
import pytest

import tiny_t5
from spec_decode import paths
from spec_decode.bench import paper
from spec_decode import gin_utils
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import ngram_format
from spec_decode.checkpoints import t5x_format
from spec_decode.engine import ngram
from spec_decode import infer
from spec_decode.infer import inputs as infer_inputs
from spec_decode import models
from spec_decode.t5 import network

importlib.import_module("spec_decode.training.train")  # registers `train` for the training configs
importlib.import_module("spec_decode.training.lm")  # and `train_lm` for the language models'

CONFIGS = paths.CONFIGS
ALL = sorted(str(p.relative_to(tiny_t5.REPO_ROOT)) for p in CONFIGS.glob("**/*.gin"))
TABLE2 = [f for f in ALL if re.fullmatch(r"configs/table2/\w+_t[01]\.gin", f)]
TABLE2_T5_1_0 = [f for f in ALL if re.fullmatch(r"configs/table2/t5_1_0/\w+_t[01]\.gin", f)]
TABLE3 = [f for f in ALL if re.fullmatch(r"configs/table3/gpt_like_\w+_t[01]\.gin", f)]
TABLE3_HARNESS = "configs/table3/spec_decode.gin"
RUNS = ["configs/demo/infer.gin"] + TABLE2 + TABLE2_T5_1_0
MODEL_FILES = [f for f in ALL if f.startswith("configs/models/")
               or f in ("configs/demo/target.gin", "configs/demo/draft.gin")]
LM_TRAIN_FILES = ["configs/train/lm_target.gin", "configs/train/lm_draft.gin",
                  "configs/train/lm_draft_whitebox.gin"]
# The pieces every training file includes: the data and schedule, and an optimizer.
TRAIN_PIECES = ["configs/train/adafactor.gin", "configs/train/adamw.gin",
                "configs/train/base.gin"]
TRAIN_FILES = [f for f in ALL if f.startswith("configs/train/")
               and not f.startswith("configs/train/lm_") and f not in TRAIN_PIECES]
T5X_FILES = [f for f in ALL if f.startswith("configs/t5x/")
             or (f.startswith("configs/table2/") and f.endswith("/t5x.gin"))]
FRAGMENTS = [f for f in ALL
             if f not in RUNS + TABLE3 + MODEL_FILES + TRAIN_FILES + LM_TRAIN_FILES + T5X_FILES]


@dataclasses.dataclass(frozen=True)
class Generation:
  """What a Table 2 row runs with, by T5 generation: its harness, the path pieces naming the
  public checkpoints of the XXL/11B target and of each draft size (the draft's `size` group),
  the folder of model gin files, and the architecture the generation is known by (T5 1.0: relu
  MLP, logits through the tied embedding; T5.1.1: gated gelu, untied logits)."""
  harness: str
  target: str
  draft: str
  models: str
  mlp_activations: tuple[str, ...]
  logits_via_embedding: bool


T5_1_1 = Generation("configs/table2/spec_decode.gin", "/t5_1_1_xxl/checkpoint_",
                    r"/t5_1_1_(?P<size>small|base|large)/checkpoint_", "configs/models/t5_1_1",
                    ("gelu", "linear"), False)
T5_1_0 = Generation("configs/table2/t5_1_0/spec_decode.gin", "/t5_11B/checkpoint_",
                    r"/t5_(?P<size>small|base|large)/checkpoint_", "configs/models/t5_1_0",
                    ("relu",), True)
ROW_GENERATION = {**{f: T5_1_1 for f in TABLE2}, **{f: T5_1_0 for f in TABLE2_T5_1_0}}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  gin.add_config_file_search_path(str(tiny_t5.REPO_ROOT))
  yield
  gin.clear_config()


def test_every_config_is_tested():
  for rows in (TABLE2, TABLE2_T5_1_0):
    assert len(rows) == 12
    assert {f.rsplit("/", 1)[1].removesuffix(".gin") for f in rows} == set(paper.TABLE2)
  # Table 3's decoder-only row: each draft (the draft LM, unigram, bigram) at T = 0 and 1.
  assert {f.rsplit("/", 1)[1] for f in TABLE3} == {
      f"gpt_like_{draft}_t{t}.gin" for draft in ("lm", "unigram", "bigram") for t in (0, 1)}
  assert set(RUNS + TABLE3 + MODEL_FILES + TRAIN_FILES + LM_TRAIN_FILES + T5X_FILES
             + FRAGMENTS) == set(ALL)


@pytest.mark.parametrize("gin_file", MODEL_FILES)
def test_model_file_binds_a_network(gin_file):
  gin.parse_config_file(gin_file)
  config = gin_utils.bound_network_config()
  assert network.is_decoder_only(config) == ("/decoder_only/" in gin_file)
  assert network.module_of(config).config.vocab_size in (8000, 32128)


@pytest.mark.parametrize("gin_file", TRAIN_FILES)
def test_train_file_binds_the_trainer(gin_file):
  # Training files leave the model to a model file (the demo trains configs/demo/*.gin).
  gin.parse_config_files_and_bindings(["configs/demo/target.gin", gin_file], [])
  arguments = gin.get_bindings("train")
  assert isinstance(arguments["config"], network.T5Config)
  assert arguments["optimizer"] is not None


@pytest.mark.parametrize("gin_file", LM_TRAIN_FILES)
def test_lm_train_file_binds_a_decoder_only_model(gin_file):
  # The language models' files carry their model: there is no encoder-decoder one to pair with.
  gin.parse_config_file(gin_file)
  arguments = gin.get_bindings("train_lm")
  assert isinstance(arguments["config"], network.DecoderOnlyConfig)
  assert arguments["optimizer"] is not None


@pytest.mark.parametrize("gin_file", FRAGMENTS)
def test_fragment_parses(gin_file):
  gin.parse_config_file(gin_file)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
  """Tiny checkpoints by config, written once each."""
  directory = tmp_path_factory.mktemp("checkpoints")
  written = {}

  def checkpoint_for(config: network.T5Config) -> str:
    if config not in written:
      model = tiny_t5.write_model(directory / str(len(written)), "model", config, len(written))
      written[config] = model.t5x_checkpoint
    return written[config]

  return checkpoint_for


@pytest.mark.parametrize("gin_file", RUNS)
def test_run_config_binds(gin_file, checkpoint_dir, tmp_path):
  generation = ROW_GENERATION.get(gin_file)
  shrink = [f"network.T5Config.{name} = {value!r}" for name, value in tiny_t5.SHRINK.items()]
  if generation:  # their default is T5X's gs:// copy; any T5-style vocabulary binds alike
    shrink.append(f"T5_VOCABULARY_FILE = '{tiny_t5.T5_STYLE_VOCAB_FILE}'")
  gin.parse_config_files_and_bindings([generation.harness, gin_file] if generation else [gin_file],
                                      shrink, finalize_config=False)
  target_config = gin.get_configurable(network.T5Config)()
  draft_path = gin.query_parameter("%DRAFT_CHECKPOINT_PATH")
  default_output_dir = gin.query_parameter("%INFER_OUTPUT_DIR")
  if generation:  # the row's draft size, shrunk, in the gs:// checkpoint's place
    assert generation.target in gin.query_parameter("%CHECKPOINT_PATH")
    size = re.search(generation.draft, draft_path).group("size")
    draft_config = gin_utils.read_model_config(
        f"{generation.models}/{size}.gin", {**tiny_t5.DRAFT_SHRINK, "dtype": target_config.dtype})
    assert (target_config.mlp_activations, target_config.logits_via_embedding) == (
        generation.mlp_activations, generation.logits_via_embedding)
    assert (draft_config.mlp_activations, draft_config.logits_via_embedding) == (
        generation.mlp_activations, generation.logits_via_embedding)
    draft_path = checkpoint_dir(draft_config)
  else:  # the shipped draft
    draft_config = formats.checkpoint_config(draft_path, target_config)
  gin.parse_config([
      f"CHECKPOINT_PATH = '{checkpoint_dir(target_config)}'",
      f"DRAFT_CHECKPOINT_PATH = '{draft_path}'", f"INFER_OUTPUT_DIR = '{tmp_path}'"])
  gin.finalize()  # every %gin.REQUIRED macro is set
  gin_utils.check_bindings_take_effect([infer.infer])  # and every binding is used

  arguments = gin.get_bindings(infer.infer)
  model, dataset_cfg = arguments["model"], arguments["dataset_cfg"]
  assert isinstance(model, models.SpeculativeEncoderDecoderModel) and model.is_speculative
  assert model.module.config == target_config
  assert model.draft_module.config == draft_config  # read from the draft's checkpoint
  assert model.input_vocabulary.vocab_size <= target_config.vocab_size
  formats.load_params(model.module, arguments["checkpoint_path"])
  assert model.draft_params is not None  # restored and checked against the draft module
  assert arguments["compare_with_baseline"] is True
  assert dataset_cfg.batch_size >= 1 and set(dataset_cfg.task_feature_lengths) == {
      "inputs", "targets"}

  if generation:
    row_name = re.fullmatch(r"configs/table2/(t5_1_0/)?(\w+)\.gin", gin_file).group(2)
    task, draft = row_name.split("_")[:2]
    row = paper.TABLE2[row_name]  # the paper's row: the config decodes with its settings
    assert (row.task.lower(), row.draft) == (task, f"T5-{draft}")
    assert row_name.endswith(f"_t{row.temperature:g}")
    expected = {"temperature": row.temperature, "topk": 0, "topp": 0.0,
                "max_decode_steps": None, "gamma": row.gamma, "verifier": "token"}
    assert {name: model.decode_settings[name] for name in expected} == expected
    assert dataset_cfg.batch_size == 1
    assert dataset_cfg.mixture_or_task_name == {"ende": "wmt_ende", "cnndm": "cnn_dailymail"}[task]
    assert size == draft  # the row's draft checkpoint is the paper's draft size
    # T5's 100 extra ids on top of the file's pieces (32100 with T5's own file).
    assert model.input_vocabulary.vocab_size == tiny_t5.T5_STYLE_VOCAB_PIECES + 100
    # Each row writes to its own folder, the T5 1.0 variants beside the T5.1.1 rows.
    assert default_output_dir == gin_file.replace("configs/", "out/").removesuffix(".gin")
  else:
    assert dataset_cfg.input_file is not None and dataset_cfg.mixture_or_task_name is None
    assert model.decode_settings["temperature"] == 0.0
    assert len(infer_inputs.read_examples(dataset_cfg, model)) >= 20


# Table 3's models at a width that restores in milliseconds (the demo vocabulary stays: the
# task tokenizes with it).
LM_SHRINK = dict(emb_dim=16, num_heads=2, head_dim=8, num_layers=1, mlp_dim=32)


@pytest.mark.parametrize("gin_file", TABLE3)
def test_table3_row_binds(gin_file, tmp_path):
  """A Table 3 row after its harness: the small-scale target of the training config's
  architecture, the row's draft (model or n-gram file, from where the README's commands write
  them) and temperature, gamma 1, the WMT prompts task; bound for real on tiny checkpoints."""
  draft_kind, temperature = re.fullmatch(r"configs/table3/gpt_like_(\w+)_t([01])\.gin",
                                         gin_file).groups()
  gin.parse_config_files_and_bindings(
      [TABLE3_HARNESS, gin_file],
      [f"network.DecoderOnlyConfig.{name} = {value!r}" for name, value in LM_SHRINK.items()],
      finalize_config=False)
  target_config = gin.get_configurable(network.DecoderOnlyConfig)()
  # The architecture configs/train/lm_target.gin trains.
  assert target_config == gin_utils.read_model_config(
      "configs/models/decoder_only/table3_target.gin", LM_SHRINK)
  assert gin.query_parameter("%CHECKPOINT_PATH").startswith("out/table3/lm_target/t5x/")
  draft_path = gin.query_parameter("%DRAFT_CHECKPOINT_PATH")
  # Each row writes to its own folder.
  assert gin.query_parameter("%INFER_OUTPUT_DIR") == gin_file.replace(
      "configs/", "out/").removesuffix(".gin")
  target_path = t5x_format.save_t5x(t5x_format.random_params(target_config, 0),
                                    str(tmp_path / "target"), step=1)
  if draft_kind == "lm":
    assert gin.query_parameter("%DRAFT_SOURCE") == "model"
    assert draft_path.startswith("out/table3/lm_draft/t5x/")
    draft_config = gin_utils.read_model_config(
        "configs/models/decoder_only/table3_draft.gin", LM_SHRINK)
    local_draft = t5x_format.save_t5x(t5x_format.random_params(draft_config, 1),
                                      str(tmp_path / "draft"), step=1)
  else:
    assert gin.query_parameter("%DRAFT_SOURCE") == "ngram"
    assert draft_path == f"out/table3/{draft_kind}.npz"
    local_draft = str(tmp_path / "ngram.npz")
    ngram_format.save(local_draft, ngram.estimate(
        [np.arange(3, 40)], target_config.vocab_size,
        order={"unigram": 1, "bigram": 2}[draft_kind]))
  gin.parse_config([f"CHECKPOINT_PATH = '{target_path}'",
                    f"DRAFT_CHECKPOINT_PATH = '{local_draft}'",
                    f"INFER_OUTPUT_DIR = '{tmp_path / 'out'}'"])
  gin.finalize()
  gin_utils.check_bindings_take_effect([infer.infer])

  arguments = gin.get_bindings(infer.infer)
  model, dataset_cfg = arguments["model"], arguments["dataset_cfg"]
  assert isinstance(model, models.SpeculativeDecoderOnlyModel) and model.is_speculative
  assert model.module.config == target_config
  formats.load_params(model.module, arguments["checkpoint_path"])
  assert model.draft_params is not None  # the draft restored (a network or n-gram tables)
  assert {name: model.decode_settings[name] for name in ("temperature", "gamma", "verifier")
          } == {"temperature": float(temperature), "gamma": 1, "verifier": "token"}
  assert model.input_vocabulary.vocab_size == 8000
  assert (dataset_cfg.mixture_or_task_name, dataset_cfg.split) == ("wmt_en_prompts_demo", "test")
  assert dict(dataset_cfg.task_feature_lengths) == {"inputs": 8, "targets": 32}
  assert (dataset_cfg.num_examples, dataset_cfg.batch_size) == (1000, 100)
  assert arguments["compare_with_baseline"] is False


@pytest.mark.parametrize("gin_file", TABLE2 + TABLE2_T5_1_0)
def test_table2_row_points_at_the_papers_numbers(gin_file):
  row_name = gin_file.rsplit("/", 1)[1].removesuffix(".gin")
  assert f"TABLE2['{row_name}']" in (tiny_t5.REPO_ROOT / gin_file).read_text()
