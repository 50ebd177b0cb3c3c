"""Engine behavior on toy models: greedy identity, per-row bookkeeping, contracts, errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.engine import decoding, drafting, lookup, loops, verify
import tiers
import toy_loop  # pylint: disable=unused-import  # a user's policy among the registered ones
import toy_setup
from toy_setup import EOS

GREEDY = (0.0, 0, 0.0)
VOCAB = 12
LENGTH = 10


@pytest.mark.slow
@pytest.mark.parametrize("batch_size,num_batches,draft", tiers.newest_among(
    [(1, 25, "near"), (1, 25, "same"), (7, 30, "near"), (7, 30, "same")], {(7, 30, "near")}))
def test_greedy_speculative_equals_baseline(draft, batch_size, num_batches):
  """Token for token, gamma in {1,2,3,5,8}, mixed prompt lengths, EOS inside accepted blocks
  ('same' accepts every draft) and the length limit inside a block."""
  target, draft_model = toy_setup.make_pair(VOCAB, draft, eos_shift=-1.0)
  rng = np.random.default_rng(batch_size)
  ended_by_eos = ended_by_length = 0
  for _ in range(num_batches):
    inputs = jnp.asarray(toy_setup.random_prompts(rng, batch_size, LENGTH, VOCAB, 4))
    want, want_log_probs = toy_setup.baseline(target, inputs, jax.random.PRNGKey(0),
                                              sampling_args=GREEDY)
    for gamma in (1, 2, 3, 5, 8):
      got, got_log_probs, stats = toy_setup.speculative(
          target, draft_model, inputs, jax.random.PRNGKey(1), gamma, sampling_args=GREEDY)
      np.testing.assert_array_equal(got, want)
      np.testing.assert_allclose(got_log_probs, want_log_probs, rtol=1e-5, atol=1e-5)
      if draft == "same":
        sampled_rows = np.asarray(stats.verified_positions) > 0
        np.testing.assert_allclose(np.asarray(stats.alpha)[sampled_rows], 1.0, atol=1e-6)
    has_eos = np.any(np.asarray(want)[:, 0] == EOS, axis=1)
    ended_by_eos += int(has_eos.sum())
    ended_by_length += int((~has_eos & (np.asarray(want)[:, 0, -1] != 0)).sum())
  assert ended_by_eos > 0 and ended_by_length > 0


@pytest.mark.parametrize("verifier", sorted(verify.EXACT_RULES))
@pytest.mark.parametrize("draft_policy", sorted(drafting.POLICIES))
def test_greedy_identity_for_every_registered_decoder(verifier, draft_policy):
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  rng = np.random.default_rng(11)
  for _ in range(10):
    inputs = jnp.asarray(toy_setup.random_prompts(rng, 7, LENGTH, VOCAB, 4))
    want, _ = toy_setup.baseline(target, inputs, jax.random.PRNGKey(0), sampling_args=GREEDY)
    got, _, _ = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(1), 4,
                                      sampling_args=GREEDY, verifier=verifier,
                                      draft_policy=draft_policy)
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_adaptive_policies_draft_fewer_tokens():
  """'confidence' stops early on an unsure draft; the draft loop really makes fewer calls."""
  target, draft = toy_setup.make_pair(VOCAB, "far", eos_shift=-3.0)
  inputs = jnp.zeros((1, LENGTH), jnp.int32)
  _, _, fixed_stats = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(0), 5)
  _, _, adaptive_stats = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(0), 5,
                                               draft_policy="confidence")
  fixed_per_call = fixed_stats.draft_calls / fixed_stats.target_calls
  adaptive_per_call = adaptive_stats.draft_calls / adaptive_stats.target_calls
  assert float(fixed_per_call[0, 0]) == 5.0
  assert float(adaptive_per_call[0, 0]) < 5.0
  assert int(adaptive_stats.drafted_tokens[0, 0]) <= int(adaptive_stats.draft_calls[0, 0])


# Bindings under which each adaptive policy stops blocks before gamma on the toy model at each
# temperature; without early stops the alpha test below would have no power. At temperature 0
# every draft distribution is a point mass, so 'confidence' stops only at a threshold above 1
# (after every first draft); 'expected_speedup' stops early on a pessimistic prior alpha.
EARLY_STOPPING_BINDINGS = {
    ("confidence", 1.0): dict(threshold=0.5),
    ("confidence", 0.0): dict(threshold=1.5),
    ("expected_speedup", 1.0): dict(prior_alpha=0.2),
    ("expected_speedup", 0.0): dict(prior_alpha=0.2),
}


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("verifier", sorted({**verify.EXACT_RULES, **verify.LOSSY_RULES}))
@pytest.mark.parametrize("draft_policy", sorted(drafting.POLICIES))
def test_draft_equal_to_target_has_alpha_one(draft_policy, verifier, temperature):
  """With the target as its own draft every verified position has sum_x min(p, q) = 1, so alpha
  is exactly 1 in every row, including rows that an adaptive policy stopped after m < gamma
  drafts: the bonus token at block offset m was never drafted and must not count."""
  model, _ = toy_setup.make_pair(VOCAB, "same", eos_shift=-1.0)
  bindings = EARLY_STOPPING_BINDINGS.get((draft_policy, temperature))
  policy = functools.partial(drafting.POLICIES[draft_policy], **(bindings or {}))
  inputs = jnp.asarray(toy_setup.random_prompts(np.random.default_rng(4), 7, LENGTH, VOCAB, 4))
  gamma = 3  # one compilation per case: 12 cases already
  _, _, stats = toy_setup.speculative(model, model, inputs, jax.random.PRNGKey(gamma), gamma,
                                      sampling_args=(temperature, 0, 0.0), verifier=verifier,
                                      draft_policy=policy)
  np.testing.assert_allclose(stats.alpha, 1.0, atol=1e-6)
  # Every draft is accepted. accepted_tokens counts only the kept ones, and a row's last block
  # alone can lose drafts (past EOS or the length limit): fewer than gamma, as its first fits.
  lost_drafts = np.asarray(stats.drafted_tokens - stats.accepted_tokens)
  assert np.all((lost_drafts >= 0) & (lost_drafts < gamma)), lost_drafts
  if bindings is not None:
    assert np.any(stats.drafted_tokens < gamma * stats.target_calls)


# Bindings under which each policy keeps a row drafting at temperature 0 (a point-mass draft),
# whatever its running alpha: a finished row that still drafted would then draft gamma tokens.
DRAFTING_BINDINGS = {"expected_speedup": dict(prior_alpha=0.95, prior_weight=1e6)}


def _row_ends_at_once(tokens_to_logits, row: int):
  """`tokens_to_logits` whose `row` puts all its mass on EOS: that row ends at its first token."""
  def wrapped(state):
    logits, cache = tokens_to_logits(state)
    eos = jnp.full(logits.shape[1:], -1e9, logits.dtype).at[:, EOS].set(0.0)
    return logits.at[row].set(eos), cache
  return wrapped


def _row_never_drafts(tokens_to_logits, row: int):
  """A draft whose `row` proposes nothing (all -inf logits): it costs one call per iteration."""
  def wrapped(state):
    logits, cache = tokens_to_logits(state)
    return logits.at[row].set(-jnp.inf), cache
  return wrapped


@pytest.mark.parametrize("drafter", ["model", "lookup"])
@pytest.mark.parametrize("draft_policy", sorted(drafting.POLICIES))
def test_a_finished_row_adds_no_draft_calls(draft_policy, drafter):
  """Row 0 ends at its first iteration, row 1 never drafts, so every draft call past row 1's
  one catch-up call per iteration is made for row 0: at most gamma - 1 of them, in the first
  iteration, while row 0 still decodes. Row 0's draft would go on proposing (the model always
  does; its lookup source continues what it ends with, EOS) and its policy would go on."""
  gamma, length = 4, 12
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-3.0)
  inputs = jnp.zeros((2, length), jnp.int32)
  if drafter == "model":
    draft_cache, draft_fn = draft.init_cache(2, length), draft.tokens_to_logits
  else:
    drafts = lookup.NGramLookup(VOCAB, 2, 1)
    source = jnp.asarray([[EOS] + [5] * 7, [0] * 8], jnp.int32)
    draft_cache, draft_fn = drafts.init_cache(source), drafts.tokens_to_logits
  policy = functools.partial(drafting.POLICIES[draft_policy],
                             **DRAFTING_BINDINGS.get(draft_policy, {}))
  decodes, _, stats = jax.jit(functools.partial(
      decoding.speculative_sample, tokens_to_logits=_row_ends_at_once(target.tokens_to_logits, 0),
      eos_id=EOS, draft_tokens_to_logits=_row_never_drafts(draft_fn, 1), gamma=gamma,
      temperature=0.0, draft_policy=policy))(inputs, target.init_cache(2, length),
                                             draft_cache=draft_cache)
  target_calls, draft_calls = np.asarray(stats.target_calls)[:, 0], np.asarray(stats.draft_calls)[:, 0]
  assert int(decodes[0, 0, 0]) == EOS and target_calls[0] == 1
  assert target_calls[1] >= 5 and int(stats.drafted_tokens[1, 0]) == 0
  assert target_calls[1] <= draft_calls[1] <= target_calls[1] + gamma - 1, (target_calls,
                                                                             draft_calls)


def test_rows_progress_independently():
  """A batch decodes exactly like its rows decoded one at a time (same rng per row is not
  required at temperature 0)."""
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  inputs = jnp.asarray(toy_setup.random_prompts(np.random.default_rng(3), 7, LENGTH, VOCAB, 4))
  batch, _, stats = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(0), 3,
                                          sampling_args=GREEDY)
  for row in range(7):
    single, _, single_stats = toy_setup.speculative(
        target, draft, inputs[row:row + 1], jax.random.PRNGKey(0), 3, sampling_args=GREEDY)
    np.testing.assert_array_equal(single[0], batch[row])
    assert int(single_stats.target_calls[0, 0]) == int(stats.target_calls[row, 0])
  # Rows accepted different numbers of tokens, so they ended after different numbers of calls.
  assert len(set(np.asarray(stats.target_calls)[:, 0].tolist())) > 1


@pytest.mark.slow
def test_prompt_is_kept_and_not_scored():
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-3.0)
  inputs = np.zeros((2, LENGTH), np.int32)
  inputs[0, 1:4] = [5, 6, 7]
  decodes, _, stats = toy_setup.speculative(target, draft, jnp.asarray(inputs),
                                            jax.random.PRNGKey(0), 2)
  np.testing.assert_array_equal(decodes[0, 0, :3], [5, 6, 7])
  # alpha counts only sampled positions: forced ones would contribute 1 each.
  assert 0 < float(stats.alpha[0, 0]) < 1


@pytest.mark.slow
def test_max_decode_steps_limits_sampled_tokens():
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-20.0)
  inputs = np.zeros((2, LENGTH), np.int32)
  inputs[1, 1:3] = [4, 4]
  base, _ = toy_setup.baseline(target, jnp.asarray(inputs), jax.random.PRNGKey(0),
                               max_decode_steps=3)
  spec, _, _ = toy_setup.speculative(target, draft, jnp.asarray(inputs), jax.random.PRNGKey(0),
                                     4, max_decode_steps=3)
  for decodes in (base, spec):
    lengths = np.sum(np.asarray(decodes)[:, 0] != 0, axis=1)
    np.testing.assert_array_equal(lengths, [3, 5])


@pytest.mark.slow
def test_num_decodes_shapes_and_sorting():
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  inputs = jnp.zeros((3, LENGTH), jnp.int32)
  decodes, log_probs, stats = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(0),
                                                    3, num_decodes=4)
  assert decodes.shape == (3, 4, LENGTH) and log_probs.shape == (3, 4)
  assert stats.target_calls.shape == (3, 4)
  assert np.all(np.diff(np.asarray(log_probs), axis=1) >= 0)
  assert len({tuple(d) for d in np.asarray(decodes)[0]}) > 1  # independent samples
  base, base_log_probs = toy_setup.baseline(target, inputs, jax.random.PRNGKey(0), num_decodes=4)
  assert base.shape == (3, 4, LENGTH)
  assert np.all(np.diff(np.asarray(base_log_probs), axis=1) >= 0)


@pytest.mark.slow
def test_log_prob_is_the_models_own():
  """log_probs is the sum of the target's log-softmax over the emitted tokens up to EOS."""
  target, draft = toy_setup.make_pair(VOCAB, "near", eos_shift=-1.0)
  inputs = jnp.zeros((4, LENGTH), jnp.int32)
  decodes, log_probs, _ = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(5), 3)
  for row in range(4):
    tokens = [t for t in np.asarray(decodes)[row, 0] if t != 0]
    state = decoding.DecodingState(
        cur_index=jnp.zeros((1,), jnp.int32), cur_token=jnp.array([[0] + tokens[:-1]]),
        sequences=jnp.array([[0] + tokens]), cache=target.init_cache(1, len(tokens)))
    all_log_probs = jax.nn.log_softmax(target.tokens_to_logits(state)[0][0])
    want = float(sum(all_log_probs[t, token] for t, token in enumerate(tokens)))
    assert float(log_probs[row, 0]) == pytest.approx(want, abs=1e-4)


def test_no_recompile_when_prompts_or_rng_change():
  target, draft = toy_setup.make_pair(VOCAB, "near")
  rng = np.random.default_rng(0)
  toy_setup.speculative._clear_cache()
  for seed in range(3):
    inputs = jnp.asarray(toy_setup.random_prompts(rng, 2, LENGTH, VOCAB, 3))
    toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(seed), 2)
  assert toy_setup.speculative._cache_size() == 1


def _call(**overrides):
  target, draft = toy_setup.make_pair(VOCAB, "near")
  kwargs = dict(draft_cache=draft.init_cache(1, LENGTH),
                draft_tokens_to_logits=draft.tokens_to_logits, gamma=2)
  kwargs.update(overrides)
  return decoding.speculative_sample(jnp.zeros((1, LENGTH), jnp.int32),
                                     target.init_cache(1, LENGTH), target.tokens_to_logits, EOS,
                                     **kwargs)


@pytest.mark.parametrize("overrides,name", [
    (dict(gamma=0), "gamma"), (dict(gamma=2.5), "gamma"), (dict(temperature=-1.0), "temperature"),
    (dict(topp=1.5), "topp"), (dict(topk=-2), "topk"), (dict(num_decodes=0), "num_decodes"),
    (dict(max_decode_steps=0), "max_decode_steps"), (dict(verifier="nope"), "verifier"),
    (dict(draft_policy="nope"), "draft_policy"),
    (dict(temperature=np.ones(3)), r"temperature must be a number or one per example \(1\)"),
    (dict(max_decode_steps=np.ones(3, np.int32)),
     r"max_decode_steps must be a number or one per example \(1\)"),
    (dict(max_decode_steps=np.array([0])), "max_decode_steps must be an integer >= 1"),
    (dict(topk=2, topp=0.5), "at most one of topk"),
    (dict(rescale_log_probs=1), "rescale_log_probs"),
    (dict(logit_callback_fn="ban_eos"), "logit_callback_fn must be a function")])
def test_bad_arguments_raise_before_compiling(overrides, name):
  with pytest.raises(ValueError, match=name):
    _call(**overrides)


def test_the_registry_states_which_settings_are_data():
  """T5X's sampling settings are data (traced, one compiled decoder for every value); the
  others are static, and an array given for one is refused by name before anything is traced."""
  for name in ("temperature_sample", "speculative_sample"):
    assert loops.get(name).data_settings == ("temperature", "topk", "topp", "max_decode_steps")
  assert set(loops.get("speculative_sample").static_settings) == {
      "gamma", "max_decode_steps_hard_limit", "rescale_log_probs", "verifier", "draft_policy",
      "logit_callback_fn"}
  target, draft = toy_setup.make_pair(VOCAB, "near")
  decode = jax.jit(lambda gamma: loops.get("speculative_sample")(
      inputs=jnp.zeros((1, LENGTH), jnp.int32), cache=target.init_cache(1, LENGTH),
      tokens_to_logits=target.tokens_to_logits, eos_id=EOS, num_decodes=1,
      draft_cache=draft.init_cache(1, LENGTH), draft_tokens_to_logits=draft.tokens_to_logits,
      gamma=gamma))
  with pytest.raises(ValueError, match="takes gamma as a Python value, fixed when it compiles"):
    decode(jnp.int32(2))


def test_vocabulary_mismatch_is_named():
  other, _ = toy_setup.make_pair(VOCAB + 1, "same")
  with pytest.raises(ValueError, match="vocabulary sizes differ.*12.*13"):
    _call(draft_cache=other.init_cache(1, LENGTH), draft_tokens_to_logits=other.tokens_to_logits)


@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 2})])
def test_a_logit_callback_writes_in_place_into_a_numpy_models_logits(name, settings):
  """T5X's loop hands the callback what the model returned: a model returning NumPy logits
  and a callback writing into them (T5X's decoding_test does) decode as the callback says."""

  def model(state):  # every id at -1e7: only what the callback writes can win
    return np.full(state.cur_token.shape + (4,), -1e7, np.float32), state.cache

  def callback(logits, state):
    del state
    logits[0, 2] = 0
    logits[1, 3] = 0
    return logits

  loop = loops.get(name)
  draft = dict(draft_cache={}, draft_tokens_to_logits=model) if loop.uses_draft else {}
  inputs = jnp.array([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], jnp.int32)
  decodes, _, _ = loop(inputs=inputs, cache={}, tokens_to_logits=model, eos_id=EOS,
                       num_decodes=1, temperature=0.0, logit_callback_fn=callback,
                       **draft, **settings)
  np.testing.assert_array_equal(decodes[:, 0], [[5, 6, 7, 2, 2], [8, 9, 3, 3, 3]])
