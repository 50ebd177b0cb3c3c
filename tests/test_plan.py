"""Tests of spec_decode.plan: per-device bytes against a hand computation, and the Table 2 plan."""

import math
import textwrap
import time

import jax.numpy as jnp
import pytest

from spec_decode import gin_utils
from spec_decode import plan

# A small T5.1.1-style target (gated gelu, untied logits) and a tied T5 1.0-style draft.
V, E, H, D, M, ENC, DEC = 64, 16, 4, 8, 32, 2, 3
DRAFT_E, DRAFT_H, DRAFT_D, DRAFT_M, DRAFT_ENC, DRAFT_DEC = 8, 2, 4, 16, 1, 2
BUCKETS = 32
B, LE, L = 2, 10, 6


@pytest.fixture()
def config_files(tmp_path):
  draft = tmp_path / "draft.gin"
  draft.write_text(textwrap.dedent(f"""\
      from __gin__ import dynamic_registration
      from spec_decode.t5 import network

      network.T5Config.vocab_size = {V}
      network.T5Config.dtype = 'bfloat16'
      network.T5Config.emb_dim = {DRAFT_E}
      network.T5Config.num_heads = {DRAFT_H}
      network.T5Config.head_dim = {DRAFT_D}
      network.T5Config.num_encoder_layers = {DRAFT_ENC}
      network.T5Config.num_decoder_layers = {DRAFT_DEC}
      network.T5Config.mlp_dim = {DRAFT_M}
      network.T5Config.mlp_activations = ('relu',)
      network.T5Config.logits_via_embedding = True
      """))
  run = tmp_path / "run.gin"
  run.write_text(textwrap.dedent(f"""\
      from __gin__ import dynamic_registration
      from spec_decode import models
      from spec_decode.t5 import network

      network.T5Config.vocab_size = {V}
      network.T5Config.dtype = 'bfloat16'
      network.T5Config.emb_dim = {E}
      network.T5Config.num_heads = {H}
      network.T5Config.head_dim = {D}
      network.T5Config.num_encoder_layers = {ENC}
      network.T5Config.num_decoder_layers = {DEC}
      network.T5Config.mlp_dim = {M}
      network.T5Config.mlp_activations = ('gelu', 'linear')
      network.T5Config.logits_via_embedding = False

      BATCH_SIZE = {B}
      TASK_FEATURE_LENGTHS = {{'inputs': {LE}, 'targets': {L}}}
      # The draft from a gin scope: its own fields over the target's.
      models.SpeculativeEncoderDecoderModel.draft_module = @draft/network.Transformer()
      draft/network.Transformer.config = @network.T5Config()
      draft/network.T5Config.emb_dim = {DRAFT_E}
      draft/network.T5Config.num_heads = {DRAFT_H}
      draft/network.T5Config.head_dim = {DRAFT_D}
      draft/network.T5Config.num_encoder_layers = {DRAFT_ENC}
      draft/network.T5Config.num_decoder_layers = {DRAFT_DEC}
      draft/network.T5Config.mlp_dim = {DRAFT_M}
      draft/network.T5Config.mlp_activations = ('relu',)
      draft/network.T5Config.logits_via_embedding = True
      """))
  return str(run), str(draft)


def _target_param_bytes(num_partitions: int) -> int:
  """T5X's 1-D rules split every kernel, the embeddings and the relative-position tables over
  'model' (joined_kv, mlp, vocab, heads); layer-norm scales ('embed') are replicated."""
  attention = 4 * E * H * D  # query, key, value [E, H*D] and out [H*D, E]
  mlp = 3 * E * M  # wi_0, wi_1 [E, M] and wo [M, E]
  split = (2 * V * E  # token_embedder/embedding and decoder/logits_dense/kernel
           + 2 * H * BUCKETS  # encoder and decoder relpos_bias
           + ENC * (attention + mlp) + DEC * (2 * attention + mlp))
  replicated = E * (2 * ENC + 1) + E * (3 * DEC + 1)  # layer norms, final norms
  assert split % num_partitions == 0
  return 2 * (split // num_partitions + replicated)  # bfloat16


def _cache_bytes(num_layers: int, heads: int, head_dim: int, model_split: int,
                 data_split: int = 1) -> int:
  rows = B // data_split
  key_value = 2 * num_layers * rows * (L + LE) * heads * head_dim * 2 // model_split  # bfloat16
  return key_value + rows * LE * 1 + rows * 4  # encoder_mask bool, cache_index int32


def _draft_param_bytes() -> int:
  attention = 4 * DRAFT_E * DRAFT_H * DRAFT_D
  mlp = 2 * DRAFT_E * DRAFT_M  # relu: wi [E, M] and wo [M, E]
  count = (V * DRAFT_E + 2 * DRAFT_H * BUCKETS + DRAFT_ENC * (attention + mlp)
           + DRAFT_DEC * (2 * attention + mlp) + DRAFT_E * (2 * DRAFT_ENC + 1)
           + DRAFT_E * (3 * DRAFT_DEC + 1))
  return 2 * count


def _plan(run_gin, num_devices=None, **kwargs):
  config = gin_utils.read_run_config([run_gin], **kwargs)
  target = plan.model_shapes(config.target, config.batch_size, config.input_length,
                             config.target_length)
  draft = plan.model_shapes(config.draft, config.batch_size, config.input_length,
                            config.target_length)
  return config, plan.plan(target, draft, jnp.bfloat16, num_devices)


def test_bytes_match_a_hand_computation(config_files):
  run_gin, _ = config_files
  config, rows = _plan(run_gin)
  assert (config.batch_size, config.input_length, config.target_length) == (B, LE, L)
  assert config.draft.emb_dim == DRAFT_E
  assert [row.num_partitions for row in rows] == [1, 2, 4, 8, 16]
  for row in rows[:3]:  # H = 4 heads: P = 1, 2, 4 divide them
    partitions = row.num_partitions
    assert row.mesh_shape == (1, partitions)
    assert row.target.params == _target_param_bytes(partitions)
    assert row.target.cache == _cache_bytes(DEC, H, D, partitions)
    assert row.draft.params == _draft_param_bytes()  # replicated
    assert row.draft.cache == _cache_bytes(DRAFT_DEC, DRAFT_H, DRAFT_D, 1)
    assert not row.target.problems and not row.draft.problems


def test_meshes_that_do_not_divide_are_named(config_files):
  run_gin, _ = config_files
  _, rows = _plan(run_gin)
  problems = {str(p.logical_axis): p for p in rows[3].target.problems}  # P = 8 > H = 4
  assert problems["heads"].size == H and problems["heads"].parts == 8
  _, rows = _plan(run_gin, num_devices=8)
  by_partitions = {row.num_partitions: row for row in rows}
  assert by_partitions[16].mesh_shape is None  # more partitions than devices
  batch = [p for p in by_partitions[2].target.problems if p.logical_axis == "batch"]
  assert batch and batch[0].size == B and batch[0].parts == 4  # data = 8 / 2
  row = by_partitions[4]  # data 2 divides B = 2: the batch is split too
  assert row.target.cache == _cache_bytes(DEC, H, D, 4, data_split=2)
  assert row.draft.cache == _cache_bytes(DRAFT_DEC, DRAFT_H, DRAFT_D, 1, data_split=2)


def test_command_line_prints_the_table(config_files, capsys):
  run_gin, draft_gin = config_files
  assert plan.main([f"--gin_file={run_gin}", "--device_kind=h200",
                    f"--draft_gin_file={draft_gin}"]) == 0
  out = capsys.readouterr().out
  assert f"{_target_param_bytes(2) / 2**10:.2f} KiB" in out
  assert "h200 = 131.32 GiB" in out
  assert "logical axis 'heads' of size 4 is split over mesh axis model of size 8" in out


def test_an_unreachable_gs_draft_checkpoint_is_one_line_after_a_bounded_wait(
    config_files, capsys, unreachable_gcs):
  run_gin, _ = config_files
  start = time.monotonic()
  assert plan.main([f"--gin_file={run_gin}",
                    "--gin_bindings=models.SpeculativeEncoderDecoderModel.draft_module = None",
                    "--gin_bindings=DRAFT_CHECKPOINT_PATH = 'gs://spec-decode-unreachable/draft'"]
                   ) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and "gs://spec-decode-unreachable/draft" in error[0], error
  assert f"no answer from Google Cloud Storage in {unreachable_gcs} s" in error[0]
  assert time.monotonic() - start < 10 * unreachable_gcs


def test_command_line_errors_are_one_line(config_files, capsys):
  run_gin, _ = config_files
  assert plan.main([f"--gin_file={run_gin}", "--gin_bindings=BATCH_SIZE = None"]) == 2
  assert "batch size must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("harness, row, draft_gin_file, emb_dim, draft_emb_dim, kv_dim", [
    # T5.1.1-XXL: 11.1B parameters, 64 heads x 64; its small draft.
    ("configs/table2/spec_decode.gin", "configs/table2/ende_small_t0.gin",
     "configs/models/t5_1_1/small.gin", 4096, 512, 64 * 64),
    # T5 1.0 11B: 11.3B parameters, 128 heads x 128; its large draft.
    ("configs/table2/t5_1_0/spec_decode.gin", "configs/table2/t5_1_0/cnndm_large_t0.gin",
     "configs/models/t5_1_0/large.gin", 1024, 1024, 128 * 128),
])
def test_table2_target_verification_fits_a_tpu_v4_slice(harness, row, draft_gin_file, emb_dim,
                                                        draft_emb_dim, kv_dim):
  """Either Table 2 target (about 21 GiB in bfloat16) fits one 32 GiB TPU-v4 chip with the
  caches and the draft; in float32 (about 42 GiB) it needs num_partitions >= 2."""
  config = gin_utils.read_run_config([harness, row], draft_gin_file=draft_gin_file)
  assert (config.target.emb_dim, config.target.num_decoder_layers) == (emb_dim, 24)
  assert config.draft.emb_dim == draft_emb_dim
  target = plan.model_shapes(config.target, config.batch_size, config.input_length,
                             config.target_length)
  draft = plan.model_shapes(config.draft, config.batch_size, config.input_length,
                            config.target_length)
  capacity = plan.device_memory_bytes("tpu_v4")
  for dtype, smallest_fitting in ((jnp.bfloat16, 1), (jnp.float32, 2)):
    rows = plan.plan(target, draft, dtype)
    fitting = [row.num_partitions for row in rows
               if row.target.total + row.draft.total <= capacity]
    assert fitting == [p for p in plan.NUM_PARTITIONS if p >= smallest_fitting], dtype
    # Parameters dominate; the batch-1 caches of 512 + 128 positions are under a GiB.
    assert rows[0].target.cache == 24 * 2 * (512 + 128) * kv_dim * 2 + 512 + 4


def test_an_ngram_draft_plans_no_draft_network(config_files):
  run_gin, _ = config_files
  config = gin_utils.read_run_config([run_gin], bindings=[
      "models.SpeculativeEncoderDecoderModel.draft_module = None", "DRAFT_SOURCE = 'ngram'",
      "DRAFT_CHECKPOINT_PATH = '/nonexistent/bigram.npz'"])
  assert config.draft is None and config.target is not None


@pytest.mark.parametrize("step", [1, 2, 4])
def test_largest_batch_bisects_to_the_last_that_fits(step):
  """Against every threshold a decode's memory could put: the largest multiple of `step` up to
  the bound at or below the threshold, asked about at most ceil(log2(bound / step)) + 2 batches,
  each a multiple of `step` within the bound."""
  up_to = 37
  for threshold in range(0, 45):
    asked = []

    def fits(batch, threshold=threshold, asked=asked):
      asked.append(batch)
      return batch <= threshold

    expected = max([b for b in range(step, up_to + 1, step) if b <= threshold], default=0)
    assert plan.largest_batch(fits, up_to, step) == expected, (threshold, asked)
    assert all(b % step == 0 and step <= b <= up_to for b in asked), asked
    assert len(asked) <= math.ceil(math.log2(up_to // step)) + 2, asked


@pytest.mark.parametrize("step", [1, 3])
def test_largest_batch_searches_from_a_guess(step):
  """From any guess, against every threshold: the same answer as without one, each batch asked
  a multiple of `step` within the bound and asked once; a right guess costs 2 calls (the guess
  and the batch after it), a guess off by d about 2 log2(d) + 2."""
  up_to = 40
  for threshold in range(0, 45):
    expected = max([b for b in range(step, up_to + 1, step) if b <= threshold], default=0)
    for guess in range(1, 46):
      asked = []

      def fits(batch, threshold=threshold, asked=asked):
        asked.append(batch)
        return batch <= threshold

      assert plan.largest_batch(fits, up_to, step, guess=guess) == expected, (threshold, guess)
      assert all(b % step == 0 and step <= b <= up_to for b in asked), asked
      assert len(set(asked)) == len(asked), asked
      distance = abs(min(max(guess // step, 1), up_to // step) - max(expected // step, 1)) + 1
      assert len(asked) <= 2 * math.ceil(math.log2(distance)) + 2, (threshold, guess, asked)
      if expected and guess == expected and expected + step <= up_to:
        assert asked == [expected, expected + step]


def test_largest_batch_needs_a_topology(capsys):
  with pytest.raises(SystemExit) as exited:
    plan.main(["--gin_file=configs/demo/infer.gin", "--largest_batch_up_to=8"])
  assert exited.value.code == 2
  assert "--largest_batch_up_to takes a positive batch size and needs --compile_for" in (
      capsys.readouterr().err)
