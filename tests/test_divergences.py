"""`spec_decode.training.divergences`: each divergence against values worked out by hand on small
distributions, total variation as 1 - alpha, zero where target and draft agree, finite
gradients at one-hot and zero-probability entries, the generalized JSD's limits in beta, and
bad settings in one line."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.training import divergences

# p = (1/2, 1/2), q = (1/4, 3/4), given as logits (log-probabilities).
P = (0.5, 0.5)
Q = (0.25, 0.75)
# Worked out by hand from the definitions:
#   KL(p||q) = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
#   KL(q||p) = 1/4 ln(1/2) + 3/4 ln(3/2)
#   m = (3/8, 5/8): KL(p||m) = 1/2 ln(4/3) + 1/2 ln(4/5) = 1/2 ln(16/15),
#                   KL(q||m) = 1/4 ln(2/3) + 3/4 ln(6/5); JSD(1/2) = their mean
#   TV = 1/2 (1/4 + 1/4) = 1/4, alpha = min(1/2,1/4) + min(1/2,3/4) = 3/4
BY_HAND = {
    "forward_kl": 0.5 * math.log(4 / 3),
    "reverse_kl": 0.25 * math.log(0.5) + 0.75 * math.log(1.5),
    "jsd": 0.5 * (0.5 * math.log(16 / 15) + 0.25 * math.log(2 / 3) + 0.75 * math.log(6 / 5)),
    "tv": 0.25,
}


def _logits(probs):
  return jnp.log(jnp.asarray(probs, jnp.float32))


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_values_worked_out_by_hand(name):
  value = divergences.per_position(name, _logits(P), _logits(Q))
  np.testing.assert_allclose(float(value), BY_HAND[name], rtol=1e-5)


def test_temperature_divides_the_logits():
  # Logits (0, 2 ln 3) at temperature 2 are (0, ln 3): probabilities (1/4, 3/4) = Q.
  target = jnp.asarray([0.0, 2 * math.log(3.0)])
  value = divergences.per_position("forward_kl", _logits(P), target, temperature=1.0)
  assert abs(float(value) - BY_HAND["forward_kl"]) > 0.1  # at temperature 1 it is not Q
  both_at_2 = divergences.per_position("reverse_kl", 2 * _logits(P), target, temperature=2.0)
  np.testing.assert_allclose(float(both_at_2), BY_HAND["reverse_kl"], rtol=1e-5)


def test_a_three_way_case_by_hand():
  # p = (0.7, 0.2, 0.1), q = (0.1, 0.3, 0.6): |p - q| = (0.6, 0.1, 0.5), TV = 0.6;
  # min = (0.1, 0.2, 0.1), alpha = 0.4.
  p, q = (0.7, 0.2, 0.1), (0.1, 0.3, 0.6)
  np.testing.assert_allclose(float(divergences.per_position("tv", _logits(p), _logits(q))), 0.6,
                             rtol=1e-5)
  sums = divergences.weighted_sums("tv", _logits(p)[None, None], _logits(q)[None, None],
                                   jnp.ones((1, 1)))
  np.testing.assert_allclose(float(sums["alpha_sum"]), 0.4, rtol=1e-5)


def test_alpha_at_temperatures_0_and_1_by_hand():
  # Four positions of a 3-token vocabulary, the last weighted 0:
  #   p (0.7, 0.2, 0.1)  q (0.1, 0.3, 0.6)   argmaxes 0, 2: disagree; min sum 0.4
  #   p (0.5, 0.3, 0.2)  q (0.35, 0.45, 0.2) argmaxes 0, 1: disagree; min sum 0.85
  #   p (0.1, 0.6, 0.3)  q (0.2, 0.5, 0.3)   argmaxes 1, 1: agree;    min sum 0.9
  #   p (0.6, 0.3, 0.1)  q (0.6, 0.3, 0.1)   agree, but weight 0
  # alpha at T=0 = 1 agreement of 3 weighted positions; at T=1 = 0.4 + 0.85 + 0.9 = 2.15.
  p = [(0.7, 0.2, 0.1), (0.5, 0.3, 0.2), (0.1, 0.6, 0.3), (0.6, 0.3, 0.1)]
  q = [(0.1, 0.3, 0.6), (0.35, 0.45, 0.2), (0.2, 0.5, 0.3), (0.6, 0.3, 0.1)]
  weights = jnp.asarray([[1, 1, 1, 0]])
  sums = divergences.alpha_sums(_logits(p)[None], _logits(q)[None], weights)
  np.testing.assert_allclose(float(sums["alpha_t0_sum"]), 1.0)
  np.testing.assert_allclose(float(sums["alpha_t1_sum"]), 2.15, rtol=1e-5)
  # The rate at T=0 is the fraction of weighted positions whose argmaxes agree.
  counted = divergences.weighted_sums("tv", _logits(p)[None], _logits(q)[None], weights)
  np.testing.assert_allclose(float(sums["alpha_t0_sum"] / counted["num_tokens"]), 1 / 3)
  # Scaling both logits by 3 keeps the argmaxes (T=0 unchanged) and changes the T=1 law.
  scaled = divergences.alpha_sums(3 * _logits(p)[None], 3 * _logits(q)[None], weights)
  np.testing.assert_allclose(float(scaled["alpha_t0_sum"]), 1.0)
  assert abs(float(scaled["alpha_t1_sum"]) - 2.15) > 0.1


def test_total_variation_is_one_minus_alpha_and_weights_mask_positions():
  rng = np.random.default_rng(0)
  target = jnp.asarray(rng.normal(size=(3, 5, 11)) * 2, jnp.float32)
  draft = jnp.asarray(rng.normal(size=(3, 5, 11)) * 2, jnp.float32)
  weights = jnp.asarray(rng.integers(0, 2, size=(3, 5)), jnp.float32)
  for temperature in (0.5, 1.0, 2.0):
    sums = divergences.weighted_sums("tv", target, draft, weights, temperature=temperature)
    tv = divergences.per_position("tv", target, draft, temperature=temperature)
    np.testing.assert_allclose(float(sums["divergence_sum"]),
                               float(sums["num_tokens"] - sums["alpha_sum"]), rtol=1e-5)
    np.testing.assert_allclose(float(sums["divergence_sum"]), float(jnp.sum(tv * weights)),
                               rtol=1e-5)
    assert float(sums["num_tokens"]) == float(weights.sum())


@pytest.mark.parametrize("name", sorted(divergences.DIVERGENCES))
def test_zero_where_target_and_draft_agree(name):
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 9)) * 3, jnp.float32)
  np.testing.assert_allclose(np.asarray(divergences.per_position(name, logits, logits)), 0.0,
                             atol=1e-6)
  # Shifting the logits leaves the distribution, hence the divergence, unchanged.
  np.testing.assert_allclose(np.asarray(divergences.per_position(name, logits, logits + 5.0)),
                             0.0, atol=1e-5)
  # And a different draft is not at zero.
  assert float(divergences.per_position(name, logits, -logits).min()) > 1e-3


@pytest.mark.parametrize("name", sorted(divergences.DIVERGENCES))
@pytest.mark.parametrize("zero", [-1e9, -jnp.inf])
def test_gradients_finite_at_one_hot_and_zero_probability_entries(name, zero):
  one_hot = jnp.asarray([0.0, zero, zero, zero])  # p = (1, 0, 0, 0) exactly
  draft = jnp.asarray([0.3, -0.2, 1.0, 0.0])

  def loss(target_logits, draft_logits):
    return divergences.per_position(name, target_logits, draft_logits)

  value = loss(one_hot, draft)
  if name == "reverse_kl" and zero == -jnp.inf:
    # KL(q || p) is infinite where q > 0 = p exactly: reported so, not hidden.
    assert float(value) == np.inf
    return
  assert np.isfinite(float(value))
  grads = jax.grad(loss, argnums=1)(one_hot, draft)  # the draft's: what training follows
  assert np.all(np.isfinite(np.asarray(grads))), grads
  assert float(jnp.abs(grads).sum()) > 0
  # Both one-hot on the same token: zero divergence, finite gradients.
  same = jax.grad(loss, argnums=1)(one_hot, jnp.asarray([0.0, -1e9, -1e9, -1e9]))
  assert np.all(np.isfinite(np.asarray(same)))
  if name in ("forward_kl", "jsd", "tv"):  # reverse KL is infinite where q > 0 = p
    assert np.all(np.isfinite(np.asarray(jax.grad(loss, argnums=0)(one_hot, draft))))


def test_jsd_limits_in_beta():
  p, q = _logits(P), _logits(Q)
  for beta in (1e-3, 1e-4):
    value = divergences.per_position("jsd", p, q, beta=beta)
    np.testing.assert_allclose(float(value) / beta, BY_HAND["forward_kl"], rtol=1e-2)
    value = divergences.per_position("jsd", p, q, beta=1 - beta)
    np.testing.assert_allclose(float(value) / beta, BY_HAND["reverse_kl"], rtol=1e-2)
  # Symmetry: JSD_beta(p, q) = JSD_{1-beta}(q, p); and JSD(1/2) <= ln 2.
  np.testing.assert_allclose(float(divergences.per_position("jsd", p, q, beta=0.3)),
                             float(divergences.per_position("jsd", q, p, beta=0.7)), rtol=1e-5)
  disjoint = divergences.per_position("jsd", jnp.asarray([0.0, -1e9]), jnp.asarray([-1e9, 0.0]))
  np.testing.assert_allclose(float(disjoint), math.log(2), rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="kl"), "unknown divergence 'kl'; known: forward_kl, jsd, reverse_kl, tv"),
    (dict(name="jsd", beta=0.0), "beta must be in (0, 1), got 0.0"),
    (dict(name="jsd", beta=1.0), "beta must be in (0, 1), got 1.0"),
    (dict(name="tv", temperature=0.0), "the divergence temperature must be > 0, got 0.0"),
])
def test_bad_settings_are_one_line(kwargs, message):
  name = kwargs.pop("name")
  with pytest.raises(ValueError) as raised:
    divergences.per_position(name, _logits(P), _logits(Q), **kwargs)
  assert str(raised.value) == message
