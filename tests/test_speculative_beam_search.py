"""`speculative_beam_search` equals the engine's `beam_search` (itself T5X's, see
test_beam_search.py): the same decodes token for token and the same scores, for gammas 1, 3, 5,
drafts that always agree (the target itself), often (a noisy copy) and rarely (an unrelated
model), unigram and bigram drafts, beam sizes 1, 2, 4, brevity alpha 0 and 0.6, batch 1 and 3, decodes that finish early
and ones that run to the length limit, forced prompts; while a draft that agrees saves target
calls. A replay that goes on past the tree's coverage fails the same comparison."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toy_setup
from spec_decode.engine import beam_search
from spec_decode.engine import loops
from spec_decode.engine import ngram
from spec_decode.engine import speculative_beam_search as sbs

VOCAB = 24
LENGTH = 9
# (alpha, batch size): each compiles once; each runs with both EOS logit shifts (models are
# arguments): decodes that finish early, and decodes that run to the length limit.
CASES = [(0.6, 3), (0.0, 1)]
EOS_SHIFTS = (1.5, -4.0)
# Every gamma with every draft and every beam size, each pair once (a Latin square), then node
# budgets smaller than the tree (None: the whole tree) and draft searches wider than the beams
# (None: as wide): each compiles the loop twice (~10 s each on this project's 2-core CPU).
GRID = [(1, "same", 4, None, None), (1, "near", 2, None, None), (1, "far", 1, None, None),
        (3, "same", 2, None, None), (3, "near", 1, None, None), (3, "far", 4, None, None),
        (5, "same", 1, None, None), (5, "near", 4, None, None), (5, "far", 2, None, None),
        (3, "same", 4, 2, None), (5, "near", 2, 1, None), (1, "far", 4, None, 8),
        (3, "near", 2, None, 5), (3, "same", 2, 4, 3)]


@functools.partial(jax.jit, static_argnames=("num_beams", "alpha"))
def _baseline(target, inputs, num_beams, alpha):
  return beam_search.beam_search(inputs, target.init_cache(*inputs.shape),
                                 target.tokens_to_logits, toy_setup.EOS, num_decodes=num_beams,
                                 alpha=alpha)


def _speculative(target, draft, inputs, gamma, num_beams, alpha, nodes_per_beam=None,
                 draft_beams=None):
  return sbs.speculative_beam_search(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, toy_setup.EOS,
      draft_cache=draft.init_cache(*inputs.shape), draft_tokens_to_logits=draft.tokens_to_logits,
      gamma=gamma, num_decodes=num_beams, alpha=alpha, nodes_per_beam=nodes_per_beam,
      draft_beams=draft_beams)


STATIC = ("gamma", "num_beams", "alpha", "nodes_per_beam", "draft_beams")
_jitted_speculative = jax.jit(_speculative, static_argnames=STATIC)


def _inputs(batch_size: int, seed: int) -> list[jax.Array]:
  rng = np.random.default_rng(seed)
  return [jnp.asarray(toy_setup.random_prompts(rng, batch_size, LENGTH, VOCAB, prompt_len))
          for prompt_len in (0, 0, 3)]


def _compare(draft_kind, gamma, num_beams, nodes_per_beam=None, draft_beams=None,
             speculative=_jitted_speculative):
  """Yields (want, got, stats) over CASES and a few inputs each."""
  for (alpha, batch_size), eos_shift in itertools.product(CASES, EOS_SHIFTS):
    target, draft = toy_setup.make_pair(VOCAB, draft_kind, seed=num_beams + gamma,
                                        eos_shift=eos_shift)
    for inputs in _inputs(batch_size, gamma):
      want = _baseline(target, inputs, num_beams, alpha)
      got = speculative(target, draft, inputs, gamma=gamma, num_beams=num_beams, alpha=alpha,
                        nodes_per_beam=nodes_per_beam, draft_beams=draft_beams)
      yield want, got


@pytest.mark.slow
@pytest.mark.parametrize("gamma,draft_kind,num_beams,nodes_per_beam,draft_beams", GRID)
def test_equals_beam_search(gamma, draft_kind, num_beams, nodes_per_beam, draft_beams):
  target_calls = beam_steps = 0
  covered = np.zeros(gamma)
  for (want, want_scores), (got, got_scores, stats) in _compare(
      draft_kind, gamma, num_beams, nodes_per_beam, draft_beams):
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6)
    target_calls += int(np.asarray(stats.target_calls)[:, 0].sum())
    beam_steps += int(np.asarray(stats.beam_steps)[:, 0].sum())
    covered += np.asarray(stats.covered_past_depth)[:, 0].sum(axis=0)
  assert target_calls <= beam_steps
  # A call takes 1 step, plus one for each depth past which it covered every selected beam.
  assert beam_steps == target_calls + covered.sum()
  assert np.all(np.diff(covered) <= 0)
  if draft_kind == "same" and gamma > 1 and nodes_per_beam is None:
    assert target_calls < beam_steps / 1.5  # a draft that always agrees covers many steps
    assert covered[0] > 0.5 * target_calls


@pytest.mark.parametrize("draft_kind", ["near", "same"])
def test_a_prefilled_prompt_decodes_as_beam_search_from_it(draft_kind):
  """initial_index, both caches prefilled, rows of different prompt lengths: beam_search's
  beams and scores from the same prefill; a draft that is the target (reading its own
  prefill) saves target calls in every row."""
  target, draft = toy_setup.make_pair(VOCAB, draft_kind, seed=5, eos_shift=1.5)
  inputs = toy_setup.random_prompts(np.random.default_rng(1), 3, LENGTH, VOCAB, 4)
  assert len(set(np.sum(inputs > 0, axis=1))) > 1
  cache, initial_index = toy_setup.prefilled(target, inputs)
  draft_cache, _ = toy_setup.prefilled(draft, inputs)
  want = beam_search.beam_search(jnp.asarray(inputs), cache, target.tokens_to_logits,
                                 toy_setup.EOS, num_decodes=2, initial_index=initial_index)
  got = sbs.speculative_beam_search(
      jnp.asarray(inputs), cache, target.tokens_to_logits, toy_setup.EOS,
      draft_cache=draft_cache, draft_tokens_to_logits=draft.tokens_to_logits, gamma=3,
      num_decodes=2, initial_index=initial_index)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
  if draft_kind == "same":
    assert np.all(got[2].target_calls < got[2].beam_steps)


@pytest.mark.slow
@pytest.mark.parametrize("order", ngram.ORDERS)
def test_ngram_drafts_equal_beam_search(order):
  """A unigram or bigram draft (`spec_decode.engine.ngram`), estimated from the target's own
  samples so that its beams sometimes cover the target's: beam_search's decodes and scores."""
  covered = 0.0
  for eos_shift in EOS_SHIFTS:
    target, _ = toy_setup.make_pair(VOCAB, "far", seed=order, eos_shift=eos_shift)
    samples, _ = toy_setup.baseline(target, jnp.zeros((200, LENGTH), jnp.int32),
                                    jax.random.PRNGKey(order))
    draft = ngram.estimate(np.asarray(samples)[:, 0], VOCAB, order=order, max_successors=4)
    for inputs in _inputs(3, order):
      want, want_scores = _baseline(target, inputs, 2, 0.6)
      got, got_scores, stats = _jitted_speculative(target, draft, inputs, gamma=3, num_beams=2,
                                                   alpha=0.6)
      np.testing.assert_array_equal(got, want)
      np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6)
      covered += float(np.asarray(stats.covered_past_depth).sum())
  assert covered > 0  # the n-gram draft's tree held the beams the target chose


@pytest.mark.slow
def test_the_cases_finish_early_and_run_to_the_length_limit():
  finished = unfinished = 0
  for (want, _), _ in _compare("same", 1, 4):
    best = np.asarray(want)[:, -1]
    has_eos = np.any(best == toy_setup.EOS, axis=1)
    finished += int(has_eos.sum())
    unfinished += int((~has_eos & (best[:, -1] != 0)).sum())
  assert finished > 0 and unfinished > 0


@pytest.mark.slow
def test_a_replay_past_coverage_fails(monkeypatch):
  """The negative control: continuing the replay where a new beam is not in the tree (using
  some node's log-probs) must break the identity above."""

  def everything_covered(tree, parent_ids, tokens):
    covered, ids = _coverage(tree, parent_ids, tokens)
    return jnp.ones_like(covered), ids

  _coverage = sbs._coverage  # pylint: disable=protected-access
  monkeypatch.setattr(sbs, "_coverage", everything_covered)
  # A function of its own: jax.jit would reuse a trace of `_speculative` made before the patch.
  wrong = jax.jit(lambda *args, **kwargs: _speculative(*args, **kwargs),
                  static_argnames=STATIC)
  mismatches = 0
  for (want, _), (got, _, _) in _compare("far", 3, 2, speculative=wrong):
    mismatches += int(np.any(np.asarray(got) != np.asarray(want)))
  assert mismatches > 0


def test_it_is_a_registered_loop_with_checked_settings():
  loop = loops.get("speculative_beam_search")
  assert loop.uses_draft and loop.setting_names == ("gamma", "alpha", "max_decode_len",
                                                    "max_decode_step", "nodes_per_beam",
                                                    "draft_beams", "min_log_prob")
  with pytest.raises(ValueError, match="takes only T5X's default min_log_prob .*, got -5.0: "
                                       "T5X stops a whole batch"):
    loop.check({"gamma": 2, "min_log_prob": -5.0})
  with pytest.raises(ValueError, match="gamma must be an integer >= 1, got 0"):
    loop.check({"gamma": 0})
  with pytest.raises(ValueError, match="max_decode_len must be an integer >= 1 or None"):
    loop.check({"gamma": 2, "max_decode_len": 1.5})
  with pytest.raises(ValueError, match="alpha .* must be a number >= 0"):
    loop.check({"gamma": 2, "alpha": -0.5})
  with pytest.raises(ValueError, match="nodes_per_beam must be an integer >= 1 or None, got 0"):
    loop.check({"gamma": 2, "nodes_per_beam": 0})

  with pytest.raises(ValueError, match="draft_beams must be an integer >= 1 or None, got 0"):
    loop.check({"gamma": 2, "draft_beams": 0})
  target, draft = toy_setup.make_pair(VOCAB, "near", seed=0)
  inputs = _inputs(1, 0)[0]
  with pytest.raises(ValueError, match=r"draft_beams \(2\) must be at least the beam count"):
    _speculative(target, draft, inputs, gamma=2, num_beams=4, alpha=0.6, draft_beams=2)


@pytest.mark.slow
def test_a_wider_draft_search_covers_more():
  """The draft's search with 2K beams holds all K of the target's choices more often than one
  with K (same outputs: test_equals_beam_search)."""
  coverage = {}
  for draft_beams in (None, 8):
    calls, covered = 0, 0
    for _, (_, _, stats) in _compare("near", 1, 4, draft_beams=draft_beams):
      calls += int(np.asarray(stats.target_calls)[:, 0].sum())
      covered += int(np.asarray(stats.covered_past_depth)[:, 0, 0].sum())
    coverage[draft_beams] = covered / calls
  assert coverage[8] > coverage[None]
