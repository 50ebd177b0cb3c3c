"""Models written to the model contract's first form (`spec_decode.engine.contract`: cur_index,
cur_token, sequences, cache; none of the optional fields added since) decode through every
registered loop, and decode what a model taking every field decodes; T5X's batch-free cache
leaves pass through every loop."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import contract, decoding, loops, toy
import toy_loop  # pylint: disable=unused-import  # a loop registered outside the package
import toy_setup
from toy_setup import EOS

VOCAB, LENGTH, BATCH = 9, 8, 3


def first_form(model: toy.PrefixHashModel):
  """`model` as a model written before the optional fields existed: it never sees them, so it
  returns every fed token's logits and scores chain calls only."""

  def tokens_to_logits(state: decoding.DecodingState):
    return model.tokens_to_logits(decoding.DecodingState(
        cur_index=state.cur_index, cur_token=state.cur_token, sequences=state.sequences,
        cache=state.cache))

  return tokens_to_logits


def _run(name: str, target, draft, tokens_to_logits, draft_tokens_to_logits, temperature):
  loop = loops.get(name)
  inputs = np.zeros((BATCH, LENGTH), np.int32)
  inputs[1, 1:3] = [4, 5]
  settings = {"gamma": 3} if "gamma" in loop.setting_names else {}
  if temperature is not None:
    settings["temperature"] = temperature
  if loop.uses_draft:
    settings.update(draft_cache=draft.init_cache(BATCH, LENGTH),
                    draft_tokens_to_logits=draft_tokens_to_logits)
  run = jax.jit(lambda inputs, rng: loop(
      inputs=inputs, cache=target.init_cache(BATCH, LENGTH), tokens_to_logits=tokens_to_logits,
      eos_id=EOS, num_decodes=2, decode_rng=rng, **settings))
  return run(jnp.asarray(inputs), jax.random.PRNGKey(3))


# Every registered loop; greedy and sampled where it takes a temperature.
CASES = [(name, temperature) for name in loops.names()
         for temperature in ((0.0, 1.0) if "temperature" in loops.get(name).setting_names
                             else (None,))]


@pytest.mark.parametrize("name,temperature", CASES)
def test_every_loop_decodes_a_model_of_the_first_form(name, temperature):
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  want_decodes, want_scores, want_aux = _run(name, target, draft, target.tokens_to_logits,
                                             draft.tokens_to_logits, temperature)
  decodes, scores, aux = _run(name, target, draft, first_form(target), first_form(draft),
                              temperature)
  np.testing.assert_array_equal(decodes, want_decodes)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
  assert np.any(np.asarray(want_decodes) > 0)
  if "target_calls" in aux and "beam_steps" in aux:
    # A target that takes no tree call is given chain calls, one per path, and they count.
    assert np.all(aux["target_calls"] > want_aux["target_calls"])


def test_a_model_returning_another_count_of_logits_is_refused():
  target, _ = toy_setup.make_pair(VOCAB, "near")

  def two_rows(state):
    logits, cache = target.tokens_to_logits(state)
    return jnp.concatenate([logits, logits], axis=1), cache

  state = decoding.DecodingState(jnp.zeros((1,), jnp.int32), jnp.zeros((1, 3), jnp.int32),
                                 jnp.zeros((1, LENGTH), jnp.int32), target.init_cache(1, LENGTH))
  with pytest.raises(ValueError, match="fed 3 tokens returned the logits of 2"):
    contract.logits_of_one(two_rows, state, jnp.zeros((1,), jnp.int32))


# T5X's batch-free cache leaves, as T5X's decoders cache them: a relative-position bias of
# leading size 1 and a position embedder's index.
BATCH_FREE = {"cached_bias": np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4),
              "position_embedder_index": np.array(5, np.int32)}


def with_batch_free_leaves(tokens_to_logits):
  """A model whose cache also holds `BATCH_FREE`, which it checks on every call: their shapes
  when traced, their values when it runs (logits NaN where any differs)."""

  def model(state: decoding.DecodingState):
    for name, want in BATCH_FREE.items():
      assert state.cache[name].shape == want.shape, (name, state.cache[name].shape)
    logits, cache = tokens_to_logits(dataclasses.replace(state, cache=state.cache["model"]))
    unchanged = jnp.all(jnp.stack([jnp.all(state.cache[name] == want)
                                   for name, want in BATCH_FREE.items()]))
    return (jnp.where(unchanged, logits, jnp.nan),
            {**{name: state.cache[name] for name in BATCH_FREE}, "model": cache})

  return model


# Every registered loop, sampled where it takes a temperature (greedy handles caches alike).
SAMPLED_CASES = [(name, temperature) for name, temperature in CASES if temperature != 0.0]


@pytest.mark.parametrize("name,temperature", SAMPLED_CASES)
def test_every_loop_passes_batch_free_cache_leaves_through(name, temperature):
  """T5X's cache convention (`contract.BATCH_FREE_LEAVES`): those leaves reach every call of
  the target and the draft as given, never expanded, gathered or rolled back."""
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  want_decodes, want_scores, _ = _run(name, target, draft, target.tokens_to_logits,
                                      draft.tokens_to_logits, temperature)

  class WithLeaves:
    def __init__(self, model):
      self.model, self.tokens_to_logits = model, with_batch_free_leaves(model.tokens_to_logits)

    def init_cache(self, batch_size, length):
      return {**BATCH_FREE, "model": self.model.init_cache(batch_size, length)}

  decodes, scores, _ = _run(name, WithLeaves(target), WithLeaves(draft),
                            with_batch_free_leaves(target.tokens_to_logits),
                            with_batch_free_leaves(draft.tokens_to_logits), temperature)
  np.testing.assert_array_equal(decodes, want_decodes)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_the_batch_free_leaves_are_t5xs():
  """`contract.map_rows` leaves alone exactly the leaves T5X's `cache_map` leaves alone."""
  t5x_decoding = pytest.importorskip("t5x.decoding")
  cache = {"decoder": {"layers_0": {"cached_key": np.ones((2, 3)), "cached_bias": np.ones((1, 3)),
                                    "position_embedder_index": np.ones((1,))}},
           "cached_bias": np.ones((1, 4)), "position_embedder_index": np.ones((1,))}
  double = lambda x: 2 * x
  jax.tree_util.tree_map(np.testing.assert_array_equal, contract.map_rows(double, cache),
                         t5x_decoding.cache_map(double, cache))
