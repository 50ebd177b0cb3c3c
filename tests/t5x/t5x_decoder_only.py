"""T5X's own decoder-only network for the tests that compare the hook's decoder-only model with
it (`spec_decode.t5x.decoder_only_network`). `network()` returns the module; the test skips only
where the T5X installation lacks the example, and fails on an error inside it. `decoder_batch`
writes the batches T5X's decoder-only models train and decode on."""

import types

import numpy as np
import pytest

from spec_decode.t5x import decoder_only_network

SKIP_REASON = ("needs T5X's decoder-only network (t5x/examples/decoder_only/network.py), absent "
               "from this T5X installation: install T5X from its repository (README: Tests)")


def network() -> types.ModuleType:
  """T5X's `t5x.examples.decoder_only.network`, or the test skips where T5X lacks it."""
  try:
    return decoder_only_network.network()
  except ImportError as error:
    if error.name != decoder_only_network.MODULE:
      raise
    pytest.skip(SKIP_REASON)


def decoder_batch(rows: list[tuple[list[int], list[int]]], length: int) -> dict[str, np.ndarray]:
  """A batch as `seqio.DecoderFeatureConverter` writes one, rows of (prompt, targets): targets =
  prompt + targets, inputs shifted right behind BOS 0, causal attention 1 over BOS and the
  prompt, loss weights on the targets."""
  batch = {name: np.zeros((len(rows), length), np.int32)
           for name in ("decoder_target_tokens", "decoder_input_tokens",
                        "decoder_causal_attention", "decoder_loss_weights")}
  for row, (prompt, targets) in enumerate(rows):
    sequence = prompt + targets
    batch["decoder_target_tokens"][row, :len(sequence)] = sequence
    batch["decoder_input_tokens"][row, 1:len(sequence)] = sequence[:-1]
    batch["decoder_causal_attention"][row, :len(prompt) + 1] = 1
    batch["decoder_loss_weights"][row, len(prompt):len(sequence)] = 1
  return batch
