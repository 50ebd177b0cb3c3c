"""The demo pair's storage round-trips, and the shipped files match configs/demo/*.gin."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.data import corpora
from spec_decode import gin_utils
from spec_decode import paths
from spec_decode.checkpoints import demo_pair
from spec_decode.t5 import network

# A fixed sentence and the shipped target's greedy translation of it, as
# `python -m spec_decode.infer --text` prints it. The sentence lies outside Multi30k's captions,
# so the translation is wrong; it is recorded as it is, to catch any change in the weights or
# the decode.
RECORDED_SENTENCE = "The weather is nice today."
RECORDED_TRANSLATION = "Der verwirrt die Schüler."

TINY = network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                        num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,
                        mlp_activations=("gelu", "linear"), dropout_rate=0.0)


def test_round_trip(tmp_path):
  tokens = jnp.ones((1, 4), jnp.int32)
  params = network.Transformer(TINY).init(jax.random.PRNGKey(0), tokens, tokens, tokens)["params"]
  demo_pair.save_model(params, TINY, tmp_path / "m.safetensors")
  config, loaded = demo_pair.load_model(tmp_path / "m.safetensors")
  assert config == dataclasses.replace(TINY, dtype="float32")
  flat, flat_loaded = (jax.tree_util.tree_leaves_with_path(p) for p in (params, loaded))
  for (path, value), (loaded_path, loaded_value) in zip(flat, flat_loaded, strict=True):
    assert path == loaded_path
    assert loaded_value.dtype == np.float32
    np.testing.assert_array_equal(loaded_value, np.asarray(value).astype(np.float16))


@pytest.mark.parametrize("name", ["target", "draft"])
def test_shipped_model_matches_gin(name):
  path = demo_pair.ASSET_DIR / f"{name}.safetensors"
  if not path.exists():
    pytest.skip(f"{path} not shipped")
  config, params = demo_pair.load_model(name)
  gin_config = gin_utils.read_model_config(str(paths.CONFIGS / "demo" / f"{name}.gin"))
  assert config == gin_config
  expected = jax.eval_shape(network.Transformer(config).init, jax.random.PRNGKey(0),
                            *(jnp.ones((1, 4), jnp.int32),) * 3)["params"]
  assert jax.tree_util.tree_structure(expected) == jax.tree_util.tree_structure(params)
  for want, got in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(params)):
    assert want.shape == got.shape and got.dtype == np.float32


def _decode_shipped_pair(sentences, gamma=2):
  """Greedy baseline and speculative decodes of the shipped pair: ([B, L], [B, L])."""
  from spec_decode.engine import decoding
  from spec_decode.t5 import vocab
  target_config, target_params = demo_pair.load_model("target")
  draft_config, draft_params = demo_pair.load_model("draft")
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  length = 48
  encoder_tokens = np.zeros((len(sentences), length), np.int32)
  for row, sentence in enumerate(sentences):
    ids = vocabulary.encode(corpora.TRANSLATE_PREFIX + sentence)[:length - 1] + [vocabulary.eos_id]
    encoder_tokens[row, :len(ids)] = ids

  @jax.jit
  def run(target_params, draft_params, encoder_tokens):
    inputs = jnp.zeros((encoder_tokens.shape[0], length), jnp.int32)
    cache = network.init_decode_cache(target_config, target_params, encoder_tokens, length)
    target = network.make_tokens_to_logits(target_config, target_params)
    baseline, _ = decoding.temperature_sample(inputs, cache, target, vocabulary.eos_id,
                                              temperature=0.0)
    speculative, _, _ = decoding.speculative_sample(
        inputs, cache, target, vocabulary.eos_id,
        draft_cache=network.init_decode_cache(draft_config, draft_params, encoder_tokens, length),
        draft_tokens_to_logits=network.make_tokens_to_logits(draft_config, draft_params),
        gamma=gamma, temperature=0.0)
    return baseline[:, 0], speculative[:, 0]

  baseline, speculative = run(target_params, draft_params, jnp.asarray(encoder_tokens))
  return vocabulary, np.asarray(baseline), np.asarray(speculative)


def test_shipped_pair_translates_and_speculation_is_identical():
  """The bundled examples: speculative == baseline token for token, and RECORDED_SENTENCE gives
  the output recorded when the weights were exported (a pin on the shipped files: it changes
  only if the weights, the vocabulary or the decoding path change)."""
  if not (demo_pair.ASSET_DIR / "target.safetensors").exists():
    pytest.skip("the demo pair is not shipped")
  sentences = [RECORDED_SENTENCE] + (demo_pair.ASSET_DIR / "examples.en").read_text().splitlines()
  vocabulary, baseline, speculative = _decode_shipped_pair(sentences)
  np.testing.assert_array_equal(speculative, baseline)
  first = baseline[0].tolist()
  first = first[:first.index(vocabulary.eos_id)] if vocabulary.eos_id in first else first
  assert vocabulary.decode(first) == RECORDED_TRANSLATION
