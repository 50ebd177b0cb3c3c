"""`call_costs`' timed sequences make the calls they describe: a call marked `one_logits` asks
for its last fed token's logits alone, as the draft's catch-up call does in the engine."""

import jax
import numpy as np
import pytest

from spec_decode.runtime import call_costs
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

CONFIG = network.T5Config(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                          num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)


@pytest.mark.parametrize("one_logits", [False, True])
def test_a_one_logits_call_asks_for_its_last_fed_tokens_logits(monkeypatch, one_logits):
  asked, returned = [], []  # logits_index (None, or its values once run), logits shapes
  make = network.make_tokens_to_logits

  def recording_make(module, params):
    tokens_to_logits = make(module, params)

    def call(state):
      if state.logits_index is None:
        asked.append(None)
      else:
        jax.debug.callback(lambda index: asked.append(np.asarray(index).tolist()),
                           state.logits_index)
      logits, cache = tokens_to_logits(state)
      returned.append(logits.shape)
      return logits, cache
    return call

  monkeypatch.setattr(network, "make_tokens_to_logits", recording_make)
  call = call_costs.Call(network.Transformer(CONFIG), t5x_format.random_params(CONFIG, seed=0),
                         3, one_logits)
  assert np.isfinite(call_costs.compile_call_sequence([call], 1, 4, 8, loops=2)())
  if one_logits:
    assert asked == [[2], [2]] and returned == [(1, 1, 32)]  # traced once, ran twice
  else:
    assert asked == [None] and returned == [(1, 3, 32)]
