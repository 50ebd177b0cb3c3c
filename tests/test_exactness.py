"""Speculative sampling samples the target's distribution over whole sequences, exactly.

For a 5-token vocabulary (PAD, EOS, and 3 words) and outputs of at most 4 tokens the target's
law over complete outputs is enumerated; 100,000 sequences are drawn in one batched call and
compared with a chi-square test at a fixed seed. The same test must reject deliberately wrong
verifiers (the negative controls), which shows it has the power to catch a broken rule.

Every exact rule registered in `spec_decode.engine.verify` runs through the whole suite, and every
drafting policy of `spec_decode.engine.drafting` through a representative part of it; n-gram
lookup drafts (`spec_decode.engine.lookup`), alone and combined with a model, run under every
exact rule and policy, greedy and at temperature 1; sampling settings given as data (traced,
and one temperature per example) under every exact rule; a logit callback's law (T5X's
logit_callback_fn) under every exact rule, and the baseline's too.

Every p-value check of this suite, test_ngram's, test_decoder_only_exactness's and
test_token_tree's passes above one floor, P_VALUE_FLOOR (below): a Bonferroni level that bounds the
family-wise error rate, the chance that an exact decoder fails any of them, by FAMILY_ERROR_RATE.
Power at that floor, 100,000 samples: every negative control of the four suites scores p < 1e-300
(below float range), but the block rule's residual mistake, p ~ 5e-18 (test_verify's exact law of
the block catches it at any sample count).

SPEC_DECODE_EXACTNESS_SAMPLES draws fewer sequences (a quick check; at least MIN_SAMPLES). The
chi-square statistic of a wrong rule grows with the sample count: at 100,000 the control
`resample_from_target` scores ~10,500 on ~120 degrees of freedom, so at 10,000 still ~1,000
against a rejection threshold near 190; a subtler bug needs the full count.
"""


import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from spec_decode.engine import decoding, drafting, sampling, toy, verify
from spec_decode.engine import lookup as engine_lookup
import test_verify
import tiers
# A user's policy (one_draft), registered outside the package, runs through the suite like the
# package's own; imported here so that every run of this file sees the same policies.
import toy_loop  # pylint: disable=unused-import
import toy_setup
from toy_setup import EOS

# The slow tier (100,000 samples per law, each compiling its loop).
pytestmark = pytest.mark.slow

VOCAB = 5
LENGTH = 4
MIN_SAMPLES = 10_000
NUM_SAMPLES = int(os.environ.get("SPEC_DECODE_EXACTNESS_SAMPLES", 100_000))
if NUM_SAMPLES < MIN_SAMPLES:
  raise ValueError(f"SPEC_DECODE_EXACTNESS_SAMPLES={NUM_SAMPLES}: at least {MIN_SAMPLES}, or the "
                   "test loses the power its negative controls show")
# The suites' p-value checks of exact decoders (this module's 52, test_ngram's 12,
# test_decoder_only_exactness's 25 and test_token_tree's 33: 122) run at fixed seeds, so a harmless
# change in how a decoder draws redraws all of them at once. Bonferroni: each check's floor is
# FAMILY_ERROR_RATE over at most MAX_CHECKS checks, so an exact decoder fails one with probability
# at most FAMILY_ERROR_RATE, whatever the seeds (at the former floor of 1e-3 alone, about 8%).
FAMILY_ERROR_RATE = 0.01
MAX_CHECKS = 122
P_VALUE_FLOOR = FAMILY_ERROR_RATE / MAX_CHECKS


def prefix_state(sequences, cur_index) -> decoding.LogitCallbackState:
  """What T5X gives a logit callback for the prefixes `sequences [N, >= t + 1]` up to
  `cur_index [N]` (no prompt: zeros after each prefix, in a buffer of LENGTH + 2)."""
  width = LENGTH + 2
  sequences = jnp.pad(sequences, ((0, 0), (0, max(0, width - sequences.shape[1]))))[:, :width]
  sequences = jnp.where(jnp.arange(width) > cur_index[:, None], 0, sequences)
  return decoding.LogitCallbackState(
      cur_index=cur_index, sequences=sequences,
      cur_token=jnp.take_along_axis(sequences, cur_index[:, None], axis=1), cache=None)


def exact_law(target, sampling_args, logit_callback_fn=None) -> dict[tuple, float]:
  """P(output) for every complete output: ends at the first EOS or after LENGTH tokens; with
  `logit_callback_fn`, of the target's logits through it."""
  law, frontier = {}, {(): 1.0}
  for depth in range(LENGTH):
    prefixes = list(frontier)
    if not prefixes:
      break
    sequences = np.array([(0,) + p for p in prefixes], np.int32)
    logits = target.next_token_logits(sequences)
    if logit_callback_fn is not None:
      logits = logit_callback_fn(logits, prefix_state(
          jnp.asarray(sequences), jnp.full((len(prefixes),), depth, jnp.int32)))
    probs = np.asarray(sampling.logits_to_probs(logits, *sampling_args), np.float64)
    next_frontier = {}
    for prefix, row in zip(prefixes, probs):
      for token in range(1, VOCAB):
        mass = frontier[prefix] * row[token]
        if mass == 0:
          continue
        sequence = prefix + (token,)
        if token == EOS or depth == LENGTH - 1:
          law[sequence] = mass
        else:
          next_frontier[sequence] = mass
    frontier = next_frontier
  return law


def chi_square_p_value(decodes: np.ndarray, law: dict[tuple, float]) -> float:
  observed = {}
  for row in map(tuple, decodes):
    sequence = tuple(t for t in row if t != 0)
    observed[sequence] = observed.get(sequence, 0) + 1
  return counts_p_value(observed, law)


def counts_p_value(observed: dict[tuple, int], law: dict[tuple, float]) -> float:
  """Chi-square p-value of the outcome counts `observed` against the law (0 where an outcome
  the law cannot produce was observed)."""
  impossible = set(observed) - set(law)
  if impossible:
    return 0.0  # a sequence the target can never produce
  expected = np.array([sum(observed.values()) * law[s] for s in law])
  counts = np.array([observed.get(s, 0) for s in law])
  rare = expected < 5  # pooled so the chi-square approximation holds
  if rare.any():
    expected = np.append(expected[~rare], expected[rare].sum())
    counts = np.append(counts[~rare], counts[rare].sum())
  expected *= counts.sum() / expected.sum()
  return float(scipy.stats.chisquare(counts, expected).pvalue)


def draw(target, draft, gamma, sampling_args, verifier, draft_policy="fixed", seed=0,
         logit_callback_fn=None):
  inputs = jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32)
  decodes, _, stats = toy_setup.speculative(target, draft, inputs, jax.random.PRNGKey(seed),
                                            gamma, sampling_args=sampling_args,
                                            verifier=verifier, draft_policy=draft_policy,
                                            logit_callback_fn=logit_callback_fn)
  return np.asarray(decodes[:, 0]), stats


CASES = {  # name: (draft, gamma, (temperature, topk, topp))
    "temperature_1": ("near", 2, (1.0, 0, 0.0)),
    "temperature_0.5": ("near", 3, (0.5, 0, 0.0)),
    "temperature_1.5": ("near", 2, (1.5, 0, 0.0)),
    "top_k_2": ("near", 3, (1.0, 2, 0.0)),
    "top_p_0.8": ("near", 2, (1.0, 0, 0.8)),
    "far_draft": ("far", 3, (1.0, 0, 0.0)),
    "draft_is_target": ("same", 2, (1.0, 0, 0.0)),
}


ADAPTIVE_CASES = ("temperature_1", "top_p_0.8", "far_draft")
DECODERS = ([(case, rule, "fixed") for case in sorted(CASES) for rule in sorted(verify.EXACT_RULES)]
            + [(case, "token", policy) for case in ADAPTIVE_CASES
               for policy in sorted(drafting.POLICIES) if policy != "fixed"]
            + [("temperature_1", "block", policy) for policy in sorted(drafting.POLICIES)
               if policy != "fixed"])


@pytest.mark.parametrize("case,verifier,draft_policy", tiers.newest_among(
    DECODERS, [("temperature_1", rule, "fixed") for rule in sorted(verify.EXACT_RULES)]))
def test_sequences_follow_the_target_law(case, verifier, draft_policy):
  draft_kind, gamma, sampling_args = CASES[case]
  target, draft = toy_setup.make_pair(VOCAB, draft_kind, seed=1)
  decodes, stats = draw(target, draft, gamma, sampling_args, verifier, draft_policy)
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args))
  assert p_value > P_VALUE_FLOOR, f"{case}/{verifier}: p = {p_value:.2e}"
  alpha = float(np.mean(stats.alpha))
  if draft_kind == "same":
    assert alpha == pytest.approx(1.0, abs=1e-5)
  else:
    assert alpha < 0.99


# N-gram lookup drafts (alone, and combined with the 'near' model) under every exact rule and
# policy, greedy and at temperature 1. Half the rows have a random encoder source to copy from,
# half an empty one (only their own output can match), so rows with and without proposals share
# every batch; the law over outputs is the target's whatever the source.
# one_draft is left out of the combined drafter's greedy case: its two-token output is decoded by
# the model's one draft and the bonus token, so the lookup never has a position to propose at.
LOOKUP_DECODERS = [(drafter, temperature, rule, policy) for drafter in ("lookup", "lookup+near")
                   for temperature in (0.0, 1.0) for rule in sorted(verify.EXACT_RULES)
                   for policy in sorted(drafting.POLICIES)
                   if (drafter, temperature, policy) != ("lookup+near", 0.0, "one_draft")]


def lookup_sources(num_rows: int, length: int = 6, seed: int = 0) -> np.ndarray:
  """[num_rows, length] encoder tokens: random words then EOS on even rows, padding on odd."""
  rng = np.random.default_rng(seed)
  sources = np.zeros((num_rows, length), np.int32)
  sources[::2, :-1] = rng.integers(2, VOCAB, (len(sources[::2]), length - 1))
  sources[::2, -1] = EOS
  return sources


def draw_lookup(drafter, sampling_args, verifier, draft_policy="fixed", gamma=3, seed=0):
  target, near = toy_setup.make_pair(VOCAB, "near", seed=1)
  combined = drafter == "lookup+near"
  # min_ngram 1 in both: the greedy output (2, EOS) is too short for a longer match; rows with
  # an empty source have no match at positions 0 and 1, where the combined draft uses the model.
  lookup = engine_lookup.NGramLookup(VOCAB, max_ngram=3, min_ngram=1)
  decodes, _, stats = toy_setup.speculative_lookup(
      target, near if combined else None, lookup, jnp.asarray(lookup_sources(NUM_SAMPLES)),
      jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32), jax.random.PRNGKey(seed), gamma,
      sampling_args=sampling_args, verifier=verifier, draft_policy=draft_policy)
  return target, np.asarray(decodes[:, 0]), stats


@pytest.mark.parametrize("drafter,temperature,verifier,draft_policy", LOOKUP_DECODERS)
def test_lookup_drafts_follow_the_target_law(drafter, temperature, verifier, draft_policy):
  sampling_args = (temperature, 0, 0.0)
  target, decodes, stats = draw_lookup(drafter, sampling_args, verifier, draft_policy)
  law = exact_law(target, sampling_args)
  if len(law) == 1:  # greedy: one possible output, which every row must produce
    (expected,) = law
    observed = {tuple(t for t in row if t != 0) for row in map(tuple, decodes)}
    assert observed == {expected}
  else:
    p_value = chi_square_p_value(decodes, law)
    assert p_value > P_VALUE_FLOOR, f"{drafter}/{verifier}/{draft_policy}: p = {p_value:.2e}"
  lookup_drafted = np.asarray(stats.lookup_drafted_tokens)[:, 0]
  drafted = np.asarray(stats.drafted_tokens)[:, 0]
  assert lookup_drafted.sum() > 0  # the lookup proposed, so the test weighed its drafts
  assert np.all(stats.lookup_accepted_tokens <= stats.accepted_tokens)
  if drafter == "lookup":
    assert np.array_equal(lookup_drafted, drafted)  # every draft is a lookup's
    # Rows proposed nothing in some iterations (fewer drafts than the policy would take).
    assert np.any(drafted < 3 * np.asarray(stats.target_calls)[:, 0])
  else:
    assert np.sum(drafted - lookup_drafted) > 0  # the model drafted where lookup did not


@functools.partial(jax.jit, static_argnames=("gamma", "verifier"))
def _speculative_with_data(target, draft, inputs, rng, gamma, verifier, temperature, topk, topp):
  """Speculative sampling with the sampling settings as data (traced arrays: the engine's
  transform for settings known only when it runs; a temperature per row)."""
  return decoding.speculative_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      draft_cache=draft.init_cache(*inputs.shape), draft_tokens_to_logits=draft.tokens_to_logits,
      gamma=gamma, decode_rng=rng, temperature=temperature, topk=topk, topp=topp,
      verifier=verifier)


def draw_with_data(temperature, topk, topp, verifier, num_rows=NUM_SAMPLES, seed=0):
  target, draft = toy_setup.make_pair(VOCAB, "near", seed=1)
  decodes, _, _ = _speculative_with_data(
      target, draft, jnp.zeros((num_rows, LENGTH), jnp.int32), jax.random.PRNGKey(seed), 2,
      verifier, jnp.asarray(temperature, jnp.float32), jnp.int32(topk), jnp.float32(topp))
  return target, np.asarray(decodes[:, 0])


@pytest.mark.parametrize("verifier", sorted(verify.EXACT_RULES))
@pytest.mark.parametrize("case", ["temperature_0.5", "top_k_2", "top_p_0.8"])
def test_traced_settings_follow_the_target_law(case, verifier):
  _, _, sampling_args = CASES[case]
  target, decodes = draw_with_data(*sampling_args, verifier)
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args))
  assert p_value > P_VALUE_FLOOR, f"{case}/{verifier}: p = {p_value:.2e}"


# One temperature per example (T5X's decoder_params), alternating: each row follows the law at
# its own temperature, NUM_SAMPLES rows each.
PER_EXAMPLE = (0.5, 1.5)


@pytest.mark.parametrize("verifier", sorted(verify.EXACT_RULES))
def test_per_example_temperatures_follow_each_examples_law(verifier):
  temperatures = np.tile(PER_EXAMPLE, NUM_SAMPLES)
  target, decodes = draw_with_data(temperatures, 0, 0.0, verifier, len(temperatures))
  for i, temperature in enumerate(PER_EXAMPLE):
    p_value = chi_square_p_value(decodes[i::2], exact_law(target, (temperature, 0, 0.0)))
    assert p_value > P_VALUE_FLOOR, f"temperature {temperature}/{verifier}: p = {p_value:.2e}"


def test_negative_control_a_temperature_for_every_example_fails():
  """An engine giving every row the first example's temperature is caught."""
  target, decodes = draw_with_data(PER_EXAMPLE[0], 0, 0.0, "token")
  p_value = chi_square_p_value(decodes, exact_law(target, (PER_EXAMPLE[1], 0, 0.0)))
  assert p_value < P_VALUE_FLOOR, f"the wrong temperature was not caught: p = {p_value:.2e}"


def repeat_penalty(logits, state):
  """A logit callback reading the prefix: each id loses 3 per occurrence in it, and EOS
  gains 1 per position."""
  vocab = jnp.arange(logits.shape[-1])
  counts = jnp.sum(state.sequences[:, 1:, None] == vocab, axis=1)
  return logits - 3.0 * counts + jnp.where(vocab == EOS, 1.0 * state.cur_index[:, None], 0.0)


@flax.struct.dataclass
class CallbackModel:
  """A toy model whose logits pass through `callback`, each fed token's with its prefix."""
  model: toy.PrefixHashModel
  callback: Any = flax.struct.field(pytree_node=False)

  def init_cache(self, batch_size, max_len):
    return self.model.init_cache(batch_size, max_len)

  def tokens_to_logits(self, state):
    logits, cache = self.model.tokens_to_logits(dataclasses.replace(state, logits_index=None))
    return jnp.stack([self.callback(logits[:, j], prefix_state(state.sequences,
                                                                state.cur_index + j))
                      for j in range(logits.shape[1])], axis=1), cache


@pytest.mark.parametrize("case,verifier", [(case, rule)
                                           for case in ("temperature_1", "temperature_1.5")
                                           for rule in sorted(verify.EXACT_RULES)])
def test_a_logit_callback_law_is_sampled(case, verifier):
  """The target's law through a logit callback (at every verified position, given the prefix
  with the drafts before it) is what speculative sampling and the baseline sample."""
  draft_kind, gamma, sampling_args = CASES[case]
  target, draft = toy_setup.make_pair(VOCAB, draft_kind, seed=1)
  law, without = exact_law(target, sampling_args, repeat_penalty), exact_law(target, sampling_args)
  assert sum(abs(law.get(s, 0) - without.get(s, 0)) for s in {*law, *without}) > 0.15
  decodes, _ = draw(target, draft, gamma, sampling_args, verifier,
                    logit_callback_fn=repeat_penalty)
  p_value = chi_square_p_value(decodes, law)
  assert p_value > P_VALUE_FLOOR, f"{case}/{verifier}: p = {p_value:.2e}"
  baseline, _ = toy_setup.baseline(target, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                                   jax.random.PRNGKey(0), sampling_args=sampling_args,
                                   logit_callback_fn=repeat_penalty)
  p_value = chi_square_p_value(np.asarray(baseline[:, 0]), law)
  assert p_value > P_VALUE_FLOOR, f"{case} baseline: p = {p_value:.2e}"


def test_negative_control_a_logit_callback_on_the_draft_only_fails():
  """The callback's law is not sampled when only the draft's logits pass through it."""
  target, draft = toy_setup.make_pair(VOCAB, "near", seed=1)
  sampling_args = (1.0, 0, 0.0)
  decodes, _ = draw(target, CallbackModel(draft, repeat_penalty), 2, sampling_args, "token")
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args, repeat_penalty))
  assert p_value < P_VALUE_FLOOR, f"a callback on the draft only was not caught: p = {p_value:.2e}"


def accept_everything(draft_tokens, draft_probs, target_probs, num_drafted):
  verdict = verify.token_rule(draft_tokens, draft_probs, target_probs, num_drafted)
  all_accepted = jax.nn.one_hot(num_drafted, draft_tokens.shape[1] + 1)
  return verify.Verdict(all_accepted, verdict.next_token_probs)


def resample_from_target(draft_tokens, draft_probs, target_probs, num_drafted):
  verdict = verify.token_rule(draft_tokens, draft_probs, target_probs, num_drafted)
  return verify.Verdict(verdict.num_accepted_probs,
                        jnp.broadcast_to(target_probs, verdict.next_token_probs.shape))


@pytest.mark.newest
@pytest.mark.parametrize("wrong_rule", [accept_everything, resample_from_target,
                                        verify.lenient_rule])
def test_negative_controls_fail(wrong_rule):
  """The test above, applied to wrong (or lossy) verifiers, must reject them."""
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=1)
  sampling_args = (1.0, 0, 0.0)
  decodes, _ = draw(target, draft, 3, sampling_args, wrong_rule)
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args))
  assert p_value < P_VALUE_FLOOR, f"{wrong_rule.__name__} was not caught: p = {p_value:.2e}"


@pytest.mark.parametrize("mistake", test_verify.BLOCK_MISTAKES)
def test_negative_controls_of_the_block_rule_past_its_first_token_fail(mistake):
  """The block rule with a mistake that only matters from block position 2 on (its weights, its
  keep probabilities, or its residual after tau >= 1 drafts: `test_verify.paper_block_rule`) is
  rejected. On the 'far' pair of seed 0: the residual mistake moves the law of seed 1's pair,
  the one the cases above run, too little for 100,000 samples (p ~ 5e-3); test_verify's exact
  law of the whole block catches every one on any pair."""
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=0)
  sampling_args = (1.0, 0, 0.0)
  decodes, _ = draw(target, draft, 3, sampling_args, test_verify.paper_block_rule(mistake))
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args))
  assert p_value < P_VALUE_FLOOR, f"the block rule's {mistake} mistake was not caught: " \
                                  f"p = {p_value:.2e}"


@pytest.mark.parametrize("drafter", ["lookup", "lookup+near"])
def test_negative_controls_fail_with_lookup_drafts(drafter):
  """The lookup test has the power to catch a wrong verifier of lookup drafts."""
  sampling_args = (1.0, 0, 0.0)
  target, decodes, _ = draw_lookup(drafter, sampling_args, accept_everything)
  p_value = chi_square_p_value(decodes, exact_law(target, sampling_args))
  assert p_value < P_VALUE_FLOOR, f"accept_everything was not caught: p = {p_value:.2e}"


def test_a_sample_count_without_power_is_refused():
  """SPEC_DECODE_EXACTNESS_SAMPLES below MIN_SAMPLES stops the module at import."""
  environment = dict(os.environ, SPEC_DECODE_EXACTNESS_SAMPLES=str(MIN_SAMPLES - 1))
  completed = subprocess.run([sys.executable, "-c", "import test_exactness"],
                             cwd=pathlib.Path(__file__).parent, env=environment,
                             capture_output=True, text=True)
  assert completed.returncode != 0
  assert f"at least {MIN_SAMPLES}" in completed.stderr
