"""Unigram and bigram drafts (`spec_decode.engine.ngram`): the estimate against counts made here
by hand, the model contract, and speculative sampling with them keeping the target's law
(every exact rule and drafting policy, with a negative control), as tests/test_exactness.py
checks it for model and lookup drafts."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import contract, drafting, ngram, verify
import test_exactness
import toy_setup

CORPUS = [[3, 4, 3, 4, 2], [3, 4, 1], [2, 2, 3, 0, 0], [4]]  # 0: padding, skipped
VOCAB = 6


def counted_bigram(corpus, max_successors, smoothing):
  """q(x | t) from counts taken here with a Counter, for every t and x."""
  tokens = [[t for t in text if t] for text in corpus]
  unigram = collections.Counter(t for text in tokens for t in text)
  total = sum(unigram.values())
  u = np.array([0.0] + [(unigram[x] + 1) / (total + VOCAB - 1) for x in range(1, VOCAB)])
  pairs = collections.Counter((p, x) for text in tokens for p, x in zip([0] + text, text))
  law = np.zeros((VOCAB, VOCAB))
  for t in range(VOCAB):
    successors = sorted(((-c, x) for (p, x), c in pairs.items() if p == t))[:max_successors]
    kept = {x: -negative for negative, x in successors}
    n = sum(kept.values())
    law[t] = [(kept.get(x, 0) + smoothing * u[x]) / (n + smoothing) for x in range(VOCAB)]
  return u, law


@pytest.mark.parametrize("max_successors", [1, 2, 8])
def test_the_bigram_estimate_is_the_counted_law(max_successors):
  model = ngram.estimate(CORPUS, VOCAB, order=2, max_successors=max_successors, smoothing=0.5)
  _, law = counted_bigram(CORPUS, max_successors, 0.5)
  got = np.exp(np.asarray(model.next_token_log_probs(jnp.arange(VOCAB))))
  np.testing.assert_allclose(got, law, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
  assert np.all(got[:, 0] == 0)  # PAD never follows anything


def test_the_unigram_estimate_is_add_one_counts_whatever_came_before():
  model = ngram.estimate(CORPUS, VOCAB, order=1)
  u, _ = counted_bigram(CORPUS, 1, 1.0)
  got = np.exp(np.asarray(model.next_token_log_probs(jnp.array([0, 3, 5]))))
  np.testing.assert_allclose(got, np.stack([u] * 3), rtol=1e-5)
  assert model.order == 1 and model.successors.shape == (VOCAB, 0)


def test_a_call_follows_the_model_contract():
  model = ngram.estimate(CORPUS, VOCAB, order=2, max_successors=2)
  fed = jnp.array([[3, 4, 0], [2, 2, 1]])
  state = contract.DecodingState(cur_index=jnp.array([2, 5]), cur_token=fed,
                                 sequences=jnp.zeros((2, 8), jnp.int32), cache={})
  logits, cache = model.tokens_to_logits(state)
  assert logits.shape == (2, 3, VOCAB) and cache == {}
  np.testing.assert_array_equal(logits, model.next_token_log_probs(fed))
  one, _ = model.tokens_to_logits(state.replace(logits_index=jnp.array([1, 2])))
  np.testing.assert_array_equal(one[:, 0], logits[jnp.arange(2), jnp.array([1, 2])])


@pytest.mark.parametrize("settings,problem", [
    (dict(order=3), "order must be one of"),
    (dict(order=2, max_successors=0), "max_successors must be an integer >= 1"),
    (dict(order=2, smoothing=0.0), "smoothing must be > 0"),
])
def test_bad_settings_are_one_line(settings, problem):
  with pytest.raises(ValueError, match=problem):
    ngram.estimate(CORPUS, VOCAB, **settings)


def test_ids_outside_the_vocabulary_are_named():
  with pytest.raises(ValueError, match="outside the vocabulary of 6"):
    ngram.estimate([[1, 6]], VOCAB, order=1)


# Speculative sampling with n-gram drafts of the toy target's vocabulary, estimated from a
# random corpus (a draft unlike the target, as real n-gram drafts are).
def toy_draft(order):
  rng = np.random.default_rng(0)
  corpus = [rng.integers(1, test_exactness.VOCAB, size=rng.integers(1, 6)) for _ in range(200)]
  return ngram.estimate(corpus, test_exactness.VOCAB, order=order, max_successors=2)


NGRAM_DECODERS = ([(order, temperature, rule, "fixed") for order in ngram.ORDERS
                   for temperature in (0.5, 1.0) for rule in sorted(verify.EXACT_RULES)]
                  + [(2, 1.0, "token", policy) for policy in sorted(drafting.POLICIES)
                     if policy != "fixed"])


@pytest.mark.slow
@pytest.mark.newest
@pytest.mark.parametrize("order,temperature,verifier,draft_policy", NGRAM_DECODERS)
def test_ngram_drafts_follow_the_target_law(order, temperature, verifier, draft_policy):
  target, _ = toy_setup.make_pair(test_exactness.VOCAB, "far", seed=1)
  sampling_args = (temperature, 0, 0.0)
  decodes, stats = test_exactness.draw(target, toy_draft(order), 3, sampling_args, verifier,
                                       draft_policy)
  law = test_exactness.exact_law(target, sampling_args)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value > test_exactness.P_VALUE_FLOOR, f"p = {p_value:.2e}"
  assert 0.0 < float(np.mean(stats.alpha)) < 0.99  # drafts were weighed, and some rejected


@pytest.mark.slow
@pytest.mark.newest
def test_negative_control_fails_with_ngram_drafts():
  target, _ = toy_setup.make_pair(test_exactness.VOCAB, "far", seed=1)
  sampling_args = (1.0, 0, 0.0)
  decodes, _ = test_exactness.draw(target, toy_draft(2), 3, sampling_args,
                                   test_exactness.accept_everything)
  p_value = test_exactness.chi_square_p_value(decodes,
                                              test_exactness.exact_law(target, sampling_args))
  assert p_value < test_exactness.P_VALUE_FLOOR, f"not caught: p = {p_value:.2e}"
