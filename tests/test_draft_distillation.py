"""`spec_decode.training.draft_distillation` and the trainer's `distillation` option, on tiny
random target/draft pairs (`tiny_t5`): a few steps lower the divergence and raise alpha, the
target's parameters come out bit-identical, on-policy batches are the draft's own decodes (and
a mixture's other rows the task's targets), and bad settings fail in one line before anything
compiles."""

import dataclasses
import pathlib

import flax.serialization
import jax
import numpy as np
import optax
import pytest

import tiny_t5
from spec_decode import paths
from spec_decode.checkpoints import demo_pair
from spec_decode.checkpoints import t5x_format
from spec_decode.training import data
from spec_decode.training import draft_distillation
from spec_decode.training import greedy
from spec_decode.training import train

VOCAB_SIZE = 40
TARGET = tiny_t5.tiny_config(VOCAB_SIZE, tiny_t5.SHRINK)
DRAFT = tiny_t5.tiny_config(VOCAB_SIZE, tiny_t5.DRAFT_SHRINK)
BATCH, LENGTH = 8, 10
OPTIMIZER = optax.adam(1e-2)


def _batch(seed: int) -> dict[str, np.ndarray]:
  """Random inputs and targets (ids past pad/EOS/unk), each row ending in EOS."""
  rng = np.random.default_rng(seed)
  inputs = [np.append(rng.integers(3, VOCAB_SIZE, rng.integers(3, LENGTH)), data.EOS_ID)
            for _ in range(BATCH)]
  targets = [np.append(rng.integers(3, VOCAB_SIZE, rng.integers(3, LENGTH)), data.EOS_ID)
             for _ in range(BATCH)]
  return data.pad_batch(inputs, targets, LENGTH, LENGTH)


def _params():
  return (t5x_format.random_params(TARGET, seed=1), t5x_format.random_params(DRAFT, seed=2))


def _step(distillation, target_params):
  return lambda state, batch, rng: draft_distillation.train_step(
      state, batch, rng, target_params=target_params, distillation=distillation,
      target_config=TARGET, draft_config=DRAFT, dropout=False)


def _eval(distillation, target_params, draft_params, batches):
  sums = draft_distillation.eval_sums(distillation, TARGET, target_params, DRAFT, draft_params,
                                      batches)
  return sums["divergence_sum"] / sums["num_tokens"], sums["alpha_sum"] / sums["num_tokens"]


@pytest.mark.parametrize("divergence, data_source", [("tv", "draft_sample"),
                                                      ("forward_kl", "dataset")])
def test_a_few_steps_lower_the_divergence_and_raise_alpha(divergence, data_source):
  distillation = draft_distillation.Distillation(target="unused", divergence=divergence,
                                                 data_source=data_source)
  target_params, draft_params = _params()
  frozen = jax.tree_util.tree_map(np.array, target_params)
  target_params = jax.device_put(target_params)
  held_out = [_batch(100), _batch(101)]
  before = _eval(distillation, target_params, draft_params, held_out)
  state = train.create_state(DRAFT, OPTIMIZER, None, 0, params=draft_params)
  step, rng = _step(distillation, target_params), jax.random.PRNGKey(0)
  for i in range(12):
    state, metrics = step(state, _batch(i), rng)
    assert np.isfinite(float(metrics["loss_sum"]))
  after = _eval(distillation, target_params, state.params, held_out)
  assert after[0] < 0.8 * before[0], (before, after)
  assert after[1] > before[1] + 0.02, (before, after)
  # The target was read, never updated nor donated: bit-identical to the copy taken before.
  for kept, now in zip(jax.tree_util.tree_leaves(frozen),
                       jax.tree_util.tree_leaves(target_params), strict=True):
    np.testing.assert_array_equal(kept, np.asarray(now))


def test_a_resumed_run_samples_and_steps_as_an_uninterrupted_one():
  """On-policy samples use fold_in(rng, step): a state restored from its bytes continues exactly
  as the uninterrupted run does."""
  distillation = draft_distillation.Distillation(target="unused", divergence="tv",
                                                 data_source="draft_sample")
  target_params, draft_params = _params()
  step, rng = _step(distillation, jax.device_put(target_params)), jax.random.PRNGKey(0)

  def run(state, steps):
    for i in steps:
      state, _ = step(state, _batch(i), rng)
    return state

  straight = run(train.create_state(DRAFT, OPTIMIZER, None, 0, params=draft_params), range(4))
  half = run(train.create_state(DRAFT, OPTIMIZER, None, 0, params=draft_params), range(2))
  fresh = train.create_state(DRAFT, OPTIMIZER, None, 0, params=draft_params)
  restored = flax.serialization.from_bytes(fresh, flax.serialization.to_bytes(half))
  resumed = run(restored, range(2, 4))
  for a, b in zip(jax.tree_util.tree_leaves(straight.params),
                  jax.tree_util.tree_leaves(resumed.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_on_policy_batches_are_the_drafts_own_decodes():
  target_params, draft_params = _params()
  batch = _batch(7)
  rng = jax.random.PRNGKey(3)

  def built(source, temperature, **kwargs):
    distillation = draft_distillation.Distillation(
        target="unused", data_source=source, temperature=temperature, **kwargs)
    return jax.tree_util.tree_map(np.asarray, draft_distillation.training_batch(
        distillation, TARGET, target_params, DRAFT, draft_params, batch, rng))

  def greedy_of(config, params):  # the trainer's greedy decoder, another path to the core
    return np.asarray(greedy.greedy_decode(config, params, batch["encoder_input_tokens"], LENGTH))

  # Near temperature 0 the draft's samples are its greedy decodes, not the target's.
  draft_greedy, target_greedy = greedy_of(DRAFT, draft_params), greedy_of(TARGET, target_params)
  assert not np.array_equal(draft_greedy, target_greedy)
  on_policy = built("draft_sample", 1e-4)
  np.testing.assert_array_equal(on_policy["decoder_target_tokens"], draft_greedy)
  np.testing.assert_array_equal(built("target_greedy", 1.0)["decoder_target_tokens"],
                                target_greedy)
  # Decoder inputs are the targets shifted right; weights cover each row up to its first EOS.
  targets = on_policy["decoder_target_tokens"]
  np.testing.assert_array_equal(on_policy["decoder_input_tokens"][:, 1:], targets[:, :-1])
  assert not on_policy["decoder_input_tokens"][:, 0].any()
  for row, weights in zip(targets, on_policy["decoder_loss_weights"]):
    eos = np.flatnonzero(row == data.EOS_ID)
    end = eos[0] + 1 if eos.size else LENGTH
    np.testing.assert_array_equal(weights, np.arange(LENGTH) < end)
  # At temperature 1 the samples differ from the greedy decodes (they are samples) and follow
  # the rng; the encoder inputs are the batch's.
  sampled = built("draft_sample", 1.0)
  assert not np.array_equal(sampled["decoder_target_tokens"], draft_greedy)
  np.testing.assert_array_equal(sampled["encoder_input_tokens"], batch["encoder_input_tokens"])
  # A mixture: the first round(fraction * B) rows are the draft's samples, the rest the task's.
  mixture = built("mixture", 1e-4, draft_sample_fraction=0.4)
  rows = round(0.4 * BATCH)
  np.testing.assert_array_equal(mixture["decoder_target_tokens"][:rows], draft_greedy[:rows])
  for key in ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"):
    np.testing.assert_array_equal(mixture[key][rows:], batch[key][rows:])


@pytest.mark.parametrize("kwargs, message", [
    (dict(divergence="kl"), "unknown divergence 'kl'; known: forward_kl, jsd, reverse_kl, tv"),
    (dict(divergence="tv", beta=0.3),
     "beta is the 'jsd' divergence's; it cannot take effect with 'tv'"),
    (dict(divergence="jsd", beta=1.5), "beta must be in (0, 1), got 1.5"),
    (dict(temperature=0.0), "the divergence temperature must be > 0, got 0.0"),
    (dict(data_source="replay"), "unknown data source 'replay'; known: dataset, target_greedy, "
                                 "target_sample, draft_sample, mixture"),
    (dict(data_source="mixture"),
     "data source 'mixture' needs a draft_sample_fraction in (0, 1), got None"),
    (dict(data_source="mixture", draft_sample_fraction=1.0),
     "data source 'mixture' needs a draft_sample_fraction in (0, 1), got 1.0"),
    (dict(data_source="draft_sample", draft_sample_fraction=0.5),
     "draft_sample_fraction takes effect with data source 'mixture' only, not 'draft_sample'"),
])
def test_bad_settings_are_one_line(kwargs, message):
  with pytest.raises(ValueError) as raised:
    draft_distillation.Distillation(target="target", **kwargs)
  assert str(raised.value) == message


# The trainer end to end: demo-format files of the tiny pair with the demo vocabulary's size.
DEMO_VOCAB = paths.DEMO_ASSETS / "spm_ende_8k.model"
TRAINER_TARGET = dataclasses.replace(TARGET, vocab_size=8000)
TRAINER_DRAFT = dataclasses.replace(DRAFT, vocab_size=8000)


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("distill_pair")
  for name, config, seed in (("target", TRAINER_TARGET, 1), ("draft", TRAINER_DRAFT, 2),
                             ("other_vocabulary", dataclasses.replace(TARGET, vocab_size=64), 3)):
    demo_pair.save_model(t5x_format.random_params(config, seed), config,
                         root / f"{name}.safetensors")
  pairs = [("A dog runs.", "Ein Hund rennt."), ("Two cats sleep.", "Zwei Katzen schlafen."),
           ("A man reads.", "Ein Mann liest."), ("Children play.", "Kinder spielen.")] * 4
  (root / "toy.en").write_text("".join(en + "\n" for en, _ in pairs), encoding="utf-8")
  (root / "toy.de").write_text("".join(de + "\n" for _, de in pairs), encoding="utf-8")
  return root


def _train(root: pathlib.Path, model_dir: pathlib.Path, distillation, **kwargs):
  arguments = dict(config=TRAINER_DRAFT, optimizer=OPTIMIZER, vocab_path=str(DEMO_VOCAB),
                   train_corpora=["toy"], eval_corpus="toy", data_root=str(root),
                   max_input_len=32, max_target_len=16, tokens_per_batch=128,
                   bucket_boundaries=(32,), clip_grad_norm=None, num_train_steps=3,
                   eval_every=None, checkpoint_every=3, t5x_checkpoints=False, log_every=1,
                   distillation=distillation)
  return train.train(str(model_dir), **{**arguments, **kwargs})


def test_the_run_starts_from_initial_model_or_its_older_name():
  older = draft_distillation.Distillation(target="target", initial_draft="draft")
  assert draft_distillation.start_from(older, None) == "draft"
  assert draft_distillation.start_from(None, "draft") == "draft"
  assert draft_distillation.start_from(None, None) is None
  with pytest.raises(ValueError, match="^the run's starting point is set twice: initial_model "
                                       "'target' and Distillation.initial_draft 'draft'"):
    draft_distillation.start_from(older, "target")


def test_a_run_starts_from_a_model_of_its_architecture_whatever_its_dropout(pair_files):
  # Continued training may add dropout: the stored model's (0) is not part of its architecture.
  stored_file = str(pair_files / "target.safetensors")
  with_dropout = dataclasses.replace(TRAINER_TARGET, dropout_rate=0.1)
  params = train.initial_state_params(stored_file, with_dropout)
  _, stored = demo_pair.load_model(stored_file)
  assert parameter_distance(params, stored) == 0.0
  deeper = dataclasses.replace(with_dropout,
                               num_decoder_layers=TRAINER_TARGET.num_decoder_layers + 1)
  with pytest.raises(ValueError, match=r"^the initial model .*target\.safetensors: the "
                                       r"checkpoint's config differs from the model's: "
                                       r"num_decoder_layers \d+ \(model: \d+\)$"):
    train.initial_state_params(stored_file, deeper)


def parameter_distance(a, b) -> float:
  """The L1 distance of two parameter trees of one structure."""
  return sum(float(np.abs(np.asarray(x) - np.asarray(y)).sum())
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b),
                             strict=True))


@pytest.mark.slow  # the trainer end to end: corpus, vocabulary, evaluation with BLEU
def test_the_trainer_distills_from_the_initial_draft_and_leaves_the_target(pair_files, tmp_path,
                                                                            capsys):
  target_file = pair_files / "target.safetensors"
  target_bytes = target_file.read_bytes()
  distillation = draft_distillation.Distillation(
      target=str(target_file), divergence="jsd", data_source="mixture",
      draft_sample_fraction=0.5)
  metrics = _train(pair_files, tmp_path / "run", distillation, eval_every=3, bleu_examples=2,
                   eval_batch_size=4, initial_model=str(pair_files / "draft.safetensors"))
  assert set(metrics) == {"eval_jsd", "eval_alpha", "eval_alpha_t0", "eval_alpha_t1",
                          "eval_bleu"}
  # Distilled at temperature 1: alpha at T=1 is the distillation temperature's.
  assert metrics["eval_alpha_t1"] == pytest.approx(metrics["eval_alpha"], rel=1e-5)
  assert 0.0 < metrics["eval_alpha"] < 1.0 and 0.0 <= metrics["eval_alpha_t0"] <= 1.0
  log = capsys.readouterr().out
  assert "alpha " in log and "acc " not in log
  assert target_file.read_bytes() == target_bytes
  # Training started from the initial draft (not a fresh initialization) and moved it.
  _, initial = demo_pair.load_model(pair_files / "draft.safetensors")
  state = train.create_state(TRAINER_DRAFT, OPTIMIZER, None, 0)
  trained = train.restore_checkpoint(state, train.latest_checkpoint(tmp_path / "run")).params
  fresh = train.init_params(TRAINER_DRAFT, jax.random.PRNGKey(0))
  assert 0 < parameter_distance(trained, initial) < parameter_distance(trained, fresh)


@pytest.mark.parametrize("name, kwargs, message", [
    ("other_vocabulary", {}, "target and draft vocabularies differ: the target has 64 ids, "
                             "the draft 8000"),
    ("target", {"z_loss": 1e-4}, "z_loss and label_smoothing are cross-entropy's: they cannot "
                                 "take effect with distillation"),
])
def test_the_trainer_refuses_what_cannot_take_effect(pair_files, tmp_path, name, kwargs,
                                                     message):
  distillation = draft_distillation.Distillation(target=str(pair_files / f"{name}.safetensors"))
  with pytest.raises(ValueError) as raised:
    _train(pair_files, tmp_path / "run", distillation, **kwargs)
  assert str(raised.value) == message
  assert not list((tmp_path / "run").glob("checkpoint_*"))
