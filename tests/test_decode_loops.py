"""A decode loop registered once (tests/toy_loop.py, `toy_speculative`) runs through every
runner with no edit anywhere else: `spec_decode.infer` (DECODE_LOOP and its own setting from a
config), the benchmark (`bench.Variant(decode_loop=...)`) and, in tests/t5x, the T5X hook. Its
greedy decodes equal the baseline's (exactness of the loop it wraps), and its own setting is
checked where every runner checks settings. So does a drafting policy registered there
(`one_draft`, named by DRAFT_POLICY)."""

import json

import numpy as np
import pytest

import tiny_t5
import toy_loop
from spec_decode import bench
from spec_decode import core
from spec_decode.infer import outputs as infer_outputs
from spec_decode.engine import loops
from spec_decode.engine import stats
from spec_decode.t5 import network


def test_the_loop_is_registered_by_its_module():
  assert "toy_speculative" in loops.names()
  assert loops.get("toy_speculative").uses_draft
  assert loops.get("toy_speculative").setting_names == (
      "gamma", "rule", "temperature", "topk", "topp", "max_decode_steps")


def test_its_settings_are_checked_before_anything_is_built():
  config = tiny_t5.tiny_config(64, tiny_t5.SHRINK)
  target, draft = network.Transformer(config), network.Transformer(config)
  with pytest.raises(ValueError, match="rule must be 'token' or 'block', got 'coin'"):
    core.Decoder.create("toy_speculative", target, draft, gamma=2, rule="coin")
  with pytest.raises(ValueError, match="decode loop 'toy_speculative' takes no setting "
                                       "'verifier'"):
    core.Decoder.create("toy_speculative", target, draft, gamma=2, verifier="token")


@pytest.mark.parametrize("loop_settings", [
    "LOOP_SETTINGS", "models.SpeculativeEncoderDecoderModel.loop_settings"])
def test_infer_runs_it_from_a_config(tmp_path, capsys, loop_settings):
  """The loop's settings by the macro both model families take, or bound on the model itself
  (the older form, which LOOP_SETTINGS's unset default leaves working)."""
  target, draft = tiny_t5.write_pair(tmp_path, vocab_size=8000)
  run_gin = tiny_t5.write_run_gin(
      tmp_path / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE, 0,
      {"inputs": 16, "targets": 8}, batch_size=2, extra=f"""
DECODE_LOOP = 'toy_speculative'
VERIFIER = None  # the toy loop has its own rule, and no drafting policy
DRAFT_POLICY = None
{loop_settings} = {{'rule': 'token'}}
""")
  traces = toy_loop.TRACES["token"]
  out = tmp_path / "out"
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", "--text=A dog runs.", "--text=Two cats sleep.",
       f"--gin.INFER_OUTPUT_DIR='{out}'"], capsys)
  assert status == 0, stderr
  assert toy_loop.TRACES["token"] > traces  # this loop ran, with the config's own setting
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert summary["decode_settings"]["rule"] == "token"
  assert summary["identical_outputs"] is True  # greedy: the baseline's tokens


@pytest.mark.slow
def test_infer_and_the_bench_run_a_registered_policy(tmp_path, capsys):
  """`one_draft` by name: one draft per target call, the baseline's greedy tokens."""
  target, draft = tiny_t5.write_pair(tmp_path, vocab_size=8000)
  run_gin = tiny_t5.write_run_gin(tmp_path / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE,
                                  0, {"inputs": 16, "targets": 8}, batch_size=2,
                                  extra="DRAFT_POLICY = 'one_draft'\n")
  traces = toy_loop.TRACES["one_draft"]
  out = tmp_path / "out"
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", "--text=A dog runs.", "--text=Two cats sleep.",
       f"--gin.INFER_OUTPUT_DIR='{out}'"], capsys)
  assert status == 0, stderr
  assert toy_loop.TRACES["one_draft"] > traces
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert summary["identical_outputs"] is True
  assert summary["decode_settings"]["draft_policy"] == "one_draft"
  assert 0 < summary["drafted_tokens"] <= summary["target_calls"], summary
  decoders = bench.PairDecoders(_tiny_pair(), {})
  run = decoders.run(bench.Variant(0.0, gamma=3, draft_policy="one_draft"), 0, 2)
  np.testing.assert_array_equal(run.decodes, decoders.run(bench.Variant(0.0), 0, 2).decodes)
  assert 0 < run.stats["drafted_tokens"] <= run.stats["target_calls"], run.stats


def _tiny_pair():
  return bench.build_pair(bench.PairConfig(
      source="near_bigram", target_gin="configs/models/t5_1_1/small.gin",
      target_overrides=dict(dtype="float32", emb_dim=16, num_heads=2, head_dim=8,
                            num_encoder_layers=2, num_decoder_layers=2, mlp_dim=32,
                            vocab_size=128),
      residual_scale=0.3, input_length=8, max_decode_len=12, gamma=3, num_random_inputs=2))


def test_the_bench_runs_it():
  decoders = bench.PairDecoders(_tiny_pair(), {})
  traces = toy_loop.TRACES["block"]
  toy = decoders.run(bench.Variant(0.0, gamma=3, decode_loop="toy_speculative",
                                   loop_settings=(("rule", "block"),)), 0, 2)
  assert toy_loop.TRACES["block"] > traces
  baseline = decoders.run(bench.Variant(0.0), 0, 2)
  np.testing.assert_array_equal(toy.decodes, baseline.decodes)
  assert toy.stats["target_calls"] < toy.stats["generated_tokens"]  # drafts were accepted


def test_the_bench_runs_speculative_beam_search_against_beam_search():
  decoders = bench.PairDecoders(_tiny_pair(), {})
  settings = dict(decode_loop="speculative_beam_search", num_decodes=4,
                  loop_settings=(("alpha", 0.6),))
  baseline = bench.Variant(0.0, **settings)
  assert baseline.label == "baseline beam_search beams=4"
  assert baseline.decoder(decoders.pair).loop_name == "beam_search"
  runs = {variant: [decoders.run(variant, repetition, 2) for repetition in range(2)]
          for variant in (baseline, bench.Variant(0.0, gamma=2, **settings))}
  (want, got) = runs.values()
  for want_run, got_run in zip(want, got):
    np.testing.assert_array_equal(got_run.decodes, want_run.decodes)
  greedy = decoders.run(bench.Variant(0.0), 0, 2)
  assert want[0].stats is None and not np.array_equal(greedy.decodes, want[0].decodes)
  summary = bench.summarize(got)
  assert summary["beam_steps_per_target_call"] == pytest.approx(
      summary["counters"]["beam_steps"] / summary["counters"]["target_calls"])
  assert len(summary["coverage_by_depth"]) == 2  # gamma
  with pytest.raises(ValueError, match="samples nothing: give temperature 0"):
    bench.Variant(1.0, gamma=2, **settings)


def test_loops_register_the_stats_they_return_and_runs_total_them():
  assert loops.get("speculative_sample").stats is stats.SpeculativeStats
  assert loops.get("speculative_beam_search").stats is stats.BeamSearchStats
  assert loops.get("temperature_sample").stats is None and loops.get("beam_search").stats is None
  # A run's ratios are ratios of its summed counters (hand-computed here).
  speculative = stats.SpeculativeStats.ratios(
      {"acceptance_sum": 3.0, "verified_positions": 4, "generated_tokens": 9,
       "target_calls": 3})
  assert float(speculative["alpha"]) == 0.75
  assert float(speculative["tokens_per_target_call"]) == 3.0
  assert float(speculative["target_calls_saved"]) == pytest.approx(2 / 3)
  beams = stats.BeamSearchStats.ratios(
      {"target_calls": 4, "beam_steps": 10, "covered_past_depth": [3, 2, 0]})
  assert float(beams["beam_steps_per_target_call"]) == 2.5
  assert float(beams["target_calls_saved"]) == pytest.approx(0.6)
  np.testing.assert_allclose(beams["coverage_by_depth"], [0.75, 0.5, 0.0])
