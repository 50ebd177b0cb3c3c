"""`spec_decode.training.lm`: packing keeps sentences apart, and a few steps on a tiny
decoder-only model lower the loss."""
import jax
import numpy as np
import optax
import sentencepiece as spm

from spec_decode import paths
from spec_decode.t5 import network
from spec_decode.training import lm
from spec_decode.training import train

VOCAB = paths.DEMO_ASSETS / "spm_ende_8k.model"
TINY = network.DecoderOnlyConfig(vocab_size=8000, emb_dim=32, num_heads=2, head_dim=16,
                                 num_layers=1, mlp_dim=64, mlp_activations=("gelu", "linear"),
                                 dropout_rate=0.0)
SENTENCES = [f"I see {n} {a}." for n in ("one", "two", "three", "four", "five", "six")
             for a in ("dogs", "cats", "horses", "birds")]


def test_pack_makes_one_segment_per_sequence_with_bos_inputs():
  rows = lm.pack([[5, 6, 1], [7, 1], [8, 9, 10, 11, 12, 1], [4, 1]], length=6)
  np.testing.assert_array_equal(rows["decoder_target_tokens"],
                                [[5, 6, 1, 7, 1, 0], [8, 9, 10, 11, 12, 1], [4, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(rows["decoder_input_tokens"],
                                [[0, 5, 6, 0, 7, 0], [0, 8, 9, 10, 11, 12], [0, 4, 0, 0, 0, 0]])
  np.testing.assert_array_equal(rows["decoder_segment_ids"],
                                [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(rows["decoder_positions"][0], [0, 1, 2, 0, 1, 0])
  np.testing.assert_array_equal(rows["decoder_loss_weights"][2], [1, 1, 0, 0, 0, 0])
  assert len(lm.pack([[1] * 7], length=6)["decoder_target_tokens"]) == 1  # dropped, one empty row


def test_loss_goes_down():
  sp = spm.SentencePieceProcessor(model_file=str(VOCAB))
  stream = lm.PackedStream(lm.pack(lm.encode(sp, SENTENCES), 32), batch_size=4, seed=0)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
  state = train.create_state(TINY, optimizer, clip_grad_norm=None, seed=1)
  assert set(state.params) == {"decoder"}  # T5X's decoder-only tree
  rng = jax.random.PRNGKey(0)
  losses = []
  for step in range(12):
    state, metrics = train.train_step(state, stream.batch_at(step), rng, 0.0, 0.0, False)
    losses.append(float(metrics["loss_sum"] / metrics["num_tokens"]))
  assert losses[-1] < 0.7 * losses[0], losses
