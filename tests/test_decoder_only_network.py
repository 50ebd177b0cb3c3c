"""The decoder-only network: T5X's parameter tree, and cached decoding from a prefilled prompt
that gives its teacher-forced logits (causal and prefix LM, rows with prompts of different
lengths, 1 and k tokens per call, rollbacks that re-feed positions holding rejected drafts).
T5X's own network is compared with in tests/t5x (its decoder-only network is not part of T5X's
wheel)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import core
from spec_decode.engine import decoding
from spec_decode.t5 import network

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest

LENGTH = 10
CONFIG = network.DecoderOnlyConfig(vocab_size=23, emb_dim=12, num_heads=2, num_layers=2,
                                   head_dim=5, mlp_dim=16, mlp_activations=("gelu", "linear"),
                                   dropout_rate=0.0)
# Each row's prompt, then the continuation it is fed (teacher forcing of the whole sequence).
PROMPTS = [[5, 7, 9], [8], [11, 12, 13, 14, 15]]
CONTINUATIONS = [[3, 4, 6, 2, 2, 9], [6, 6, 6, 1, 4, 4, 4, 3], [2, 5, 7, 8]]


def params_of(config=CONFIG, seed=0):
  tokens = jnp.ones((1, LENGTH), jnp.int32)
  return network.module_of(config).init(jax.random.PRNGKey(seed), tokens, tokens)["params"]


def features():
  """(decoder_input_tokens, decoder_causal_attention, prompt) of the rows [B, LENGTH]."""
  inputs = np.zeros((len(PROMPTS), LENGTH), np.int32)
  causal = np.zeros_like(inputs)
  for row, (prompt, continuation) in enumerate(zip(PROMPTS, CONTINUATIONS)):
    sequence = [0] + prompt + continuation
    inputs[row, :len(sequence)] = sequence[:LENGTH]
    causal[row, :len(prompt) + 1] = 1
  return inputs, causal, inputs * causal


def test_the_parameter_tree_is_t5xs_decoder_only_tree():
  names = {jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_leaves_with_path(params_of())}
  layer = ["['decoder']['layers_0']['pre_self_attention_layer_norm']['scale']",
           "['decoder']['layers_0']['self_attention']['query']['kernel']",
           "['decoder']['layers_0']['self_attention']['out']['kernel']",
           "['decoder']['layers_0']['pre_mlp_layer_norm']['scale']",
           "['decoder']['layers_0']['mlp']['wi_0']['kernel']",
           "['decoder']['layers_0']['mlp']['wi_1']['kernel']",
           "['decoder']['layers_0']['mlp']['wo']['kernel']"]
  for name in layer + ["['decoder']['token_embedder']['embedding']",
                       "['decoder']['relpos_bias']['rel_embedding']",
                       "['decoder']['decoder_norm']['scale']",
                       "['decoder']['logits_dense']['kernel']"]:
    assert name in names
  assert not any("encoder" in name or "cross" in name for name in names)
  tied = params_of(network.DecoderOnlyConfig(**{**CONFIG.__dict__, "logits_via_embedding": True}))
  assert "logits_dense" not in tied["decoder"]


@pytest.mark.parametrize("prefix_lm", [False, True])
@pytest.mark.parametrize("tokens_per_call", [1, 3])
def test_cached_calls_from_the_prefill_give_the_teacher_forced_logits(prefix_lm, tokens_per_call):
  module = network.DecoderOnlyTransformer(CONFIG, inputs_bidirectional_attention=prefix_lm)
  params = params_of()
  inputs, causal, prompt = features()
  forced = module.apply({"params": params}, inputs, np.ones_like(inputs),
                        decoder_causal_attention=causal)
  cache = network.init_decode_cache(module, params, jnp.asarray(prompt), LENGTH)
  start = np.asarray(network.prompt_lengths(jnp.asarray(prompt)))
  np.testing.assert_array_equal(start, [len(p) for p in PROMPTS])
  call = jax.jit(network.make_tokens_to_logits(module, params))
  index = start.copy()
  while (index + tokens_per_call <= LENGTH).any():
    live = index + tokens_per_call <= LENGTH
    feed = np.minimum(index[:, None] + np.arange(tokens_per_call), LENGTH - 1)
    tokens = np.take_along_axis(inputs, feed, axis=1)
    logits, cache = call(decoding.DecodingState(
        cur_index=jnp.asarray(index), cur_token=jnp.asarray(tokens),
        sequences=jnp.asarray(inputs), cache=cache))
    want = np.take_along_axis(np.asarray(forced), feed[:, :, None], axis=1)
    np.testing.assert_allclose(np.asarray(logits)[live], want[live], rtol=1e-5, atol=1e-5)
    index = np.where(live, index + tokens_per_call, index)


@pytest.mark.parametrize("prefix_lm", [False, True])
def test_a_rollback_re_feeds_positions_the_cache_holds_wrong_entries_for(prefix_lm):
  """As speculative decoding rolls back: each call feeds 3 tokens of which only the first is
  the sequence's (the others rejected drafts, their entries written to the cache), and the
  next call starts one position after that first token, re-feeding a position the cache holds a
  wrong entry for, with wrong ones after it. The logits of every right prefix are the
  teacher-forced ones."""
  module = network.DecoderOnlyTransformer(CONFIG, inputs_bidirectional_attention=prefix_lm)
  params = params_of()
  inputs, causal, prompt = features()
  forced = np.asarray(module.apply({"params": params}, inputs, np.ones_like(inputs),
                                   decoder_causal_attention=causal))
  cache = network.init_decode_cache(module, params, jnp.asarray(prompt), LENGTH)
  call = jax.jit(network.make_tokens_to_logits(module, params))
  index = np.asarray(network.prompt_lengths(jnp.asarray(prompt)))
  calls = 0
  while (index + 3 <= LENGTH).any():
    live = index + 3 <= LENGTH
    feed = np.minimum(index[:, None] + np.arange(3), LENGTH - 1)
    tokens = np.take_along_axis(inputs, feed, axis=1)
    tokens[:, 1:] = tokens[:, 1:] % (CONFIG.vocab_size - 1) + 1  # rejected drafts: not these
    logits, cache = call(decoding.DecodingState(
        cur_index=jnp.asarray(index), cur_token=jnp.asarray(tokens),
        sequences=jnp.asarray(inputs), cache=cache))
    want = forced[np.arange(len(index)), feed[:, 0]]
    np.testing.assert_allclose(np.asarray(logits)[live, 0], want[live], rtol=1e-5, atol=1e-5)
    index = np.where(live, index + 1, index)
    calls += 1
  assert calls >= 4


def test_a_prefix_lm_prompt_attends_both_ways():
  """A prefix LM's prompt positions see later prompt positions, so its first continuation
  logits differ from a causal model's of the same parameters."""
  params = params_of()
  _, _, prompt = features()
  logits = {}
  for prefix_lm in (False, True):
    module = network.DecoderOnlyTransformer(CONFIG, inputs_bidirectional_attention=prefix_lm)
    cache = network.init_decode_cache(module, params, jnp.asarray(prompt), LENGTH)
    start = network.prompt_lengths(jnp.asarray(prompt))
    last = jnp.take_along_axis(jnp.asarray(prompt), start[:, None], axis=1)
    logits[prefix_lm], _ = network.make_tokens_to_logits(module, params)(decoding.DecodingState(
        cur_index=start, cur_token=last, sequences=jnp.asarray(prompt), cache=cache))
  for row in range(len(PROMPTS)):  # even a 1-token prompt: BOS attends to it
    assert not np.allclose(logits[False][row], logits[True][row])


def test_a_prompt_buffer_longer_than_the_decode_is_one_line():
  with pytest.raises(ValueError, match="does not fit a decode of 6"):
    network.init_decode_cache(CONFIG, params_of(), jnp.zeros((1, LENGTH), jnp.int32), 6)


def test_a_decoder_only_target_takes_no_encoder_decoder_draft():
  t5 = network.Transformer(network.T5Config(vocab_size=23, emb_dim=8, num_heads=2, head_dim=4,
                                            mlp_dim=8, num_encoder_layers=1,
                                            num_decoder_layers=1))
  with pytest.raises(ValueError, match="the target is a decoder-only model and the draft an "
                                       "encoder-decoder"):
    core.Decoder.create("speculative_sample", network.DecoderOnlyTransformer(CONFIG), t5, gamma=2)


def test_predict_returns_the_continuations_without_the_prompt():
  """Greedy `Decoder.predict` on decoder features: each row's continuation (up to EOS), the
  argmax of the teacher-forced logits of prompt + continuation so far, at the front."""
  module = network.DecoderOnlyTransformer(CONFIG)
  params = params_of()
  _, causal, prompt = features()
  decoder = core.Decoder.create("temperature_sample", module, temperature=0.0)
  decodes, _ = decoder.predict(params, None, {"decoder_input_tokens": prompt,
                                              "decoder_causal_attention": causal}, eos_id=1)
  for row, tokens in enumerate(PROMPTS):
    sequence = [0] + tokens
    while len(sequence) < LENGTH + 1 and sequence[-1] != 1 or len(sequence) == len(tokens) + 1:
      padded = np.zeros((1, LENGTH), np.int32)
      padded[0, :len(sequence)] = sequence[:LENGTH]
      logits = module.apply({"params": params}, padded, np.ones_like(padded))
      sequence.append(int(np.argmax(logits[0, len(sequence) - 1])))
    continuation = sequence[len(tokens) + 1:]
    want = continuation + [0] * (LENGTH - len(continuation))
    np.testing.assert_array_equal(np.asarray(decodes[row]), want)
  with pytest.raises(ValueError, match="needs decoder_causal_attention"):
    decoder.predict(params, None, {"decoder_input_tokens": prompt}, eos_id=1)
