"""bfloat16 as T5X computes it, on the tiny T5.1.1 checkpoint (conftest.py): our network's cached
calls (1 token and k tokens) against T5X's network decoding one token at a time
(`decode=True`), and greedy decodes of our baseline and of the T5X hook against
`t5x.decoding.temperature_sample` over T5X's network (t5x.infer in bfloat16: test_t5x_runs).

What "identical" means here: every bfloat16 activation (the self-attention keys and values each
call caches, the decoder's normalized output) is bit-identical to T5X's, for 1-token and k-token
calls, with plain XLA ops and with the CPU ops decode calls run with. The float32 logits are
bit-identical for 1-token calls with plain XLA ops (the same product as T5X's); otherwise they
differ only by the accumulation order of the float32 logits projection (a k-row product, or the
CPU kernel's), a few float32 ulps, never the argmax here. Greedy decodes are identical.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.models",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_setup  # pylint: disable=g-import-not-at-top
from spec_decode.runtime import platforms  # pylint: disable=g-import-not-at-top
from spec_decode.engine import decoding  # pylint: disable=g-import-not-at-top
from spec_decode.t5 import cpu_kernels, network  # pylint: disable=g-import-not-at-top
from spec_decode.t5x import speculative  # pylint: disable=g-import-not-at-top
from t5x.examples.t5 import layers as t5x_layers  # pylint: disable=g-import-not-at-top
from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top

# The slow tier (compiles T5X's and our decodes in bfloat16).
pytestmark = pytest.mark.slow

BF16 = dataclasses.replace(t5x_setup.TINY, dtype="bfloat16")  # float32_attention_logits: False
BATCH, ENCODER_LENGTH, DECODER_LENGTH = 4, 10, 12
GREEDY_BATCH = 32


def _encoder_tokens(batch_size: int, seed: int) -> np.ndarray:
  tokens = np.random.default_rng(seed).integers(3, 32000, (batch_size, ENCODER_LENGTH))
  tokens[:, 7] = 1  # EOS, then padding
  tokens[:, 8:] = 0
  return tokens.astype(np.int32)


def _decoder_norm(module: Any, method_name: str) -> bool:
  del method_name
  return module.name == "decoder_norm"


@pytest.fixture(scope="module")
def inputs(tiny_checkpoint) -> tuple[dict, np.ndarray, np.ndarray]:
  params = t5x_setup.load_params(str(tiny_checkpoint))
  decoder_tokens = np.random.default_rng(1).integers(3, 32000, (BATCH, DECODER_LENGTH))
  decoder_tokens[:, 0] = 0  # BOS
  return params, _encoder_tokens(BATCH, 0), decoder_tokens.astype(np.int32)


def t5x_one_token_calls(config: t5x_network.T5Config, params: Any, encoder_tokens: np.ndarray,
                        decoder_tokens: np.ndarray) -> dict[str, np.ndarray]:
  """T5X's network fed `decoder_tokens` one at a time with decode=True, as T5X's decoding
  calls it: {'logits' [B,L,V], 'normed' (decoder_norm's output) [B,L,E], 'keys_i', 'values_i'
  (layer i's self-attention cache) [B,L,H,D]}."""
  module = t5x_network.Transformer(config)

  @jax.jit
  def run(params, encoder_tokens, decoder_tokens):
    encoded = module.apply({"params": params}, encoder_tokens, enable_dropout=False,
                           method=module.encode)
    ones = jnp.ones_like(decoder_tokens)
    _, variables = module.apply({"params": params}, jnp.ones_like(encoder_tokens), ones, ones,
                                decode=True, enable_dropout=False, mutable=["cache"])
    cache, logits, normed = variables["cache"], [], []
    for i in range(decoder_tokens.shape[1]):
      token = decoder_tokens[:, i:i + 1]
      step_logits, variables = module.apply(
          {"params": params, "cache": cache}, encoded, encoder_tokens, token, token,
          enable_dropout=False, decode=True, max_decode_length=decoder_tokens.shape[1],
          mutable=["cache", "intermediates"], capture_intermediates=_decoder_norm,
          method=module.decode)
      cache = variables["cache"]
      logits.append(step_logits)
      normed.append(variables["intermediates"]["decoder"]["decoder_norm"]["__call__"][0])
    out = {"logits": jnp.concatenate(logits, 1), "normed": jnp.concatenate(normed, 1)}
    for i in range(config.num_decoder_layers):
      layer = cache["decoder"][f"layers_{i}"]["self_attention"]
      # T5X caches [B, H, D, L].
      out[f"keys_{i}"] = jnp.moveaxis(layer["cached_key"], -1, 1)
      out[f"values_{i}"] = jnp.moveaxis(layer["cached_value"], -1, 1)
    return out

  return jax.tree_util.tree_map(np.asarray, run(params, encoder_tokens, decoder_tokens))


def our_cached_calls(module: network.Transformer, params: Any, encoder_tokens: np.ndarray,
                     decoder_tokens: np.ndarray, k: int) -> dict[str, np.ndarray]:
  """Our cached calls (`decode_chunk`, the engine's tokens_to_logits) feeding k tokens per
  call (the last call what is left): the same dict as `t5x_one_token_calls`."""

  @jax.jit
  def run(params, encoder_tokens, decoder_tokens):
    batch_size, length = decoder_tokens.shape
    cache = network.init_decode_cache(module, params, encoder_tokens, length)
    logits, normed = [], []
    for start in range(0, length, k):
      (step_logits, cache), variables = module.apply(
          {"params": params}, cache, jnp.full((batch_size,), start, jnp.int32),
          decoder_tokens[:, start:start + k], method=network.Transformer.decode_chunk,
          mutable=["intermediates"], capture_intermediates=_decoder_norm)
      logits.append(step_logits)
      normed.append(variables["intermediates"]["decoder"]["decoder_norm"]["__call__"][0])
    out = {"logits": jnp.concatenate(logits, 1), "normed": jnp.concatenate(normed, 1)}
    for i in range(module.config.num_decoder_layers):
      out[f"keys_{i}"] = cache[f"layers_{i}"]["self_attention"]["cached_key"]
      out[f"values_{i}"] = cache[f"layers_{i}"]["self_attention"]["cached_value"]
    return out

  return jax.tree_util.tree_map(np.asarray, run(params, encoder_tokens, decoder_tokens))


_t5x_calls: dict[bool, dict[str, np.ndarray]] = {}


def _t5x(inputs: tuple, float32_attention_logits: bool) -> dict[str, np.ndarray]:
  if float32_attention_logits not in _t5x_calls:
    config = dataclasses.replace(BF16, float32_attention_logits=float32_attention_logits)
    _t5x_calls[float32_attention_logits] = t5x_one_token_calls(config, *inputs)
  return _t5x_calls[float32_attention_logits]


def _module(float32_attention_logits: bool, ops: str) -> network.Transformer:
  config = speculative.config_from_t5x(
      dataclasses.replace(BF16, float32_attention_logits=float32_attention_logits))
  assert config.float32_attention_logits == float32_attention_logits
  return network.Transformer(config, {"xla": network.Ops(),
                                      "cpu": cpu_kernels.cpu_ops(config.dtype)}[ops])


@pytest.mark.parametrize("k", [1, 5, DECODER_LENGTH])
@pytest.mark.parametrize("float32_attention_logits, ops",
                         [(False, "xla"), (False, "cpu"), (True, "xla")])
def test_cached_calls_give_t5x_one_token_logits(inputs, float32_attention_logits, ops, k):
  want = _t5x(inputs, float32_attention_logits)
  got = our_cached_calls(_module(float32_attention_logits, ops), *inputs, k=k)
  assert got["normed"].dtype == want["normed"].dtype == jnp.bfloat16
  for name in want:
    if name != "logits":
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  if ops == "xla" and k == 1:
    np.testing.assert_array_equal(got["logits"], want["logits"])
  else:  # the float32 logits projection's accumulation order only
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got["logits"].argmax(-1), want["logits"].argmax(-1))


def test_negative_control_the_other_logits_precision_is_not_t5x(inputs):
  """The comparison above sees a rounding difference: float32 attention logits where T5X
  computes them in bfloat16 change the activations and the logits far beyond float32 ulps."""
  want = _t5x(inputs, float32_attention_logits=False)
  got = our_cached_calls(_module(True, "xla"), *inputs, k=1)
  assert not np.array_equal(got["normed"], want["normed"])
  assert np.max(np.abs(got["logits"] - want["logits"])) > 1e-3


def test_layer_norm_rounds_as_t5x():
  """Normalized in float32, rounded to bfloat16, then scaled in bfloat16 (T5X's LayerNorm);
  rounding once after scaling in float32 (this network before) differs."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((64, 32)) * 3, jnp.bfloat16)
  scale = jnp.asarray(rng.uniform(0.1, 3.0, 32), jnp.float32)
  variables = {"params": {"scale": scale}}
  want = t5x_layers.LayerNorm(dtype=jnp.bfloat16).apply(variables, x)
  got = network.LayerNorm(jnp.bfloat16).apply(variables, x)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  x32 = x.astype(jnp.float32)
  rounded_once = (x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + 1e-6)
                  * scale).astype(jnp.bfloat16)
  assert not np.array_equal(np.asarray(rounded_once), np.asarray(want))


@pytest.fixture(scope="module")
def draft_checkpoint(tmp_path_factory, tiny_checkpoint) -> str:
  """A noisy copy of the tiny checkpoint, saved by T5X's Checkpointer: drafts both accepted and
  rejected."""
  params = t5x_setup.load_params(str(tiny_checkpoint))
  return t5x_setup.save_checkpoint(tmp_path_factory.mktemp("bf16_draft"), t5x_setup.TINY,
                                   t5x_setup.perturbed(params, relative_noise=0.3, seed=1))


@pytest.mark.newest
def test_greedy_decodes_equal_t5x_temperature_sample(tiny_checkpoint, draft_checkpoint):
  """32 inputs, bfloat16: our baseline (the engine's temperature_sample over our network with
  the ops decode calls use) and the T5X hook's speculative decodes equal T5X's
  EncoderDecoderModel with `temperature_sample` over T5X's network, token for token."""
  params = t5x_setup.load_params(str(tiny_checkpoint))
  encoder_tokens = _encoder_tokens(GREEDY_BATCH, 2)
  zeros = np.zeros((GREEDY_BATCH, DECODER_LENGTH), np.int32)
  batch = {"encoder_input_tokens": encoder_tokens, "decoder_input_tokens": zeros,
           "decoder_target_tokens": zeros, "decoder_loss_weights": zeros}
  t5x_model = t5x_setup.t5x_model(BF16)
  expected = np.asarray(jax.jit(t5x_model.predict_batch)(params, batch))
  assert len({tuple(row) for row in expected}) > GREEDY_BATCH // 2  # not one degenerate decode

  module = platforms.Platform.default().module(
      network.Transformer(speculative.config_from_t5x(BF16)))

  @jax.jit
  def baseline(params, encoder_tokens):
    decodes, _ = decoding.temperature_sample(
        jnp.zeros_like(zeros), network.init_decode_cache(module, params, encoder_tokens,
                                                         DECODER_LENGTH),
        network.make_tokens_to_logits(module, params), eos_id=1, temperature=0.0)
    return decodes[:, -1]

  np.testing.assert_array_equal(np.asarray(baseline(params, encoder_tokens)), expected)

  both_params = {**params, speculative.DRAFT_PARAMS_KEY: t5x_setup.load_params(draft_checkpoint)}
  accepted = drafted = 0
  for gamma in (1, 4):
    model = speculative.speculative_version(t5x_model, draft_checkpoint, gamma=gamma)
    assert model.module.config.dtype == model.draft_module.config.dtype == "bfloat16"
    decodes, aux = jax.jit(model.predict_batch_with_aux)(both_params, batch)
    np.testing.assert_array_equal(np.asarray(decodes), expected, err_msg=f"gamma {gamma}")
    accepted += np.sum(aux["accepted_tokens"])
    drafted += np.sum(aux["drafted_tokens"])
  assert 0 < accepted < drafted
