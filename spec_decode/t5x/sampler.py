"""T5X's standard decoders over a network config of this package: `t5x.models.EncoderDecoderModel`
with T5X's own network (`t5x.examples.t5.network`) and `t5x.decoding.temperature_sample`, the
baseline the paper's Table 2 speeds up (the benchmark's peer suite times it on the same weights:
this package's parameter tree is T5X's), or `t5x.decoding.beam_search`
(`scripts/beam_search_bench.py --t5x` times it beside ours)."""

import dataclasses
import functools

import seqio
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x.examples.t5 import network as t5x_network

from spec_decode.t5 import network


def _model(config: network.T5Config, eos_id: int, decode_fn) -> t5x_models.EncoderDecoderModel:
  t5x_config = t5x_network.T5Config(**{
      field.name: getattr(config, field.name) for field in dataclasses.fields(t5x_network.T5Config)
      if hasattr(config, field.name)})
  vocabulary = seqio.PassThroughVocabulary(config.vocab_size, eos_id=eos_id)
  return t5x_models.EncoderDecoderModel(
      t5x_network.Transformer(t5x_config), vocabulary, vocabulary, optimizer_def=None,
      decode_fn=decode_fn)


def sampler_model(config: network.T5Config, eos_id: int,
                  temperature: float) -> t5x_models.EncoderDecoderModel:
  """T5X's model of `config` decoding greedily at temperature 0, else from the whole
  distribution (topk 0); its vocabularies pass ids through, with `eos_id` (-1: none)."""
  return _model(config, eos_id, functools.partial(t5x_decoding.temperature_sample,
                                                  temperature=temperature, topk=0))


def beam_search_model(config: network.T5Config, eos_id: int,
                      alpha: float) -> t5x_models.EncoderDecoderModel:
  """T5X's model of `config` decoding with its `beam_search` (brevity `alpha`; the beams are
  predict_batch_with_aux's num_decodes); vocabularies as `sampler_model`'s."""
  return _model(config, eos_id, functools.partial(t5x_decoding.beam_search, alpha=alpha))
