"""N-gram lookup drafts: what the drafter proposes on hand-made sequences, and that decoding with
it (alone or combined with a draft model) reproduces the target greedily through the engine,
`core.Decoder` and `models.SpeculativeEncoderDecoderModel`; bad settings are one-line errors.
Their exactness at T > 0 is tests/test_exactness.py's; the T5X hook's runs tests/t5x's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shared_data
import tiny_t5
import toy_setup
from spec_decode import core
from spec_decode import models
from spec_decode.engine import decoding
from spec_decode.engine import lookup
from spec_decode.t5 import network
from spec_decode.t5 import vocab

V = 16


def propose(source, output, max_ngram=4, min_ngram=1):
  """(token, proposes) the drafter gives after the last token of `output` (BOS first)."""
  drafter = lookup.NGramLookup(V, max_ngram, min_ngram)
  sequences = jnp.asarray([list(output) + [0] * 4], jnp.int32)
  t = len(output) - 1
  state = decoding.DecodingState(jnp.asarray([t], jnp.int32), sequences[:, t:t + 1], sequences,
                                 drafter.init_cache(jnp.asarray([source], jnp.int32)))
  logits, _ = drafter.tokens_to_logits(state)
  logits = np.asarray(logits[0, 0])
  finite = np.isfinite(logits)
  if not finite.any():
    return None
  assert finite.sum() == 1 and logits[finite][0] == 0.0  # a one-hot: q is a point mass
  return int(np.argmax(finite))


@pytest.mark.parametrize("source,output,expected", [
    # The suffix (5, 6) occurs in the input: the token that followed it.
    ([5, 6, 7, 8, 1, 0, 0], [0, 5, 6], 7),
    # The longest match wins: (5, 6) -> 9 over the 1-gram (6) -> 7.
    ([3, 6, 7, 5, 6, 9, 1], [0, 5, 6], 9),
    # A match in the row's own output (the input has none): 4 was followed by 2.
    ([0, 0, 0], [0, 4, 2, 3, 4], 2),
    # Among equally long matches, the latest: the output's (4, 2 -> 8) over the input's (-> 3).
    ([4, 2, 3, 1, 0], [0, 4, 2, 8, 9, 4, 2], 8),
    # Among equally long matches in the input, the first (a summary copies from the top).
    ([5, 7, 5, 8, 1], [0, 5], 7),
    # Nothing matches: no proposal, not a made-up token.
    ([5, 6, 7, 1], [0, 9, 10], None),
    # The only occurrence is followed by padding: nothing to propose.
    ([9, 0, 0, 0], [0, 9], None),
    # The suffix itself is not an earlier occurrence (the output's own last token).
    ([0, 0], [0, 3], None),
    # BOS is never matched against padding.
    ([0, 0, 7], [0], None),
])
def test_proposes_the_token_after_the_longest_match(source, output, expected):
  assert propose(source, output) == expected


def test_max_and_min_ngram():
  source, output = [2, 3, 4, 5, 6, 1, 0], [0, 9, 4, 5]
  # (4, 5) matches with 2 tokens: min_ngram 3 refuses it, 2 takes it.
  assert propose(source, output, min_ngram=3, max_ngram=4) is None
  assert propose(source, output, min_ngram=2) == 6
  # max_ngram caps the length compared; a capped match still proposes.
  token, length = lookup.longest_match(jnp.asarray([source]), jnp.asarray([[0, 3, 4, 5, 0]]),
                                       jnp.asarray([[3]]), max_ngram=2)
  assert (int(token[0, 0]), int(length[0, 0])) == (6, 2)
  token, length = lookup.longest_match(jnp.asarray([source]), jnp.asarray([[0, 3, 4, 5, 0]]),
                                       jnp.asarray([[3]]), max_ngram=4)
  assert (int(token[0, 0]), int(length[0, 0])) == (6, 3)


def test_rows_and_fed_positions_are_independent():
  """Per row, and per fed position j: position t_j sees only tokens <= t_j."""
  drafter = lookup.NGramLookup(V, 3)
  sources = jnp.asarray([[5, 6, 7, 1], [0, 0, 0, 0]], jnp.int32)
  sequences = jnp.asarray([[0, 5, 6, 0, 0], [0, 8, 9, 8, 0]], jnp.int32)
  state = decoding.DecodingState(jnp.asarray([1, 2], jnp.int32), jnp.asarray([[5, 6], [9, 8]]),
                                 sequences, drafter.init_cache(sources))
  logits, cache = drafter.tokens_to_logits(state)
  assert logits.shape == (2, 2, V) and cache is state.cache
  proposed = np.where(np.isfinite(np.asarray(logits)).any(-1),
                      np.argmax(np.asarray(logits), -1), -1)
  # Row 0: after (5) -> 6, after (5, 6) -> 7. Row 1: after (8, 9) nothing yet (9 is new),
  # after (8, 9, 8) the earlier 8 was followed by 9.
  assert proposed.tolist() == [[6, 7], [-1, 9]]


def test_combined_takes_the_lookup_where_it_matches_and_the_model_elsewhere():
  drafter = lookup.NGramLookup(V, 3, min_ngram=2)
  model_logits = jnp.arange(2 * V, dtype=jnp.float32).reshape(2, 1, V)
  model = lambda state: (model_logits, {"seen": state.cache["seen"] + 1})
  combined = lookup.with_model(drafter, model)
  sources = jnp.asarray([[5, 6, 7, 1], [5, 6, 7, 1]], jnp.int32)
  sequences = jnp.asarray([[0, 5, 6, 0], [0, 9, 6, 0]], jnp.int32)
  cache = lookup.init_combined_cache(drafter, sources, {"seen": jnp.zeros((2,), jnp.int32)})
  logits, new_cache = combined(decoding.DecodingState(
      jnp.asarray([2, 2], jnp.int32), jnp.asarray([[6], [6]]), sequences, cache))
  # Row 0 matches (5, 6) with 2 tokens: the lookup's 7. Row 1 only the 1-gram (6): the model's.
  assert np.isfinite(np.asarray(logits[0, 0])).sum() == 1 and int(jnp.argmax(logits[0, 0])) == 7
  np.testing.assert_array_equal(logits[1], model_logits[1])
  assert new_cache["model"]["seen"].tolist() == [1, 1]  # the model saw every fed token


@pytest.mark.parametrize("max_ngram,min_ngram,message", [
    (0, 1, "max_ngram must be an integer >= 1, got 0"),
    (3, 0, "min_ngram must be an integer >= 1, got 0"),
    (True, 1, "max_ngram must be an integer >= 1, got True"),
    (2, 3, "min_ngram (3) must be <= max_ngram (2)"),
])
def test_bad_ngram_settings(max_ngram, min_ngram, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    core.LookupDraft(max_ngram, min_ngram)


@pytest.mark.parametrize("combined", [False, True])
def test_engine_greedy_lookup_equals_the_baseline(combined):
  target, near = toy_setup.make_pair(V, "near", seed=3, eos_shift=-2.0)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(toy_setup.random_prompts(rng, 16, 12, V, max_prompt_len=3))
  sources = rng.integers(2, V, (16, 10)).astype(np.int32)
  sources[1::2] = 0  # rows with nothing to copy from the input
  drafter = lookup.NGramLookup(V, 3, 2 if combined else 1)
  decodes, log_probs, stats = toy_setup.speculative_lookup(
      target, near if combined else None, drafter, jnp.asarray(sources), inputs,
      jax.random.PRNGKey(0), 4, sampling_args=(0.0, 0, 0.0))
  expected, expected_log_probs = toy_setup.baseline(target, inputs, jax.random.PRNGKey(1),
                                                    sampling_args=(0.0, 0, 0.0))
  np.testing.assert_array_equal(decodes, expected)
  np.testing.assert_allclose(log_probs, expected_log_probs, rtol=1e-5)
  assert stats.lookup_drafted_tokens.sum() > 0
  assert np.all(stats.lookup_accepted_tokens <= stats.lookup_drafted_tokens)
  assert np.all(stats.lookup_drafted_tokens <= stats.drafted_tokens)
  if not combined:
    # Every draft is the lookup's, except forced prompt tokens, which the engine drafts itself
    # where the lookup proposes nothing.
    no_prompt = np.asarray(inputs[:, 1] == 0)
    assert no_prompt.sum() >= 2
    np.testing.assert_array_equal(stats.lookup_drafted_tokens[no_prompt],
                                  stats.drafted_tokens[no_prompt])
    assert np.any(stats.drafted_tokens < 4 * stats.target_calls)  # iterations without drafts


# The tiny T5 pair through the runners' one core.
VOCAB_SIZE = 8000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return tiny_t5.write_pair(tmp_path_factory.mktemp("pair"), VOCAB_SIZE)


@pytest.fixture(scope="module")
def vocabulary():
  return vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))


def _batch(batch_size=4, input_length=12, target_length=16):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 40, (batch_size, input_length)).astype(np.int32)
  tokens[:, -3:] = 0
  tokens[:, -4] = 1
  return {"encoder_input_tokens": tokens,
          "decoder_input_tokens": np.zeros((batch_size, target_length), np.int32)}


@pytest.mark.slow
@pytest.mark.parametrize("draft_source", ["lookup", "lookup+model"])
def test_models_greedy_lookup_equals_the_baseline(pair, vocabulary, draft_source):
  target, draft = pair
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(target.config), vocabulary, vocabulary,
      draft_checkpoint_path=None if draft_source == "lookup" else draft.t5x_checkpoint,
      draft_source=draft_source, gamma=3, temperature=0.0)
  assert (model.draft_module is None) == (draft_source == "lookup")
  batch = _batch()
  decodes, aux = jax.jit(model.predict_batch_with_aux)(target.params, batch)
  expected, _ = jax.jit(model.baseline().predict_batch_with_aux)(target.params, batch)
  np.testing.assert_array_equal(decodes, expected)
  assert np.sum(aux["lookup_drafted_tokens"]) > 0
  assert np.all(aux["tokens_per_target_call"] >= 1.0)
  if draft_source == "lookup":
    np.testing.assert_array_equal(aux["lookup_drafted_tokens"], aux["drafted_tokens"])
  else:
    assert np.sum(aux["drafted_tokens"] - aux["lookup_drafted_tokens"]) > 0


def test_bad_lookup_configurations_fail_at_construction(pair, vocabulary):
  target, draft = pair
  module = network.Transformer(target.config)
  build = lambda **kwargs: models.SpeculativeEncoderDecoderModel(
      module, vocabulary, vocabulary, gamma=3, **kwargs)
  with pytest.raises(ValueError, match="draft_source 'lookup' uses no draft model: unset "
                                       "draft_checkpoint_path"):
    build(draft_checkpoint_path=draft.t5x_checkpoint, draft_source="lookup")
  with pytest.raises(ValueError, match="lookup max_ngram must be an integer >= 1, got 0"):
    build(draft_source="lookup", lookup_max_ngram=0)
  with pytest.raises(ValueError, match="draft_source must be one of"):
    build(draft_checkpoint_path=draft.t5x_checkpoint, draft_source="trigram")
  with pytest.raises(ValueError, match="draft_source 'ngram' reads an n-gram draft file"):
    build(draft_checkpoint_path=draft.t5x_checkpoint, draft_source="ngram")
  with pytest.raises(ValueError, match="needs a draft: set draft_checkpoint_path"):
    build(draft_source="lookup+model")
  with pytest.raises(ValueError, match="needs a draft model"):
    core.make_draft("lookup+model", None)
  # A lookup is a draft: the baseline loop refuses it like a model draft.
  with pytest.raises(ValueError, match="uses no draft model, but one is given"):
    core.Decoder.create("temperature_sample", module, core.LookupDraft())


LOOKUP_ROWS = sorted(str(p.relative_to(tiny_t5.REPO_ROOT))
                     for p in (tiny_t5.REPO_ROOT / "configs" / "table2" / "lookup").glob("*.gin"))


@pytest.mark.parametrize("row", LOOKUP_ROWS)
def test_table2_lookup_rows_bind_with_spec_decode_s_harness(row, tmp_path):
  """Each lookup row, after configs/table2/spec_decode.gin, builds the lookup model it says
  (tiny checkpoints in the gs:// ones' places)."""
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode import gin_utils, infer  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  gin.add_config_file_search_path(str(tiny_t5.REPO_ROOT))
  try:
    bindings = [f"network.T5Config.{name} = {value!r}" for name, value in tiny_t5.SHRINK.items()]
    # Their default is T5X's gs:// copy; any T5-style vocabulary binds alike.
    bindings.append(f"T5_VOCABULARY_FILE = '{tiny_t5.T5_STYLE_VOCAB_FILE}'")
    gin.parse_config_files_and_bindings(["configs/table2/spec_decode.gin", row], bindings,
                                        finalize_config=False)
    combined = gin.query_parameter("%DRAFT_SOURCE") == "lookup+model"
    target_config = gin.get_configurable(network.T5Config)()
    target = tiny_t5.write_model(tmp_path / "target", "target", target_config, 1)
    overrides = [f"CHECKPOINT_PATH = '{target.t5x_checkpoint}'",
                 f"INFER_OUTPUT_DIR = '{tmp_path / 'out'}'"]
    if combined:
      assert "/t5_1_1_base/" in gin.query_parameter("%DRAFT_CHECKPOINT_PATH")
      overrides.append(f"DRAFT_CHECKPOINT_PATH = '{target.t5x_checkpoint}'")
    gin.parse_config(overrides)
    gin.finalize()
    gin_utils.check_bindings_take_effect([infer.infer])
    arguments = gin.get_bindings(infer.infer)
    model, dataset_cfg = arguments["model"], arguments["dataset_cfg"]
  finally:
    gin.clear_config()
  assert isinstance(model.decoder.draft, core.LookupDraft)
  assert model.decoder.draft.max_ngram == 4
  assert (model.draft_module is not None) == combined
  assert model.decoder.draft.min_ngram == (2 if combined else 1)
  assert dataset_cfg.mixture_or_task_name == "cnn_dailymail" and dataset_cfg.batch_size == 1
  assert arguments["compare_with_baseline"] is True
  assert model.decode_settings["temperature"] == (1.0 if row.endswith("_t1.gin") else 0.0)


# spec_decode.infer with lookup drafts, in this process (tests/test_infer.py runs the rest).
needs_shared = pytest.mark.skipif(not tiny_t5.T5_VOCAB_FILE.is_file(),
                                  reason=shared_data.missing("the T5 vocabulary"))
INFER_TEXTS = ["The cat sat on the mat. The cat sat on the mat again.",
               "Where is the station? Where is the station, please?", "Hello"]


@pytest.fixture(scope="module")
def infer_run_gin(tmp_path_factory):
  directory = tmp_path_factory.mktemp("infer_lookup")
  target, draft = tiny_t5.write_pair(directory)
  return directory, tiny_t5.write_run_gin(
      directory / "run.gin", target, draft, tiny_t5.T5_VOCAB_FILE, 100,
      {"inputs": 32, "targets": 16}, batch_size=2)


@pytest.mark.slow
@needs_shared
@pytest.mark.parametrize("draft_source", ["lookup", "lookup+model"])
def test_infer_greedy_lookup_equals_the_baseline(infer_run_gin, capsys, tmp_path, draft_source):
  import json  # pylint: disable=g-import-not-at-top
  from spec_decode.infer import outputs as infer_outputs  # pylint: disable=g-import-not-at-top
  _, run_gin = infer_run_gin
  out = tmp_path / "out"
  bindings = [f"--gin.DRAFT_SOURCE='{draft_source}'", f"--gin.INFER_OUTPUT_DIR='{out}'"]
  if draft_source == "lookup":
    bindings.append("--gin.DRAFT_CHECKPOINT_PATH=None")
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", *(f"--text={text}" for text in INFER_TEXTS), *bindings], capsys)
  assert status == 0, stderr
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert summary["identical_outputs"] is True and summary["num_identical"] == len(INFER_TEXTS)
  assert summary["lookup_drafted_tokens"] > 0
  assert summary["draft"].startswith("n-gram lookup")
  if draft_source == "lookup":
    assert summary["lookup_drafted_tokens"] == summary["drafted_tokens"]
    assert "costs" not in summary  # no draft model to measure
  else:
    assert summary["drafted_tokens"] > summary["lookup_drafted_tokens"]


@needs_shared
@pytest.mark.parametrize("bindings,message", [
    (["--gin.DRAFT_SOURCE='lookup'"],
     "draft_source 'lookup' uses no draft model: unset draft_checkpoint_path"),
    (["--gin.DRAFT_SOURCE='lookup'", "--gin.DRAFT_CHECKPOINT_PATH=None",
      "--gin.LOOKUP_MAX_NGRAM=0"], "lookup max_ngram must be an integer >= 1, got 0"),
])
def test_infer_bad_lookup_settings_are_one_line_errors(infer_run_gin, capsys, tmp_path,
                                                       bindings, message):
  _, run_gin = infer_run_gin
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", "--text=Hello", f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'",
       *bindings], capsys)
  assert status == 2
  assert len(stderr) == 1 and stderr[0].startswith("spec_decode.infer: error: "), stderr
  assert message in stderr[0]
  assert not (tmp_path / "out").exists()
