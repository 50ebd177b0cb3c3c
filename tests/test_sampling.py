"""The sampling transform against a direct NumPy reading of its definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import sampling


def reference_probs(logits: np.ndarray, temperature: float, topk: int, topp: float) -> np.ndarray:
  """One row at a time, by the definitions in the module docstring."""
  logits = np.asarray(logits, np.float64)
  if temperature <= sampling.GREEDY_TEMPERATURE:
    out = np.zeros_like(logits)
    out[np.argmax(logits)] = 1.0
    return out
  scaled = logits / temperature
  keep = np.ones_like(scaled, bool)
  if 0 < topk < len(scaled):
    keep = scaled >= np.sort(scaled)[::-1][topk - 1]
  probs = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
  probs /= probs.sum()
  if 0 < topp < 1:
    order = np.argsort(-probs, kind="stable")
    total, kept = 0.0, []
    for token in order:  # the smallest most-likely set reaching topp
      kept.append(token)
      total += probs[token]
      if total >= topp:
        break
    keep = probs >= probs[kept[-1]]
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
  return probs


@pytest.mark.parametrize("temperature,topk,topp", [
    (1.0, 0, 0.0), (0.5, 0, 0.0), (1.7, 0, 0.0), (0.0, 0, 0.0), (1e-5, 3, 0.9),
    (1.0, 3, 0.0), (1.0, 0, 0.8), (0.7, 5, 0.6), (1.0, 0, 1.0), (1.0, 1, 0.0)])
def test_matches_reference(temperature, topk, topp):
  logits = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (16, 11))) * 2
  want = np.stack([reference_probs(row, temperature, topk, topp) for row in logits])
  got = np.asarray(sampling.logits_to_probs(jnp.asarray(logits), temperature, topk, topp))
  np.testing.assert_allclose(got, want, atol=1e-6)
  # The settings as data, traced: one compiled transform for every value.
  traced = jax.jit(sampling.logits_to_probs)(jnp.asarray(logits), jnp.float32(temperature),
                                             jnp.int32(topk), jnp.float32(topp))
  np.testing.assert_allclose(np.asarray(traced), want, atol=1e-6)


def test_a_temperature_per_row():
  logits = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (4, 3, 11))) * 2
  temperatures = [0.0, 0.5, 1.0, 1.7]
  got = np.asarray(sampling.logits_to_probs(jnp.asarray(logits), np.array(temperatures), 3))
  for row, temperature in enumerate(temperatures):
    want = np.stack([reference_probs(position, temperature, 3, 0.0) for position in logits[row]])
    np.testing.assert_allclose(got[row], want, atol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_topp():
  logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, 0, 0.8), [.625, .375, 0, 0],
                             atol=1e-6)
  np.testing.assert_allclose(sampling.logits_to_probs(logits, 1.0, 0, 0.81),
                             [.5 / .95, .3 / .95, .15 / .95, 0], atol=1e-6)


@pytest.mark.parametrize("kwargs,name", [
    (dict(temperature=-0.1, topk=0, topp=0.0), "temperature"),
    (dict(temperature=1.0, topk=-1, topp=0.0), "topk"),
    (dict(temperature=1.0, topk=1.5, topp=0.0), "topk"),
    (dict(temperature=1.0, topk=0, topp=1.2), "topp"),
    (dict(temperature=1.0, topk=0, topp=-0.1), "topp"),
    (dict(temperature=np.array([1.0, -0.5]), topk=0, topp=0.0), "temperature"),
    (dict(temperature=np.ones((2, 2)), topk=0, topp=0.0), "temperature"),
    (dict(temperature=1.0, topk=np.array([1, 2]), topp=0.0), "topk"),
    (dict(temperature=1.0, topk=3, topp=0.5), r"at most one of topk \(3\) and topp \(0.5\)"),
    (dict(temperature=0.0, topk=1, topp=np.float32(0.9)), "at most one of topk")])
def test_bad_arguments_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    sampling.validate_sampling_args(**kwargs)


def test_topk_and_topp_together_are_checked_only_where_both_are_known():
  """As in T5X's temperature_sample: where either is traced nothing is checked, and the
  transform masks top-k, then top-p within it."""
  jax.jit(lambda topk: sampling.validate_sampling_args(1.0, topk, 0.5))(jnp.int32(3))
  jax.jit(lambda topp: sampling.validate_sampling_args(1.0, 3, topp))(jnp.float32(0.5))


def test_sample_draws_each_row_from_its_own_unnormalized_law():
  from scipy import stats
  # Two rows with zeros in different places, unnormalized, one entry rounded below zero.
  probs = np.array([[0.0, 3.0, 1.0, 0.0, 4.0, -1e-8],
                    [2.0, 0.0, 0.0, 0.5, 0.5, 1.0]], np.float32)
  num_samples = 100_000
  tokens = np.asarray(sampling.sample(jax.random.PRNGKey(0),
                                      jnp.broadcast_to(probs, (num_samples, 2, 6))))
  assert tokens.shape == (num_samples, 2) and tokens.dtype == np.int32
  for row in range(2):
    law = np.maximum(probs[row], 0.0) / np.maximum(probs[row], 0.0).sum()
    counts = np.bincount(tokens[:, row], minlength=6)
    assert np.all(counts[law == 0] == 0), counts
    kept = law > 0
    assert stats.chisquare(counts[kept], num_samples * law[kept]).pvalue > 1e-3


@pytest.mark.parametrize("point_masses", [False, True])
def test_sample_of_a_one_hot_row_is_its_token(point_masses):
  one_hot = jax.nn.one_hot(jnp.array([0, 7, 4095]), 4096)
  for seed in range(20):
    np.testing.assert_array_equal(
        sampling.sample(jax.random.PRNGKey(seed), one_hot, point_masses=point_masses),
        [0, 7, 4095])


@pytest.mark.parametrize("vocab_size", [6, 97, 4099, 8000, 32128])
def test_sample_from_uniform_is_the_inverse_cdf(vocab_size):
  """Against the inverse CDF computed in float64: the same id but for rounding ties, never an
  id of probability 0 (vocabularies of one block, primes, padded to whole blocks, and T5's
  32128 = 251 x 128)."""
  rng = np.random.default_rng(vocab_size)
  probs = rng.random((2000, vocab_size)).astype(np.float32) ** 8
  probs[:, rng.random(vocab_size) < 0.3] = 0.0
  uniform = rng.random(2000).astype(np.float32)
  got = np.asarray(sampling.sample_from_uniform(jnp.asarray(uniform), jnp.asarray(probs)))
  mass = np.cumsum(probs.astype(np.float64), axis=1)
  want = np.argmax(mass > (uniform * mass[:, -1])[:, None], axis=1)
  assert np.mean(got == want) >= 0.995
  assert np.all(probs[np.arange(2000), got] > 0)
