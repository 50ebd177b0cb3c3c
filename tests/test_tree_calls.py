"""The model contract's optional fields. Tree calls (token_positions and token_mask) give each
fed token the logits of decoding its path alone: on the toy prefix-hash model exactly, on T5
(both families) and the decoder-only model to float rounding. The rows start at different positions over stale cache
entries, and the cache a tree call writes (its chain of pending tokens) continues like a chain
call's. A call asking for one fed token's logits (logits_index) returns those and writes the
same cache; a model ignoring that field has the row selected by the engine."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import contract
from spec_decode.engine import decoding
from spec_decode.engine import lookup
from spec_decode.engine import toy
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network

CACHE_LEN = 12
START = np.array([3, 5])  # the rows' cur_index: everything from there on is stale
# The fed tokens: two pending ones written at START, START + 1, then a tree over them.
TOKENS = np.array([[7, 9, 4, 5, 6, 8, 10], [11, 3, 4, 12, 6, 2, 13]], np.int32)
PARENT = [-1, 0, 1, 1, 2, 3, 5]  # fed index of each token's parent (-1: the cache)
NUM_PENDING = 2


def _ancestors() -> np.ndarray:
  """mask [k, k]: fed token i is an ancestor of (or is) fed token j."""
  num_fed = len(PARENT)
  mask = np.eye(num_fed, dtype=bool)
  for j in range(num_fed):
    if PARENT[j] >= 0:
      mask[j] |= mask[PARENT[j]]
  return mask


def _depths() -> np.ndarray:
  return _ancestors().sum(axis=1) - 1


class Toy:
  def __init__(self):
    self.model = toy.PrefixHashModel.random(jax.random.PRNGKey(3), 16, num_buckets=1024)
    self.params = None
    self.init_cache = lambda: self.model.init_cache(len(START), CACHE_LEN)
    self.call = jax.jit(lambda params, state: self.model.tokens_to_logits(state))
    self.tolerance = dict(rtol=0, atol=0)


class TinyT5:
  def __init__(self, family: str):
    config = network.T5Config(
        vocab_size=16, emb_dim=8, num_heads=3, head_dim=4, mlp_dim=7, num_encoder_layers=1,
        num_decoder_layers=2, dropout_rate=0.0, relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
        mlp_activations=("relu",) if family == "t5_1_0" else ("gelu", "linear"),
        logits_via_embedding=family == "t5_1_0")
    self.params = t5x_format.random_params(config, seed=5)
    encoder_tokens = jnp.array([[3, 4, 5, 0], [6, 7, 8, 9]], jnp.int32)
    self.init_cache = lambda: network.init_decode_cache(config, self.params, encoder_tokens,
                                                        CACHE_LEN)
    self.call = jax.jit(lambda params, state: network.make_tokens_to_logits(config, params)(
        state))
    self.tolerance = dict(rtol=1e-5, atol=1e-5)


class TinyDecoderOnly:
  """A decoder-only model, its cache prefilled with prompts of different lengths."""

  def __init__(self):
    config = network.DecoderOnlyConfig(
        vocab_size=16, emb_dim=8, num_heads=3, head_dim=4, mlp_dim=7, num_layers=2,
        dropout_rate=0.0, relative_attention_num_buckets=8, relative_attention_max_distance=12,
        mlp_activations=("gelu", "linear"))
    tokens = jnp.ones((1, CACHE_LEN), jnp.int32)
    self.params = network.module_of(config).init(jax.random.PRNGKey(5), tokens, tokens)["params"]
    prompt = jnp.array([[0, 3, 4, 5, 0, 0], [0, 6, 0, 0, 0, 0]], jnp.int32)
    self.init_cache = lambda: network.init_decode_cache(config, self.params, prompt, CACHE_LEN)
    self.call = jax.jit(lambda params, state: network.make_tokens_to_logits(config, params)(
        state))
    self.tolerance = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=["toy", "t5_1_0", "t5_1_1", "decoder_only"])
def model(request):
  if request.param == "decoder_only":
    return TinyDecoderOnly()
  return Toy() if request.param == "toy" else TinyT5(request.param)


def _state(cur_index, tokens, cache, positions=None, mask=None) -> decoding.DecodingState:
  tokens = jnp.asarray(tokens, jnp.int32)
  return decoding.DecodingState(
      cur_index=jnp.asarray(cur_index, jnp.int32), cur_token=tokens,
      sequences=jnp.zeros((tokens.shape[0], CACHE_LEN), jnp.int32), cache=cache,
      token_positions=None if positions is None else jnp.asarray(positions, jnp.int32),
      token_mask=None if mask is None else jnp.asarray(mask))


def _prefilled(model):
  """Caches holding a random chain at positions 0..9: prefixes below START, stale above."""
  chain = np.random.default_rng(0).integers(2, 16, (len(START), 10)).astype(np.int32)
  chain[:, 0] = 0
  _, cache = model.call(model.params, _state([0, 0], chain, model.init_cache()))
  return cache


def _tree_call(model, cache):
  """The tree call of TOKENS at START over `cache` -> (logits, new cache)."""
  mask = _ancestors()
  positions = START[:, None] + _depths()[None]
  return model.call(model.params, _state(
      START, TOKENS, cache, positions, np.broadcast_to(mask, (len(START),) + mask.shape)))


def test_each_fed_token_gets_the_logits_of_its_path_alone(model):
  cache = _prefilled(model)
  mask = _ancestors()
  tree_logits, _ = _tree_call(model, cache)
  for j in range(len(PARENT)):
    path = TOKENS[:, mask[j]]  # its ancestors and itself, in position order
    alone, _ = model.call(model.params, _state(START, path, cache))
    np.testing.assert_allclose(tree_logits[:, j], alone[:, -1], **model.tolerance)
  # Siblings (fed 2 and 3 share a position) differ: the call did not mix their paths.
  assert not np.allclose(tree_logits[:, 4], tree_logits[:, 5])


def test_the_pending_chain_it_writes_continues_like_a_chain_call(model):
  cache = _prefilled(model)
  _, tree_cache = _tree_call(model, cache)
  _, chain_cache = model.call(model.params, _state(START, TOKENS[:, :NUM_PENDING], cache))
  after = START + NUM_PENDING
  nxt = np.array([[14], [15]], np.int32)
  from_tree, _ = model.call(model.params, _state(after, nxt, tree_cache))
  from_chain, _ = model.call(model.params, _state(after, nxt, chain_cache))
  np.testing.assert_allclose(from_tree, from_chain, **model.tolerance)


def test_a_call_asking_for_one_fed_tokens_logits_returns_those(model):
  cache = _prefilled(model)
  tokens = TOKENS[:, :3]
  every, every_cache = model.call(model.params, _state(START, tokens, cache))
  index = jnp.asarray([2, 0], jnp.int32)
  one, one_cache = model.call(model.params, dataclasses.replace(
      _state(START, tokens, cache), logits_index=index))
  assert one.shape == (len(START), 1, every.shape[-1])
  np.testing.assert_allclose(one[:, 0], every[np.arange(len(START)), index], **model.tolerance)
  for a, b in zip(jax.tree_util.tree_leaves(one_cache), jax.tree_util.tree_leaves(every_cache)):
    np.testing.assert_allclose(a, b, **model.tolerance)


def test_a_lookup_asked_for_one_fed_token_proposes_for_that_token_alone():
  drafter = lookup.NGramLookup(vocab_size=16, max_ngram=2)
  source = jnp.asarray([[5, 6, 7, 8, 0], [9, 4, 3, 2, 1]], jnp.int32)
  sequences = jnp.asarray([[0, 5, 6, 7, 0, 0], [0, 9, 4, 0, 0, 0]], jnp.int32)
  state = decoding.DecodingState(jnp.asarray([1, 1], jnp.int32), sequences[:, 1:4], sequences,
                                 drafter.init_cache(source))
  every, _ = drafter.tokens_to_logits(state)
  index = jnp.asarray([1, 0], jnp.int32)
  one, _ = drafter.tokens_to_logits(dataclasses.replace(state, logits_index=index))
  np.testing.assert_array_equal(one[:, 0], every[np.arange(2), index])
  assert np.isfinite(np.asarray(one)).any()  # it proposes something there


def test_a_model_ignoring_logits_index_gets_the_row_selected_by_the_engine():
  model = toy.PrefixHashModel.random(jax.random.PRNGKey(0), 8)

  def every_logits(state):  # drops the field: answers with every fed token's logits
    return model.tokens_to_logits(dataclasses.replace(state, logits_index=None))

  state = decoding.DecodingState(jnp.zeros((2,), jnp.int32), jnp.asarray([[3, 4], [5, 6]]),
                                 jnp.zeros((2, 4), jnp.int32), model.init_cache(2, 4))
  index = jnp.asarray([1, 0], jnp.int32)
  want = model.tokens_to_logits(state)[0][jnp.arange(2), index]
  for tokens_to_logits in (every_logits, model.tokens_to_logits):
    logits, _ = contract.logits_of_one(tokens_to_logits, state, index)
    np.testing.assert_array_equal(logits, want)
