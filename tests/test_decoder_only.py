"""Decoder-only language models end to end: the models' speculative decodes against the target
alone, a decoder-only T5X checkpoint read back, `spec_decode.infer` continuing prompts with
each draft source and its one-line errors, and `spec_decode.plan` of a decoder-only pair."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny_t5
from spec_decode import models
from spec_decode import plan
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import tiny_lm_pair
from spec_decode.data import ngrams
from spec_decode.t5 import network
from spec_decode.t5 import vocab

PROMPTS = ["The station is", "Where is the station? The station is near the station", ""]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  return tiny_lm_pair.write_pair(tmp_path_factory.mktemp("lm_pair"))


@pytest.fixture(scope="module")
def vocabulary(pair):
  return vocab.SentencePieceVocabulary(pair.vocabulary, 0)


def _prompt_batch(prompts: list[list[int]], length: int) -> dict[str, np.ndarray]:
  """seqio.DecoderFeatureConverter's features of prompts with no target yet: BOS, the prompt,
  0s; decoder_causal_attention over BOS and the prompt."""
  tokens = np.zeros((len(prompts), length), np.int32)
  causal = np.zeros_like(tokens)
  for row, prompt in enumerate(prompts):
    tokens[row, 1:len(prompt) + 1] = prompt
    causal[row, :len(prompt) + 1] = 1
  return {"decoder_input_tokens": tokens, "decoder_causal_attention": causal}


def _greedy_continuation(module, params, prompt: list[int], steps: int) -> list[int]:
  """The target's greedy continuation by full teacher-forced forward passes (no cache), each
  over the same zero-padded buffer: a causal model's logits at a position do not depend on the
  positions after it, so one compiled forward pass serves every step."""
  forward = jax.jit(lambda params, tokens: module.apply({"params": params}, tokens,
                                                        jnp.ones_like(tokens)))
  tokens = np.zeros((1, len(prompt) + 1 + steps), np.int32)
  tokens[0, 1:len(prompt) + 1] = prompt
  for position in range(len(prompt), len(prompt) + steps):
    tokens[0, position + 1] = int(np.argmax(forward(params, tokens)[0, position]))
  return tokens[0, len(prompt) + 1:].tolist()


def test_speculative_greedy_decodes_are_the_targets_on_prompts_of_any_length(pair, vocabulary):
  target = network.DecoderOnlyTransformer(pair.target)
  params = t5x_format.random_params(pair.target, 1)
  draft_params = t5x_format.random_params(pair.draft, 2)
  model = models.SpeculativeDecoderOnlyModel(
      target, vocabulary, draft_module=network.DecoderOnlyTransformer(pair.draft), gamma=3,
      temperature=0.0)
  prompts = [vocabulary.encode(text) for text in PROMPTS]
  batch = _prompt_batch(prompts, 24)
  # An EOS no model emits: every row decodes to the end of its buffer.
  never = {"eos_id": pair.target.vocab_size}
  decodes, aux = model.predict_batch_with_aux(params, batch, draft_params=draft_params,
                                              decoder_params=never)
  baseline = model.baseline().predict_batch_with_aux(params, batch, decoder_params=never)[0]
  np.testing.assert_array_equal(decodes, baseline)
  assert np.all(aux["target_calls"] > 0)
  for row, prompt in enumerate(prompts):
    steps = 24 - len(prompt)  # the continuation fills the rest of the buffer
    assert list(decodes[row, :steps]) == _greedy_continuation(target, params, prompt, steps)
    assert not np.any(decodes[row, steps:])


def test_the_model_follows_t5x_decoder_only_protocol(pair, vocabulary):
  module = network.DecoderOnlyTransformer(pair.target)
  model = models.DecoderOnlyModel(module, vocabulary, inputs_bidirectional_attention=True)
  assert model.module.inputs_bidirectional_attention and model.inputs_bidirectional_attention
  assert model.input_vocabulary is model.output_vocabulary is vocabulary
  variables = jax.eval_shape(lambda: model.get_initial_variables(
      jax.random.PRNGKey(0), {"decoder_input_tokens": (2, 8)}))
  assert jax.tree_util.tree_map(lambda x: x.shape, variables["params"]) == (
      jax.tree_util.tree_map(lambda x: x.shape, t5x_format.expected_param_shapes(pair.target)))
  params = t5x_format.random_params(pair.target, 1)
  targets = np.asarray([[5, 6, 7, 1]], np.int32)
  batch = {"decoder_input_tokens": np.asarray([[0, 5, 6, 7]], np.int32),
           "decoder_target_tokens": targets,
           "decoder_loss_weights": np.asarray([[0, 0, 1, 1]], np.int32),
           "decoder_causal_attention": np.asarray([[1, 1, 0, 0]], np.int32)}
  logits = model.module.apply({"params": params}, batch["decoder_input_tokens"], targets,
                              decoder_causal_attention=batch["decoder_causal_attention"])
  log_probs = jax.nn.log_softmax(logits)[0]
  expected = float(log_probs[2, 7] + log_probs[3, 1])
  np.testing.assert_allclose(model.score_batch(params, batch), [expected], rtol=1e-5)
  loss, (weight_sum, _) = model.loss_fn(params, batch, dropout_rng=None)
  np.testing.assert_allclose(loss, -expected, rtol=1e-5)
  assert weight_sum == 2


def test_a_decoder_only_t5x_checkpoint_reads_back_its_config_arrays_and_logits(pair):
  for config in (pair.target, pair.draft):
    found = formats.checkpoint_config(
        pair.target_checkpoint if config is pair.target else pair.draft_checkpoint,
        like=pair.target)
    assert found == config
  saved = t5x_format.random_params(pair.target, 0)  # the target write_pair saved (seed 0)
  restored = formats.load_params(network.DecoderOnlyTransformer(pair.target),
                                 pair.target_checkpoint)
  jax.tree_util.tree_map(np.testing.assert_array_equal, restored, saved)
  module = network.DecoderOnlyTransformer(pair.target)
  tokens = np.asarray([[0, 4, 9, 3]], np.int32)
  np.testing.assert_array_equal(module.apply({"params": restored}, tokens, tokens),
                                module.apply({"params": saved}, tokens, tokens))


def _run(pair, tmp_path, capsys, *flags):
  status, errors = tiny_t5.run_infer_main(
      [f"--gin_file={pair.infer_gin}", f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'",
       *flags], capsys)
  return status, errors


def _predictions(tmp_path) -> list[dict]:
  lines = (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def bigram_file(tmp_path_factory):
  directory = tmp_path_factory.mktemp("lm_ngrams")
  (directory / "texts").write_text("\n".join(PROMPTS[:2]) + "\n", encoding="utf-8")
  output = directory / "bigram.npz"
  assert ngrams.main([f"--text_file={directory / 'texts'}", f"--output={output}",
                      "--order=2", "--max_successors=4"]) == 0
  return output


@pytest.mark.parametrize("draft", ["model", "lookup", "ngram"])
def test_infer_continues_text_prompts_with_each_draft_source(pair, tmp_path, capsys, draft,
                                                             bigram_file):
  flags = [f"--gin.DRAFT_SOURCE='{draft}'"]
  if draft == "lookup":
    flags.append("--gin.DRAFT_CHECKPOINT_PATH=None")
  if draft == "ngram":
    flags.append(f"--gin.DRAFT_CHECKPOINT_PATH='{bigram_file}'")
  status, errors = _run(pair, tmp_path, capsys, *flags,
                        *[f"--text={text}" for text in PROMPTS])
  assert status == 0, errors
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary["identical_outputs"] and summary["num_identical"] == len(PROMPTS)
  records = _predictions(tmp_path)
  assert [record["inputs"] for record in records] == PROMPTS
  # The continuation only: never the prompt's own text first.
  assert all(record["prediction"] and record["prediction"] == record["baseline_prediction"]
             for record in records)


def test_infer_runs_the_token_tree_config_on_a_language_model(pair, tmp_path, capsys):
  """configs/decoding/speculative_tree.gin after the decoder-only run config: the tree loop
  with its settings, the target alone's greedy continuations. The target is its own draft, so
  the likeliest child at every depth is the target's argmax and every iteration accepts the
  whole depth (the last one of a row may stop at the buffer's end)."""
  status, errors = _run(pair, tmp_path, capsys,
                        "--gin_file=configs/decoding/speculative_tree.gin",
                        "--gin.TREE_BRANCHING=(2, 2)", "--gin.TREE_RULE='most_likely'",
                        f"--gin.DRAFT_CHECKPOINT_PATH='{pair.target_checkpoint}'",
                        *[f"--text={text}" for text in PROMPTS[:2]])
  assert status == 0, errors
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary["decode_loop"] == "speculative_tree_sample"
  assert summary["decode_settings"]["tree_branching"] == [2, 2]
  assert summary["identical_outputs"] and summary["num_identical"] == 2
  depths = summary["accepted_depths"]
  assert sum(depths[:2]) <= 2 and depths[2] == summary["target_calls"] - sum(depths[:2]) > 0


def test_infer_reads_prompts_from_an_input_file(pair, tmp_path, capsys):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
  status, errors = _run(pair, tmp_path, capsys, f"--input_file={prompts}")
  assert status == 0, errors
  assert [record["inputs"] for record in _predictions(tmp_path)] == PROMPTS[:2]


def test_a_prompt_longer_than_the_decode_allows_is_one_line(pair, tmp_path, capsys, vocabulary):
  long_prompt = " ".join(["station"] * 40)
  length = len(vocabulary.encode(long_prompt))
  limit = tiny_lm_pair.TASK_FEATURE_LENGTHS["inputs"]
  status, errors = _run(pair, tmp_path, capsys, "--text=short", f"--text={long_prompt}")
  assert status == 2 and len(errors) == 1
  assert f"prompt 2 has {length} tokens" in errors[0] and str(limit) in errors[0]
  assert not (tmp_path / "out").exists()


def test_a_draft_of_another_vocabulary_or_family_is_one_line(pair, tmp_path, capsys):
  other_vocabulary = tiny_lm_pair.tiny_config(pair.target.vocab_size + 128,
                                              tiny_lm_pair.DRAFT_SHAPE)
  lm_draft = t5x_format.save_t5x(t5x_format.random_params(other_vocabulary, 3),
                                 str(tmp_path / "vocab_draft"), step=1)
  t5_draft = tiny_t5.write_model(tmp_path / "t5", "draft",
                                 tiny_t5.tiny_config(pair.target.vocab_size,
                                                     tiny_t5.DRAFT_SHRINK), seed=3)
  for draft, expected in ((lm_draft, "vocabularies differ"),
                          (t5_draft.t5x_checkpoint, "family")):
    status, errors = _run(pair, tmp_path, capsys, "--text=short",
                          f"--gin.DRAFT_CHECKPOINT_PATH='{draft}'")
    assert status == 2 and len(errors) == 1 and expected in errors[0], errors


def test_plan_describes_a_decoder_only_pair(capsys):
  base = "configs/models/decoder_only/base.gin"
  status = plan.main([f"--gin_file={base}", f"--draft_gin_file={base}", "--batch_size=1",
                      "--input_length=32", "--target_length=16", "--device_kind=h200"])
  out = capsys.readouterr().out
  assert status in (0, None), out
  # 12 layers of attention (4 x 768 x 768) and gated MLP (3 x 768 x 2048), the 32128 x 768
  # embedding that also gives the logits: 109.6M.
  assert "target: 0.110B parameters" in out and "12 decoder-only layers" in out
  assert "decode length 48" in out
