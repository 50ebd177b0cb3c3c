"""The T5X hook's decoder-only model against T5X itself, in process: `speculative_version` of a
T5X `DecoderOnlyModel` over T5X's own decoder-only network (`t5x_decoder_only`) greedily
decodes what T5X's model decodes with `t5x.decoding.temperature_sample`, token for token, in
float32 and bfloat16, as a causal and as a prefix LM, on rows of different prompt lengths; with
T5X's `beam_search` every beam and score are T5X's; T5X's scores of the hook's model are T5X's
own; the parameter tree is T5X's plus the draft's; the draft's config is read from its T5X
checkpoint; a draft of the other family or another vocabulary is refused in one line.
Target and drafts are random tiny decoder-only models saved by T5X's Checkpointer: a smaller
draft (narrower, shallower, with tied logits) and a noisy copy of the target (so that drafts are
both accepted and rejected)."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("t5x.models",
                    reason="needs t5x, installed from its repository (README: Tests)")

import t5x_decoder_only  # pylint: disable=g-import-not-at-top
import t5x_setup  # pylint: disable=g-import-not-at-top
import tiers  # pylint: disable=g-import-not-at-top
from spec_decode.t5x import speculative  # pylint: disable=g-import-not-at-top
from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

# The slow tier: each case compiles T5X's decode and the hook's.
pytestmark = pytest.mark.slow

LENGTH = 16  # decoder length: prompt and continuation
GAMMA = 3
# Rows of a batch: (prompt, targets), as a seqio task's inputs and targets (the targets are only
# the reference: decoding sees the prompt alone).
ROWS = [([5, 7, 9, 11, 1], [3, 4, 1]), ([8, 1], [6, 6, 6, 1]),
        ([11, 12, 13, 14, 15, 16, 17, 1], [2, 1])]
# Beam search gives T5X's output for rows that start together (spec_decode.engine.beam_search):
# prompts of one length.
BEAM_ROWS = [([5, 7, 9, 1], [3, 1]), ([20, 21, 22, 1], [4, 1])]


@pytest.fixture(scope="module")
def network():
  return t5x_decoder_only.network()


@pytest.fixture(scope="module")
def configs(network) -> dict:
  target = network.TransformerConfig(
      vocab_size=128, dtype="float32", emb_dim=16, num_heads=4, num_layers=2, head_dim=4,
      mlp_dim=32, mlp_activations=("gelu", "linear"), dropout_rate=0.0,
      logits_via_embedding=False)
  return {"target": target,
          "draft": dataclasses.replace(target, emb_dim=8, num_heads=2, num_layers=1,
                                       mlp_dim=16, logits_via_embedding=True),
          "other_vocabulary": dataclasses.replace(target, vocab_size=256, num_layers=1)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, configs) -> dict:
  """name -> (T5X checkpoint directory, its params), written by T5X's Checkpointer."""
  directory = tmp_path_factory.mktemp("t5x_decoder_only")
  saved = {}
  for seed, (name, config) in enumerate(sorted(configs.items())):
    params = t5x_setup.initial_variables(config, seed=seed)["params"]
    saved[name] = (t5x_setup.save_checkpoint(directory / name, config, params), params)
  noisy_copy = t5x_setup.perturbed(saved["target"][1], relative_noise=0.3, seed=1)
  saved["noisy_copy"] = (t5x_setup.save_checkpoint(directory / "noisy_copy", configs["target"],
                                                   noisy_copy), noisy_copy)
  return saved


def decoder_batch(rows: list[tuple[list[int], list[int]]]) -> dict[str, np.ndarray]:
  return t5x_decoder_only.decoder_batch(rows, LENGTH)


def both_params(checkpoints: dict, draft: str = "draft") -> dict:
  """The hook's params: target and `draft`, as T5X restores them."""
  return {**t5x_setup.load_params(checkpoints["target"][0]),
          speculative.DRAFT_PARAMS_KEY: t5x_setup.load_params(checkpoints[draft][0])}


def _cast(params: dict, dtype: str) -> dict:
  """Parameters as T5X's infer restores them with RestoreCheckpointConfig.dtype."""
  return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf, dtype), params)


@pytest.mark.parametrize("draft,prefix_lm,dtype", tiers.newest_among(
    itertools.product(["draft", "noisy_copy"], [False, True], ["float32", "bfloat16"]),
    {("noisy_copy", True, "float32"), ("noisy_copy", False, "bfloat16")}))
def test_greedy_decodes_equal_t5x(configs, checkpoints, dtype, prefix_lm, draft):
  """The smaller random draft is mostly rejected; the noisy copy of the target mostly
  accepted."""
  config = dataclasses.replace(configs["target"], dtype=dtype)
  # T5X's default: topk 1, greedy.
  t5x_model = t5x_setup.t5x_model(config, decode_fn=t5x_decoding.temperature_sample,
                                  inputs_bidirectional_attention=prefix_lm)
  model = speculative.speculative_version(t5x_model, checkpoints[draft][0], gamma=GAMMA)
  assert isinstance(model, speculative.SpeculativeDecoderOnlyModel)
  assert model.decoder.loop_name == "speculative_sample"
  assert model.module.inputs_bidirectional_attention == prefix_lm
  assert model.draft_module.inputs_bidirectional_attention == prefix_lm
  batch = decoder_batch(ROWS)
  params = _cast(t5x_setup.load_params(checkpoints["target"][0]), dtype)
  want = np.asarray(jax.jit(t5x_model.predict_batch)(params, batch))
  got, aux = jax.jit(model.predict_batch_with_aux)(
      _cast(both_params(checkpoints, draft), dtype), batch)
  np.testing.assert_array_equal(np.asarray(got), want)
  assert np.all(np.sum(want != 0, axis=1) > 1), want  # every row decoded tokens before EOS
  assert np.sum(aux["accepted_tokens"]) < np.sum(aux["drafted_tokens"])
  if draft == "noisy_copy":
    assert np.sum(aux["accepted_tokens"]) > 0


@pytest.mark.newest
def test_beam_search_equals_t5x(configs, checkpoints):
  """T5X's `beam_search` (3 beams, alpha 0.6) on T5X's model against the hook's speculative beam
  search: every beam, token for token, and its score."""
  t5x_model = t5x_setup.t5x_model(
      configs["target"], decode_fn=functools.partial(t5x_decoding.beam_search, alpha=0.6))
  model = speculative.speculative_version(t5x_model, checkpoints["draft"][0], gamma=GAMMA)
  assert model.decoder.loop_name == "speculative_beam_search"
  predict = lambda m, params: jax.jit(functools.partial(
      m.predict_batch_with_aux, num_decodes=3, return_all_decodes=True))(
          params, decoder_batch(BEAM_ROWS))
  want, want_aux = predict(t5x_model, checkpoints["target"][1])
  got, aux = predict(model, both_params(checkpoints))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_allclose(aux["scores"], want_aux["scores"], rtol=1e-5, atol=1e-5)


def test_scores_are_t5xs(configs, checkpoints):
  """T5X's score_batch (its teacher-forced logits through the hook's module) and the greedy
  decodes' scores under the target's own log-softmax (`rescale_log_probs=False`) are T5X's."""
  t5x_model = t5x_setup.t5x_model(configs["target"], decode_fn=functools.partial(
      t5x_decoding.temperature_sample, temperature=0.0, rescale_log_probs=False),
                                  inputs_bidirectional_attention=True)
  model = speculative.speculative_version(t5x_model, checkpoints["draft"][0], gamma=GAMMA)
  batch = decoder_batch(ROWS)
  target_params = checkpoints["target"][1]
  params = both_params(checkpoints)
  np.testing.assert_allclose(jax.jit(model.score_batch)(params, batch),
                             jax.jit(t5x_model.score_batch)(target_params, batch),
                             rtol=1e-5, atol=1e-5)
  _, want = jax.jit(t5x_model.predict_batch_with_aux)(target_params, batch)
  _, got = jax.jit(model.predict_batch_with_aux)(params, batch)
  np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shard_draft", [False, True])
def test_initial_variables_add_the_draft_beside_t5x_tree(configs, checkpoints, shard_draft):
  """The target's tree is T5X's DecoderOnlyModel's; the draft's logical axes are all None
  (replicated) unless shard_draft."""
  t5x_model = t5x_setup.t5x_model(configs["target"])
  model = speculative.speculative_version(t5x_model, checkpoints["draft"][0], gamma=GAMMA,
                                          shard_draft=shard_draft)
  initial_variables = lambda m: jax.eval_shape(
      functools.partial(m.get_initial_variables,
                        input_shapes={"decoder_input_tokens": (1, LENGTH)}),
      jax.random.PRNGKey(0))
  variables = initial_variables(model)
  t5x_variables = initial_variables(t5x_model)
  target_params, draft_params = speculative.split_params(variables["params"])
  shapes = lambda tree: jax.tree_util.tree_map(lambda leaf: leaf.shape, dict(tree))
  assert shapes(target_params) == shapes(t5x_variables["params"])
  assert shapes(draft_params) == shapes(checkpoints["draft"][1])
  draft_axes = jax.tree_util.tree_leaves(
      variables["params_axes"][speculative.DRAFT_PARAMS_KEY],
      is_leaf=lambda x: isinstance(x, speculative.nn_partitioning.AxisMetadata))
  assert draft_axes
  assert all((set(meta.names) == {None}) != shard_draft for meta in draft_axes)


def test_draft_config_is_read_from_its_checkpoint(configs, checkpoints):
  to_ours = lambda config: speculative.config_from_t5x(
      config, speculative.network.DecoderOnlyConfig)
  assert (speculative.draft_config_from_checkpoint(checkpoints["draft"][0],
                                                   to_ours(configs["target"]))
          == to_ours(configs["draft"]))


def test_draft_of_the_other_family_is_one_line(configs, tiny_checkpoint):
  t5x_model = t5x_setup.t5x_model(configs["target"])
  with pytest.raises(ValueError) as error:
    speculative.speculative_version(t5x_model, str(tiny_checkpoint.parent), gamma=GAMMA)
  assert str(error.value) == (
      f"{tiny_checkpoint.parent}: an encoder-decoder (T5) checkpoint, but the target is a "
      f"decoder-only model: a draft must be of its target's family")


def test_draft_of_another_vocabulary_is_one_line(configs, checkpoints):
  t5x_model = t5x_setup.t5x_model(configs["target"])
  with pytest.raises(ValueError) as error:
    speculative.speculative_version(t5x_model, checkpoints["other_vocabulary"][0], gamma=GAMMA)
  assert str(error.value) == ("target and draft vocabularies differ: the target has 128 ids, "
                              "the draft 256")


def test_benchmark_peer_decodes_a_language_model_as_ours(network):
  """The benchmark's T5X peer for a language-model pair (`bench.t5x_sampler`: T5X's
  DecoderOnlyModel and temperature_sample over T5X's own decoder-only network, on the pair's
  weights): greedy decodes of random prompts of different lengths equal to our baseline's and
  speculative decoder's, with the same token counts."""
  from spec_decode import bench  # pylint: disable=g-import-not-at-top
  from spec_decode.bench import t5x_sampler  # pylint: disable=g-import-not-at-top
  tiny = dict(vocab_size=128, dtype="float32", emb_dim=16, num_heads=2, head_dim=8,
              num_layers=2, mlp_dim=32)
  pair = bench.build_pair(bench.PairConfig(
      source="random", target_gin="configs/models/decoder_only/base.gin",
      draft_gin="configs/models/decoder_only/base.gin", target_overrides=tiny,
      draft_overrides=dict(tiny, num_layers=1), input_length=8, max_decode_len=6,
      num_random_inputs=3))
  sampler = t5x_sampler.T5XSampler(pair)
  ours = bench.PairDecoders(pair, {})
  lengths = set()
  for repetition in range(3):
    theirs = sampler.run(0.0, repetition)
    baseline = ours.run(bench.Variant(0.0), repetition, 1)
    speculative_run = ours.run(bench.Variant(0.0, 2), repetition, 1)
    np.testing.assert_array_equal(theirs.decodes, baseline.decodes)
    np.testing.assert_array_equal(speculative_run.decodes, baseline.decodes)
    assert theirs.tokens == baseline.tokens == speculative_run.tokens
    lengths.add(int((pair.batch(repetition, 1) != 0).sum()))
  assert len(lengths) > 1  # prompts of different lengths
