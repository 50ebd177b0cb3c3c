"""`spec_decode.bench`: the smoke run of every suite, the report's fields, the thresholds' bookkeeping
and the SIMULATED coin rule (its law, and that no decoding config can reach it)."""

import dataclasses
import importlib.util
import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import bench
from spec_decode.bench.suites import peer
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import demo_pair
from spec_decode.engine import loops
from spec_decode.engine import verify
from spec_decode.t5 import vocab

TINY = dict(dtype="float32", emb_dim=16, num_heads=2, head_dim=8, num_encoder_layers=1,
            num_decoder_layers=1, mlp_dim=32)


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _has_rates(summary):
  return all(summary[key] > 0 for key in ("tokens_per_s", "tokens_per_s_min", "tokens_per_s_max"))


@pytest.mark.slow
def test_smoke_runs_every_suite(tmp_path, clean_gin):
  assert bench.main(["--smoke", "--output_dir", str(tmp_path)]) == 0
  report = json.loads((tmp_path / bench.JSON_FILE).read_text())
  markdown = (tmp_path / bench.MARKDOWN_FILE).read_text()

  machine = report["machine"]
  for key in ("cpu_model", "usable_cores", "jax_version", "jax_backend"):
    assert machine[key], key
  assert set(report["suites"]) == set(bench.SUITES)

  own = report["suites"]["own_baseline"]
  (group,) = own["groups"]
  assert _has_rates(group["baseline"]) and _has_rates(group["speculative"])
  for key in ("alpha", "c", "v", "predicted_speedup", "measured_over_predicted", "speedup",
              "decode_speedup", "predicted_speedup_realized", "measured_over_realized",
              "predicted_speedup_interleaved", "measured_over_interleaved",
              "interleaved_over_isolated", "accepted_per_target_call", "tokens_per_target_call", "model_call_share"):
    assert np.isfinite(group["speculative"][key]), key
  assert group["baseline"]["model_call_share"] > 0
  for summary in (group["baseline"], group["speculative"]):
    # The decoding loop is part of the whole call.
    assert 0 < summary["decode_seconds"] < summary["seconds"]
    assert summary["decode_tokens_per_s"] > summary["tokens_per_s"]
  labels = set(group["variants"])
  assert {"token fixed gamma=2", "block fixed gamma=2", "token expected_speedup gamma<=2",
          "token confidence gamma<=2"} <= labels
  assert group["best_fixed"] in labels
  bound = dict(group["variants"]["token expected_speedup gamma<=2"]["variant"]["policy_bindings"])
  assert bound["cost_ratio"] == pytest.approx(group["speculative"]["c"])

  engine = report["suites"]["engine_cost"]
  assert [group["temperature"] for group in engine["pair"]] == [0.0, 1.0]
  for group in engine["pair"]:
    (row,) = group["speculative"]
    assert row["gamma"] == 2 and row["seconds"] > 0 and row["model_seconds"] > 0
    # A speculative iteration runs two models and verifies: more kernels than a baseline step.
    assert row["model_kernels"] > group["baseline"]["model_kernels"] > 0
    assert row["engine_kernels"] > group["baseline"]["engine_kernels"] > 0
  assert "## engine_cost" in markdown

  peer = report["suites"]["peer"]
  (entry,) = peer["temperatures"]
  assert "error" not in entry, entry.get("error")
  for label in ("ours baseline", "ours speculative", "hf generate", "hf assisted"):
    assert _has_rates(entry[label]), label
  agreement = entry["greedy_agreement_with_ours_baseline"]
  assert agreement["ours speculative"]["all_identical"]  # exact speculative decoding
  peers = {"ours speculative", "hf generate", "hf assisted"}
  if importlib.util.find_spec("t5x") is not None:  # T5X's sampler on the same weights
    assert "t5x_error" not in peer and _has_rates(entry["t5x sampler"])
    assert agreement["t5x sampler"]["all_identical"]
    peers.add("t5x sampler")
  else:
    assert "T5X is not installed" in peer["t5x_error"]
  assert set(agreement) == peers

  table2 = report["suites"]["simulated_table2"]
  (row,) = table2["rows"]
  assert table2["simulated"] and row["simulated"] and row["label"].startswith(bench.SIMULATED)
  assert (row["forced_alpha"], row["gamma"]) == (0.75, 7)
  for key in ("speedup", "decode_speedup", "predicted_speedup", "measured_over_predicted",
              "predicted_speedup_realized", "measured_over_realized",
              "predicted_speedup_interleaved", "measured_over_interleaved", "c", "v"):
    assert np.isfinite(row[key]), key
  # The coin (alpha 0.75) accepts drafts although this random draft and target rarely agree.
  assert row["speculative"]["accepted_per_target_call"] > 0

  limit = report["suites"]["physical_limit"]
  assert limit["copy"]["bytes_per_s"] > 0
  assert {t["model"] for t in limit["targets"]} == {"random target",
                                                    f"{bench.SIMULATED} T5.1.1 target"}
  assert all(0 < t["fraction_of_copy_bandwidth"] for t in limit["targets"])

  cost = report["suites"]["verify_cost"]
  assert cost["read_bandwidth"]["bytes_per_s"] > 0 and cost["matmul"]["flops_per_s"] > 0
  (model,) = cost["models"]
  assert [row["k"] for row in model["rows"]] == [1, 2]
  assert model["weight_bytes_per_step"] > 0 and 0 < model["read_bandwidth_fraction"]
  for row in model["rows"]:
    for key in ("step_s", "v", "xla_step_s", "xla_v", "ours_over_xla", "roofline_v",
                "serial_v"):
      assert np.isfinite(row[key]) and row[key] > 0, key
    assert row["roofline_v"] >= 1 and row["serial_v"] >= 1  # more rows never cost less
  assert model["rows"][0]["v"] == model["rows"][0]["xla_v"] == 1.0
  assert model["rows"][0]["roofline_v"] == model["rows"][0]["serial_v"] == 1.0
  # The tiny model is under the thresholds' size: recorded as not measured, never asserted.
  cost_goals = [g for g in report["thresholds"] if g["goal"].startswith("verify_cost")]
  assert len(cost_goals) == 3 and all(g["met"] is None for g in cost_goals)

  assert report["thresholds"] and all("status" in goal for goal in report["thresholds"])
  assert "PairConfig" in report["gin_config"]
  for heading in ("own_baseline", "peer", "simulated_table2 (SIMULATED)", "physical_limit",
                  "verify_cost", "engine_cost", "Thresholds"):
    assert heading in markdown, heading


@pytest.mark.slow
def test_smoke_runs_a_language_model_pair(tmp_path, clean_gin):
  """configs/bench/smoke_decoder_only.gin: the suites on tiny decoder-only models continuing
  random prompts."""
  assert bench.main(["--gin_file=configs/bench/smoke_decoder_only.gin",
                     "--output_dir", str(tmp_path)]) == 0
  report = json.loads((tmp_path / bench.JSON_FILE).read_text())
  assert set(report["suites"]) == {"own_baseline", "engine_cost", "peer", "physical_limit",
                                   "verify_cost"}
  own = report["suites"]["own_baseline"]
  assert own["pair"]["decoder_only"] and own["pair"]["input_length"] == 8
  assert own["pair"]["target"]["config"]["num_layers"] == 1
  (group,) = own["groups"]
  assert _has_rates(group["baseline"]) and _has_rates(group["speculative"])
  assert np.isfinite(group["speculative"]["predicted_speedup"])
  # No EOS: every row decodes the rest of its 16 positions (random prompts of 3 to 7 tokens
  # after BOS), each counted once.
  assert 16 - 7 <= group["baseline"]["tokens"] / own["repetitions"] <= 16 - 3
  assert group["speculative"]["tokens"] == group["baseline"]["tokens"]
  for engine_group in report["suites"]["engine_cost"]["pair"]:
    (row,) = engine_group["speculative"]
    assert row["model_kernels"] > engine_group["baseline"]["model_kernels"] > 0

  peer = report["suites"]["peer"]
  assert "Hugging Face has no class for T5X's decoder-only" in peer["error"]
  if "t5x_error" in peer:  # no peer at all (tests/t5x compare T5X's wherever it can run)
    assert ("absent from this T5X installation" in peer["t5x_error"]
            or "T5X is not installed" in peer["t5x_error"])
    assert peer["temperatures"] == []
  else:
    (entry,) = peer["temperatures"]
    agreement = entry["greedy_agreement_with_ours_baseline"]
    assert agreement["ours speculative"]["all_identical"]
    assert agreement["t5x sampler"]["all_identical"]
    assert entry["t5x sampler"]["tokens"] == entry["ours baseline"]["tokens"]

  (limit,) = report["suites"]["physical_limit"]["targets"]
  # 1 layer x keys and values x 2 heads x 8 dims x 4 bytes over the 16 cached positions; no
  # cross-attention.
  assert limit["kv_cache_bytes_per_step"] == 1 * 2 * 2 * 8 * 4 * 16
  (model,) = report["suites"]["verify_cost"]["models"]
  assert [row["k"] for row in model["rows"]] == [1, 2]
  assert all(np.isfinite(row["step_s"]) for row in model["rows"])
  assert "## peer: T5X's sampler" in (tmp_path / bench.MARKDOWN_FILE).read_text()


def test_random_models_hold_their_weights_in_the_activation_dtype():
  """As T5X's inference restores a bfloat16 model: a step reads bfloat16 weights, half the
  bytes of float32's."""
  gin_file = "configs/demo/target.gin"
  float32 = bench.random_model("f32", gin_file, TINY, 0)
  bfloat16 = bench.random_model("bf16", gin_file, dict(TINY, dtype="bfloat16"), 0)
  dtypes = lambda model: {leaf.dtype for leaf in jax.tree_util.tree_leaves(model.params)}
  assert dtypes(float32) == {np.dtype("float32")}
  assert dtypes(bfloat16) == {np.dtype(jnp.bfloat16)}
  assert bfloat16.decode_step_weight_bytes * 2 == float32.decode_step_weight_bytes
  for ours, theirs in zip(jax.tree_util.tree_leaves(bfloat16.params),
                          jax.tree_util.tree_leaves(float32.params)):
    np.testing.assert_array_equal(ours, theirs.astype(jnp.bfloat16))


def test_demo_pair_decodes_the_bundled_sentences(tmp_path, monkeypatch):
  for seed, name in enumerate(("target", "draft")):
    model = bench.random_model(name, "configs/demo/target.gin", TINY, seed)
    demo_pair.save_model(model.params, model.config, tmp_path / f"{name}.safetensors")
  (tmp_path / "examples.en").write_text("Hello.\nWhere is the train station?\n")
  monkeypatch.setattr(demo_pair, "ASSET_DIR", tmp_path)

  pair = bench.build_pair(bench.PairConfig(source="auto", input_length=6, max_decode_len=8))
  assert (pair.name, pair.has_eos, pair.max_decode_len) == ("demo", True, 8)
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  for row, text in zip(pair.inputs, ("Hello.", "Where is the train station?")):
    ids = vocabulary.encode("translate English to German: " + text)[:5] + [vocabulary.eos_id]
    np.testing.assert_array_equal(row[:len(ids)], ids)
  np.testing.assert_array_equal(pair.batch(1, 3)[:, 0], pair.inputs[[1, 0, 1], 0])


def test_thresholds_say_by_how_much_they_are_missed():
  suites = {
      "own_baseline": {"pair": {"name": "demo"}, "groups": [
          {"temperature": 0.0, "batch_size": 1, "speculative": {"measured_over_predicted": 0.45,
                                                                "measured_over_realized": 0.95,
                                                                "measured_over_interleaved": 0.9}},
          {"temperature": 1.0, "batch_size": 8, "speculative": {"speedup": 1.0}}]},
      "peer": {"pair": "demo", "gamma": 5, "target_params": 11_000_000,
               "temperatures": [{"temperature": 0.0, "ours_speculative_over_hf_assisted": 3.0},
                                {"temperature": 1.0, "error": "RuntimeError: cache"}]},
      "physical_limit": {"targets": [{"model": "small", "num_params": 10}]},
  }
  by_status = [(goal["met"], goal["status"]) for goal in bench.thresholds(suites)]
  assert by_status == [(False, "missed by 0.45 (50% of the target)"), (True, "met"), (True, "met"),
                       (False, "missed by 0 (100% of the target)"),  # must be strictly faster
                       (True, "met"), (None, "not measured (RuntimeError: cache)"),
                       (None, "not measured (no target of that size was measured in this run)")]


def test_verify_cost_thresholds_are_upper_bounds_on_the_largest_model():
  rows = [{"k": 1, "v": 1.0}, {"k": 4, "v": 1.8}, {"k": 8, "v": 2.0}]
  suites = {"verify_cost": {"models": [
      {"model": "small", "num_params": 10, "rows": [{"k": 4, "v": 9.0}]},
      {"model": "large", "num_params": 800_000_000, "rows": rows,
       "read_bandwidth_fraction": 0.6}]}}
  by_goal = {g["goal"]: (g["met"], g["status"]) for g in bench.thresholds(suites)}
  assert by_goal == {
      "verify_cost: v(4) <= 1.5 (large)": (False, "missed by 0.3 (120% of the target)"),
      "verify_cost: v(8) <= 2.0 (large)": (True, "met"),
      "verify_cost: baseline step reads its weights at >= 80% of the read bandwidth (large)":
          (False, "missed by 0.2 (75% of the target)")}


def test_theory_comparison_uses_the_decoding_loops():
  costs = {"c": 0.1, "v": 2.0}
  baseline = {"decode_tokens_per_s": 100.0}
  # 3 tokens per target call at 5 draft calls per target call cost 5 * 0.1 + 2 = 2.5 steps.
  speculative = {"decode_tokens_per_s": 108.0, "tokens_per_target_call": 3.0,
                 "draft_calls_per_target_call": 5.0, "counters": {
                     "target_calls": 4, "draft_calls": 20}, "decode_seconds": 1.0}
  costs.update(target_step_s=0.01, draft_step_s=0.001, verify_step_s=0.02,
               iteration_calls_s=0.03)
  theory = bench.compare_with_theory(speculative, baseline, costs, alpha=0.8, gamma=5,
                                     batch_size=1)
  assert theory["decode_speedup"] == pytest.approx(1.08)
  assert theory["predicted_speedup_realized"] == pytest.approx(3.0 / 2.5)
  assert theory["measured_over_realized"] == pytest.approx(1.08 / 1.2)
  expected = (1 - 0.8 ** 6) / ((1 - 0.8) * (5 * 0.1 + 2.0))
  assert theory["predicted_speedup"] == pytest.approx(expected, rel=1e-5)
  assert theory["measured_over_predicted"] == pytest.approx(1.08 / expected, rel=1e-5)
  # 3 tokens per iteration of 0.03 s against one token per 0.01 s target step.
  assert theory["predicted_speedup_interleaved"] == pytest.approx(1.0)
  assert theory["measured_over_interleaved"] == pytest.approx(1.08)
  assert theory["model_call_share"] == pytest.approx(4 * 0.02 + 20 * 0.001)


def test_generated_lengths_count_through_the_first_eos():
  decodes = np.array([[5, 1, 0, 0], [5, 6, 7, 8], [1, 0, 0, 0]])
  np.testing.assert_array_equal(bench.generated_lengths(decodes, 1), [2, 4, 1])
  np.testing.assert_array_equal(bench.generated_lengths(decodes, None), [4, 4, 4])
  # A language model's rows decode what their prompts leave: an EOS past that is padding.
  np.testing.assert_array_equal(bench.generated_lengths(decodes, 1, [1, 3, 4]), [1, 3, 1])
  np.testing.assert_array_equal(bench.generated_lengths(decodes, None, [1, 3, 4]), [1, 3, 4])


def test_simulated_rule_is_a_geometric_coin_with_the_targets_next_token():
  alpha, gamma, vocab = 0.6, 3, 5
  target_probs = jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(vocab), (2, gamma + 1)),
                             jnp.float32)
  verdict = bench.simulated_acceptance_rule(alpha)(
      jnp.zeros((2, gamma), jnp.int32), jnp.full((2, gamma, vocab), 1.0 / vocab), target_probs,
      jnp.array([gamma, 1]))
  assert isinstance(verdict, verify.Verdict)
  expected = [[0.4, 0.6 * 0.4, 0.36 * 0.4, 0.216], [0.4, 0.6, 0.0, 0.0]]
  np.testing.assert_allclose(verdict.num_accepted_probs, expected, rtol=1e-6)
  np.testing.assert_allclose(verdict.next_token_probs, target_probs)
  with pytest.raises(ValueError, match="alpha"):
    bench.simulated_acceptance_rule(1.0)


def test_simulated_rule_is_not_a_registered_verifier(clean_gin):
  registered = {**verify.EXACT_RULES, **verify.LOSSY_RULES}
  assert not any("simulated_acceptance_rule" in rule.__qualname__ for rule in registered.values())
  for name in ("simulated_acceptance_rule", "simulated", "coin"):
    with pytest.raises(ValueError, match="verifier must be one of"):
      verify.get_rule(name)
  # Its name as a config's VERIFIER fails where every runner checks its settings, before
  # anything is built.
  with pytest.raises(ValueError, match="verifier must be one of"):
    loops.get("speculative_sample").check({"gamma": 2, "verifier": "simulated_acceptance_rule"})


# A T5.1.1 config at toy width, deep enough that the 1+1-layer draft drops most of the target.
NEAR_BIGRAM_TINY = dict(TINY, vocab_size=128, num_encoder_layers=3, num_decoder_layers=3)


def _near_bigram_config(residual_scale):
  return bench.PairConfig(source="near_bigram",
                          target_gin="configs/models/t5_1_1/small.gin",
                          target_overrides=NEAR_BIGRAM_TINY, residual_scale=residual_scale,
                          input_length=8, max_decode_len=16, gamma=3, num_random_inputs=4)


def _greedy_alpha(pair):
  decoders = bench.PairDecoders(pair, {})
  return bench.summarize([decoders.run(bench.Variant(0.0, 3), i, 1) for i in range(4)])["alpha"]


@pytest.mark.slow
def test_near_bigram_draft_is_the_targets_own_arrays_and_agrees_with_it():
  pair = bench.build_pair(_near_bigram_config(1e-4))
  target, draft = pair.target.params, pair.draft.params
  assert (draft["token_embedder"]["embedding"] is target["token_embedder"]["embedding"])
  for stack, names in {"encoder": ("relpos_bias", "encoder_norm", "layers_0"),
                       "decoder": ("relpos_bias", "decoder_norm", "layers_0", "logits_dense")
                       }.items():
    assert set(draft[stack]) == set(names)
    for name in names:
      for ours, theirs in zip(jax.tree_util.tree_leaves(draft[stack][name]),
                              jax.tree_util.tree_leaves(target[stack][name])):
        assert ours is theirs, (stack, name)
  assert (pair.draft.config.num_encoder_layers, pair.draft.config.num_decoder_layers) == (1, 1)
  assert pair.draft.config.emb_dim == pair.target.config.emb_dim and not pair.has_eos
  # Every residual branch of the target is scaled, nothing else is.
  unscaled = dict(t5x_format.flatten_params(t5x_format.random_params(pair.target.config, 0)))
  for path, leaf in t5x_format.flatten_params(target):
    expected = unscaled[path] * (1e-4 if path[-2] in ("out", "wo") else 1.0)
    np.testing.assert_allclose(np.asarray(leaf), expected, rtol=1e-6, err_msg=str(path))
  assert "scaled by 0.0001" in pair.description
  assert _greedy_alpha(pair) > 0.9
  # Unscaled, the same construction is no longer close to a bigram model: rare agreement.
  assert _greedy_alpha(bench.build_pair(_near_bigram_config(1.0))) < 0.5
  with pytest.raises(ValueError, match="residual_scale must be > 0"):
    bench.build_pair(_near_bigram_config(0.0))
  # Settings another source would read are refused, not ignored.
  with pytest.raises(ValueError, match="PairConfig.draft_gin does not apply"):
    bench.build_pair(dataclasses.replace(_near_bigram_config(1e-4), draft_gin="x.gin"))
  with pytest.raises(ValueError, match="PairConfig.residual_scale does not apply"):
    bench.build_pair(dataclasses.replace(_near_bigram_config(1e-4), source="random"))
  # The shipped pair has its own models: a model gin file bound for it would be ignored.
  if bench.demo_files_exist():
    for source in ("demo", "auto"):
      with pytest.raises(ValueError, match="PairConfig.target_gin does not apply to PairConfig."
                         f"source = '{source}'"):
        bench.build_pair(bench.PairConfig(source=source,
                                          target_gin="configs/models/decoder_only/base.gin"))


NEAR_BIGRAM_TINY_LM = dict(vocab_size=128, dtype="float32", emb_dim=16, num_heads=2,
                          head_dim=8, num_layers=3, mlp_dim=32)


@pytest.mark.slow
def test_near_bigram_language_model_pair_continues_prompts():
  config = bench.PairConfig(source="near_bigram", target_gin="configs/models/decoder_only/base.gin",
                            target_overrides=NEAR_BIGRAM_TINY_LM, residual_scale=1e-4,
                            input_length=8, max_decode_len=12, gamma=3, num_random_inputs=4)
  pair = bench.build_pair(config)
  assert pair.decoder_only and pair.decode_length == 20 and not pair.has_eos
  target, draft = pair.target.params, pair.draft.params
  # A language model's embedding is its decoder's; base.gin ties the logits to it.
  names = {"token_embedder", "relpos_bias", "decoder_norm", "layers_0"}
  assert set(draft) == {"decoder"} and set(draft["decoder"]) == names
  for name in names:
    for ours, theirs in zip(jax.tree_util.tree_leaves(draft["decoder"][name]),
                            jax.tree_util.tree_leaves(target["decoder"][name])):
      assert ours is theirs, name
  assert (pair.draft.config.num_layers, pair.target.config.num_layers) == (1, 3)
  # Prompts as T5X's DecoderOnlyModel reads them: BOS 0, tokens past pad/eos/unk, no EOS.
  assert (pair.inputs[:, 0] == 0).all()
  lengths = (pair.inputs[:, 1:] != 0).sum(axis=1)
  for row, length in zip(pair.inputs, lengths):
    assert (row[1:1 + length] >= 3).all() and (row[1 + length:] == 0).all()
  decoders = bench.PairDecoders(pair, {})
  for repetition in range(2):
    baseline = decoders.run(bench.Variant(0.0), repetition, 2)
    speculative = decoders.run(bench.Variant(0.0, 3), repetition, 2)
    np.testing.assert_array_equal(speculative.decodes, baseline.decodes)
    rows = [(repetition * 2 + i) % 4 for i in range(2)]
    # No EOS: each row fills the 20 positions after its prompt.
    assert baseline.tokens == speculative.tokens == sum(20 - lengths[rows])
    assert speculative.stats["generated_tokens"] == baseline.tokens
  assert _greedy_alpha(pair) > 0.9


@pytest.mark.slow
def test_hugging_face_worker_decodes_as_our_baseline(tmp_path):
  pair = bench.build_pair(_near_bigram_config(1e-3))
  decoders = bench.PairDecoders(pair, {})
  ours = [decoders.run(bench.Variant(0.0), i, 1) for i in range(3)]
  torch = pytest.importorskip("torch")
  worker = peer.HuggingFaceWorker(pair, str(tmp_path), gamma=3, num_threads=1,
                                  assistant_schedule="constant", torch_device="auto")
  try:
    assert set(worker.versions) == {"torch_version", "transformers_version", "torch_device"}
    # 'auto': CUDA where torch sees it (then timed to the end of its work), else the CPU.
    assert worker.versions["torch_device"].startswith(
        "cuda" if torch.cuda.is_available() else "cpu")
    for assisted in (False, True):
      theirs = [worker.run(0.0, assisted, i) for i in range(3)]
      assert all(out.tokens == pair.max_decode_len and out.seconds > 0 for out in theirs)
      assert peer.greedy_agreement(ours, theirs, pair.eos_id)["all_identical"], assisted
  finally:
    worker.close()
  assert worker._process.returncode == 0  # stdin closed: the worker exits cleanly


@pytest.mark.slow
def test_hugging_face_worker_without_cuda_says_so(tmp_path):
  torch = pytest.importorskip("torch")
  if torch.cuda.is_available():
    pytest.skip("torch sees a CUDA device here: the refusal cannot be shown")
  pair = bench.build_pair(_near_bigram_config(1e-3))
  with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
    peer.HuggingFaceWorker(pair, str(tmp_path), gamma=3, num_threads=1,
                           assistant_schedule="constant", torch_device="cuda")


def _peer_entry(ours_base, ours_spec, hf_base, hf_assisted):
  rate = lambda tokens_per_s: {"tokens_per_s": tokens_per_s, "tokens_per_s_min": tokens_per_s,
                               "tokens_per_s_max": tokens_per_s}
  return {"temperature": 0.0, "ours baseline": rate(ours_base),
          "ours speculative": dict(rate(ours_spec), alpha=0.85), "hf generate": rate(hf_base),
          "hf assisted": rate(hf_assisted), "ours_speedup": ours_spec / ours_base,
          "hf_speedup": hf_assisted / hf_base,
          "ours_speculative_over_hf_assisted": ours_spec / hf_assisted,
          "greedy_agreement_with_ours_baseline": {
              "hf assisted": {"identical": 3, "compared": 4}}}


def test_peer_report_and_thresholds_at_a_real_size():
  suite = {"pair": "near-bigram t5_1_1/large", "pair_description": "a stated construction",
           "target_params": 780_000_000, "draft_params": 90_000_000, "gamma": 3,
           "max_decode_len": 64, "torch_num_threads": 2, "torch_version": "t",
           "transformers_version": "x",
           "temperatures": [_peer_entry(ours_base=4.0, ours_spec=6.0, hf_base=3.0,
                                        hf_assisted=5.0)]}
  by_status = [(g["goal"], g["met"], g["status"]) for g in bench.thresholds({"peer": suite})]
  assert by_status == [
      ("peer (near-bigram t5_1_1/large) batch 1 greedy gamma=3: ours speculative tokens/s >= "
       "1.5x HF assisted generation", False, "missed by 0.3 (80% of the target)"),
      ("peer (near-bigram t5_1_1/large) batch 1 greedy gamma=3: ours speculative/baseline "
       "speedup >= HF assisted/generate speedup (ratio of the two >= 1)", False,
       "missed by 0.1 (90% of the target)")]
  markdown = bench.to_markdown({"machine": {"cpu_model": "cpu", "usable_cores": 2,
                                            "load_average_at_start": None, "jax_version": "j",
                                            "jax_backend": "cpu"},
                                "compiler_options": {}, "mesh": {"data": 1, "model": 1},
                                "suites": {"peer": suite},
                                "thresholds": []})
  assert "a stated construction" in markdown
  assert ("| near-bigram t5_1_1/large | 0 | 4.0 [4.0-4.0] | 6.0 [6.0-6.0] | 1.5 | "
          "3.0 [3.0-3.0] | 5.0 [5.0-5.0] | 1.67 | 1.2 | - | - | 0.85 | hf assisted 3/4 |") in markdown
