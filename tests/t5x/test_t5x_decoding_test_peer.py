"""T5X's own decoding tests (`t5x/decoding_test.py`, as installed with T5X) run against the
engine: in T5X's test module, `t5x.decoding`'s `temperature_sample`,
`_temperature_sample_single_trial` and `beam_search` are replaced by the engine's loops, called
with T5X's arguments and T5X's models (one token per call, adapted to the model contract by
`engine_model`), in two modes: the loop of the target alone, and its speculative form with a
draft proposing wrong tokens, so that every draft is verified and rejected and every token is
the target's. (A draft equal to the target passes them too; `test_t5x_decode_functions` runs
that draft against T5X's functions, and it would double this file's time.) Every expectation
is T5X's test's own; the cases that test something other than a decode loop's output are named
with the reason (`NOT_COMPARABLE`)."""

import inspect
import types
from typing import Callable
import unittest

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.decoding_test", reason="needs t5x: pip install --no-deps "
                                                "../shared/wheels/*.whl and its dependencies")

from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
from t5x import decoding_test as t5x_decoding_test  # pylint: disable=g-import-not-at-top

from spec_decode.engine import loops  # pylint: disable=g-import-not-at-top

MODES = {  # mode: (the sampler, the beam search, their speculative settings)
    "target": ("temperature_sample", "beam_search", {}),
    "wrong_draft": ("speculative_sample", "speculative_beam_search", {"gamma": 2}),
}


def _stack(rows: list) -> object:
  """The rows a T5X model returned [B, V] each as the contract's logits [B, k, V]: NumPy rows
  stay NumPy (T5X's loop hands a logit callback what the model returned)."""
  if all(isinstance(row, np.ndarray) for row in rows):
    return np.stack(rows, axis=1)
  return jnp.stack(rows, axis=1)


def engine_model(t5x_tokens_to_logits: Callable, wrong: bool = False) -> Callable:
  """The engine's tokens_to_logits for a T5X one: each fed token in turn, at its position;
  `wrong`: the logits moved one id up, so that a draft proposes wrong tokens."""

  def tokens_to_logits(state):
    cache, rows = state.cache, []
    for j in range(state.cur_token.shape[1]):
      row, cache = t5x_tokens_to_logits(t5x_decoding.DecodingState(
          cur_index=state.cur_index + j, sequences=state.sequences,
          cur_token=state.cur_token[:, j:j + 1], cache=cache))
      rows.append(jnp.roll(row, 1, axis=-1) if wrong else row)
    return _stack(rows), cache

  return tokens_to_logits


def _peer_decoding(mode: str) -> types.ModuleType:
  """`t5x.decoding` with its decode loops replaced by the engine's in `mode`."""
  sampler, beam_search, speculative = MODES[mode]

  def run(name, t5x_fn, args, kwargs):
    bound = inspect.signature(t5x_fn).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    if arguments.pop("cache_offset"):
      raise ValueError("cache_offset: the engine's caches have the batch leading")
    if arguments.get("state_callback_fn") is None:
      arguments.pop("state_callback_fn", None)
    runner = {key: arguments.pop(key)
              for key in ("inputs", "cache", "tokens_to_logits", "eos_id")}
    loop = loops.get(name)
    draft = {}
    if loop.uses_draft:
      draft = dict(draft_cache=runner["cache"], draft_tokens_to_logits=engine_model(
          runner["tokens_to_logits"], wrong=mode == "wrong_draft"), **speculative)
    decodes, scores, _ = loop(inputs=jnp.asarray(runner["inputs"]), cache=runner["cache"],
                              tokens_to_logits=engine_model(runner["tokens_to_logits"]),
                              eos_id=runner["eos_id"], **arguments, **draft)
    return decodes, scores

  def temperature_sample(*args, **kwargs):
    return run(sampler, t5x_decoding.temperature_sample, args, kwargs)

  def temperature_sample_single_trial(*args, **kwargs):
    bound = inspect.signature(t5x_decoding._temperature_sample_single_trial).bind(  # pylint: disable=protected-access
        *args, **kwargs)
    bound.apply_defaults()  # the single trial's own, topk's among them
    arguments = dict(bound.arguments)
    arguments["decode_rng"] = arguments.pop("prng_key")
    # T5X's rows, already expanded: one decode each (num_decodes only repeats temperatures).
    if arguments.pop("num_decodes") != 1:
      raise ValueError("a single trial of expanded rows")
    decodes, scores = temperature_sample(**arguments)
    return decodes[:, 0], scores[:, 0]

  def beam(*args, **kwargs):
    return run(beam_search, t5x_decoding.beam_search, args, kwargs)

  peer = types.ModuleType("t5x_decoding_peer")
  peer.__dict__.update(vars(t5x_decoding))
  peer.temperature_sample = temperature_sample
  peer._temperature_sample_single_trial = temperature_sample_single_trial  # pylint: disable=protected-access
  peer.beam_search = beam
  return peer


SPECULATIVE_MODES = ("wrong_draft",)
ALL_MODES = tuple(MODES)
# T5X's test: (the modes where it tests something other than the loop's output, why).
NOT_COMPARABLE = {
    "test_temperature_sample_prefix_ending_with_eos_early_stop": (
        ALL_MODES, "mocks jax.random.categorical, which the engine's samplers never call (they "
                   "draw by inverse CDF from one uniform per draw)"),
    "test_temperature_sample_log_prob": (
        ALL_MODES, "mocks jax.random.categorical (see above)"),
    "test_topp_log_probs": (
        ALL_MODES, "reads the logits T5X hands jax.random.categorical (see above)"),
    "test_temperature_sample_num_decodes": (
        ALL_MODES, "mocks T5X's _temperature_sample_single_trial, which temperature_sample "
                   "calls in T5X"),
    "test_temperature_sample_num_decodes_with_initial_index": (
        ALL_MODES, "mocks T5X's _temperature_sample_single_trial and cache_map"),
    "test_temperature_sample_with_state_callback": (
        ALL_MODES, "state_callback_fn edits T5X's per-token loop state, which no engine loop "
                   "builds (refused by name)"),
    "test_temperature_sample_max_decode_steps_with_initial_index_no_initial_index": (
        SPECULATIVE_MODES, "counts the model's calls, which speculation changes"),
    "test_temperature_sample_max_decode_steps_with_initial_index_initial_index": (
        SPECULATIVE_MODES, "counts the model's calls"),
    "test_temperature_sample_max_decode_steps_with_initial_index_lower_initial_index": (
        SPECULATIVE_MODES, "counts the model's calls"),
    "test_temperature_sample_max_decode_steps_endpad": (
        SPECULATIVE_MODES, "counts the model's calls"),
    "test_temperature_sample_max_decode_steps_docstring_ex4": (
        SPECULATIVE_MODES, "counts the model's calls"),
    "test_beam_search": (
        SPECULATIVE_MODES, "its model counts its calls in its cache (cur_iter), where the "
                           "contract's model writes its cache by position: a speculative loop "
                           "rolls a cache back by calling at an earlier position"),
    "test_beam_search_min_log_prob": (
        SPECULATIVE_MODES, "speculative_beam_search takes only T5X's default min_log_prob "
                           "(refused by name: its rows advance at their own pace)"),
}
HELPERS = ("test_add_beam_dim", "test_flat_batch_beam_expand", "test_top_k_two_stage",
           "test_cache_map", "test_cache_map_with_index", "test_align_prompt")


def _cases():
  names = unittest.defaultTestLoader.getTestCaseNames(t5x_decoding_test.DecodeTest)
  for name in names:
    if name in HELPERS:  # T5X's own helpers, not a decode loop
      continue
    for mode in MODES:
      modes, why = NOT_COMPARABLE.get(name, ((), ""))
      marks = [pytest.mark.skip(reason=why)] if mode in modes else []
      if mode in SPECULATIVE_MODES:  # the fast tier runs T5X's tests on the target's loops
        marks.append(pytest.mark.slow)
      yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


@pytest.mark.parametrize("name,mode", list(_cases()))
def test_t5x_decoding_test_passes_on_the_engine(name, mode, monkeypatch):
  monkeypatch.setattr(t5x_decoding_test, "decoding", _peer_decoding(mode))
  result = unittest.TestResult()
  t5x_decoding_test.DecodeTest(name).run(result)
  problems = result.failures + result.errors
  assert not problems, problems[0][1]
  assert result.testsRun == 1 and not result.skipped
