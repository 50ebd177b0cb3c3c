"""The engine's `beam_search` against T5X's own `t5x.decoding.beam_search`, on the same toy
model (a prefix-hash model with a real cache) and the same tiny T5 network: the same decodes
token for token and the same scores, for beam sizes 1, 2, 4, brevity alpha 0 and 0.6, batch 1
and 3, decodes that finish early and ones that run to the length limit, and forced prompts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiers
import tiny_t5
import toy_setup
from spec_decode import core
from spec_decode.engine import beam_search
from spec_decode.engine import decoding
from spec_decode.engine import loops
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

t5x_decoding = pytest.importorskip(
    "t5x.decoding", reason="needs t5x, installed from its repository (README: Tests)")

VOCAB = 24
LENGTH = 9


def t5x_tokens_to_logits(tokens_to_logits):
  """T5X's calling convention (a scalar cur_index, [N, V] logits) over an engine model."""

  def call(state):
    num_rows = state.cur_token.shape[0]
    logits, cache = tokens_to_logits(decoding.DecodingState(
        cur_index=jnp.broadcast_to(state.cur_index, (num_rows,)), cur_token=state.cur_token,
        sequences=state.sequences, cache=state.cache))
    return logits[:, 0], cache

  return call


@functools.partial(jax.jit, static_argnames=("num_beams", "alpha"))
def _ours(model, inputs, num_beams, alpha):
  return beam_search.beam_search(inputs, model.init_cache(*inputs.shape),
                                 model.tokens_to_logits, toy_setup.EOS, num_decodes=num_beams,
                                 alpha=alpha)


@functools.partial(jax.jit, static_argnames=("num_beams", "alpha"))
def _t5x(model, inputs, num_beams, alpha):
  return t5x_decoding.beam_search(inputs, model.init_cache(*inputs.shape),
                                  t5x_tokens_to_logits(model.tokens_to_logits), toy_setup.EOS,
                                  num_decodes=num_beams, alpha=alpha)


@pytest.mark.parametrize("eos_shift", [1.5, -4.0], ids=["finish_early", "length_limit"])
@pytest.mark.parametrize("num_beams", [1, 2, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
# Batch 1 in the fast tier, batch 3 (rows finishing apart) in the slow one.
@pytest.mark.parametrize("batch_size", [1, pytest.param(3, marks=[pytest.mark.slow,
                                                                 pytest.mark.newest])])
def test_equals_t5x_on_a_toy_model(eos_shift, num_beams, alpha, batch_size):
  model, _ = toy_setup.make_pair(VOCAB, "same", seed=num_beams, eos_shift=eos_shift)
  rng = np.random.default_rng(batch_size)
  finished = unfinished = 0
  for prompt_len in (0, 0, 2):
    inputs = jnp.asarray(toy_setup.random_prompts(rng, batch_size, LENGTH, VOCAB, prompt_len))
    want, want_scores = _t5x(model, inputs, num_beams, alpha)
    got, got_scores = _ours(model, inputs, num_beams, alpha)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6)
    best = np.asarray(want)[:, -1]
    has_eos = np.any(best == toy_setup.EOS, axis=1)
    finished += int(has_eos.sum())
    unfinished += int((~has_eos & (best[:, -1] != 0)).sum())
  # The cases exercise what their names say.
  assert finished > 0 if eos_shift > 0 else unfinished > 0


def test_a_prefilled_prompt_decodes_as_the_forced_one():
  """From a prefilled cache (initial_index, rows of different prompt lengths) every beam and
  score is that of the same prompt forced: T5X keeps one beam inside a prompt."""
  model, _ = toy_setup.make_pair(VOCAB, "same", seed=3, eos_shift=1.5)
  inputs = toy_setup.random_prompts(np.random.default_rng(0), 4, LENGTH, VOCAB, 4)
  assert len(set(np.sum(inputs > 0, axis=1))) > 1
  want, want_scores = map(np.asarray, _ours(model, jnp.asarray(inputs), 4, 0.6))
  cache, initial_index = toy_setup.prefilled(model, inputs)
  got, scores = map(np.asarray, jax.jit(functools.partial(
      beam_search.beam_search, tokens_to_logits=model.tokens_to_logits, eos_id=toy_setup.EOS,
      num_decodes=4, alpha=0.6))(jnp.asarray(inputs), cache, initial_index=initial_index))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("num_beams,alpha,batch_size",
                         tiers.newest_among([(4, 0.6, 3), (2, 0.0, 1)], {(4, 0.6, 3)}))
def test_equals_t5x_on_a_tiny_t5(num_beams, alpha, batch_size):
  config = tiny_t5.tiny_config(64, tiny_t5.SHRINK)
  module = network.Transformer(config)
  params = t5x_format.random_params(config, seed=2)
  encoder_tokens = jnp.asarray(
      np.random.default_rng(0).integers(2, 64, (batch_size, 6)), jnp.int32)
  inputs = jnp.zeros((batch_size, LENGTH), jnp.int32)
  calls = core.NETWORK_CALLS
  cache = calls.init_cache("target", module, params, encoder_tokens, LENGTH)
  tokens_to_logits = calls.tokens_to_logits("target", module, params)
  got, got_scores = jax.jit(functools.partial(
      beam_search.beam_search, tokens_to_logits=tokens_to_logits, eos_id=1,
      num_decodes=num_beams, alpha=alpha))(inputs, cache)

  def t5x_call(state):  # T5X expands every leaf but cache_index, which this network ignores
    logits, new_cache = t5x_tokens_to_logits(tokens_to_logits)(
        state.replace(cache={**state.cache, "cache_index": state.cur_token[:, 0]}))
    return logits, {name: value for name, value in new_cache.items() if name != "cache_index"}

  t5x_cache = {name: value for name, value in cache.items() if name != "cache_index"}
  want, want_scores = jax.jit(functools.partial(
      t5x_decoding.beam_search, tokens_to_logits=t5x_call, eos_id=1, num_decodes=num_beams,
      alpha=alpha))(inputs, t5x_cache)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5)


def test_it_is_a_registered_loop_with_checked_settings():
  loop = loops.get("beam_search")
  assert not loop.uses_draft and loop.setting_names == ("alpha", "max_decode_len",
                                                        "max_decode_step", "min_log_prob")
  with pytest.raises(ValueError, match="min_log_prob must be a number, got 'low'"):
    loop.check({"min_log_prob": "low"})
  with pytest.raises(ValueError, match="max_decode_len must be an integer >= 1 or None"):
    loop.check({"max_decode_len": 0})
  with pytest.raises(ValueError, match=r"max_decode_len \(5\) is past the inputs' length 4"):
    beam_search.beam_search(jnp.zeros((1, 4), jnp.int32), None, None, 1, max_decode_len=5)
  config = tiny_t5.tiny_config(64, tiny_t5.SHRINK)
  with pytest.raises(ValueError, match="alpha .* must be a number >= 0, got -1"):
    core.Decoder.create("beam_search", network.Transformer(config), alpha=-1)
  with pytest.raises(ValueError, match=r"initial_index must be one position per example \(1\)"):
    beam_search.beam_search(jnp.zeros((1, 4), jnp.int32), None, None, 1,
                            initial_index=jnp.zeros((2,), jnp.int32))
