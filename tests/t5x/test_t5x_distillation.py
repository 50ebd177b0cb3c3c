"""Draft distillation in T5X (`spec_decode.t5x.distillation`, configs/t5x/distill_draft.gin).

In process (the slow tier, as the neighbouring T5X tests, but for the bad settings and the gin
files): the models' loss is the divergence between T5X's own target network's and the
draft's distributions (alpha = 1 - total variation, computed here from T5X's logits), for an
encoder-decoder and a decoder-only (prefix LM) pair; a few gradient steps on it raise alpha;
bad settings fail in one line before anything compiles. The data sources (the standalone
trainer's): on-policy batches are the draft's own T5X decodes of the same parameters, a
mixture's other rows the task's, and loss_fn trains on them where T5X gives it an rng. End to end: `python -m t5x.train`
(T5X's pretrain.gin, a tiny draft's model gin, distill_draft.gin, the target's T5X checkpoint)
raises the draft's alpha on the task, leaves the target's checkpoint as it was, and writes a
checkpoint of the draft alone that the speculative hook restores as its draft.
"""

import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

pytest.importorskip("t5x.train", reason="needs t5x, installed from its repository (README: Tests)")

import t5x_decoder_only  # pylint: disable=g-import-not-at-top
import t5x_setup  # pylint: disable=g-import-not-at-top
import t5x_tasks  # pylint: disable=g-import-not-at-top
from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
from spec_decode.t5x import distillation  # pylint: disable=g-import-not-at-top
from spec_decode.t5x import speculative  # pylint: disable=g-import-not-at-top
from spec_decode.training import divergences  # pylint: disable=g-import-not-at-top

HERE = pathlib.Path(__file__).resolve().parent
# Target and draft of seqio's test vocabulary padded to 128 ids, as test_t5x_runs' models.
TARGET = dataclasses.replace(t5x_setup.TINY, vocab_size=128)
DRAFT = dataclasses.replace(t5x_setup.TINY_DRAFT, vocab_size=128)
INPUT_LENGTH, TARGET_LENGTH = 24, 16
TRAIN_STEPS = 30


def _batch() -> dict[str, np.ndarray]:
  """The training task's examples as seqio's EncDecFeatureConverter writes them, unpacked."""
  vocabulary = t5x_setup.vocabulary()
  batch = {name: np.zeros((t5x_tasks.NUM_EXAMPLES, length), np.int32)
           for name, length in (("encoder_input_tokens", INPUT_LENGTH),
                                ("decoder_input_tokens", TARGET_LENGTH),
                                ("decoder_target_tokens", TARGET_LENGTH),
                                ("decoder_loss_weights", TARGET_LENGTH))}
  for row, (source, target) in enumerate(zip(t5x_tasks.SENTENCES, t5x_tasks.TRAIN_TARGETS)):
    inputs = vocabulary.encode("translate English to German: " + source)[:INPUT_LENGTH - 1] + [1]
    targets = vocabulary.encode(target)[:TARGET_LENGTH - 1] + [1]
    batch["encoder_input_tokens"][row, :len(inputs)] = inputs
    batch["decoder_target_tokens"][row, :len(targets)] = targets
    batch["decoder_input_tokens"][row, 1:len(targets)] = targets[:-1]
    batch["decoder_loss_weights"][row, :len(targets)] = 1
  return batch


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
  """A target saved by T5X's Checkpointer and a smaller draft's initial parameters."""
  directory = tmp_path_factory.mktemp("t5x_distillation")
  target_params = t5x_setup.initial_variables(TARGET, seed=t5x_setup.TINY_SEED)["params"]
  draft_params = t5x_setup.initial_variables(DRAFT, seed=3)["params"]
  return {"directory": directory, "target_params": target_params, "draft_params": draft_params,
          "target": t5x_setup.save_checkpoint(directory / "target", TARGET, target_params)}


def _alpha(model, params, batch) -> float:
  _, metrics = jax.jit(model.loss_fn)(params, batch, None)
  return float(metrics["alpha"].compute())


@pytest.mark.slow  # compiles T5X's networks and the loss
def test_the_loss_is_the_divergence_from_t5xs_target_network(pair):
  batch = _batch()
  model = distillation.distillation_version(t5x_setup.t5x_model(DRAFT), pair["target"],
                                            divergence="tv")
  assert isinstance(model, distillation.DistillationEncoderDecoderModel)
  loss, metrics = jax.jit(model.loss_fn)(pair["draft_params"], batch, None)
  # The same distributions from T5X's own networks, the target's from its checkpoint.
  target_logits = jax.jit(t5x_setup.t5x_model(TARGET)._compute_logits)(
      t5x_setup.load_params(pair["target"]), batch)
  draft_logits = jax.jit(t5x_setup.t5x_model(DRAFT)._compute_logits)(pair["draft_params"], batch)
  tv = divergences.per_position("tv", target_logits, draft_logits)
  weights = batch["decoder_loss_weights"]
  np.testing.assert_allclose(float(loss), float(jnp.sum(tv * weights)), rtol=1e-4)
  np.testing.assert_allclose(float(metrics["alpha"].compute()),
                             1 - float(jnp.sum(tv * weights)) / weights.sum(), rtol=1e-4)
  np.testing.assert_allclose(float(metrics["divergence/tv"].compute()),
                             float(jnp.sum(tv * weights)) / weights.sum(), rtol=1e-4)
  assert "accuracy" in metrics  # T5X's metrics stay


@pytest.mark.slow  # compiles T5X's networks and the loss
def test_gradient_steps_raise_alpha_and_leave_the_target(pair):
  batch = _batch()
  model = distillation.distillation_version(t5x_setup.t5x_model(DRAFT), pair["target"],
                                            divergence="jsd", beta=0.3)
  target_before = jax.tree_util.tree_map(np.array, model.target_params)
  optimizer = optax.adam(3e-2)
  params = pair["draft_params"]
  state = optimizer.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.grad(lambda p: model.loss_fn(p, batch, None)[0])(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state

  before = _alpha(model, params, batch)
  for _ in range(15):
    params, state = step(params, state)
  assert _alpha(model, params, batch) > before + 0.05
  for kept, now in zip(jax.tree_util.tree_leaves(target_before),
                       jax.tree_util.tree_leaves(model.target_params), strict=True):
    np.testing.assert_array_equal(kept, np.asarray(now))


@pytest.mark.slow  # compiles T5X's networks and the loss
@pytest.mark.parametrize("prefix_lm", [False, True])
def test_decoder_only_loss_is_the_divergence_from_t5xs_target_network(tmp_path, prefix_lm):
  network = t5x_decoder_only.network()
  target_config = network.TransformerConfig(
      vocab_size=128, dtype="float32", emb_dim=16, num_heads=4, num_layers=2, head_dim=4,
      mlp_dim=32, mlp_activations=("gelu", "linear"), dropout_rate=0.0,
      logits_via_embedding=False)
  draft_config = dataclasses.replace(target_config, emb_dim=8, num_heads=2, num_layers=1,
                                     mlp_dim=16, logits_via_embedding=True)
  target_params = t5x_setup.initial_variables(target_config, seed=1)["params"]
  draft_params = t5x_setup.initial_variables(draft_config, seed=2)["params"]
  target = t5x_setup.save_checkpoint(tmp_path / "target", target_config, target_params)
  draft_model = t5x_setup.t5x_model(draft_config, inputs_bidirectional_attention=prefix_lm)
  model = distillation.distillation_version(draft_model, target, divergence="forward_kl",
                                            temperature=2.0)
  assert isinstance(model, distillation.DistillationDecoderOnlyModel)
  # seqio's DecoderFeatureConverter's rows: a prompt, then targets; loss on the targets only.
  rows = [([5, 7, 9], [11, 12, 13, 1]), ([20, 21, 22, 23, 24], [30, 1])]
  batch = t5x_decoder_only.decoder_batch(rows, length=10)
  loss, metrics = jax.jit(model.loss_fn)(draft_params, batch, None)
  target_model = t5x_setup.t5x_model(target_config, inputs_bidirectional_attention=prefix_lm)
  kl = divergences.per_position(
      "forward_kl", jax.jit(target_model._compute_logits)(target_params, batch),
      jax.jit(draft_model._compute_logits)(draft_params, batch), temperature=2.0)
  weights = batch["decoder_loss_weights"]
  np.testing.assert_allclose(float(loss), float(jnp.sum(kl * weights)), rtol=1e-4)
  assert 0 < float(metrics["alpha"].compute()) < 1


@pytest.mark.slow  # compiles five decodes (about 30 s of CPU)
def test_on_policy_and_mixture_batches_are_the_drafts_own_decodes(pair):
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  rng = jax.random.PRNGKey(5)
  params = pair["draft_params"]

  def built(data_source, temperature, **kwargs):
    model = distillation.distillation_version(
        t5x_setup.t5x_model(DRAFT), pair["target"], temperature=temperature,
        data_source=data_source, **kwargs)
    return model, jax.tree_util.tree_map(np.asarray, model._training_batch(params, batch, rng))

  # The same parameters decoded by another T5X model of the draft: greedy, and sampling the
  # whole distribution at temperature 1 from the same rng.
  greedy, _ = t5x_setup.t5x_model(DRAFT).predict_batch_with_aux(params, batch)
  sampled, _ = t5x_setup.t5x_model(DRAFT, temperature=1.0).predict_batch_with_aux(
      params, batch, rng=rng)
  greedy, sampled = np.asarray(greedy), np.asarray(sampled)
  assert not np.array_equal(greedy, sampled)

  def as_targets(decodes):  # up to and including the first EOS, padding after it
    after_eos = np.cumsum(decodes == 1, axis=1) - (decodes == 1) > 0
    return np.where(after_eos, 0, decodes), (~after_eos).astype(np.int32)

  model, on_policy = built("draft_sample", 1.0)
  targets, weights = as_targets(sampled)
  np.testing.assert_array_equal(on_policy["decoder_target_tokens"], targets)
  np.testing.assert_array_equal(on_policy["decoder_loss_weights"], weights)
  np.testing.assert_array_equal(on_policy["decoder_input_tokens"][:, 1:], targets[:, :-1])
  assert not on_policy["decoder_input_tokens"][:, 0].any()
  np.testing.assert_array_equal(on_policy["encoder_input_tokens"], batch["encoder_input_tokens"])
  # Near temperature 0 the draft's samples are its greedy decodes.
  _, cold = built("draft_sample", 1e-4)
  np.testing.assert_array_equal(cold["decoder_target_tokens"], as_targets(greedy)[0])
  # A mixture: round(fraction * B) rows the draft's samples, the others the task's targets.
  _, mixture = built("mixture", 1e-4, draft_sample_fraction=0.3)
  rows = round(0.3 * t5x_tasks.NUM_EXAMPLES)
  assert 0 < rows < t5x_tasks.NUM_EXAMPLES
  np.testing.assert_array_equal(mixture["decoder_target_tokens"][:rows],
                                as_targets(greedy)[0][:rows])
  for key in ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"):
    np.testing.assert_array_equal(mixture[key][rows:], np.asarray(batch[key])[rows:])
  # The draft's decodes differ from the task's targets, so the rows tell the sources apart.
  assert not np.array_equal(as_targets(greedy)[0], np.asarray(batch["decoder_target_tokens"]))


@pytest.mark.slow  # compiles the loss with the draft's decoding inside
def test_the_loss_with_an_rng_is_taken_on_the_sources_batch(pair):
  batch = _batch()
  rng = jax.random.PRNGKey(7)
  model = distillation.distillation_version(t5x_setup.t5x_model(DRAFT), pair["target"],
                                            data_source="draft_sample")
  params = pair["draft_params"]
  # loss_fn splits its rng into the samples' and dropout's (the tiny draft has no dropout).
  on_policy = model._training_batch(params, batch, jax.random.split(rng)[0])
  loss, metrics = jax.jit(model.loss_fn)(params, batch, rng)
  expected, expected_metrics = jax.jit(model.loss_fn)(params, on_policy, None)
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
  for name in ("alpha", "alpha_t0", "alpha_t1"):
    np.testing.assert_allclose(float(metrics[name].compute()),
                               float(expected_metrics[name].compute()), rtol=1e-5)
  # Without an rng (T5X's eval_fn) the loss is the task targets'.
  teacher_forced, _ = jax.jit(model.loss_fn)(params, batch, None)
  assert abs(float(teacher_forced) - float(loss)) > 1e-3


@pytest.mark.parametrize("arguments, message", [
    (dict(target_checkpoint_path=None), "no target checkpoint: set TARGET_CHECKPOINT_PATH"),
    (dict(target_checkpoint_path="/nonexistent/checkpoint_1"),
     "target checkpoint not found: /nonexistent/checkpoint_1"),
    (dict(divergence="kl"), "unknown divergence 'kl'; known: forward_kl, jsd, reverse_kl, tv"),
    (dict(divergence="tv", beta=0.5),
     "beta is the 'jsd' divergence's; it cannot take effect with 'tv'"),
    (dict(temperature=0.0), "the divergence temperature must be > 0, got 0.0"),
    (dict(model="z_loss"), "z_loss and label_smoothing are cross-entropy's: they cannot take "
                           "effect with distillation"),
    (dict(model="other_vocabulary"),
     "target and draft vocabularies differ: the target has 128 ids, the draft 256"),
    (dict(data_source="replay"), "unknown data source 'replay'; known: dataset, target_greedy, "
                                 "target_sample, draft_sample, mixture"),
    (dict(data_source="mixture"),
     "data source 'mixture' needs a draft_sample_fraction in (0, 1), got None"),
    (dict(data_source="target_greedy", draft_sample_fraction=0.5),
     "draft_sample_fraction takes effect with data source 'mixture' only, not 'target_greedy'"),
    (dict(data_source="draft_sample", model="beam_search"),
     "data source 'draft_sample' samples with the draft's decode_fn, which takes no "
     "temperature: bind decoding.temperature_sample"),
    (dict(data_source="target_sample", model="decoder_only"),
     "data source 'target_sample' decodes an encoder-decoder's inputs: a decoder-only model "
     "takes 'dataset' only"),
])
def test_bad_settings_are_one_line(pair, arguments, message):
  arguments = {"target_checkpoint_path": pair["target"], **arguments}
  model = arguments.pop("model", None)
  if model == "decoder_only":  # refused before its checkpoint is read
    model = t5x_setup.t5x_model(t5x_decoder_only.network().TransformerConfig(
        vocab_size=128, dtype="float32", emb_dim=8, num_heads=2, num_layers=1, head_dim=4,
        mlp_dim=16))
  elif model == "beam_search":
    model = t5x_setup.t5x_model(DRAFT, decode_fn=t5x_decoding.beam_search)
  elif model == "z_loss":
    model = t5x_setup.t5x_model(DRAFT)
    model._z_loss = 1e-4  # as T5X's constructor stores models.EncoderDecoderModel.z_loss
  else:
    model = t5x_setup.t5x_model(dataclasses.replace(DRAFT, vocab_size=256)
                                if model == "other_vocabulary" else DRAFT)
  with pytest.raises(ValueError) as raised:
    distillation.distillation_version(model, **arguments)
  assert str(raised.value) == message


@pytest.mark.parametrize("gin_file, model, pack", [
    ("configs/t5x/distill_draft.gin", "models.EncoderDecoderModel", False),
    ("configs/t5x/distill_draft_decoder_only.gin", "models.DecoderOnlyModel", True),
])
def test_the_gin_files_bind_the_draft_model_of_their_family(gin_file, model, pack):
  gin.clear_config()
  try:
    gin.add_config_file_search_path(str(t5x_setup.REPO_ROOT))
    gin.parse_config_files_and_bindings([gin_file], ["TARGET_CHECKPOINT_PATH = '/path/to/t'"])
    assert gin.query_parameter("%MODEL").selector == "distillation.distillation_version"
    assert gin.query_parameter("distillation.distillation_version.model").selector == model
    assert gin.query_parameter(f"{model}.z_loss") == 0.0
    assert gin.query_parameter("train/utils.DatasetConfig.pack") == pack
  finally:
    gin.clear_config()


# A T5X user's tiny draft model on the training task: T5X's model gin for T5.1.1, the draft's
# dimensions. Run with t5x/configs/runs/pretrain.gin before it, distill_draft.gin after it.
DRAFT_MODEL_GIN = t5x_setup.t5_1_1_model_gin(
    DRAFT, task_name=t5x_tasks.TRAIN_TASK_NAME, inputs_length=INPUT_LENGTH,
    targets_length=TARGET_LENGTH, imports="import __main__ as train_script\n") + f"""
BATCH_SIZE = {t5x_tasks.NUM_EXAMPLES}
USE_CACHED_TASKS = False
train_script.train.train_eval_dataset_cfg = None
train_script.train.infer_eval_dataset_cfg = None
utils.SaveCheckpointConfig.period = {TRAIN_STEPS // 3}
utils.create_learning_rate_scheduler.factors = 'constant'
utils.create_learning_rate_scheduler.base_learning_rate = 0.05
"""


def _digest(directory: str) -> dict[str, str]:
  return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
          for path in sorted(pathlib.Path(directory).rglob("*")) if path.is_file()}


@pytest.mark.slow  # python -m t5x.train as a subprocess
def test_t5x_train_distills_a_draft_that_restores_as_the_hooks_draft(pair):
  directory = pair["directory"]
  (directory / "draft_model.gin").write_text(DRAFT_MODEL_GIN)
  target_files = _digest(pair["target"])
  model_dir = directory / "model"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(t5x_setup.REPO_ROOT), str(HERE)]))
  run = subprocess.run(
      [sys.executable, "-m", "t5x.train", f"--gin_search_paths={t5x_setup.REPO_ROOT}",
       "--gin_file=t5x/configs/runs/pretrain.gin",
       f"--gin_file={directory / 'draft_model.gin'}",
       "--gin_file=configs/t5x/distill_draft.gin",
       f"--gin.TARGET_CHECKPOINT_PATH='{pair['target']}'",
       f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={TRAIN_STEPS}"],
      env=env, capture_output=True, text=True, timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-5000:]
  # T5X saves the draft's initialization (checkpoint_0) before its first step.
  initial, trained = (str(model_dir / f"checkpoint_{step}") for step in (0, TRAIN_STEPS))
  # The target's checkpoint is as it was; the run's checkpoint is the draft's alone, which the
  # speculative hook reads as its draft (config from its shapes, parameters added to the
  # target's state as T5X restores it).
  assert _digest(pair["target"]) == target_files
  target_config = speculative.config_from_t5x(TARGET)
  assert speculative.draft_config_from_checkpoint(trained, target_config) == \
      speculative.config_from_t5x(DRAFT)
  state = speculative.restore_draft_params({"target": t5x_setup.load_params(pair["target"])},
                                           None, draft_checkpoint_path=trained)
  draft_params = state["target"][speculative.DRAFT_PARAMS_KEY]
  assert (jax.tree_util.tree_structure(draft_params)
          == jax.tree_util.tree_structure(pair["draft_params"]))
  # The training moved the draft towards the target on the task.
  model = distillation.distillation_version(t5x_setup.t5x_model(DRAFT), pair["target"])
  batch = _batch()
  before = _alpha(model, speculative.read_draft_params(initial), batch)
  after = _alpha(model, draft_params, batch)
  assert after > before + 0.1, (before, after)
