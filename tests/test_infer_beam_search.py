"""`spec_decode.infer` runs exact speculative beam search from a config
(`configs/demo/beam_search.gin`: the demo pair, 4 beams): its outputs are beam search's over the
target (the baseline run, and the engine's `beam_search` called directly, scores included), its
summary totals the loop's counters with their ratios, and sampling settings given to a beam
loop are one-line errors."""

import json

import gin
import numpy as np
import pytest

import tiny_t5
from spec_decode import infer
from spec_decode.infer import outputs as infer_outputs
from spec_decode import models
from spec_decode.checkpoints import demo_pair
from spec_decode.t5 import network
from spec_decode.t5 import vocab

# The slow tier (spec_decode.infer end to end).
pytestmark = pytest.mark.slow

TEXTS = ["A man in a red jacket is walking his dog along the beach.",
         "Two young girls are playing with a ball in the park.",
         "A man and a woman are walking hand in hand on a bridge.",
         "A woman with long hair is reading a book on a bench."]
PREFIX = "translate English to German: "


@pytest.fixture(scope="module")
def beam_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("beam") / "out"
  try:
    status = infer.main(["--gin_file=configs/demo/beam_search.gin",
                         *[f"--text={text}" for text in TEXTS],
                         f"--gin.INFER_OUTPUT_DIR='{out}'"])
  finally:
    gin.clear_config()
  assert status == 0
  records = [json.loads(line) for line in
             (out / infer_outputs.PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()]
  return records, json.loads((out / infer_outputs.SUMMARY_FILE).read_text())


def _beam_search(num_decodes):
  """The demo target's beam search over TEXTS, from the engine's `beam_search` loop."""
  config, params = demo_pair.load_model("target")
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  model = models.EncoderDecoderModel(network.Transformer(config), vocabulary, vocabulary,
                                     decode_loop="beam_search", num_decodes=num_decodes,
                                     loop_settings={"alpha": 0.6})
  inputs = np.zeros((len(TEXTS), 64), np.int32)
  for row, text in enumerate(TEXTS):
    ids = vocab.trim_with_eos(vocabulary.encode(PREFIX + text), 64, vocabulary.eos_id)
    inputs[row, :len(ids)] = ids
  decodes, aux = model.predict_batch_with_aux(params, {
      "encoder_input_tokens": inputs,
      "decoder_input_tokens": np.zeros((len(TEXTS), 64), np.int32)})
  texts = [vocabulary.decode(vocab.until_eos(np.asarray(row), vocabulary.eos_id))
           for row in decodes]
  return texts, np.asarray(aux["scores"])


def test_outputs_are_beam_search_over_the_target(beam_run):
  records, summary = beam_run
  assert summary["decode_loop"] == "speculative_beam_search" and summary["num_decodes"] == 4
  assert all(r["identical"] for r in records) and summary["identical_outputs"] is True
  texts, scores = _beam_search(4)
  assert [r["prediction"] for r in records] == texts
  np.testing.assert_allclose([r["score"] for r in records], scores, rtol=1e-5)
  # NUM_DECODES took effect: one beam (greedy) decodes some of these otherwise.
  assert _beam_search(1)[0] != texts


def test_summary_totals_the_counters_and_their_ratios(beam_run):
  records, summary = beam_run
  for name in ("target_calls", "draft_calls", "beam_steps", "tree_nodes"):
    assert summary[name] == sum(r["stats"][name] for r in records), name
  covered = np.sum([r["stats"]["covered_past_depth"] for r in records], axis=0)
  assert summary["covered_past_depth"] == covered.tolist()
  assert len(covered) == summary["decode_settings"]["gamma"]
  assert summary["decode_settings"]["draft_beams"] == 8
  assert summary["beam_steps_per_target_call"] == pytest.approx(
      summary["beam_steps"] / summary["target_calls"])
  assert summary["target_calls_saved"] == pytest.approx(
      1 - summary["target_calls"] / summary["beam_steps"])
  np.testing.assert_allclose(summary["coverage_by_depth"], covered / summary["target_calls"])
  assert summary["beam_steps"] == summary["target_calls"] + covered.sum()
  assert "alpha" not in summary and "costs" not in summary  # speculative sampling's only


def test_sampling_settings_given_to_beam_search_are_one_line_errors(capsys, tmp_path):
  status, stderr = tiny_t5.run_infer_main(
      ["--gin.DECODE_LOOP='speculative_beam_search'", "--text=Hello",
       f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"], capsys)
  assert status == 2 and len(stderr) == 1, stderr
  assert "decode loop 'speculative_beam_search' takes no setting" in stderr[0]
  assert "'temperature'" in stderr[0] and not (tmp_path / "out").exists()
