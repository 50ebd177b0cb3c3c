"""T5X's token loss, used by `models.EncoderDecoderModel.loss_fn` and the trainer.

`cross_entropy_with_logits(logits [B, L, V], targets [B, L], z_loss, label_smoothing)` ->
(per-token loss including the z-loss term [B, L], the z-loss term alone [B, L]), as T5X's
`t5x/losses.py`: the caller weights and sums them.
"""

import jax
import jax.numpy as jnp


def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array, z_loss: float,
                              label_smoothing: float) -> tuple[jax.Array, jax.Array]:
  """Per-token T5X cross-entropy: returns (loss incl. z-loss, z-loss part), both [B, L].

  With label smoothing the constant entropy of the smoothed target is subtracted (as T5X
  does) so that a perfect model scores 0.
  """
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low_confidence = label_smoothing / (vocab_size - 1)
  normalizer = -(confidence * jnp.log(confidence) +
                 (vocab_size - 1) * low_confidence * jnp.log(low_confidence + 1e-20))
  soft_targets = jax.nn.one_hot(targets, vocab_size) * (confidence - low_confidence) + low_confidence
  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_probs = logits - log_z[..., None]
  z_term = z_loss * jnp.square(log_z)
  loss = -jnp.sum(soft_targets * log_probs, axis=-1) - normalizer + z_term
  return loss, z_term
