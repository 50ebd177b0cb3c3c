"""The engine's decode loops against T5X's own decode functions, called directly as T5X's callers
and tests call them (`t5x.decoding.temperature_sample`, `t5x.decoding.beam_search`), on models
written in T5X's `tokens_to_logits` convention and given to the engine through `engine_model`,
an adapter to the engine's contract in its first form (chain calls, none of its optional
fields). Every expected value comes from T5X."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.decoding", reason="needs t5x: pip install --no-deps "
                                           "../shared/wheels/*.whl and its dependencies")

from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

from spec_decode.engine import decoding  # pylint: disable=g-import-not-at-top
from spec_decode.engine import loops  # pylint: disable=g-import-not-at-top

EOS_ID = 1
NEG = -1e7


def engine_model(t5x_tokens_to_logits):
  """The engine's tokens_to_logits for a T5X one: each fed token in turn, at its position. It
  reads cur_index, cur_token, sequences and cache only (the contract's first form)."""

  def tokens_to_logits(state: decoding.DecodingState):
    cache, logits = state.cache, []
    for j in range(state.cur_token.shape[1]):
      row, cache = t5x_tokens_to_logits(t5x_decoding.DecodingState(
          cur_index=state.cur_index + j, sequences=state.sequences,
          cur_token=state.cur_token[:, j:j + 1], cache=cache))
      logits.append(row)
    return jnp.stack(logits, axis=1), cache

  return tokens_to_logits


# T5X's own prefix case: a 4-id model whose example 0 always gives id 2 and example 1 id 3
# (its cache holds each row's example, so it survives T5X's and the engine's expansion of rows),
# prompts forcing ids 5..9, outside its vocabulary.
CONSTANT_LOGITS = np.array([[NEG, NEG, 0, NEG], [NEG, NEG, NEG, 0]], np.float32)
PREFIX_INPUTS = np.array([[0, 5, 6, 7, 0], [0, 8, 9, 0, 0]], np.int32)
T5X_PREFIX_OUTPUT = [[5, 6, 7, 2, 2], [8, 9, 3, 3, 3]]  # T5X's decoding_test's expectation


def constant_model(state):
  return jnp.asarray(CONSTANT_LOGITS)[state.cache["example"]], state.cache


def _example_cache(batch_size: int) -> dict:
  return {"example": jnp.arange(batch_size)}


def _decode(name: str, model, inputs, *, num_decodes=1, rng=None, **settings):
  """(decodes, scores) of the registered loop `name` with `model` as target and draft."""
  loop = loops.get(name)
  arguments = dict(settings)
  if loop.uses_draft:
    arguments.update(draft_cache=_example_cache(len(inputs)),
                     draft_tokens_to_logits=engine_model(model))
  decodes, scores, _ = loop(inputs=jnp.asarray(inputs), cache=_example_cache(len(inputs)),
                            tokens_to_logits=engine_model(model), eos_id=EOS_ID,
                            num_decodes=num_decodes, decode_rng=rng, **arguments)
  return decodes, scores


def _engine_loop(*args, **kwargs):
  return tuple(map(np.asarray, _decode(*args, **kwargs)))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name,settings", [
    ("temperature_sample", {}), ("speculative_sample", {"gamma": 1}),
    ("speculative_sample", {"gamma": 3}),
    ("speculative_sample", {"gamma": 2, "verifier": "block"})])
def test_forced_ids_beyond_the_vocabulary_are_copied_as_t5x_copies_them(
    temperature, name, settings):
  want, want_scores = t5x_decoding.temperature_sample(
      jnp.asarray(PREFIX_INPUTS), _example_cache(2), constant_model, EOS_ID,
      jax.random.PRNGKey(0), temperature=temperature, topk=0)
  np.testing.assert_array_equal(want[:, 0], T5X_PREFIX_OUTPUT)
  got, scores = _engine_loop(name, constant_model, PREFIX_INPUTS, rng=jax.random.PRNGKey(1),
                             temperature=temperature, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, atol=1e-6)


@pytest.mark.parametrize("name,settings", [
    ("beam_search", {}), ("speculative_beam_search", {"gamma": 1}),
    ("speculative_beam_search", {"gamma": 3})])
def test_forced_ids_beyond_the_vocabulary_in_beam_search(name, settings):
  want, want_scores = t5x_decoding.beam_search(
      jnp.asarray(PREFIX_INPUTS), _example_cache(2), constant_model, EOS_ID, num_decodes=2,
      alpha=0.6)
  np.testing.assert_array_equal(want[:, -1, :2], [[5, 6], [8, 9]])  # the prompts, copied
  got, scores = _engine_loop(name, constant_model, PREFIX_INPUTS, num_decodes=2, alpha=0.6,
                             **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-6)


# A 6-id model whose next-token logits depend on the position and the token fed: what T5X's
# samplers score is then a function of the decode alone, whichever rng drew it.
BIGRAM = np.random.default_rng(0).normal(0.0, 1.5, (8, 6, 6)).astype(np.float32)
BIGRAM[:, :, 0] = NEG  # PAD is never sampled
BIGRAM[:, :, EOS_ID] -= 1.0  # longer outputs


def bigram_model(state):
  position = jnp.minimum(state.cur_index, BIGRAM.shape[0] - 1)
  return jnp.asarray(BIGRAM)[position, state.cur_token[:, 0]], state.cache


def _decodes_and_scores(decodes, scores) -> dict[tuple, float]:
  return {tuple(int(t) for t in decode): float(score)
          for decode, score in zip(np.asarray(decodes).reshape(-1, decodes.shape[-1]),
                                   np.asarray(scores).reshape(-1))}


SAMPLED = [dict(temperature=0.7, topk=0, topp=0.0), dict(temperature=0.6, topk=3, topp=0.0),
           dict(temperature=1.3, topk=0, topp=0.7), dict(temperature=1.0, topk=0, topp=0.0)]


@pytest.mark.parametrize("rescale_log_probs", [True, False])
@pytest.mark.parametrize("sampling_settings", SAMPLED, ids=lambda s: "_".join(
    f"{name}{value}" for name, value in s.items()))
@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 2})])
def test_sampled_scores_are_t5xs(rescale_log_probs, sampling_settings, name, settings):
  """Every decode both draw (200 samples each, 4 sampled positions) has T5X's score."""
  inputs = np.zeros((1, 4), np.int32)
  want = _decodes_and_scores(*t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), num_decodes=200,
      rescale_log_probs=rescale_log_probs, **sampling_settings))
  got = _decodes_and_scores(*_engine_loop(
      name, bigram_model, inputs, num_decodes=200, rng=jax.random.PRNGKey(1),
      rescale_log_probs=rescale_log_probs, **sampling_settings, **settings))
  common = sorted(set(want) & set(got))
  assert len(common) >= 5, "too few decodes in common to compare"
  np.testing.assert_allclose([got[d] for d in common], [want[d] for d in common], rtol=1e-5,
                             atol=1e-5)


# A draft the target often rejects: another random bigram model. After a rejection the token
# emitted is a residual draw (sampled) or the target's own (greedy), and the score goes on.
OTHER_BIGRAM = np.random.default_rng(1).normal(0.0, 1.5, BIGRAM.shape).astype(np.float32)
OTHER_BIGRAM[:, :, 0] = NEG


def other_bigram_model(state):
  position = jnp.minimum(state.cur_index, OTHER_BIGRAM.shape[0] - 1)
  return jnp.asarray(OTHER_BIGRAM)[position, state.cur_token[:, 0]], state.cache


@pytest.mark.parametrize("rescale_log_probs", [True, False])
@pytest.mark.parametrize("sampling_settings,verifier", [
    (dict(temperature=0.0, topk=0, topp=0.0), "token"),
    (SAMPLED[2], "token"), (SAMPLED[0], "block")],
    ids=lambda s: s if isinstance(s, str) else "_".join(f"{k}{v}" for k, v in s.items()))
def test_scores_after_rejected_drafts_are_t5xs(rescale_log_probs, sampling_settings, verifier):
  """With a draft the target rejects, every decode both draw has T5X's score (greedy: T5X's
  decodes and scores)."""
  greedy = sampling_settings["temperature"] == 0.0
  num_decodes = 1 if greedy else 200
  inputs = np.zeros((1 if not greedy else 3, 6 if greedy else 4), np.int32)
  if greedy:
    inputs[1, 1:3] = [4, 2]
  want = t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0),
      num_decodes=num_decodes, rescale_log_probs=rescale_log_probs, **sampling_settings)
  got_decodes, got_scores, stats = loops.get("speculative_sample")(
      inputs=jnp.asarray(inputs), cache={}, tokens_to_logits=engine_model(bigram_model),
      eos_id=EOS_ID, draft_cache={}, draft_tokens_to_logits=engine_model(other_bigram_model),
      gamma=3, verifier=verifier, num_decodes=num_decodes, decode_rng=jax.random.PRNGKey(1),
      rescale_log_probs=rescale_log_probs, **sampling_settings)
  assert np.sum(stats["accepted_tokens"]) < np.sum(stats["drafted_tokens"])  # drafts rejected
  assert np.sum(stats["accepted_tokens"]) > 0
  if greedy:
    np.testing.assert_array_equal(got_decodes, want[0])
    np.testing.assert_allclose(got_scores, want[1], rtol=1e-5, atol=1e-6)
    return
  want, got = _decodes_and_scores(*want), _decodes_and_scores(got_decodes, got_scores)
  common = sorted(set(want) & set(got))
  assert len(common) >= 5, "too few decodes in common to compare"
  np.testing.assert_allclose([got[d] for d in common], [want[d] for d in common], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("rescale_log_probs", [True, False])
@pytest.mark.parametrize("t5x_settings,engine_settings", [
    (dict(temperature=0.0, topk=0), dict(temperature=0.0)),
    (dict(temperature=0.8, topk=1), dict(temperature=0.0)),  # T5X's topk=1: greedy
    (dict(temperature=1.0, topk=0, topp=1e-6), dict(temperature=1.0, topp=1e-6))])
@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 3})])
def test_deterministic_decodes_and_scores_are_t5xs(rescale_log_probs, t5x_settings,
                                                   engine_settings, name, settings):
  inputs = np.zeros((3, 6), np.int32)
  inputs[1, 1:3] = [4, 2]
  want, want_scores = t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0),
      rescale_log_probs=rescale_log_probs, **t5x_settings)
  got, scores = _engine_loop(name, bigram_model, inputs, rng=jax.random.PRNGKey(1),
                             rescale_log_probs=rescale_log_probs, **engine_settings, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
  assert rescale_log_probs or np.all(np.asarray(want_scores) < -0.1)  # a case with a score


@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 2})])
def test_per_example_temperatures_are_t5xs(name, settings):
  """T5X's decoder_params use: example 0 greedy, 1 at 0.8, 2 at 1.5. Every decode both draw
  has T5X's score, which depends on its example's temperature. (With one temperature per
  example T5X draws every row of a step with the same key, so rows with the same logits draw
  alike: its decodes come from 40 rngs here, the engine's from 100 independent rows.)"""
  temperatures = np.array([0.0, 0.8, 1.5], np.float32)
  inputs = np.zeros((3, 4), np.int32)
  t5x_sample = jax.jit(lambda rng: t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, rng, temperature=temperatures, topk=0))
  t5x_runs = [t5x_sample(jax.random.PRNGKey(seed)) for seed in range(40)]
  got_decodes, got_scores = _engine_loop(name, bigram_model, inputs, num_decodes=100,
                                         rng=jax.random.PRNGKey(1), temperature=temperatures,
                                         **settings)
  for example in range(3):
    want = {}
    for decodes, scores in t5x_runs:
      want.update(_decodes_and_scores(decodes[example], scores[example]))
    got = _decodes_and_scores(got_decodes[example], got_scores[example])
    common = sorted(set(want) & set(got))
    assert len(common) >= (1 if example == 0 else 5), f"example {example}"
    np.testing.assert_allclose([got[d] for d in common], [want[d] for d in common],
                               rtol=1e-5, atol=1e-5)
  assert len(_decodes_and_scores(got_decodes[0], got_scores[0])) == 1  # greedy
  assert len(_decodes_and_scores(got_decodes[2], got_scores[2])) > 5


# (temperature, topk, topp, max_decode_steps): deterministic under T5X's conventions.
TRACED = [(0.0, 0, 0.0, 4), (0.8, 1, 0.0, 2), (1.0, 0, 1e-6, 3), (0.0, 3, 0.0, 6)]
HARD_LIMIT = 3  # T5X's max_decode_steps_hard_limit: a Python int, static


@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 3})])
def test_traced_settings_in_one_compiled_decoder_are_t5xs(name, settings):
  """temperature, topk, topp and max_decode_steps as arguments of one jitted decoder, traced
  once, within a hard limit on max_decode_steps: T5X's decodes and scores for each value."""
  inputs = np.zeros((3, 6), np.int32)
  inputs[1, 1:3] = [4, 2]
  traces = []

  @jax.jit
  def decode(temperature, topk, topp, max_decode_steps):
    traces.append(name)
    return _decode(name, bigram_model, inputs, rng=jax.random.PRNGKey(1),
                   temperature=temperature, topk=topk, topp=topp,
                   max_decode_steps=max_decode_steps, max_decode_steps_hard_limit=HARD_LIMIT,
                   **settings)

  for temperature, topk, topp, max_decode_steps in TRACED:
    want, want_scores = t5x_decoding.temperature_sample(
        jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0),
        temperature=temperature, topk=topk, topp=topp, max_decode_steps=max_decode_steps,
        max_decode_steps_hard_limit=HARD_LIMIT)
    got, scores = decode(jnp.float32(temperature), jnp.int32(topk), jnp.float32(topp),
                         jnp.int32(max_decode_steps))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
  assert len(traces) == 1


@pytest.mark.parametrize("max_decode_step", [-1, 2, 4])
@pytest.mark.parametrize("name,settings", [("beam_search", {}),
                                           ("speculative_beam_search", {"gamma": 2})])
def test_beam_search_with_t5xs_step_cap_is_t5xs(max_decode_step, name, settings):
  inputs = np.zeros((2, 6), np.int32)
  inputs[1, 1] = 3
  want, want_scores = t5x_decoding.beam_search(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, num_decodes=3, alpha=0.6,
      max_decode_step=max_decode_step)
  got, scores = _engine_loop(name, bigram_model, inputs, num_decodes=3, alpha=0.6,
                             max_decode_step=max_decode_step, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def repeat_penalty(logits, state):
  """A logit callback of T5X's kind reading every field of the prefix's state: each id loses
  3 per time it occurs in `sequences` (the prefix and the prompt ahead), the current token 2
  more, and EOS is banned before position 3."""
  vocab = jnp.arange(logits.shape[-1])
  counts = jnp.sum(state.sequences[:, :, None] == vocab, axis=1)
  logits = logits - 3.0 * counts - 2.0 * (state.cur_token == vocab)
  return jnp.where((vocab == EOS_ID) & (state.cur_index[:, None] < 3), NEG, logits)


CALLBACK_LOOPS = [("temperature_sample", {}), ("speculative_sample", {"gamma": 2}),
                  ("speculative_sample", {"gamma": 3, "verifier": "block"})]


@pytest.mark.parametrize("rescale_log_probs", [True, False])
@pytest.mark.parametrize("name,settings", CALLBACK_LOOPS)
def test_greedy_decodes_with_a_logit_callback_are_t5xs(rescale_log_probs, name, settings):
  inputs = np.zeros((3, 7), np.int32)
  inputs[1, 1:3] = [4, 2]
  want, want_scores = t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), temperature=0.0,
      topk=0, rescale_log_probs=rescale_log_probs, logit_callback_fn=repeat_penalty)
  without, _ = t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), temperature=0.0,
      topk=0)
  assert not np.array_equal(want, without)  # the callback changes what is decoded
  got, scores = _engine_loop(name, bigram_model, inputs, rng=jax.random.PRNGKey(1),
                             temperature=0.0, rescale_log_probs=rescale_log_probs,
                             logit_callback_fn=repeat_penalty, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rescale_log_probs", [True, False])
@pytest.mark.parametrize("name,settings", CALLBACK_LOOPS)
def test_sampled_scores_with_a_logit_callback_are_t5xs(rescale_log_probs, name, settings):
  """Every decode both draw (200 samples each) has T5X's score under the callback's law."""
  inputs = np.zeros((1, 5), np.int32)
  want = _decodes_and_scores(*t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), num_decodes=200,
      temperature=1.0, topk=0, rescale_log_probs=rescale_log_probs,
      logit_callback_fn=repeat_penalty))
  got = _decodes_and_scores(*_engine_loop(
      name, bigram_model, inputs, num_decodes=200, rng=jax.random.PRNGKey(1), temperature=1.0,
      rescale_log_probs=rescale_log_probs, logit_callback_fn=repeat_penalty, **settings))
  assert all(EOS_ID not in decode[:3] for decode in got)  # banned there
  common = sorted(set(want) & set(got))
  assert len(common) >= 5, "too few decodes in common to compare"
  np.testing.assert_allclose([got[d] for d in common], [want[d] for d in common], rtol=1e-5,
                             atol=1e-5)


def _recording(callback, seen: set, live=lambda state: state.cur_index >= 0):
  """`callback`, recording on the host (cur_index, sequences, cur_token) of each row it is
  given a state for, where `live(state)` [N] holds."""

  def record(live_rows, cur_index, sequences, cur_token):
    seen.update((int(i), tuple(map(int, s)), int(t[0]))
                for keep, i, s, t in zip(live_rows, cur_index, sequences, cur_token) if keep)

  def recording(logits, state):
    jax.debug.callback(record, live(state), state.cur_index, state.sequences, state.cur_token)
    return callback(logits, state)

  return recording


@pytest.mark.parametrize("name,settings", CALLBACK_LOOPS)
def test_a_logit_callback_sees_the_state_t5x_gives_it(name, settings):
  """Every (cur_index, sequences, cur_token) T5X's greedy loop gives the callback for a row that
  has not ended, the engine's gives it too (a speculative loop also scores its drafts'
  prefixes), the prompt ahead of the prefix included."""
  inputs = np.zeros((2, 6), np.int32)
  inputs[1, 1:3] = [4, 2]
  want, got = set(), set()
  t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), temperature=0.0,
      topk=0, logit_callback_fn=_recording(repeat_penalty, want,
                                           live=lambda state: ~state.ended[:, 0]))
  _engine_loop(name, bigram_model, inputs, temperature=0.0,
               logit_callback_fn=_recording(repeat_penalty, got), **settings)
  assert len(want) >= 6 and any(i == 0 and s[1:3] == (4, 2) for i, s, _ in want)  # a prompt ahead
  assert want <= got, sorted(want - got)


def cached_position_bigram(state):
  """`bigram_model` as T5X's beam search with initial_index needs it: T5X then feeds the step
  as cur_index, so the position is the model's own (its cache, prefilled to the prompt's end)."""
  position = jnp.minimum(state.cache["position"], BIGRAM.shape[0] - 1)
  return (jnp.asarray(BIGRAM)[position, state.cur_token[:, 0]],
          {"position": state.cache["position"] + 1})


def _t5x_prefilled_beam_search(inputs, initial_index, **settings):
  return t5x_decoding.beam_search(
      jnp.asarray(inputs), {"position": jnp.asarray(initial_index)}, cached_position_bigram,
      EOS_ID, initial_index=jnp.asarray(initial_index), **settings)


PROMPTS = {"empty": [], "one": [3], "three": [4, 2, 5]}


@pytest.mark.parametrize("max_decode_step", [-1, 2])
@pytest.mark.parametrize("prompt", sorted(PROMPTS))
@pytest.mark.parametrize("name,settings", [("beam_search", {}),
                                           ("speculative_beam_search", {"gamma": 2})])
def test_beam_search_from_a_prefilled_prompt_is_t5xs(prompt, max_decode_step, name, settings):
  """initial_index (the cache holds the prompt before it): T5X's beams and scores, for rows
  sharing one prompt length, the brevity penalty counting the prompt."""
  tokens = PROMPTS[prompt]
  inputs = np.zeros((2, 7), np.int32)
  inputs[:, 1:1 + len(tokens)] = tokens
  initial_index = np.full((2,), len(tokens), np.int32)
  want, want_scores = _t5x_prefilled_beam_search(inputs, initial_index, num_decodes=3,
                                                 alpha=0.6, max_decode_step=max_decode_step)
  np.testing.assert_array_equal(want[:, -1, :len(tokens)], [tokens, tokens])
  got, scores = _engine_loop(name, bigram_model, inputs, num_decodes=3, alpha=0.6,
                             max_decode_step=max_decode_step,
                             initial_index=jnp.asarray(initial_index), **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,settings", [("beam_search", {}),
                                           ("speculative_beam_search", {"gamma": 2})])
def test_prefilled_rows_of_different_lengths_are_t5xs_rows_alone(name, settings):
  """Rows with different initial_index each get what T5X gives that example alone (T5X runs
  a batch L - min(initial_index) steps, past position L for longer prompts)."""
  inputs = np.zeros((3, 7), np.int32)
  initial_index = np.zeros((3,), np.int32)
  for row, tokens in enumerate(PROMPTS.values()):
    inputs[row, 1:1 + len(tokens)] = tokens
    initial_index[row] = len(tokens)
  got, scores = _engine_loop(name, bigram_model, inputs, num_decodes=3, alpha=0.6,
                             initial_index=jnp.asarray(initial_index), **settings)
  for row in range(3):
    want, want_scores = _t5x_prefilled_beam_search(inputs[row:row + 1],
                                                   initial_index[row:row + 1], num_decodes=3,
                                                   alpha=0.6)
    np.testing.assert_array_equal(got[row:row + 1], want)
    np.testing.assert_allclose(scores[row:row + 1], want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("min_log_prob", [-0.5, -1.5, -2.5])
def test_beam_search_with_a_min_log_prob_is_t5xs(min_log_prob):
  """T5X stops the batch once no row's best live beam passes min_log_prob: a row above it keeps
  the others going, so a row's output depends on its batch."""
  inputs = np.zeros((3, 7), np.int32)
  inputs[1, 1] = 3
  inputs[2, 1:3] = [4, 2]
  settings = dict(num_decodes=3, alpha=0.6, min_log_prob=min_log_prob)
  want, want_scores = t5x_decoding.beam_search(jnp.asarray(inputs), {}, bigram_model, EOS_ID,
                                               **settings)
  alone = [t5x_decoding.beam_search(jnp.asarray(inputs[row:row + 1]), {}, bigram_model,
                                    EOS_ID, **settings)[0] for row in range(3)]
  assert not np.array_equal(np.concatenate(alone), want)
  got, scores = _engine_loop("beam_search", bigram_model, inputs, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,settings", [("beam_search", {}),
                                           ("speculative_beam_search", {"gamma": 2})])
def test_beam_search_with_t5xs_max_decode_len_is_t5xs(name, settings):
  """T5X's beam_search.max_decode_len: decodes that long, shorter than the inputs."""
  max_decode_len = 3
  inputs = np.zeros((2, 6), np.int32)
  inputs[1, 1:3] = [3, 4]
  want, want_scores = t5x_decoding.beam_search(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, num_decodes=2, alpha=0.6,
      max_decode_len=max_decode_len)
  assert want.shape == (2, 2, max_decode_len)
  got, scores = _engine_loop(name, bigram_model, inputs, num_decodes=2, alpha=0.6,
                             max_decode_len=max_decode_len, **settings)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


# T5X's decoding_test's prefilled beam search (test_beam_search_force_decode_prefix_with_
# initial_index): batch 2, beams 2, prompts of lengths 1 and 2 in the cache, which holds a
# batch-free relative-position bias as T5X's decoders cache it.
PREFILLED_LOGITS = np.array([[NEG, -1e10, -0.1, -0.9, -1e4, -1e4, -1e4, -1e4],
                             [NEG, -1.0, -0.9, -0.1, -1e4, -1e4, -1e4, -1e4]], np.float32)


def prefilled_model(state):
  """Example 0 prefers id 2 then 3, example 1 id 3, 2, then EOS (T5X's test's logits, each
  beam's rows adjacent); the cache as it came, its bias checked to arrive unexpanded."""
  assert state.cache["cached_bias"].shape == (1, 1024)
  num_rows = state.cur_token.shape[0]
  return jnp.repeat(jnp.asarray(PREFILLED_LOGITS), num_rows // 2, axis=0), state.cache


def _prefilled_cache() -> dict:
  return {"cached_bias": np.ones((1, 1024), np.float32),
          "decoder/layers_0/self_attention/cached_key": np.ones((2, 1024), np.float32),
          "decoder/layers_0/self_attention/cache_index": np.ones((2,), np.float32)}


@pytest.mark.parametrize("max_decode_step", [-1, 2])
@pytest.mark.parametrize("name,settings", [("beam_search", {}),
                                           ("speculative_beam_search", {"gamma": 2})])
def test_t5xs_prefilled_beam_search_case_is_t5xs(max_decode_step, name, settings):
  inputs = np.array([[0, 7, 0, 0, 0], [0, 4, 5, 0, 0]], np.int32)
  initial_index = jnp.asarray([1, 2], jnp.int32)
  want, want_scores = t5x_decoding.beam_search(
      jnp.asarray(inputs), _prefilled_cache(), prefilled_model, EOS_ID, num_decodes=2, alpha=0,
      initial_index=initial_index, max_decode_step=max_decode_step)
  loop = loops.get(name)
  draft = {}
  if loop.uses_draft:
    draft = dict(draft_cache=_prefilled_cache(), draft_tokens_to_logits=engine_model(
        prefilled_model), **settings)
  got, scores, _ = loop(inputs=jnp.asarray(inputs), cache=_prefilled_cache(),
                        tokens_to_logits=engine_model(prefilled_model), eos_id=EOS_ID,
                        num_decodes=2, alpha=0, initial_index=initial_index,
                        max_decode_step=max_decode_step, **draft)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_allclose(scores, want_scores, atol=1e-5)


@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 2})])
def test_traced_topk_and_topp_together_are_t5xs(name, settings):
  """T5X checks topk and topp only where both are known: traced, it masks top-k, then top-p
  within it. Every decode both draw (200 samples each) has T5X's score."""
  inputs = np.zeros((1, 4), np.int32)
  t5x_sample = jax.jit(lambda topk, topp: t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), num_decodes=200,
      temperature=1.2, topk=topk, topp=topp))
  engine_sample = jax.jit(lambda topk, topp: _decode(
      name, bigram_model, inputs, num_decodes=200, rng=jax.random.PRNGKey(1), temperature=1.2,
      topk=topk, topp=topp, **settings))
  want = _decodes_and_scores(*t5x_sample(jnp.int32(3), jnp.float32(0.7)))
  got = _decodes_and_scores(*engine_sample(jnp.int32(3), jnp.float32(0.7)))
  common = sorted(set(want) & set(got))
  assert len(common) >= 5, "too few decodes in common to compare"
  np.testing.assert_allclose([got[d] for d in common], [want[d] for d in common], rtol=1e-5,
                             atol=1e-5)
  with pytest.raises(ValueError, match="at most one of topk"):
    _decode(name, bigram_model, inputs, temperature=1.2, topk=3, topp=0.7, **settings)


@pytest.mark.parametrize("name,settings", [("temperature_sample", {}),
                                           ("speculative_sample", {"gamma": 3})])
def test_per_example_max_decode_steps_in_one_compiled_decoder_are_t5xs(name, settings):
  """max_decode_steps [B], traced, as T5X's temperature_sample takes it: T5X's decodes and
  scores for each value, one trace; with num_decodes (which T5X cannot combine with it) each
  example's rows keep its limit."""
  inputs = np.zeros((3, 7), np.int32)
  inputs[1, 1:3] = [4, 2]
  traces = []

  @functools.partial(jax.jit, static_argnames="num_decodes")
  def decode(max_decode_steps, num_decodes=1):
    traces.append(num_decodes)
    return _decode(name, bigram_model, inputs, num_decodes=num_decodes, temperature=0.0,
                   max_decode_steps=max_decode_steps, **settings)

  t5x_sample = jax.jit(lambda max_decode_steps: t5x_decoding.temperature_sample(
      jnp.asarray(inputs), {}, bigram_model, EOS_ID, jax.random.PRNGKey(0), temperature=0.0,
      topk=0, max_decode_steps=max_decode_steps))
  for steps in ([1, 3, 5], [4, 2, 1]):
    want, want_scores = t5x_sample(jnp.asarray(steps, jnp.int32))
    got, scores = decode(jnp.asarray(steps, jnp.int32))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
  assert len(traces) == 1
  got, _ = decode(jnp.asarray([4, 2, 1], jnp.int32), num_decodes=2)
  np.testing.assert_array_equal(np.asarray(got), np.repeat(np.asarray(want), 2, axis=1))
