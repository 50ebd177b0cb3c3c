"""T5X's standard sampler on a pair's target, for the peer suite: `t5x.models.EncoderDecoderModel`
over T5X's own network (`t5x.examples.t5.network`) decoding with `t5x.decoding.temperature_sample`
(the baseline the paper's Table 2 speeds up), jitted as T5X's own infer would jit it.

T5X is optional: `T5XSampler` raises RuntimeError naming why it cannot run (T5X not installed).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import gin
import jax
import numpy as np

from spec_decode.bench.decoders import RunOutput, generated_lengths
from spec_decode.bench.pairs import Pair


class T5XSampler:
  """`run(temperature, repetition) -> RunOutput`: the pair's batch-1 input of that repetition
  decoded by T5X's model (greedy at temperature 0; else the whole distribution, topk 0), rng
  PRNGKey(repetition), timed from the call to its outputs on the host."""

  def __init__(self, pair: Pair):
    # T5X registers gin configurables when imported; the bench's config is locked by then.
    try:
      with gin.unlock_config():
        # pylint: disable=import-outside-toplevel
        import seqio
        from t5x import decoding as t5x_decoding
        from t5x import models as t5x_models
        from t5x.examples.t5 import network as t5x_network
    except ImportError as e:
      raise RuntimeError(f"T5X is not installed ({e})") from None
    config = pair.target.config
    t5x_config = t5x_network.T5Config(**{
        field.name: getattr(config, field.name)
        for field in dataclasses.fields(t5x_network.T5Config)
        if hasattr(config, field.name)})
    vocabulary = seqio.PassThroughVocabulary(config.vocab_size,
                                             eos_id=pair.eos_id if pair.has_eos else -1)
    self.pair = pair
    self._models = {}
    self._build = lambda temperature: t5x_models.EncoderDecoderModel(
        t5x_network.Transformer(t5x_config), vocabulary, vocabulary, optimizer_def=None,
        decode_fn=functools.partial(t5x_decoding.temperature_sample, temperature=temperature,
                                    topk=0))
    self._params = jax.device_put(pair.target.params)

  def _predict(self, temperature: float):
    if temperature not in self._models:
      self._models[temperature] = jax.jit(self._build(temperature).predict_batch_with_aux)
    return self._models[temperature]

  def run(self, temperature: float, repetition: int) -> RunOutput:
    encoder_tokens = self.pair.batch(repetition, 1)
    batch = {"encoder_input_tokens": encoder_tokens,
             "decoder_input_tokens": np.zeros((1, self.pair.max_decode_len), np.int32)}
    predict = self._predict(temperature)
    rng = jax.random.PRNGKey(repetition)
    start = time.perf_counter()
    decodes = np.asarray(jax.block_until_ready(predict(self._params, batch, rng)[0]))
    seconds = time.perf_counter() - start
    return RunOutput(seconds, int(generated_lengths(decodes, self.pair.eos_id).sum()), decodes)
