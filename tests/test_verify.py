"""Verification rules, computed exactly from their laws (no sampling) and by sampling."""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import verify

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest


def random_probs(rng, shape, concentration=1.0):
  return np.asarray(jax.random.dirichlet(rng, jnp.full(shape[-1], concentration), shape[:-1]),
                    np.float64)


def one_hot_probs(rng, shape):
  return np.eye(shape[-1])[np.asarray(jax.random.randint(rng, shape[:-1], 0, shape[-1]))]


def outcome_law(rule, draft_probs, target_probs, num_drafted):
  """Yields (probability of the drafts, drafts, Verdict) for every draft tuple in V^G."""
  gamma, vocab = draft_probs.shape
  drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)), np.int32)
  verdict = rule(jnp.asarray(drafts), jnp.broadcast_to(draft_probs, drafts.shape + (vocab,)),
                 jnp.broadcast_to(target_probs, (len(drafts),) + target_probs.shape),
                 jnp.full((len(drafts),), num_drafted, jnp.int32))
  draft_law = np.prod(draft_probs[np.arange(gamma), drafts], axis=1)
  return draft_law, drafts, jax.tree_util.tree_map(np.asarray, verdict)


def first_token_marginal(rule, draft_probs, target_probs, num_drafted):
  draft_law, drafts, verdict = outcome_law(rule, draft_probs, target_probs, num_drafted)
  vocab = draft_probs.shape[-1]
  accepted_any = verdict.num_accepted_probs[:, 1:].sum(axis=1)
  marginal = draft_law[:, None] * (accepted_any[:, None] * np.eye(vocab)[drafts[:, 0]]
                                   + verdict.num_accepted_probs[:, :1]
                                   * verdict.next_token_probs[:, 0])
  return marginal.sum(axis=0)


def expected_accepted(rule, draft_probs, target_probs):
  draft_law, _, verdict = outcome_law(rule, draft_probs, target_probs, draft_probs.shape[0])
  lengths = np.arange(verdict.num_accepted_probs.shape[1])
  return float(np.sum(draft_law * (verdict.num_accepted_probs @ lengths)))


@pytest.mark.parametrize("name", sorted(verify.EXACT_RULES))
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed", range(3))
def test_first_emitted_token_is_distributed_as_p1(name, gamma, seed):
  rng_p, rng_q = jax.random.split(jax.random.PRNGKey(seed))
  target_probs = random_probs(rng_p, (gamma + 1, 4), 0.7)
  draft_probs = random_probs(rng_q, (gamma, 4), 0.7)
  for num_drafted in range(1, gamma + 1):
    marginal = first_token_marginal(verify.EXACT_RULES[name], draft_probs, target_probs,
                                    num_drafted)
    np.testing.assert_allclose(marginal, target_probs[0], atol=1e-5)


def test_the_marginal_check_has_power():
  """A rule that resamples from p instead of the residual is caught by the same computation."""
  def resample_from_p(draft_tokens, draft_probs, target_probs, num_drafted):
    verdict = verify.token_rule(draft_tokens, draft_probs, target_probs, num_drafted)
    return verify.Verdict(verdict.num_accepted_probs,
                          jnp.broadcast_to(target_probs, verdict.next_token_probs.shape))
  rng_p, rng_q = jax.random.split(jax.random.PRNGKey(0))
  target_probs = random_probs(rng_p, (3, 4), 0.7)
  draft_probs = random_probs(rng_q, (2, 4), 0.7)
  marginal = first_token_marginal(resample_from_p, draft_probs, target_probs, 2)
  assert np.max(np.abs(marginal - target_probs[0])) > 1e-2


def paper_block_rule(mistake: str | None = None) -> verify.Rule:
  """Block verification transcribed from the paper's Algorithm 2 (Sun et al., 2025) position by
  position, apart from `verify.block_rule`'s vectorized form; or with one `mistake` that only
  matters from block position 2 on: 'weights' (w_i = min(1, p_i(x_i)/q_i(x_i)), forgetting
  w_{i-1}), 'keep' (h_i = r_i / (r_i + 1 - w_{i-1}), an index off by one) or 'residual' (the
  residual after tau >= 1 accepted drafts drawn from max(p - q, 0), forgetting w_tau)."""
  def rule(draft_tokens, draft_probs, target_probs, num_drafted):
    gamma = draft_tokens.shape[1]
    p_x = jnp.take_along_axis(target_probs[:, :gamma], draft_tokens[..., None], -1)[..., 0]
    q_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], -1)[..., 0]
    drafted = jnp.arange(gamma) < num_drafted[:, None]
    ratio = jnp.where(drafted & (p_x > 0), p_x / q_x, 0.0)
    w = [jnp.ones_like(ratio[:, 0])]  # w_0 .. w_G
    for i in range(1, gamma + 1):
      previous = jnp.ones_like(w[0]) if mistake == "weights" and i >= 2 else w[i - 1]
      w.append(jnp.minimum(1.0, previous * ratio[:, i - 1]))
    keep, residuals = [jnp.ones_like(w[0])], []  # h_0 = 1; the residual at positions 1 .. G
    for i in range(gamma):
      excess = jnp.maximum(w[i][:, None] * target_probs[:, i] - draft_probs[:, i], 0.0)
      if i >= 1:  # h_i, from r_i = sum(excess)
        other = w[i - 1] if mistake == "keep" and i >= 2 else w[i]
        denominator = excess.sum(-1) + 1.0 - other
        h = jnp.where(denominator > 0, excess.sum(-1) / jnp.where(denominator > 0,
                                                                  denominator, 1.0), 1.0)
        keep.append(jnp.where(i == num_drafted, w[i], jnp.where(i > num_drafted, 0.0, h)))
      if mistake == "residual" and i >= 1:
        excess = jnp.maximum(target_probs[:, i] - draft_probs[:, i], 0.0)
      total = excess.sum(-1, keepdims=True)
      residuals.append(jnp.where(total > 0, excess / jnp.where(total > 0, total, 1.0),
                                 target_probs[:, i]))
    keep.append(jnp.where(num_drafted == gamma, w[gamma], 0.0))  # h_G
    # P(tau = i) = h_i * prod_{j > i} (1 - h_j): the largest position whose coin says yes.
    none_later = [jnp.ones_like(w[0])]
    for i in range(gamma, 0, -1):
      none_later.insert(0, none_later[0] * (1.0 - keep[i]))
    next_token = jnp.stack(residuals + [target_probs[:, gamma]], axis=1)
    bonus = jnp.arange(gamma + 1) == num_drafted[:, None]
    return verify.Verdict(jnp.stack(keep, 1) * jnp.stack(none_later, 1),
                          jnp.where(bonus[..., None], target_probs, next_token))
  return rule


BLOCK_MISTAKES = ("weights", "keep", "residual")


def prefix_laws(seed: int, gamma: int, vocab: int) -> tuple[dict, dict]:
  """A target law p(. | prefix) for every prefix of up to gamma tokens and a draft law
  q(. | prefix) for every prefix of fewer, each its own random distribution, as a language
  model's next-token laws depend on the prefix."""
  rng = np.random.default_rng(seed)
  laws = lambda longest: {prefix: rng.dirichlet(np.full(vocab, 0.7))
                          for n in range(longest + 1)
                          for prefix in itertools.product(range(vocab), repeat=n)}
  return laws(gamma), laws(gamma - 1)


def block_law_distance(rule, seed: int, gamma: int, vocab: int, num_drafted: int,
                       positions: int | None = None) -> float:
  """L1 distance between the target's law of the first `positions` (all gamma + 1 by default)
  tokens and that of speculative sampling's: one iteration of `rule` over num_drafted drafts
  from q, the positions after the ones it emits filled from p, as the next iterations do. Both
  are exact sums over every draft tuple, verdict and continuation."""
  p, q = prefix_laws(seed, gamma, vocab)
  drafts = np.array([x + (0,) * (gamma - num_drafted)
                     for x in itertools.product(range(vocab), repeat=num_drafted)], np.int32)
  uniform = np.full(vocab, 1.0 / vocab)  # the law of a draft past num_drafted: never weighed
  draft_probs = np.array([[q[tuple(x[:j])] if j < num_drafted else uniform
                           for j in range(gamma)] for x in drafts])
  target_probs = np.array([[p[tuple(x[:j])] for j in range(gamma + 1)] for x in drafts])
  verdict = jax.tree_util.tree_map(np.asarray, rule(
      jnp.asarray(drafts), jnp.asarray(draft_probs, jnp.float32),
      jnp.asarray(target_probs, jnp.float32), jnp.full((len(drafts),), num_drafted, jnp.int32)))
  continuation = lambda s, start: np.prod([p[s[:j]][s[j]] for j in range(start, gamma + 1)])
  sequences = list(itertools.product(range(vocab), repeat=gamma + 1))
  target = {s: continuation(s, 0) for s in sequences}
  sampled = dict.fromkeys(sequences, 0.0)
  for x, accepted, next_token in zip(drafts, verdict.num_accepted_probs,
                                     verdict.next_token_probs):
    drafted = np.prod([q[tuple(x[:j])][x[j]] for j in range(num_drafted)])
    for n in range(num_drafted + 1):
      for y in range(vocab):
        emitted = tuple(int(t) for t in x[:n]) + (y,)
        for rest in itertools.product(range(vocab), repeat=gamma - n):
          s = emitted + rest
          sampled[s] += drafted * accepted[n] * next_token[n, y] * continuation(s, n + 1)
  length = gamma + 1 if positions is None else positions
  difference = collections.defaultdict(float)  # per prefix of `length` tokens
  for s in sequences:
    difference[s[:length]] += sampled[s] - target[s]
  return sum(abs(d) for d in difference.values())


@pytest.mark.parametrize("name", sorted(verify.EXACT_RULES))
@pytest.mark.parametrize("seed", range(3))
def test_every_emitted_token_of_a_block_follows_the_target(name, seed):
  """The whole block, not only its first token: with prefix-dependent laws, every rule keeps
  the target's joint law of gamma + 1 positions, for every number of drafts."""
  gamma = 3
  for num_drafted in range(1, gamma + 1):
    assert block_law_distance(verify.EXACT_RULES[name], seed, gamma, 3, num_drafted) < 1e-5


@pytest.mark.parametrize("mistake", BLOCK_MISTAKES)
def test_the_block_law_check_catches_mistakes_past_the_first_token(mistake):
  """The paper's block rule as written is `verify.block_rule` (same verdicts); each mistake in
  it, which matters only from position 2 on, moves the block's law, and 'residual' leaves the
  first emitted token's law as it was: only the whole block's law shows it."""
  gamma, vocab = 3, 3
  rng_p, rng_q, rng_x = jax.random.split(jax.random.PRNGKey(0), 3)
  target_probs = jax.random.dirichlet(rng_p, jnp.full(vocab, 0.7), (64, gamma + 1))
  draft_probs = jax.random.dirichlet(rng_q, jnp.full(vocab, 0.7), (64, gamma))
  draft_tokens = jax.random.categorical(rng_x, jnp.log(draft_probs))
  num_drafted = jnp.arange(64) % (gamma + 1)
  for want, got in zip(
      jax.tree_util.tree_leaves(verify.block_rule(draft_tokens, draft_probs, target_probs,
                                                  num_drafted)),
      jax.tree_util.tree_leaves(paper_block_rule()(draft_tokens, draft_probs, target_probs,
                                                   num_drafted))):
    np.testing.assert_allclose(got, want, atol=1e-5)
  wrong = paper_block_rule(mistake)
  distances = {(seed, num_drafted): block_law_distance(wrong, seed, gamma, vocab, num_drafted)
               for seed in range(3) for num_drafted in range(1, gamma + 1)}
  assert max(distances.values()) > 1e-2, distances
  assert all(distances[seed, 1] < 1e-5 for seed in range(3))  # one draft: no position 2
  if mistake == "residual":
    assert all(block_law_distance(wrong, seed, gamma, vocab, num_drafted, positions=1) < 1e-5
               for seed in range(3) for num_drafted in range(1, gamma + 1))


@pytest.mark.parametrize("seed", range(6))
def test_block_accepts_at_least_as_many_tokens_as_token(seed):
  rng_p, rng_q = jax.random.split(jax.random.PRNGKey(seed))
  gamma = 1 + seed % 3
  target_probs = random_probs(rng_p, (gamma + 1, 4), 0.8)
  draft_probs = random_probs(rng_q, (gamma, 4), 0.8)
  token = expected_accepted(verify.token_rule, draft_probs, target_probs)
  block = expected_accepted(verify.block_rule, draft_probs, target_probs)
  assert block >= token - 1e-6
  if gamma > 1:
    assert block > token + 1e-4  # strictly better on generic distributions


@pytest.mark.parametrize("seed", range(4))
def test_block_equals_token_at_temperature_zero(seed):
  rng_p, rng_q = jax.random.split(jax.random.PRNGKey(seed))
  target_probs = one_hot_probs(rng_p, (4, 3))
  draft_probs = one_hot_probs(rng_q, (3, 3))
  draft_law, _, token_verdict = outcome_law(verify.token_rule, draft_probs, target_probs, 3)
  _, _, block_verdict = outcome_law(verify.block_rule, draft_probs, target_probs, 3)
  support = draft_law > 0
  np.testing.assert_allclose(block_verdict.num_accepted_probs[support],
                             token_verdict.num_accepted_probs[support], atol=1e-6)


@pytest.mark.parametrize("name", sorted(verify.EXACT_RULES))
def test_empty_residual_is_not_nan(name):
  probs = random_probs(jax.random.PRNGKey(0), (4, 5))
  draft_tokens = jnp.array([[1, 2, 3]])
  verdict = verify.EXACT_RULES[name](draft_tokens, jnp.asarray(probs[None, :3]),
                                     jnp.asarray(probs[None]), jnp.array([3]))
  assert np.all(np.isfinite(verdict.next_token_probs))
  np.testing.assert_allclose(verdict.num_accepted_probs, [[0, 0, 0, 1]], atol=1e-6)
  num_accepted, next_token = verify.verify(jax.random.PRNGKey(1), draft_tokens,
                                           jnp.asarray(probs[None, :3]), jnp.asarray(probs[None]),
                                           rule=name)
  assert int(num_accepted[0]) == 3 and 0 <= int(next_token[0]) < 5


def test_sampled_outcomes_follow_the_law():
  """verify() draws (num_accepted, next_token) with the verdict's probabilities."""
  rng_p, rng_q, rng_x, rng_v = jax.random.split(jax.random.PRNGKey(7), 4)
  target_probs = jnp.asarray(random_probs(rng_p, (3, 4)), jnp.float32)
  draft_probs = jnp.asarray(random_probs(rng_q, (2, 4)), jnp.float32)
  draft_tokens = jax.random.categorical(rng_x, jnp.log(draft_probs), shape=(2,))[None]
  verdict = verify.token_rule(draft_tokens, draft_probs[None], target_probs[None],
                              jnp.array([2]))
  num_samples = 200_000
  tile = lambda x: jnp.broadcast_to(x, (num_samples,) + x.shape[1:])
  num_accepted, _ = verify.verify(rng_v, tile(draft_tokens), tile(draft_probs[None]),
                                  tile(target_probs[None]))
  frequencies = np.bincount(np.asarray(num_accepted), minlength=3) / num_samples
  np.testing.assert_allclose(frequencies, verdict.num_accepted_probs[0], atol=5e-3)


def test_registry_rejects_duplicates_and_unknown_names():
  with pytest.raises(ValueError, match="already registered"):
    verify.register_rule("token", verify.token_rule, exact=True)
  with pytest.raises(ValueError, match="verifier must be one of"):
    verify.get_rule("nope")


@pytest.mark.parametrize("name", sorted(verify.EXACT_RULES))
def test_laws_are_probabilities(name):
  """No rounding below zero (a negative probability would be a NaN logit when sampling)."""
  rng_p, rng_q, rng_x = jax.random.split(jax.random.PRNGKey(0), 3)
  target_probs = jax.random.dirichlet(rng_p, jnp.full(5, 0.7), (2000, 4))
  draft_probs = jax.random.dirichlet(rng_q, jnp.full(5, 0.7), (2000, 3))
  draft_tokens = jax.random.categorical(rng_x, jnp.log(draft_probs))
  verdict = verify.EXACT_RULES[name](draft_tokens, draft_probs, target_probs,
                                     jnp.full((2000,), 3))
  assert float(verdict.num_accepted_probs.min()) >= 0.0
  np.testing.assert_allclose(verdict.num_accepted_probs.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", sorted({**verify.EXACT_RULES, **verify.LOSSY_RULES}))
@pytest.mark.parametrize("seed", range(6))
def test_every_rule_at_point_masses_is_the_token_comparison(name, seed):
  """Greedy decoding verifies by `compare_tokens` instead of a rule's law: for every registered
  rule, when p and q are point masses, the law must put all its mass on that comparison's
  outcome (accept while the draft is the target's token; then the target's token)."""
  rng_p, rng_q = jax.random.split(jax.random.PRNGKey(seed))
  gamma, vocab = 3, 3
  target_probs = one_hot_probs(rng_p, (8, gamma + 1, vocab))
  draft_probs = one_hot_probs(rng_q, (8, gamma, vocab))
  if seed % 2:  # rows whose drafts agree with the target more often
    draft_probs[:4] = target_probs[:4, :gamma]
  draft_tokens = jnp.asarray(draft_probs.argmax(-1), jnp.int32)
  target_tokens = jnp.asarray(target_probs.argmax(-1), jnp.int32)
  for num_drafted in range(gamma + 1):
    drafted = jnp.full((8,), num_drafted, jnp.int32)
    verdict = verify.get_rule(name)(draft_tokens, jnp.asarray(draft_probs, jnp.float32),
                                    jnp.asarray(target_probs, jnp.float32), drafted)
    num_accepted, next_token = verify.compare_tokens(draft_tokens, target_tokens, drafted)
    rows = np.arange(8)
    np.testing.assert_allclose(np.asarray(verdict.num_accepted_probs)[rows, num_accepted], 1.0,
                               atol=1e-6)
    emitted = np.asarray(verdict.next_token_probs)[rows, num_accepted]
    np.testing.assert_allclose(emitted[rows, next_token], 1.0, atol=1e-6)
    assert np.all(np.asarray(num_accepted) <= num_drafted)


def test_the_token_comparison_has_power():
  """A comparison that ignores num_drafted, or emits the draft after a mismatch, is caught."""
  draft_tokens = jnp.asarray([[1, 2, 0]], jnp.int32)
  target_tokens = jnp.asarray([[1, 2, 2, 0]], jnp.int32)
  n, token = verify.compare_tokens(draft_tokens, target_tokens, jnp.asarray([3]))
  assert (int(n[0]), int(token[0])) == (2, 2)
  n, token = verify.compare_tokens(draft_tokens, target_tokens, jnp.asarray([1]))
  assert (int(n[0]), int(token[0])) == (1, 2)
