"""spec_decode.models: T5X's model protocol (shapes, types, scores) and speculative decoding
through it, on tiny random models with the demo vocabulary."""

import dataclasses
import functools
import pathlib
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import tiny_t5
from spec_decode import gin_utils
from spec_decode import paths
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode import models
from spec_decode.t5 import network
from spec_decode.t5 import vocab

VOCAB_SIZE = 8000
B, LE, L = 3, 10, 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return tiny_t5.write_pair(tmp_path_factory.mktemp("pair"), VOCAB_SIZE)


@pytest.fixture(scope="module")
def vocabulary():
  return vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))


def _model(pair, vocabulary, **settings):
  target, draft = pair
  return models.SpeculativeEncoderDecoderModel(
      network.Transformer(target.config), vocabulary, vocabulary,
      draft_checkpoint_path=draft.t5x_checkpoint, **settings)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  encoder_input_tokens = rng.integers(3, VOCAB_SIZE, (B, LE)).astype(np.int32)
  encoder_input_tokens[:, 7:] = 0  # padding
  encoder_input_tokens[:, 6] = 1  # EOS
  targets = rng.integers(3, VOCAB_SIZE, (B, L)).astype(np.int32)
  targets[0, 5:] = 0
  targets[0, 4] = 1
  weights = (targets > 0).astype(np.int32)
  decoder_input_tokens = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
  return {"encoder_input_tokens": encoder_input_tokens,
          "decoder_input_tokens": decoder_input_tokens,
          "decoder_target_tokens": targets, "decoder_loss_weights": weights}


# Scored by the target's own log-softmax (T5X's rescale_log_probs=False), so that a decode's
# score is its log-likelihood; by default a greedy decode scores 0, the log-probability of a
# point mass (tests/t5x check both against T5X's).
GREEDY_SPECULATIVE = dict(temperature=0.0, gamma=3, loop_settings={"rescale_log_probs": False})


@pytest.fixture(scope="module")
def jitted(pair, vocabulary):
  """Jitted functions of the tiny target, one compilation each: greedy speculative and
  baseline predict (all 2 decodes; the non-zero decoder_input_tokens are forced as a prompt, so
  zeros mean no prompt), score_batch, and teacher-forced logits."""
  target, _ = pair
  model = _model(pair, vocabulary, **GREEDY_SPECULATIVE)
  baseline = model.baseline()
  options = dict(prompt_with_targets=True, return_all_decodes=True, num_decodes=2)
  return {
      "model": model,
      "predict": jax.jit(lambda params, draft_params, batch: model.predict_batch_with_aux(
          params, batch, draft_params=draft_params, **options)),
      "predict_baseline": jax.jit(lambda params, batch: baseline.predict_batch_with_aux(
          params, batch, **options)),
      "score": jax.jit(model.score_batch),
      "logits": jax.jit(network.Transformer(target.config).apply),
  }


def _as_targets(decodes: np.ndarray) -> dict[str, np.ndarray]:
  """Teacher-forcing features of decodes [B, L]: targets up to and including EOS, PAD after."""
  ends = np.where((decodes == 1).any(1), (decodes == 1).argmax(1) + 1, decodes.shape[1])
  targets = np.where(np.arange(decodes.shape[1]) < ends[:, None], decodes, 0)
  return {"decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
          "decoder_target_tokens": targets,
          "decoder_loss_weights": (targets > 0).astype(np.int32)}


def test_get_initial_variables_follows_t5x(pair, vocabulary):
  model = _model(pair, vocabulary, **GREEDY_SPECULATIVE)
  shapes = {"encoder_input_tokens": (2, LE), "decoder_input_tokens": (2, L)}
  variables = jax.eval_shape(functools.partial(model.get_initial_variables, input_shapes=shapes),
                             jax.random.PRNGKey(0))
  assert set(variables) == {"params", "params_axes"}
  t5x_format.check_params(t5x_format.expected_param_shapes(pair[0].config),
                           variables["params"], "initial variables")
  kernel_axes = variables["params_axes"]["decoder"]["logits_dense"]["kernel_axes"]
  assert tuple(kernel_axes.names) == ("embed", "vocab")


def test_greedy_speculative_equals_baseline_and_is_greedy(pair, jitted):
  target, _ = pair
  model = jitted["model"]
  batch = dict(_batch(), decoder_input_tokens=np.zeros((B, L), np.int32))
  decodes, aux = jitted["predict"](target.params, model.draft_params, batch)
  baseline_decodes, baseline_aux = jitted["predict_baseline"](target.params, batch)

  assert decodes.shape == (B, 2, L) and decodes.dtype == jnp.int32
  np.testing.assert_array_equal(decodes, baseline_decodes)
  np.testing.assert_allclose(aux["scores"], baseline_aux["scores"], rtol=1e-5, atol=1e-4)
  assert set(baseline_aux) == {"scores"}
  for name in ("scores", "alpha", "target_calls", "draft_calls", "accepted_tokens",
               "generated_tokens", "drafted_tokens", "verified_positions", "acceptance_sum"):
    assert aux[name].shape == (B, 2), name
  assert np.all(np.diff(np.asarray(aux["scores"]), axis=1) >= 0)  # ascending: best last
  assert np.all(np.asarray(aux["target_calls"]) >= 1)
  assert np.all(np.asarray(aux["draft_calls"]) >= np.asarray(aux["target_calls"]))

  # Independently: each decoded token is the argmax of the target's teacher-forced logits,
  # and the decode's score is its log-likelihood.
  best = np.asarray(decodes[:, -1])
  features = _as_targets(best)
  logits = jitted["logits"]({"params": target.params}, batch["encoder_input_tokens"],
                            features["decoder_input_tokens"], features["decoder_target_tokens"])
  generated = features["decoder_target_tokens"] > 0
  np.testing.assert_array_equal(np.argmax(logits, -1)[generated], best[generated])
  np.testing.assert_array_equal(np.asarray(aux["generated_tokens"][:, -1]), generated.sum(1))
  rescored = jitted["score"](target.params, dict(batch, **features))
  np.testing.assert_allclose(rescored, aux["scores"][:, -1], rtol=1e-4, atol=1e-3)


def test_prompt_with_targets_forces_the_prompt(pair, jitted):
  target, _ = pair
  model = jitted["model"]
  prompt = np.zeros((B, L), np.int32)
  prompt[:, 1:3] = [[11, 12], [13, 14], [15, 16]]  # BOS at 0, then two forced tokens
  batch = dict(_batch(), decoder_input_tokens=prompt)
  decodes, _ = jitted["predict"](target.params, model.draft_params, batch)
  np.testing.assert_array_equal(np.asarray(decodes)[:, -1, :2], prompt[:, 1:3])
  np.testing.assert_array_equal(decodes, jitted["predict_baseline"](target.params, batch)[0])
  # Without return_all_decodes: the best decode and its aux, [B, L] and [B] (shapes only).
  best, aux = jax.eval_shape(model.predict_batch_with_aux, target.params, batch)
  assert best.shape == (B, L) and aux["scores"].shape == aux["alpha"].shape == (B,)
  assert jax.eval_shape(model.predict_batch, target.params, batch).shape == (B, L)


def test_score_batch_is_the_weighted_target_log_likelihood(pair, jitted):
  target, _ = pair
  model = jitted["model"]
  batch = _batch(seed=1)
  batch["decoder_loss_weights"][1, -2:] = 0  # weights, not targets, decide what counts
  scores = jitted["score"](target.params, batch)
  assert scores.shape == (B,) and scores.dtype == jnp.float32

  logits = np.asarray(jitted["logits"](
      {"params": target.params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"],
      batch["decoder_target_tokens"]), np.float64)
  log_probs = scipy.special.log_softmax(logits, axis=-1)
  token_log_probs = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None],
                                       axis=-1)[..., 0]
  expected = (token_log_probs * batch["decoder_loss_weights"]).sum(-1)
  np.testing.assert_allclose(scores, expected, rtol=1e-5)

  _, intermediates = jax.eval_shape(
      functools.partial(model.score_batch, return_intermediates=True), target.params, batch)
  assert intermediates["decoder"]["target_tokens"][0].shape == (B, L)

  loss, (weight_sum, metrics) = jax.jit(model.loss_fn)(target.params, batch, None)
  assert weight_sum == batch["decoder_loss_weights"].sum()
  np.testing.assert_allclose(loss, -expected.sum(), rtol=1e-5)
  assert set(metrics) >= {"loss", "z_loss", "accuracy"}


def test_draft_params_load_once_from_either_format(pair, vocabulary):
  target, draft = pair
  model = _model(pair, vocabulary, **GREEDY_SPECULATIVE)
  loaded = model.draft_params
  assert model.draft_params is loaded  # kept, not re-read
  for path in (draft.t5x_checkpoint, draft.hf_folder):
    params = formats.load_params(network.Transformer(draft.config), path)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, draft.params)
  cast = formats.load_params(network.Transformer(draft.config), draft.t5x_checkpoint, "bfloat16")
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(cast)} == {jnp.dtype("bfloat16")}
  jax.tree_util.tree_map(
      lambda got, want: np.testing.assert_array_equal(got, want.astype(jnp.bfloat16)), cast,
      draft.params)
  with pytest.raises(ValueError, match="emb_dim 8 .model: 16."):
    formats.load_params(network.Transformer(target.config), draft.hf_folder)
  with pytest.raises(ValueError, match="has shape"):
    formats.load_params(network.Transformer(target.config), draft.t5x_checkpoint)
  with pytest.raises(FileNotFoundError, match="checkpoint not found: /nonexistent"):
    formats.load_params(network.Transformer(target.config), "/nonexistent")


def test_a_draft_built_in_memory_decodes_without_a_checkpoint(pair, vocabulary):
  """`draft_module` alone (no draft_checkpoint_path) with its parameters given to the decode
  gives the decodes of the same draft read from its checkpoint."""
  target, draft = pair
  from_disk = _model(pair, vocabulary, **GREEDY_SPECULATIVE)
  in_memory = models.SpeculativeEncoderDecoderModel(
      network.Transformer(target.config), vocabulary, vocabulary,
      draft_module=network.Transformer(draft.config), **GREEDY_SPECULATIVE)
  draft_params = formats.load_params(network.Transformer(draft.config), draft.t5x_checkpoint)
  batch = _batch(seed=3)
  expected, _ = from_disk.predict_batch_with_aux(target.params, batch)
  decodes, aux = in_memory.predict_batch_with_aux(target.params, batch,
                                                  draft_params=draft_params)
  np.testing.assert_array_equal(decodes, expected)
  assert int(np.sum(aux["draft_calls"])) > 0
  with pytest.raises(ValueError, match="no draft parameters: set draft_checkpoint_path, or "
                                       "pass draft_params"):
    in_memory.predict_batch_with_aux(target.params, batch)


def test_bad_configurations_fail_at_construction(pair, vocabulary):
  target, draft = pair
  module = network.Transformer(target.config)
  other_vocab = tiny_t5.tiny_config(VOCAB_SIZE + 128, tiny_t5.DRAFT_SHRINK)
  with pytest.raises(ValueError, match="target and draft vocabularies differ: the target has "
                                       "8000 ids, the draft 8128"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                          draft_checkpoint_path=draft.t5x_checkpoint,
                                          draft_module=network.Transformer(other_vocab),
                                          **GREEDY_SPECULATIVE)
  with pytest.raises(ValueError, match="gamma is not set"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                          draft_checkpoint_path=draft.t5x_checkpoint)
  with pytest.raises(ValueError, match="gamma must be an integer >= 1, got 0"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                          draft_checkpoint_path=draft.t5x_checkpoint, gamma=0)
  with pytest.raises(ValueError, match="verifier must be one of .*got 'nope'"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                          draft_checkpoint_path=draft.t5x_checkpoint, gamma=2,
                                          verifier="nope")
  with pytest.raises(ValueError, match="needs a draft: set draft_checkpoint_path"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary, **GREEDY_SPECULATIVE)
  with pytest.raises(FileNotFoundError, match="checkpoint not found: /nonexistent/draft"):
    models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                          draft_checkpoint_path="/nonexistent/draft",
                                          **GREEDY_SPECULATIVE)
  with pytest.raises(ValueError, match="decode loop 'speculative_sample' needs a draft model"):
    models.EncoderDecoderModel(module, vocabulary, vocabulary, decode_loop="speculative_sample",
                               gamma=2)
  with pytest.raises(ValueError, match="decode loop 'temperature_sample' takes no setting "
                                       "'gamma'"):
    models.EncoderDecoderModel(module, vocabulary, vocabulary, gamma=2)
  with pytest.raises(ValueError, match="unknown decode loop 'beam'"):
    models.EncoderDecoderModel(module, vocabulary, vocabulary, decode_loop="beam")
  small = network.Transformer(tiny_t5.tiny_config(4000, tiny_t5.SHRINK))
  with pytest.raises(ValueError, match="input vocabulary has 8000 ids but the model's embedding "
                                       "only 4000"):
    models.EncoderDecoderModel(small, vocabulary, vocabulary)
  # The baseline loop needs no draft at all, and never reads one.
  baseline = models.SpeculativeEncoderDecoderModel(module, vocabulary, vocabulary,
                                                   decode_loop="temperature_sample")
  assert not baseline.is_speculative and baseline.draft_module is None


def test_the_draft_config_comes_from_its_checkpoint(pair, vocabulary):
  """Each checkpoint format tells the draft's architecture; its dtype is the target's."""
  target, draft = pair
  bfloat16_target = network.Transformer(dataclasses.replace(target.config, dtype="bfloat16"))
  for path in (draft.t5x_checkpoint, draft.hf_folder):
    model = models.SpeculativeEncoderDecoderModel(
        bfloat16_target, vocabulary, vocabulary, draft_checkpoint_path=path, gamma=2)
    assert model.draft_module.config == dataclasses.replace(draft.config, dtype="bfloat16")


def test_settings_and_the_baseline(pair, vocabulary):
  model = _model(pair, vocabulary, gamma=4, temperature=0.5, topk=7)
  expected = {"temperature": 0.5, "topk": 7, "topp": 0.0, "max_decode_steps": None,
              "max_decode_steps_hard_limit": None, "rescale_log_probs": True, "gamma": 4,
              "verifier": "token", "draft_policy": "fixed"}
  assert {name: model.decode_settings[name] for name in expected} == expected
  assert model.baseline().decode_settings == {"temperature": 0.5, "topk": 7, "topp": 0.0,
                                              "max_decode_steps": None,
                                              "max_decode_steps_hard_limit": None,
                                              "rescale_log_probs": True,
                                              "logit_callback_fn": None}
  assert not model.baseline().is_speculative


@pytest.mark.parametrize("gin_file", sorted(
    str(p.relative_to(tiny_t5.REPO_ROOT))
    for p in paths.CONFIGS.glob("**/*.gin")
    if p.parent.parent == paths.CONFIGS / "models"
    or (p.parent.name == "demo" and p.name in ("target.gin", "draft.gin"))))
def test_read_model_config_reads_what_gin_binds(gin_file):
  config = gin_utils.read_model_config(gin_file, overrides={"dtype": "float32"})
  gin.clear_config()
  try:
    gin.parse_config_file(paths.resolve(gin_file))
    config_class = (network.DecoderOnlyConfig if "/decoder_only/" in gin_file
                    else network.T5Config)
    expected = gin.get_configurable(config_class)(dtype="float32")
  finally:
    gin.clear_config()
  assert config == expected


def test_read_model_config_leaves_the_live_config_as_it_was(tmp_path):
  """A model file is read by gin itself (a macro resolves), and the run's own config, even a
  finalized one, is the same afterwards."""
  gin_file = tmp_path / "model.gin"
  gin_file.write_text("include 'configs/models/t5_1_1/small.gin'\n"
                      "EMB = 128\n"
                      "network.T5Config.emb_dim = %EMB\n")
  gin.clear_config()
  try:
    gin.parse_config("from __gin__ import dynamic_registration\n"
                     "from spec_decode.t5 import network\n"
                     "network.T5Config.emb_dim = 7\n"
                     "BATCH = 3\n")
    gin.finalize()
    before = gin.config_str()
    assert gin_utils.read_model_config(str(gin_file)).emb_dim == 128
    assert gin.config_str() == before and gin.config_is_locked()
    assert gin.query_parameter("%BATCH") == 3
  finally:
    gin.clear_config()
  with pytest.raises(FileNotFoundError, match="model gin file not found"):
    gin_utils.read_model_config(str(tmp_path / "missing.gin"))
  incomplete = tmp_path / "incomplete.gin"
  incomplete.write_text("from __gin__ import dynamic_registration\n"
                        "from spec_decode.t5 import network\n"
                        "network.T5Config.emb_dim = 8\n")
  with pytest.raises(ValueError,
                     match=r"incomplete.gin: not a complete network config \(T5Config"):
    gin_utils.read_model_config(str(incomplete))


def test_feature_converter_is_seqio_s():
  seqio = pytest.importorskip("seqio")
  assert models.EncoderDecoderModel.FEATURE_CONVERTER_CLS is seqio.EncDecFeatureConverter


def test_models_import_without_tensorflow():
  code = ("import sys, spec_decode.models, spec_decode.infer; "
          "assert 'tensorflow' not in sys.modules and 'seqio' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=pathlib.Path(__file__).parent)
