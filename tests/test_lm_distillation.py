"""White-box distillation of a decoder-only draft language model (`draft_distillation` through
`lm.train_lm`'s `distillation`), on tiny random decoder-only pairs: a few steps on packed rows
lower the divergence and raise alpha while the target comes out bit-identical, packed rows are
scored as the same sentences one per row would be, the trainer distils on a target checkpoint
in the layout it writes itself, and what cannot work fails in one line before anything
compiles. (The divergences against hand computations: tests/test_divergences.py.)"""

import hashlib
import pathlib

import jax
import numpy as np
import optax
import pytest

import test_draft_distillation

from spec_decode import paths
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.training import data
from spec_decode.training import draft_distillation
from spec_decode.training import lm
from spec_decode.training import train

VOCAB_SIZE = 40


def _config(vocab_size: int, emb_dim: int, num_layers: int) -> network.DecoderOnlyConfig:
  return network.DecoderOnlyConfig(vocab_size=vocab_size, emb_dim=emb_dim, num_heads=2,
                                   head_dim=emb_dim // 2, num_layers=num_layers,
                                   mlp_dim=2 * emb_dim, mlp_activations=("gelu", "linear"),
                                   dropout_rate=0.0, logits_via_embedding=num_layers == 1)


TARGET = _config(VOCAB_SIZE, 32, 2)
DRAFT = _config(VOCAB_SIZE, 16, 1)
ROWS, LENGTH = 6, 16
OPTIMIZER = optax.adam(1e-2)


def _sequences(seed: int, count: int) -> list[list[int]]:
  """Random sentences (ids past pad/EOS/unk), each ending in EOS."""
  rng = np.random.default_rng(seed)
  return [list(rng.integers(3, VOCAB_SIZE, rng.integers(2, 7))) + [data.EOS_ID]
          for _ in range(count)]


def _packed(seed: int) -> dict[str, np.ndarray]:
  """ROWS packed rows of LENGTH (several sentences a row, as `train_lm` trains on)."""
  rows = lm.pack(_sequences(seed, 4 * ROWS), LENGTH)
  return {k: v[:ROWS] for k, v in rows.items()}


def _params():
  return (t5x_format.random_params(TARGET, seed=1), t5x_format.random_params(DRAFT, seed=2))


def _eval(distillation, target_params, draft_params, batches):
  sums = draft_distillation.eval_sums(distillation, TARGET, target_params, DRAFT, draft_params,
                                      batches)
  return sums["divergence_sum"] / sums["num_tokens"], sums["alpha_sum"] / sums["num_tokens"]


@pytest.mark.parametrize("divergence", ["tv", "forward_kl"])
def test_a_few_steps_on_packed_rows_lower_the_divergence_and_leave_the_target(divergence):
  distillation = draft_distillation.Distillation(target="unused", divergence=divergence)
  target_params, draft_params = _params()
  frozen = jax.tree_util.tree_map(np.array, target_params)
  target_params = jax.device_put(target_params)
  held_out = [_packed(100), _packed(101)]
  before = _eval(distillation, target_params, draft_params, held_out)
  state = train.create_state(DRAFT, OPTIMIZER, None, 0, params=draft_params)
  rng = jax.random.PRNGKey(0)
  for i in range(24):
    state, metrics = draft_distillation.train_step(
        state, _packed(i), rng, target_params=target_params, distillation=distillation,
        target_config=TARGET, draft_config=DRAFT, dropout=False)
    assert np.isfinite(float(metrics["loss_sum"]))
  after = _eval(distillation, target_params, state.params, held_out)
  assert after[0] < 0.8 * before[0], (before, after)
  assert after[1] > before[1] + 0.02, (before, after)
  # The gradient reached the draft (every leaf moved) and never the target: it was read, not
  # updated nor donated, bit-identical to the copy taken before.
  for initial, trained in zip(jax.tree_util.tree_leaves(draft_params),
                              jax.tree_util.tree_leaves(state.params), strict=True):
    assert not np.array_equal(initial, np.asarray(trained))
  for kept, now in zip(jax.tree_util.tree_leaves(frozen),
                       jax.tree_util.tree_leaves(target_params), strict=True):
    np.testing.assert_array_equal(kept, np.asarray(now))


def test_packed_rows_score_as_one_sentence_per_row():
  """The packing features reach both networks: a packed batch's divergence and alpha sums are
  those of its sentences each in a row of its own; without its segment ids and positions (the
  sentences of a row attending to each other) they are not."""
  distillation = draft_distillation.Distillation(target="unused", divergence="jsd", beta=0.3)
  target_params, draft_params = _params()
  sequences = _sequences(7, 9)
  packed = lm.pack(sequences, LENGTH)
  assert len(packed["decoder_target_tokens"]) < len(sequences)  # several sentences a row
  one_per_row = [lm.pack([sequence], LENGTH) for sequence in sequences]
  alone = {k: np.concatenate([rows[k] for rows in one_per_row]) for k in packed}

  def sums(batch):
    return draft_distillation.eval_sums(distillation, TARGET, target_params, DRAFT, draft_params,
                                        [batch])

  expected, found = sums(alone), sums(packed)
  assert set(found) == {"divergence_sum", "alpha_sum", "num_tokens", "alpha_t0_sum",
                        "alpha_t1_sum"}
  for key in expected:
    assert found[key] == pytest.approx(expected[key], rel=1e-5), key
  unsegmented = {k: v for k, v in packed.items() if k not in data.PACKING_FEATURES}
  assert sums(unsegmented)["divergence_sum"] != pytest.approx(expected["divergence_sum"],
                                                              rel=1e-3)


# The trainer end to end: tiny models of the demo vocabulary's size on a toy text.
DEMO_VOCAB = paths.DEMO_ASSETS / "spm_ende_8k.model"
TRAINER_TARGET = _config(8000, 32, 2)
TRAINER_DRAFT = _config(8000, 16, 1)
SENTENCES = [f"I see {n} {a}." for n in ("one", "two", "three", "four", "five", "six")
             for a in ("dogs", "cats", "horses", "birds")]


def _write_checkpoint(directory: pathlib.Path, config: network.DecoderOnlyConfig,
                      seed: int) -> str:
  """A model of `config` saved as `train_lm` saves its own (`train.save_checkpoint`): returns
  its T5X checkpoint, what `spec_decode.infer` and the distillation's target restore."""
  params = t5x_format.random_params(config, seed)
  state = train.create_state(config, OPTIMIZER, None, seed, params=params)
  train.save_checkpoint(state, directory, keep=1, t5x_layout=True)
  return str(directory / "t5x" / "checkpoint_0")


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("lm_distill")
  (root / "toy.en").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
  for name, config, seed in (("target", TRAINER_TARGET, 1), ("draft", TRAINER_DRAFT, 2),
                             ("other_vocabulary", _config(9000, 32, 2), 3)):
    (root / name).mkdir()
    _write_checkpoint(root / name, config, seed)
  return root


def _train_lm(root: pathlib.Path, model_dir: pathlib.Path, distillation, **kwargs):
  arguments = dict(config=TRAINER_DRAFT, optimizer=OPTIMIZER, vocab_path=str(DEMO_VOCAB),
                   train_files=["toy.en"], eval_files=["toy.en"], data_root=str(root),
                   sequence_length=32, batch_size=4, clip_grad_norm=None, num_train_steps=3,
                   eval_every=3, eval_batch_size=4, checkpoint_every=3, log_every=1,
                   distillation=distillation)
  return lm.train_lm(str(model_dir), **{**arguments, **kwargs})


def _digest(directory: pathlib.Path) -> str:
  files = sorted(p for p in directory.rglob("*") if p.is_file())
  return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


@pytest.mark.slow  # the trainer end to end: text, vocabulary, checkpoints, evaluation
def test_the_lm_trainer_distills_on_its_own_checkpoint_and_leaves_the_target(toy, tmp_path,
                                                                             capsys):
  target = str(toy / "target" / "t5x" / "checkpoint_0")
  target_digest = _digest(toy / "target")
  distillation = draft_distillation.Distillation(target=target, divergence="forward_kl")
  initial = str(toy / "draft" / "t5x" / "checkpoint_0")
  metrics = _train_lm(toy, tmp_path / "run", distillation, initial_model=initial)
  assert set(metrics) == {"eval_loss", "eval_perplexity", "eval_accuracy", "eval_forward_kl",
                          "eval_alpha", "eval_alpha_t0", "eval_alpha_t1"}
  # Distilled at temperature 1: alpha at T=1 is the distillation temperature's.
  assert metrics["eval_alpha_t1"] == pytest.approx(metrics["eval_alpha"], rel=1e-5)
  assert 0.0 < metrics["eval_alpha"] < 1.0 and 0.0 <= metrics["eval_alpha_t0"] <= 1.0
  assert "alpha " in capsys.readouterr().out
  assert _digest(toy / "target") == target_digest
  # The trained draft restores as spec_decode.infer restores a draft; training started from
  # the initial draft (not a fresh initialization) and moved it.
  trained = formats.load_params(network.module_of(TRAINER_DRAFT),
                                str(tmp_path / "run" / "t5x" / "checkpoint_3"))
  initial_params = formats.load_params(network.module_of(TRAINER_DRAFT), initial)
  fresh = train.init_params(TRAINER_DRAFT, jax.random.PRNGKey(0))
  assert (0 < test_draft_distillation.parameter_distance(trained, initial_params)
          < test_draft_distillation.parameter_distance(trained, fresh))


@pytest.mark.parametrize("target, settings, kwargs, message", [
    ("other_vocabulary/t5x/checkpoint_0", {}, {},
     "target and draft vocabularies differ: the target has 9000 ids, the draft 8000"),
    ("missing/t5x/checkpoint_7", {}, {},
     "the distillation target does not restore: checkpoint not found: {root}/missing/t5x/"
     "checkpoint_7"),
    ("target/t5x/checkpoint_0", {"data_source": "draft_sample"}, {},
     "data source 'draft_sample' decodes an encoder-decoder's inputs: a decoder-only model "
     "takes 'dataset' only"),
    ("target/t5x/checkpoint_0", {}, {"label_smoothing": 0.1},
     "z_loss and label_smoothing are cross-entropy's: they cannot take effect with "
     "distillation"),
])
def test_the_lm_trainer_refuses_what_cannot_work(toy, tmp_path, target, settings, kwargs,
                                                 message):
  distillation = draft_distillation.Distillation(target=str(toy / target), **settings)
  with pytest.raises(ValueError) as raised:
    _train_lm(toy, tmp_path / "run", distillation, **kwargs)
  assert str(raised.value) == message.format(root=toy)
  assert not (tmp_path / "run").exists()


def test_a_target_of_the_other_family_does_not_restore(toy, tmp_path):
  encoder_decoder = network.T5Config(
      vocab_size=8000, emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
      num_decoder_layers=1, mlp_dim=32, mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  path = t5x_format.save_t5x(t5x_format.random_params(encoder_decoder, 4), str(tmp_path), 0)
  distillation = draft_distillation.Distillation(target=path)
  with pytest.raises(ValueError) as raised:
    _train_lm(toy, tmp_path / "run", distillation)
  assert "\n" not in str(raised.value)
  assert str(raised.value).startswith(f"{path}: an encoder-decoder (T5) checkpoint"), raised.value
