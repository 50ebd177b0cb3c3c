"""The engine on real T5 networks: speculative == baseline, and == Hugging Face's generate."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import decoding
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
import hf_utils

EOS = 1


@functools.partial(jax.jit, static_argnames=("target_config", "draft_config", "max_len", "gamma",
                                             "temperature"))
def decode_both(target_params, draft_params, encoder_tokens, rng, target_config, draft_config,
                max_len, gamma, temperature):
  inputs = jnp.zeros((encoder_tokens.shape[0], max_len), jnp.int32)
  cache = network.init_decode_cache(target_config, target_params, encoder_tokens, max_len)
  target = network.make_tokens_to_logits(target_config, target_params)
  baseline, _ = decoding.temperature_sample(inputs, cache, target, EOS, decode_rng=rng,
                                            temperature=temperature)
  draft_cache = network.init_decode_cache(draft_config, draft_params, encoder_tokens, max_len)
  speculative, _, stats = decoding.speculative_sample(
      inputs, cache, target, EOS, draft_cache=draft_cache,
      draft_tokens_to_logits=network.make_tokens_to_logits(draft_config, draft_params),
      gamma=gamma, decode_rng=rng, temperature=temperature)
  return baseline[:, 0], speculative[:, 0], stats


def test_greedy_speculative_equals_baseline_with_t5_pair():
  target_config = network.T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8,
                                   mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2,
                                   mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  draft_config = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                                  num_encoder_layers=1, num_decoder_layers=1,
                                  mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  target_params = t5x_format.random_params(target_config, 0)
  # A draft that agrees with the target often: the target's embeddings, a shallower stack.
  draft_params = t5x_format.random_params(draft_config, 1)
  encoder_tokens = jnp.asarray(np.random.default_rng(0).integers(2, 64, (5, 7)), jnp.int32)
  encoder_tokens = encoder_tokens.at[3, 4:].set(0)  # a padded row
  baseline, speculative, stats = decode_both(target_params, draft_params, encoder_tokens,
                                             jax.random.PRNGKey(0), target_config, draft_config,
                                             12, 3, 0.0)
  np.testing.assert_array_equal(speculative, baseline)
  assert np.all(np.asarray(stats.target_calls) < np.asarray(stats.generated_tokens) + 1)


@hf_utils.needs_hf
@pytest.mark.parametrize("name", sorted(hf_utils.HF_CONFIGS))
def test_greedy_engine_equals_hugging_face_generate(tmp_path, name):
  import torch
  model, config, params = hf_utils.hf_model_and_params(tmp_path, name)
  encoder_tokens = np.random.default_rng(1).integers(2, config.vocab_size, (3, 9))
  encoder_tokens[1, 6:] = 0
  max_len = 10
  with torch.no_grad():
    hf = model.generate(input_ids=torch.tensor(encoder_tokens),
                        attention_mask=torch.tensor(encoder_tokens != 0), do_sample=False,
                        max_new_tokens=max_len, min_new_tokens=0, num_beams=1,
                        decoder_start_token_id=0, eos_token_id=EOS, pad_token_id=0,
                        use_cache=False).numpy()  # HF's cache mishandles unequal depths
  hf = hf[:, 1:]  # drop the decoder start token
  hf = np.pad(hf, ((0, 0), (0, max_len - hf.shape[1])))
  inputs = jnp.zeros((3, max_len), jnp.int32)
  cache = network.init_decode_cache(config, params, jnp.asarray(encoder_tokens), max_len)
  ours, _ = jax.jit(lambda cache: decoding.temperature_sample(
      inputs, cache, network.make_tokens_to_logits(config, params), EOS, temperature=0.0))(cache)
  np.testing.assert_array_equal(np.asarray(ours[:, 0]), hf)
