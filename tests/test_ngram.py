"""Unigram and bigram drafts (`spec_decode.engine.ngram`): the estimate against counts made here
by hand, the model contract, and speculative sampling with them keeping the target's law
(every exact rule and drafting policy, with a negative control), as tests/test_exactness.py
checks it for model and lookup drafts."""

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import models
from spec_decode.checkpoints import ngram_format
from spec_decode.data import ngrams
from spec_decode.engine import contract, drafting, ngram, verify
from spec_decode.infer import outputs as infer_outputs
from spec_decode.t5 import network
from spec_decode.t5 import vocab
import test_exactness
import tiers
import tiny_t5
import toy_setup

CORPUS = [[3, 4, 3, 4, 2], [3, 4, 1], [2, 2, 3, 0, 0], [4]]  # 0: padding, skipped
VOCAB = 6


def counted_bigram(corpus, max_successors, smoothing):
  """q(x | t) from counts taken here with a Counter, for every t and x."""
  tokens = [[t for t in text if t] for text in corpus]
  unigram = collections.Counter(t for text in tokens for t in text)
  total = sum(unigram.values())
  u = np.array([0.0] + [(unigram[x] + 1) / (total + VOCAB - 1) for x in range(1, VOCAB)])
  pairs = collections.Counter((p, x) for text in tokens for p, x in zip([0] + text, text))
  law = np.zeros((VOCAB, VOCAB))
  for t in range(VOCAB):
    successors = sorted(((-c, x) for (p, x), c in pairs.items() if p == t))[:max_successors]
    kept = {x: -negative for negative, x in successors}
    n = sum(kept.values())
    law[t] = [(kept.get(x, 0) + smoothing * u[x]) / (n + smoothing) for x in range(VOCAB)]
  return u, law


@pytest.mark.parametrize("max_successors", [1, 2, 8])
def test_the_bigram_estimate_is_the_counted_law(max_successors):
  model = ngram.estimate(CORPUS, VOCAB, order=2, max_successors=max_successors, smoothing=0.5)
  _, law = counted_bigram(CORPUS, max_successors, 0.5)
  got = np.exp(np.asarray(model.next_token_log_probs(jnp.arange(VOCAB))))
  np.testing.assert_allclose(got, law, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
  assert np.all(got[:, 0] == 0)  # PAD never follows anything


def test_the_unigram_estimate_is_add_one_counts_whatever_came_before():
  model = ngram.estimate(CORPUS, VOCAB, order=1)
  u, _ = counted_bigram(CORPUS, 1, 1.0)
  got = np.exp(np.asarray(model.next_token_log_probs(jnp.array([0, 3, 5]))))
  np.testing.assert_allclose(got, np.stack([u] * 3), rtol=1e-5)
  assert model.order == 1 and model.successors.shape == (VOCAB, 0)


def test_a_call_follows_the_model_contract():
  model = ngram.estimate(CORPUS, VOCAB, order=2, max_successors=2)
  fed = jnp.array([[3, 4, 0], [2, 2, 1]])
  state = contract.DecodingState(cur_index=jnp.array([2, 5]), cur_token=fed,
                                 sequences=jnp.zeros((2, 8), jnp.int32), cache={})
  logits, cache = model.tokens_to_logits(state)
  assert logits.shape == (2, 3, VOCAB) and cache == {}
  np.testing.assert_array_equal(logits, model.next_token_log_probs(fed))
  one, _ = model.tokens_to_logits(state.replace(logits_index=jnp.array([1, 2])))
  np.testing.assert_array_equal(one[:, 0], logits[jnp.arange(2), jnp.array([1, 2])])


@pytest.mark.parametrize("settings,problem", [
    (dict(order=3), "order must be one of"),
    (dict(order=2, max_successors=0), "max_successors must be an integer >= 1"),
    (dict(order=2, smoothing=0.0), "smoothing must be > 0"),
])
def test_bad_settings_are_one_line(settings, problem):
  with pytest.raises(ValueError, match=problem):
    ngram.estimate(CORPUS, VOCAB, **settings)


def test_ids_outside_the_vocabulary_are_named():
  with pytest.raises(ValueError, match="outside the vocabulary of 6"):
    ngram.estimate([[1, 6]], VOCAB, order=1)


# Speculative sampling with n-gram drafts of the toy target's vocabulary, estimated from a
# random corpus (a draft unlike the target, as real n-gram drafts are).
def toy_draft(order):
  rng = np.random.default_rng(0)
  corpus = [rng.integers(1, test_exactness.VOCAB, size=rng.integers(1, 6)) for _ in range(200)]
  return ngram.estimate(corpus, test_exactness.VOCAB, order=order, max_successors=2)


NGRAM_DECODERS = ([(order, temperature, rule, "fixed") for order in ngram.ORDERS
                   for temperature in (0.5, 1.0) for rule in sorted(verify.EXACT_RULES)]
                  + [(2, 1.0, rule, policy) for rule in sorted(verify.EXACT_RULES)
                     for policy in sorted(drafting.POLICIES) if policy != "fixed"])


@pytest.mark.slow
@pytest.mark.parametrize("order,temperature,verifier,draft_policy",
                         tiers.newest_among(NGRAM_DECODERS, {(2, 1.0, "token", "fixed")}))
def test_ngram_drafts_follow_the_target_law(order, temperature, verifier, draft_policy):
  target, _ = toy_setup.make_pair(test_exactness.VOCAB, "far", seed=1)
  sampling_args = (temperature, 0, 0.0)
  decodes, stats = test_exactness.draw(target, toy_draft(order), 3, sampling_args, verifier,
                                       draft_policy)
  law = test_exactness.exact_law(target, sampling_args)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value > test_exactness.P_VALUE_FLOOR, f"p = {p_value:.2e}"
  assert 0.0 < float(np.mean(stats.alpha)) < 0.99  # drafts were weighed, and some rejected


@pytest.mark.slow
@pytest.mark.newest
def test_negative_control_fails_with_ngram_drafts():
  target, _ = toy_setup.make_pair(test_exactness.VOCAB, "far", seed=1)
  sampling_args = (1.0, 0, 0.0)
  decodes, _ = test_exactness.draw(target, toy_draft(2), 3, sampling_args,
                                   test_exactness.accept_everything)
  p_value = test_exactness.chi_square_p_value(decodes,
                                              test_exactness.exact_law(target, sampling_args))
  assert p_value < test_exactness.P_VALUE_FLOOR, f"not caught: p = {p_value:.2e}"


# The runners: `python -m spec_decode.data.ngrams` writes the draft, `spec_decode.infer` decodes
# with it (DRAFT_SOURCE = 'ngram'), a tiny random pair with the demo's vocabulary.
TEXTS = ["Die Katze sitzt auf der Matte.", "Wo ist der Bahnhof, bitte?", "Guten Morgen.",
         "Die Katze sitzt auf dem Stuhl."]
INFER_TEXTS = ["The cat sits on the mat.", "Where is the station?", "Good morning."]


@pytest.fixture(scope="module")
def bigram_file(tmp_path_factory):
  directory = tmp_path_factory.mktemp("ngrams")
  (directory / "texts.de").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
  output = directory / "bigram.npz"
  assert ngrams.main([f"--text_file={directory / 'texts.de'}", f"--output={output}",
                      "--order=2", "--max_successors=4"]) == 0
  return output


def test_the_command_line_writes_the_estimate_of_the_tokenized_texts(bigram_file):
  vocabulary = vocab.SentencePieceVocabulary(str(ngrams.DEMO_VOCABULARY))
  model = ngram_format.load(str(bigram_file))
  expected = ngram.estimate([vocabulary.encode(text) + [vocabulary.eos_id] for text in TEXTS],
                            vocabulary.vocab_size, order=2, max_successors=4)
  assert model.order == 2 and model.vocab_size == vocabulary.vocab_size
  for name in ("unigram_log_probs", "successors", "successor_counts", "smoothing"):
    np.testing.assert_array_equal(getattr(model, name), getattr(expected, name))


@pytest.mark.parametrize("flags,problem", [
    (["--output=/tmp/model.bin"], "--output must name a .npz file"),
    (["--output=/tmp/model.npz", "--vocab_size=10"], "--vocab_size=10 is below the vocabulary"),
])
def test_the_command_line_answers_bad_flags_in_one_line(tmp_path, capsys, flags, problem):
  (tmp_path / "texts").write_text("Hallo\n", encoding="utf-8")
  assert ngrams.main([f"--text_file={tmp_path / 'texts'}", *flags]) == 2
  stderr = capsys.readouterr().err.strip().splitlines()
  assert len(stderr) == 1 and problem in stderr[0], stderr


def test_a_file_that_is_not_an_ngram_draft_is_named(tmp_path):
  np.savez(tmp_path / "other.npz", weights=np.zeros(3))
  with pytest.raises(ValueError, match="other.npz: not an n-gram draft file"):
    ngram_format.load(str(tmp_path / "other.npz"))


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
  directory = tmp_path_factory.mktemp("infer_ngram")
  target, draft = tiny_t5.write_pair(directory, 8000)
  return tiny_t5.write_run_gin(directory / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE,
                               0, {"inputs": 16, "targets": 12}, batch_size=2)


@pytest.mark.slow
def test_infer_greedy_with_an_ngram_draft_equals_the_baseline(run_gin, bigram_file, capsys,
                                                              tmp_path):
  out = tmp_path / "out"
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", *(f"--text={text}" for text in INFER_TEXTS),
       "--gin.DRAFT_SOURCE='ngram'", f"--gin.DRAFT_CHECKPOINT_PATH='{bigram_file}'",
       f"--gin.INFER_OUTPUT_DIR='{out}'"], capsys)
  assert status == 0, stderr
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert summary["draft"] == "bigram draft"
  assert summary["identical_outputs"] is True and summary["num_identical"] == len(INFER_TEXTS)
  assert summary["drafted_tokens"] > 0


def test_infer_with_a_network_checkpoint_as_ngram_draft_is_one_line(run_gin, capsys, tmp_path):
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", "--text=Hello", "--gin.DRAFT_SOURCE='ngram'",
       f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"], capsys)
  assert status == 2
  assert len(stderr) == 1 and "draft_source 'ngram' reads an n-gram draft file" in stderr[0]
  assert not (tmp_path / "out").exists()


def test_an_ngram_draft_of_another_vocabulary_is_one_line(tmp_path):
  small = tmp_path / "small.npz"
  ngram_format.save(str(small), ngram.estimate(CORPUS, VOCAB, order=2))
  target = network.Transformer(tiny_t5.tiny_config(8000, tiny_t5.SHRINK))
  vocabulary = vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))
  with pytest.raises(ValueError, match="target and draft vocabularies differ: the target has "
                                       f"8000 ids, the draft {VOCAB}"):
    models.SpeculativeEncoderDecoderModel(target, vocabulary, vocabulary, gamma=2,
                                          draft_checkpoint_path=str(small), draft_source="ngram")
