"""The T5X hook's model against T5X itself, in process: greedy speculative decodes equal T5X's
own model, network and `t5x.decoding.temperature_sample(temperature=0)`, token for token, on
the tiny T5.1.1 checkpoint (conftest.py; draft: a noisy copy, so drafts are both accepted and
rejected) and on a random tiny T5.1.1 saved by T5X's Checkpointer (draft: a smaller random
T5.1.1); scores are the target's; the parameter tree is T5X's plus the draft's; the draft's
config is read from its checkpoint; the sampled distribution follows the T5X decode_fn; the
TPU's products decode the same tokens on CPU."""

import functools
import inspect

import gin

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.models",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_setup  # pylint: disable=g-import-not-at-top
import tiers  # pylint: disable=g-import-not-at-top
from spec_decode.runtime import platforms  # pylint: disable=g-import-not-at-top
from spec_decode.t5 import network  # pylint: disable=g-import-not-at-top
from spec_decode.t5x import speculative  # pylint: disable=g-import-not-at-top
from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

ENCODER_LENGTH, DECODER_LENGTH = 10, 12
# (batch size, gamma) per target; each pair compiles once (~10 s on CPU).
CASES = {"t5x_tiny": [(4, 1), (4, 3), (4, 6), (1, 3)], "random_tiny": [(4, 4), (1, 4)]}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tiny_checkpoint) -> dict[str, tuple[str, str]]:
  """(target checkpoint, draft checkpoint) per target, all written by T5X's Checkpointer: the
  tiny checkpoint (arrays inline, conftest.py) and a noisy copy of it; a random tiny T5.1.1 and
  a smaller random draft (TensorStore arrays)."""
  directory = tmp_path_factory.mktemp("t5x_checkpoints")
  tiny = str(tiny_checkpoint)
  noisy_copy = t5x_setup.perturbed(t5x_setup.load_params(tiny), relative_noise=0.3, seed=1)
  random_target = t5x_setup.initial_variables(t5x_setup.TINY, seed=3)["params"]
  random_draft = t5x_setup.initial_variables(t5x_setup.TINY_DRAFT, seed=4)["params"]
  save = t5x_setup.save_checkpoint
  return {
      "t5x_tiny": (tiny, save(directory / "noisy_copy", t5x_setup.TINY, noisy_copy)),
      "random_tiny": (save(directory / "random_target", t5x_setup.TINY, random_target),
                      save(directory / "random_draft", t5x_setup.TINY_DRAFT, random_draft)),
  }


def _batch(batch_size: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(batch_size)
  encoder_input_tokens = rng.integers(3, 32000, (batch_size, ENCODER_LENGTH)).astype(np.int32)
  encoder_input_tokens[:, 7] = 1  # EOS, then padding
  encoder_input_tokens[:, 8:] = 0
  zeros = np.zeros((batch_size, DECODER_LENGTH), np.int32)
  return {"encoder_input_tokens": encoder_input_tokens, "decoder_input_tokens": zeros,
          "decoder_target_tokens": zeros, "decoder_loss_weights": zeros}


def _both_params(target_path: str, draft_path: str) -> dict:
  return {**t5x_setup.load_params(target_path),
          speculative.DRAFT_PARAMS_KEY: t5x_setup.load_params(draft_path)}


@pytest.mark.slow
@pytest.mark.parametrize("target", tiers.newest_among(sorted(CASES), {"t5x_tiny"}))
def test_greedy_speculative_decodes_equal_t5x(pairs, target):
  target_path, draft_path = pairs[target]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY)
  params = t5x_setup.load_params(target_path)
  both_params = _both_params(target_path, draft_path)
  accepted = drafted = 0
  for batch_size, gamma in CASES[target]:
    batch = _batch(batch_size)
    expected = np.asarray(jax.jit(t5x_model.predict_batch)(params, batch))
    model = speculative.speculative_version(t5x_model, draft_path, gamma=gamma)
    decodes, aux = jax.jit(model.predict_batch_with_aux)(both_params, batch)
    np.testing.assert_array_equal(np.asarray(decodes), expected,
                                  err_msg=f"batch {batch_size}, gamma {gamma}")
    np.testing.assert_allclose(aux["tokens_per_target_call"],
                               aux["generated_tokens"] / aux["target_calls"])
    accepted += np.sum(aux["accepted_tokens"])
    drafted += np.sum(aux["drafted_tokens"])
  assert accepted < drafted, "no draft was rejected"
  if target == "t5x_tiny":
    assert accepted > 0, "no draft was accepted"


# (beam size, alpha, batch size, gamma, the draft search's beams as a loop setting: None is
# the beam size): each compiles T5X's and the hook's decode once.
BEAM_CASES = [(4, 0.6, 3, 3, None), (2, 0.0, 1, 1, None), (1, 0.6, 3, 5, None),
              (4, 0.6, 1, 1, 8)]


@pytest.mark.slow
@pytest.mark.parametrize("num_beams,alpha,batch_size,gamma,draft_beams",
                         tiers.newest_among(BEAM_CASES, BEAM_CASES[:1]))
def test_beam_search_equals_t5x(pairs, num_beams, alpha, batch_size, gamma, draft_beams):
  """T5X's model with its own network and `beam_search` (its default decode_fn) against the
  hook's speculative beam search: every beam, token for token, and its score."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(
      t5x_setup.TINY, decode_fn=functools.partial(t5x_decoding.beam_search, alpha=alpha))
  predict = lambda model, params: jax.jit(functools.partial(
      model.predict_batch_with_aux, num_decodes=num_beams, return_all_decodes=True))(
          params, _batch(batch_size))
  want, want_aux = predict(t5x_model, t5x_setup.load_params(target_path))
  loop_settings = None if draft_beams is None else {"draft_beams": draft_beams}
  model = speculative.speculative_version(t5x_model, draft_path, gamma=gamma,
                                          loop_settings=loop_settings)
  assert model.decoder.loop_name == "speculative_beam_search"
  assert model.decoder.resolved_settings()["draft_beams"] == draft_beams
  got, aux = predict(model, _both_params(target_path, draft_path))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_allclose(aux["scores"], want_aux["scores"], rtol=1e-5, atol=1e-5)
  assert np.all(aux["target_calls"] <= aux["beam_steps"])
  assert aux["covered_past_depth"].shape == aux["beam_steps"].shape + (gamma,)


# T5X decode_fns whose scores the hook must reproduce: greedy (T5X's default rescale_log_probs
# scores the law sampled, a point mass: 0), greedy scored by the target's own log-softmax, and
# sampled from a top-2 truncation for 2 steps (4 decodes per example, so both sides draw common
# ones whatever their rngs), both ways.
SCORED = {
    "greedy": dict(temperature=0.0, topk=0),
    "greedy_raw": dict(temperature=0.0, topk=0, rescale_log_probs=False),
    "top2": dict(temperature=0.6, topk=2, max_decode_steps=2),
    "top2_raw": dict(temperature=0.6, topk=2, max_decode_steps=2, rescale_log_probs=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", tiers.newest_among(sorted(SCORED), {"greedy"}))
def test_predict_batch_with_aux_scores_are_t5xs(pairs, case):
  """Each decode the hook returns that T5X's EncoderDecoderModel also returns (8 per example)
  has T5X's score."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=functools.partial(
      t5x_decoding.temperature_sample, **SCORED[case]))
  predict = lambda model, params, seed: jax.jit(functools.partial(
      model.predict_batch_with_aux, num_decodes=8, return_all_decodes=True))(
          params, _batch(2), rng=jax.random.PRNGKey(seed))
  want, want_aux = predict(t5x_model, t5x_setup.load_params(target_path), 0)
  model = speculative.speculative_version(t5x_model, draft_path, gamma=2)
  got, aux = predict(model, _both_params(target_path, draft_path), 1)
  for example in range(2):
    expected = dict(zip(map(tuple, np.asarray(want[example])),
                        np.asarray(want_aux["scores"][example])))
    common = [(expected[tuple(d)], score) for d, score in
              zip(np.asarray(got[example]), np.asarray(aux["scores"][example]))
              if tuple(d) in expected]
    assert common, f"example {example}: no decode in common with T5X's"
    np.testing.assert_allclose(*zip(*common), rtol=1e-5, atol=1e-5)
  if case == "greedy":
    assert np.all(np.asarray(want_aux["scores"]) == 0)
  if case.endswith("_raw"):
    assert np.all(np.asarray(want_aux["scores"]) < 0)


@pytest.mark.slow
@pytest.mark.parametrize("topk,temperatures", [
    (0, ([0.0, 0.0, 0.0, 0.0], [1e-5, 0.0, 5e-5, 0.0])),  # at or below T5X's greedy threshold
    (1, ([0.7, 1.3, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]))])  # T5X's default topk: its argmax
def test_decoder_params_as_t5x_gives_them_traced_per_example(pairs, topk, temperatures):
  """T5X's decoder_params: one temperature per example, traced inside one jitted predict,
  where both decode deterministically: T5X's decodes and scores, one compilation for every
  value."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=functools.partial(
      t5x_decoding.temperature_sample, topk=topk))
  model = speculative.speculative_version(t5x_model, draft_path, gamma=3)
  traces = []

  def predict(params, batch, temperature):
    traces.append(1)
    return model.predict_batch_with_aux(params, batch,
                                        decoder_params={"temperature": temperature})

  predict = jax.jit(predict)
  batch = _batch(4)
  t5x_predict = jax.jit(lambda params, temperature: t5x_model.predict_batch_with_aux(
      params, batch, decoder_params={"temperature": temperature}))
  for values in temperatures:
    values = np.asarray(values, np.float32)
    want, want_aux = t5x_predict(t5x_setup.load_params(target_path), values)
    got, aux = predict(_both_params(target_path, draft_path), batch, values)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_allclose(aux["scores"], want_aux["scores"], atol=1e-6)
  assert len(traces) == 1


@pytest.mark.slow
def test_scores_use_the_target_alone(pairs):
  """T5X's score_batch, through the overridden _compute_logits, ignores the draft subtree."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY)
  model = speculative.speculative_version(t5x_model, draft_path, gamma=2)
  batch = _batch(4)
  targets = batch["encoder_input_tokens"][:, :8]
  batch.update(decoder_target_tokens=targets,
               decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
               decoder_loss_weights=(targets > 0).astype(np.int32))
  np.testing.assert_allclose(
      jax.jit(model.score_batch)(_both_params(target_path, draft_path), batch),
      jax.jit(t5x_model.score_batch)(t5x_setup.load_params(target_path), batch),
      rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sampled_decodes_are_scored_as_t5x_scores_them(pairs):
  """At temperature 1 (rng from T5X's argument), aux['scores'] is the target's log-likelihood of
  each decode as T5X's score_batch computes it."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY, temperature=1.0)
  model = speculative.speculative_version(t5x_model, draft_path, gamma=3)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(
      _both_params(target_path, draft_path), _batch(4), rng=jax.random.PRNGKey(7))
  decodes = np.asarray(decodes)
  scored = {"encoder_input_tokens": _batch(4)["encoder_input_tokens"],
            "decoder_target_tokens": decodes,
            "decoder_input_tokens": np.pad(decodes[:, :-1], ((0, 0), (1, 0))),
            "decoder_loss_weights": (decodes > 0).astype(np.int32)}
  np.testing.assert_allclose(
      aux["scores"], jax.jit(t5x_model.score_batch)(t5x_setup.load_params(target_path), scored),
      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shard_draft", [False, True])
def test_initial_variables_add_the_draft_beside_t5x_tree(shard_draft):
  """The target's tree is T5X's; the draft's logical axes are all None (replicated) unless
  shard_draft."""
  to_ours = lambda config: speculative.network.Transformer(speculative.config_from_t5x(config))
  vocabulary = t5x_setup.vocabulary()
  model = speculative.SpeculativeEncoderDecoderModel(
      to_ours(t5x_setup.TINY), vocabulary, vocabulary, None, gamma=2,
      draft_module=to_ours(t5x_setup.TINY_DRAFT), shard_draft=shard_draft)
  initial_variables = lambda m: jax.eval_shape(
      functools.partial(m.get_initial_variables, input_shapes=t5x_setup.INPUT_SHAPES),
      jax.random.PRNGKey(0))
  variables = initial_variables(model)
  t5x_variables = initial_variables(t5x_setup.t5x_model(t5x_setup.TINY))
  target_params, _ = speculative.split_params(variables["params"])
  assert (jax.tree_util.tree_structure(target_params)
          == jax.tree_util.tree_structure(dict(t5x_variables["params"])))
  draft_axes = jax.tree_util.tree_leaves(
      variables["params_axes"][speculative.DRAFT_PARAMS_KEY],
      is_leaf=lambda x: isinstance(x, speculative.nn_partitioning.AxisMetadata))
  assert draft_axes
  assert all((set(meta.names) == {None}) != shard_draft for meta in draft_axes)


@pytest.mark.slow
def test_draft_config_is_read_from_its_checkpoint(pairs):
  _, draft_path = pairs["random_tiny"]
  target_config = speculative.config_from_t5x(t5x_setup.TINY)
  assert (speculative.draft_config_from_checkpoint(draft_path, target_config)
          == speculative.config_from_t5x(t5x_setup.TINY_DRAFT))


GREEDY = ("speculative_sample",
          {"temperature": 0.0, "topk": 0, "topp": 0.0, "max_decode_steps": None})
# T5X's default, topk=1: greedy at any temperature, so at temperature 0 with topk 1 kept.
DEFAULT = ("speculative_sample",
           {"temperature": 0.0, "topk": 1, "topp": 0.0, "max_decode_steps": None})


@pytest.mark.parametrize("decode_fn, settings", [
    (t5x_decoding.beam_search, ("speculative_beam_search", {"alpha": 0.6})),
    (functools.partial(t5x_decoding.beam_search, alpha=0.0),
     ("speculative_beam_search", {"alpha": 0.0})),
    (functools.partial(t5x_decoding.beam_search, max_decode_step=3),
     ("speculative_beam_search", {"alpha": 0.6, "max_decode_step": 3})),
    (t5x_decoding.temperature_sample, DEFAULT),
    (functools.partial(t5x_decoding.temperature_sample, temperature=0.0, topk=0), GREEDY),
    (functools.partial(t5x_decoding.temperature_sample, temperature=0.7, topk=0, topp=0.9,
                       max_decode_steps=5),
     ("speculative_sample", {"temperature": 0.7, "topk": 0, "topp": 0.9, "max_decode_steps": 5})),
    (functools.partial(t5x_decoding.temperature_sample, rescale_log_probs=False,
                       max_decode_steps_hard_limit=4),
     ("speculative_sample", dict(DEFAULT[1], rescale_log_probs=False,
                                 max_decode_steps_hard_limit=4))),
])
def test_decode_settings_follow_the_t5x_decode_fn(decode_fn, settings):
  assert speculative.decode_fn_settings(decode_fn) == settings


def no_repeats(logits, state):
  """T5X's kind of logit callback: an id already in the sequence is banned."""
  seen = jnp.any(state.sequences[:, 1:, None] == jnp.arange(logits.shape[-1]), axis=1)
  return jnp.where(seen, t5x_decoding.NEG_INF, logits)


def test_a_logit_callback_is_passed_on():
  decode_fn = functools.partial(t5x_decoding.temperature_sample, temperature=0.0, topk=0,
                                logit_callback_fn=no_repeats)
  assert speculative.decode_fn_settings(decode_fn) == ("speculative_sample", dict(
      GREEDY[1], logit_callback_fn=no_repeats))


@pytest.mark.slow
def test_greedy_decodes_with_a_logit_callback_equal_t5x(pairs):
  """T5X's model with a decode_fn given a logit callback, against the hook's: the decodes
  (which the callback changes) token for token, and their scores under the target's own
  log-softmax."""
  target_path, draft_path = pairs["t5x_tiny"]
  decode_fn = functools.partial(t5x_decoding.temperature_sample, temperature=0.0, topk=0,
                                rescale_log_probs=False)
  predict = lambda model, params: jax.jit(model.predict_batch_with_aux)(params, _batch(4))
  params = t5x_setup.load_params(target_path)
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=functools.partial(
      decode_fn, logit_callback_fn=no_repeats))
  want, want_aux = predict(t5x_model, params)
  without, _ = predict(t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=decode_fn), params)
  assert not np.array_equal(want, without)
  model = speculative.speculative_version(t5x_model, draft_path, gamma=3)
  assert model.decoder.resolved_settings()["logit_callback_fn"] is no_repeats
  got, aux = predict(model, _both_params(target_path, draft_path))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_allclose(aux["scores"], want_aux["scores"], rtol=1e-5, atol=1e-5)


def test_beam_search_arguments_that_cannot_take_effect_are_refused():
  with pytest.raises(ValueError, match="t5x.decoding.beam_search.cache_offset = 1 cannot "
                                       "take effect"):
    speculative.decode_fn_settings(functools.partial(t5x_decoding.beam_search, cache_offset=1))


def test_a_min_log_prob_is_passed_on_and_refused_by_speculative_beam_search(pairs):
  """The speculative loop cannot honour it (its rows' pace differs, T5X's stop is batch-wide):
  a one-line error when the model is built."""
  decode_fn = functools.partial(t5x_decoding.beam_search, min_log_prob=-5.0)
  assert speculative.decode_fn_settings(decode_fn) == (
      "speculative_beam_search", {"alpha": 0.6, "min_log_prob": -5.0})
  with pytest.raises(ValueError, match="speculative_beam_search takes only T5X's default "
                                       "min_log_prob .* got -5.0: T5X stops a whole batch"):
    speculative.speculative_version(t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=decode_fn),
                                    pairs["t5x_tiny"][1], gamma=2)


@pytest.mark.parametrize("binding,message", [
    (dict(cache_offset=1), "cache_offset = 1 cannot take effect: speculative decoding keeps "
                           "T5X's default 0"),
    (dict(state_callback_fn=lambda state: state),
     "state_callback_fn = .* cannot take effect: it edits T5X's per-token loop state")])
def test_temperature_sample_arguments_that_cannot_take_effect_are_refused(binding, message):
  with pytest.raises(ValueError, match="t5x.decoding.temperature_sample." + message):
    speculative.decode_fn_settings(functools.partial(t5x_decoding.temperature_sample,
                                                     **binding))


def test_sampling_settings_read_gin_bindings():
  with gin.unlock_config():
    gin.parse_config("""
        from __gin__ import dynamic_registration
        from t5x import decoding
        decoding.temperature_sample.temperature = 1.0
        decoding.temperature_sample.topk = 40
        DECODE_FN = @decoding.temperature_sample
    """)
  try:
    decode_fn = gin.query_parameter("%DECODE_FN").scoped_configurable_fn
    assert speculative.decode_fn_settings(decode_fn) == ("speculative_sample", {
        "temperature": 1.0, "topk": 40, "topp": 0.0, "max_decode_steps": None})
  finally:
    gin.clear_config()


# For every argument of T5X's decode functions that has a default, another value.
OTHER_VALUES = {
    "decode_rng": jax.random.PRNGKey(1), "num_decodes": 3, "temperature": 0.5, "topk": 3,
    "topp": 0.5, "cache_offset": 1, "initial_index": np.array([1]), "max_decode_steps": 3,
    "max_decode_steps_hard_limit": 2, "rescale_log_probs": False,
    "state_callback_fn": lambda state: state, "logit_callback_fn": no_repeats, "alpha": 0.3,
    "max_decode_len": 5, "max_decode_step": 2, "min_log_prob": -3.0}


@pytest.mark.parametrize("decode_fn", [t5x_decoding.temperature_sample,
                                       t5x_decoding.beam_search])
def test_every_argument_of_t5xs_decode_functions_is_honoured_or_refused(decode_fn):
  """T5X's signatures walked: each argument bound to another value than T5X's default either
  reaches the loop with that value and passes the loop's settings check (run when the model is
  built), or is refused in one line naming it: by the hook (`decode_fn_settings`) or by the
  loop's check. None is dropped."""
  from spec_decode.engine import loops  # pylint: disable=g-import-not-at-top
  refused = set()
  for name, parameter in inspect.signature(decode_fn).parameters.items():
    if parameter.default is inspect.Parameter.empty:
      assert name in loops.RUNNER_ARGUMENTS  # the model gives it
      continue
    value = OTHER_VALUES[name]  # a new argument of T5X's needs a value here
    binding = f"t5x.decoding.{decode_fn.__name__}.{name} = "
    # T5X's topk default 1 means greedy whatever the temperature, and refuses a topp beside it.
    untruncated = {"topk": 0} if decode_fn is t5x_decoding.temperature_sample else {}
    try:
      loop, settings = speculative.decode_fn_settings(functools.partial(
          decode_fn, **{**untruncated, name: value}))
    except ValueError as e:
      assert str(e).startswith(binding) and "\n" not in str(e), str(e)
      refused.add(name)
      continue
    assert settings[name] is value, name
    try:
      loops.get(loop).check({**settings, "gamma": 2})
    except ValueError as e:
      assert name in str(e) and "\n" not in str(e), str(e)
      refused.add(name)
  assert refused == {"decode_rng", "num_decodes", "initial_index", "cache_offset"} | (
      {"state_callback_fn"} if decode_fn is t5x_decoding.temperature_sample
      else {"min_log_prob"})


def test_a_gin_bound_max_decode_len_reaches_beam_search():
  with gin.unlock_config():
    gin.parse_config("""
        from __gin__ import dynamic_registration
        from t5x import decoding
        decoding.beam_search.max_decode_len = 7
        DECODE_FN = @decoding.beam_search
    """)
  try:
    decode_fn = gin.query_parameter("%DECODE_FN").scoped_configurable_fn
    assert speculative.decode_fn_settings(decode_fn) == (
        "speculative_beam_search", {"alpha": 0.6, "max_decode_len": 7})
  finally:
    gin.clear_config()


def test_other_decode_fns_are_refused():
  with pytest.raises(ValueError, match="reproduces t5x.decoding.temperature_sample or beam_search"):
    speculative.decode_fn_settings(lambda **kwargs: None)


@pytest.mark.slow
def test_prompt_with_targets_decodes_alike_in_every_runner(pairs):
  """A prompt taken from decoder_input_tokens that hold EOS (T5X strips it before forcing the
  prompt): the standalone model, the hook and T5X's own model decode the same tokens."""
  from spec_decode import models  # pylint: disable=g-import-not-at-top
  target_path, draft_path = pairs["t5x_tiny"]
  batch = _batch(4)
  prompts = np.asarray(batch["encoder_input_tokens"][:, :4])
  prompts[:, 3] = 1  # EOS inside the prompt
  batch["decoder_input_tokens"] = np.pad(prompts, ((0, 0), (1, DECODER_LENGTH - 5)))
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY, decode_fn=functools.partial(
      t5x_decoding.temperature_sample, temperature=0.0, topk=0, rescale_log_probs=False))
  predict = lambda model, params: jax.tree_util.tree_map(np.asarray, jax.jit(functools.partial(
      model.predict_batch_with_aux, prompt_with_targets=True))(params, batch))
  expected, expected_aux = predict(t5x_model, t5x_setup.load_params(target_path))
  hook = speculative.speculative_version(t5x_model, draft_path, gamma=3)
  vocabulary = t5x_setup.vocabulary()
  standalone = models.SpeculativeEncoderDecoderModel(
      speculative.network.Transformer(speculative.config_from_t5x(t5x_setup.TINY)), vocabulary,
      vocabulary, draft_checkpoint_path=draft_path, gamma=3, temperature=0.0,
      loop_settings={"rescale_log_probs": False})
  for decodes, aux in (predict(hook, _both_params(target_path, draft_path)),
                       predict(standalone, t5x_setup.load_params(target_path))):
    np.testing.assert_array_equal(decodes, expected)
    # Scored as T5X scores them (the target's log-softmax of the tokens after the prompt).
    np.testing.assert_allclose(aux["scores"], expected_aux["scores"], rtol=1e-4, atol=1e-4)
  # The prompt is forced up to its EOS, and the EOS is not: forcing it would end every row there.
  np.testing.assert_array_equal(expected[:, :3], prompts[:, :3])
  assert np.any(expected[:, 3] != 1)


@pytest.mark.slow
def test_a_registered_decode_loop_runs_through_the_hook(pairs):
  """tests/toy_loop.py's loop, named by DECODE_LOOP with its own setting, and its drafting
  policy, named by DRAFT_POLICY: T5X's greedy tokens."""
  import toy_loop  # pylint: disable=g-import-not-at-top
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY)
  batch = _batch(4)
  expected = np.asarray(jax.jit(t5x_model.predict_batch)(t5x_setup.load_params(target_path),
                                                         batch))
  traces = toy_loop.TRACES["block"]
  model = speculative.speculative_version(
      t5x_model, draft_path, gamma=3, verifier=None, draft_policy=None,
      decode_loop="toy_speculative", loop_settings={"rule": "block"})
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_both_params(target_path, draft_path),
                                                       batch)
  assert toy_loop.TRACES["block"] > traces
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  assert np.sum(aux["accepted_tokens"]) > 0
  # tests/toy_loop.py's drafting policy, named by DRAFT_POLICY: one draft per target call.
  traces = toy_loop.TRACES["one_draft"]
  model = speculative.speculative_version(t5x_model, draft_path, gamma=3,
                                          draft_policy="one_draft")
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_both_params(target_path, draft_path),
                                                       batch)
  assert toy_loop.TRACES["one_draft"] > traces
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  assert 0 < np.sum(aux["drafted_tokens"]) <= np.sum(aux["target_calls"])


@pytest.mark.slow
def test_the_token_tree_loop_runs_through_the_hook(pairs):
  """DECODE_LOOP 'speculative_tree_sample' with its tree settings (no gamma): T5X's greedy
  tokens, several of them per target call."""
  target_path, draft_path = pairs["t5x_tiny"]
  t5x_model = t5x_setup.t5x_model(t5x_setup.TINY)
  batch = _batch(4)
  expected = np.asarray(jax.jit(t5x_model.predict_batch)(t5x_setup.load_params(target_path),
                                                         batch))
  model = speculative.speculative_version(
      t5x_model, draft_path, gamma=None, decode_loop="speculative_tree_sample",
      loop_settings={"tree_branching": (3, 2), "tree_rule": "most_likely"})
  decodes, aux = jax.jit(model.predict_batch_with_aux)(_both_params(target_path, draft_path),
                                                       batch)
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  assert np.sum(aux["accepted_tokens"]) > 0
  assert np.sum(aux["target_calls"]) < np.sum(aux["generated_tokens"])


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.1])
def test_the_tpus_products_decode_what_the_cpus_do(pairs, monkeypatch, temperature):
  """The hook's decode with the TPU's products (`platforms.TPU_OPS`) in place of the CPU's, on
  this CPU: the same tokens, greedy and sampled with a fixed rng (tests/test_platforms.py: the
  same for `spec_decode.infer`'s decode). The control: decoder projections 5% off, put in the
  same way, change the tokens, so the hook does decode with the products put there."""
  target_path, draft_path = pairs["t5x_tiny"]
  params = _both_params(target_path, draft_path)

  def decode() -> np.ndarray:
    model = speculative.speculative_version(
        t5x_setup.t5x_model(t5x_setup.TINY, temperature=temperature), draft_path, gamma=3)
    return np.asarray(jax.jit(model.predict_batch)(params, _batch(4),
                                                   rng=jax.random.PRNGKey(7)))

  cpu = decode()
  monkeypatch.setattr(platforms.Platform, "ops",
                      lambda self, dtype=jnp.float32: platforms.TPU_OPS)
  np.testing.assert_array_equal(decode(), cpu)
  off = network.Ops(decoder_projection=lambda x, kernel: network.kernel_first_dot(x, kernel) * 1.05)
  monkeypatch.setattr(platforms.Platform, "ops", lambda self, dtype=jnp.float32: off)
  assert (decode() != cpu).any()
