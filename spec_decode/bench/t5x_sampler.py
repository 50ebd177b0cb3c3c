"""T5X's standard sampler on a pair's target, for the peer suite (`spec_decode.t5x.sampler`: the
baseline the paper's Table 2 speeds up), jitted as T5X's own infer would jit it.

T5X is optional: `T5XSampler` raises RuntimeError naming why it cannot run (T5X not installed,
or for a language model T5X's decoder-only network not importable).
"""

from __future__ import annotations

import time

import gin
import jax
import numpy as np

from spec_decode.bench.decoders import RunOutput, generated_lengths
from spec_decode.bench.pairs import Pair
from spec_decode.t5 import network


class T5XSampler:
  """`run(temperature, repetition) -> RunOutput`: the pair's batch-1 input of that repetition
  decoded by T5X's model (greedy at temperature 0; else the whole distribution, topk 0), rng
  PRNGKey(repetition), timed from the call to its outputs on the host."""

  def __init__(self, pair: Pair):
    # T5X registers gin configurables when imported; the bench's config is locked by then.
    try:
      with gin.unlock_config():
        from spec_decode.t5x import sampler  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise RuntimeError(f"T5X is not installed ({e})") from None
    eos_id = pair.eos_id if pair.has_eos else -1
    try:
      sampler.sampler_model(pair.target.config, eos_id, 0.0)
    except ImportError as e:  # a language model's: T5X's decoder-only network is absent
      raise RuntimeError(str(e)) from None
    self.pair = pair
    self._predict = {}
    self._model = lambda temperature: sampler.sampler_model(pair.target.config, eos_id,
                                                            temperature)
    self._params = jax.device_put(pair.target.params)

  def run(self, temperature: float, repetition: int) -> RunOutput:
    if temperature not in self._predict:
      self._predict[temperature] = jax.jit(self._model(temperature).predict_batch_with_aux)
    tokens = self.pair.batch(repetition, 1)
    if self.pair.decoder_only:  # seqio.DecoderFeatureConverter's: BOS and prompt, then 0s
      decoder_input_tokens = np.zeros((1, self.pair.decode_length), np.int32)
      decoder_input_tokens[:, :tokens.shape[1]] = tokens
      causal_attention = (np.arange(self.pair.decode_length)[None]
                          <= np.asarray(network.prompt_lengths(tokens))[:, None])
      batch = {"decoder_input_tokens": decoder_input_tokens,
               "decoder_causal_attention": causal_attention.astype(np.int32)}
    else:
      batch = {"encoder_input_tokens": tokens,
               "decoder_input_tokens": np.zeros((1, self.pair.max_decode_len), np.int32)}
    rng = jax.random.PRNGKey(repetition)
    start = time.perf_counter()
    decodes = np.asarray(jax.block_until_ready(
        self._predict[temperature](self._params, batch, rng)[0]))
    seconds = time.perf_counter() - start
    limits = self.pair.new_tokens(tokens)
    return RunOutput(seconds, int(generated_lengths(decodes, self.pair.eos_id, limits).sum()),
                     decodes)
