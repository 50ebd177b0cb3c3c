"""The trainer learns, and a resumed run is bitwise identical to an uninterrupted one.

Uses a tiny model on a small synthetic parallel corpus written to a temporary directory, with
the shipped demo vocabulary; evaluation (BLEU) is disabled to keep the test fast.
"""
import pathlib

import jax
import numpy as np
import optax
import pytest
import sentencepiece as spm

from spec_decode.data import corpora
from spec_decode import paths
from spec_decode.training import data
from spec_decode.t5 import network
from spec_decode.training import train

# The slow tier (trains and resumes).
pytestmark = pytest.mark.slow

VOCAB = paths.DEMO_ASSETS / "spm_ende_8k.model"
TINY = network.T5Config(vocab_size=8000, emb_dim=32, num_heads=2, head_dim=16,
                        num_encoder_layers=1, num_decoder_layers=1, mlp_dim=64,
                        mlp_activations=("gelu", "linear"), dropout_rate=0.0)
NUMBERS = [("one", "eins"), ("two", "zwei"), ("three", "drei"), ("four", "vier"),
           ("five", "fünf"), ("six", "sechs")]
ANIMALS = [("dog", "Hund"), ("cat", "Katze"), ("horse", "Pferd"), ("bird", "Vogel")]
# One optimizer object (clipping included, so the trainer adds no wrapper of its own) for every
# run: it is static state of the jitted train step, so sharing it means a single compilation.
OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("corpus")
  pairs = [(f"I see {n_en} {a_en}.", f"Ich sehe {n_de} {a_de}.")
           for n_en, n_de in NUMBERS for a_en, a_de in ANIMALS]
  (root / "toy.en").write_text("\n".join(en for en, _ in pairs) + "\n", encoding="utf-8")
  (root / "toy.de").write_text("\n".join(de for _, de in pairs) + "\n", encoding="utf-8")
  return root


def _train(model_dir: pathlib.Path, corpus: pathlib.Path, steps: int) -> None:
  train.train(str(model_dir), config=TINY, optimizer=OPTIMIZER, vocab_path=str(VOCAB),
              train_corpora=["toy"], eval_corpus="toy", data_root=str(corpus),
              max_input_len=32, max_target_len=16, tokens_per_batch=128,
              bucket_boundaries=(32,), clip_grad_norm=None, num_train_steps=steps, eval_every=None,
              checkpoint_every=2, t5x_checkpoints=False, log_every=100, seed=1)


def test_loss_goes_down(corpus):
  sp = spm.SentencePieceProcessor(model_file=str(VOCAB))
  sources, targets = corpora.read_parallel(["toy"], data_root=str(corpus))
  stream = data.BatchStream(data.encode_pairs(sp, sources, targets, 32, 16),
                            tokens_per_batch=128, boundaries=(32,))
  state = train.create_state(TINY, OPTIMIZER, clip_grad_norm=None, seed=1)
  rng = jax.random.PRNGKey(0)
  losses = []
  for step in range(12):
    state, metrics = train.train_step(state, stream.batch_at(step), rng, 0.0, 0.0, False)
    losses.append(float(metrics["loss_sum"] / metrics["num_tokens"]))
  assert losses[-1] < 0.7 * losses[0], losses


def test_resume_is_bitwise_identical(corpus, tmp_path):
  _train(tmp_path / "straight", corpus, steps=6)
  _train(tmp_path / "resumed", corpus, steps=3)  # checkpoints at steps 2 and 3
  assert train.latest_checkpoint(tmp_path / "resumed").name == "checkpoint_3.msgpack"
  _train(tmp_path / "resumed", corpus, steps=6)

  def restore(model_dir):
    state = train.create_state(TINY, OPTIMIZER, clip_grad_norm=None, seed=1)
    return train.restore_checkpoint(state, train.latest_checkpoint(model_dir))

  straight, resumed = restore(tmp_path / "straight"), restore(tmp_path / "resumed")
  assert int(straight.step) == int(resumed.step) == 6
  for a, b in zip(jax.tree_util.tree_leaves((straight.params, straight.opt_state)),
                  jax.tree_util.tree_leaves((resumed.params, resumed.opt_state)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # And the restored state differs from a fresh one: the checkpoint really carries training.
  fresh = train.create_state(TINY, OPTIMIZER, clip_grad_norm=None, seed=1)
  assert not np.array_equal(fresh.params["token_embedder"]["embedding"],
                            straight.params["token_embedder"]["embedding"])


def test_train_vocab_writes_a_vocabulary_with_t5s_special_ids(corpus, tmp_path):
  """The demo vocabulary's trainer (its model card names it): T5's special ids, no BOS, and
  every character of the corpus and of the task prefix (which it adds to the corpus) a piece."""
  path = data.train_vocab(["toy"], str(tmp_path / "toy"), vocab_size=40, data_root=str(corpus))
  sp = spm.SentencePieceProcessor(model_file=path)
  assert sp.get_piece_size() == 40
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  for text in (corpora.TRANSLATE_PREFIX.strip(), "I see five birds.", "Ich sehe fünf Vogel."):
    assert sp.unk_id() not in sp.encode(text), text
    assert sp.decode(sp.encode(text)) == text
