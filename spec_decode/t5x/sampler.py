"""T5X's standard decoders over a network config of this package: `t5x.models.EncoderDecoderModel`
with T5X's own network (`t5x.examples.t5.network`) and `t5x.decoding.temperature_sample`, the
baseline the paper's Table 2 speeds up (the benchmark's peer suite times it on the same weights:
this package's parameter tree is T5X's), or `t5x.decoding.beam_search`
(`scripts/beam_search_bench.py --t5x` times it beside ours); for a decoder-only config
`t5x.models.DecoderOnlyModel` with T5X's decoder-only network
(`decoder_only_network`: an ImportError where the T5X installation lacks it)."""

import dataclasses
import functools

import seqio
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x.examples.t5 import network as t5x_network

from spec_decode.t5 import network
from spec_decode.t5x import decoder_only_network


def _t5x_config(config_class: type, config: network.NetworkConfig):
  """T5X's config of the fields this package's `config` shares with it."""
  return config_class(**{field.name: getattr(config, field.name)
                         for field in dataclasses.fields(config_class)
                         if hasattr(config, field.name)})


def _model(config: network.NetworkConfig, eos_id: int, decode_fn
           ) -> t5x_models.BaseTransformerModel:
  vocabulary = seqio.PassThroughVocabulary(config.vocab_size, eos_id=eos_id)
  if network.is_decoder_only(config):
    t5x_decoder_only = decoder_only_network.network()  # ImportError where T5X lacks it
    return t5x_models.DecoderOnlyModel(
        t5x_decoder_only.DecoderWrapper(_t5x_config(t5x_decoder_only.TransformerConfig, config)),
        vocabulary, optimizer_def=None, decode_fn=decode_fn)
  return t5x_models.EncoderDecoderModel(
      t5x_network.Transformer(_t5x_config(t5x_network.T5Config, config)), vocabulary,
      vocabulary, optimizer_def=None, decode_fn=decode_fn)


def sampler_model(config: network.NetworkConfig, eos_id: int,
                  temperature: float) -> t5x_models.BaseTransformerModel:
  """T5X's model of `config` decoding greedily at temperature 0, else from the whole
  distribution (topk 0); its vocabularies pass ids through, with `eos_id` (-1: none). A
  decoder-only config's model is a causal LM (T5X's default)."""
  return _model(config, eos_id, functools.partial(t5x_decoding.temperature_sample,
                                                  temperature=temperature, topk=0))


def beam_search_model(config: network.NetworkConfig, eos_id: int,
                      alpha: float) -> t5x_models.BaseTransformerModel:
  """T5X's model of `config` decoding with its `beam_search` (brevity `alpha`; the beams are
  predict_batch_with_aux's num_decodes); vocabularies as `sampler_model`'s."""
  return _model(config, eos_id, functools.partial(t5x_decoding.beam_search, alpha=alpha))
