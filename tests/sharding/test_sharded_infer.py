"""The path `python -m spec_decode.infer` runs, on 8 simulated CPU devices.

`decode_layout.DecodeLayout` is the one place a decode is compiled and its parameters placed;
infer uses it with any partitioner. Checked here on a tiny random T5 pair (demo vocabulary,
T5X TensorStore checkpoints):
  * `python -m spec_decode.infer` itself (subprocesses) at num_partitions 1 (the data-parallel
    mesh (8, 1)), 2, 4 and 8 gives the predictions, scores and statistics of the single-device
    run, greedy and sampled with a fixed seed (baseline included), and so does a run as two
    processes of 4 devices each (one JAX distributed system), whose process 0 alone writes;
  * restored parameters have T5X's shardings, model-split kernels are split on every device, the
    draft is replicated, and each device holds exactly the plan's parameter and cache bytes;
  * the compiled decode loop's only collectives are the model-split matmuls' all-reduces;
  * the benchmark's decoders (`bench.PairDecoders`, the same layout) on a (2, 4) mesh give the
    decodes and statistics of one device, greedy, sampled and the sampled baseline, and their
    compiled loop has exactly infer's collectives;
  * a run over the memory budget, or with a batch the 'data' axis does not divide, is refused
    with one line before anything is restored.
"""

import dataclasses
import functools
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
from collections.abc import Sequence

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from spec_decode import bench
from spec_decode.bench import pairs as bench_pairs
from spec_decode.infer import outputs as infer_outputs
from spec_decode import models
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode import paths
from spec_decode import plan
from spec_decode.engine import decoding
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.t5 import vocab
import tiny_t5
import xla_flags
from test_sharded_decoding import comparable_loop_collectives

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB_FILE = paths.DEMO_ASSETS / "spm_ende_8k.model"
# heads, joined_kv, mlp and the vocabulary (8000) are divisible by 8.
TARGET = network.T5Config(vocab_size=8000, emb_dim=16, num_heads=8, head_dim=2,
                          num_encoder_layers=1, num_decoder_layers=1, mlp_dim=16,
                          mlp_activations=("gelu", "linear"), dropout_rate=0.0,
                          logits_via_embedding=False, dtype="float32")
DRAFT = dataclasses.replace(TARGET, num_heads=4, head_dim=4)
GAMMA = 3  # as tiny_t5.write_run_gin binds it for the infer runs
LOGIT_SCALE = 8.0
DRAFT_NOISE = 0.1
BATCH_SIZE, INPUT_LENGTH, TARGET_LENGTH = 8, 12, 10
TEXTS = ["Where is the station?", "The cat sleeps.", "I would like a coffee, please.",
         "It is raining again today.", "Good morning!", "How much does this cost?",
         "We are going to the sea tomorrow.", "She reads a book.", "Thank you very much.",
         "The museum opens at nine."]  # two batches of 8, the second one padded
NUM_PARTITIONS = (1, 2, 4, 8)
NUM_PARTITIONS_BINDING = "partitioning.PjitPartitioner.num_partitions"  # T5X's
MODES = {"greedy": 0.0, "sampled": 1.0}
# T5X's rules for every parameter, by its last path entries (rules: batch->data, vocab, mlp,
# heads, joined_kv->model, embed/kv/relpos_buckets->None).
T5X_SPECS = {("key", "kernel"): PartitionSpec(None, "model"),
             ("query", "kernel"): PartitionSpec(None, "model"),
             ("value", "kernel"): PartitionSpec(None, "model"),
             ("out", "kernel"): PartitionSpec("model", None),
             ("wi_0", "kernel"): PartitionSpec(None, "model"),
             ("wi_1", "kernel"): PartitionSpec(None, "model"),
             ("wo", "kernel"): PartitionSpec("model", None),
             ("logits_dense", "kernel"): PartitionSpec(None, "model"),
             ("relpos_bias", "rel_embedding"): PartitionSpec("model", None),
             ("token_embedder", "embedding"): PartitionSpec("model", None),
             "scale": PartitionSpec(None)}


def _random_params(config: network.T5Config, seed: int) -> dict:
  """Random parameters whose output distributions are peaked (logits of standard deviation
  about LOGIT_SCALE): over a flat distribution on 8000 ids, float rounding that differs
  between meshes would move a sampled token across a CDF boundary now and then."""
  rng = np.random.default_rng(seed)

  def draw(path: tuple, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
    if len(leaf.shape) == 1:  # layer norm scales around 1
      return (1.0 + 0.1 * rng.standard_normal(leaf.shape)).astype(np.float32)
    scale = LOGIT_SCALE if path[-2].key == "logits_dense" else 1.0
    return (scale * rng.standard_normal(leaf.shape) / np.sqrt(leaf.shape[0])).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, t5x_format.expected_param_shapes(config))


def _draft_params(target_params: dict) -> dict:
  """The target's parameters, perturbed, in the draft's layout (4 heads of 4 where the target
  has 8 of 2: the same joined_kv kernels): drafts are often accepted, not always."""
  rng = np.random.default_rng(2)
  params = jax.tree_util.tree_map(
      lambda x: (x + DRAFT_NOISE * np.std(x) * rng.standard_normal(x.shape)).astype(np.float32),
      target_params)
  for stack in (params["encoder"], params["decoder"]):
    stack["relpos_bias"]["rel_embedding"] = stack["relpos_bias"]["rel_embedding"][::2]
  return params


@dataclasses.dataclass(frozen=True)
class Setup:
  directory: pathlib.Path
  run_gin: str
  target_params: dict
  draft_params: dict
  target_checkpoint: str
  draft_checkpoint: str
  hf_folder: str


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
  directory = tmp_path_factory.mktemp("sharded_infer")
  target = tiny_t5.write_model_files(directory, "target", TARGET, _random_params(TARGET, 1))
  draft = tiny_t5.write_model_files(directory, "draft", DRAFT, _draft_params(target.params))
  run_gin = tiny_t5.write_run_gin(
      directory / "run.gin", target, draft, VOCAB_FILE, extra_ids=0,
      task_feature_lengths={"inputs": INPUT_LENGTH, "targets": TARGET_LENGTH},
      batch_size=BATCH_SIZE, extra=f"""
MIXTURE_OR_TASK_NAME = None
infer.DatasetConfig.texts = {TEXTS!r}
SEED = 5
""")
  return Setup(directory, run_gin, target.params, draft.params, target.t5x_checkpoint,
               draft.t5x_checkpoint, target.hf_folder)


# --------------------------------------------------------------------------- infer end to end


def _start_infer(setup: Setup, name: str, num_devices: int, num_partitions: int,
                 temperature: float, flags: Sequence[str] = ()) -> subprocess.Popen:
  """`python -m spec_decode.infer` on `num_devices` CPU devices, writing to directory `name`
  (`flags`: more command-line flags)."""
  env = dict(os.environ, XLA_FLAGS=xla_flags.with_devices(num_devices))
  env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + (
      [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  return subprocess.Popen(
      [sys.executable, "-m", "spec_decode.infer", f"--gin_file={setup.run_gin}",
       f"--gin.{NUM_PARTITIONS_BINDING}={num_partitions}",
       f"--gin.INFER_OUTPUT_DIR='{setup.directory / name}'",
       f"--gin.TEMPERATURE={temperature}",
       # The baseline once, greedy: it must then reproduce the speculative outputs.
       f"--gin.COMPARE_WITH_BASELINE={temperature == 0}", *flags],
      env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def infer_runs(setup):
  """{(mode, num_partitions or 'one device'): (records, summary)} of every run, run a few at a
  time (each is mostly one compile, single-threaded)."""
  pending = [(mode, key) for mode in MODES for key in ("one device",) + NUM_PARTITIONS]
  concurrency = max(2, min(4, os.cpu_count() or 1))
  results, running = {}, []
  while pending or running:
    while pending and len(running) < concurrency:
      mode, key = pending.pop(0)
      name = f"{mode}_{'1dev' if key == 'one device' else f'p{key}'}"
      devices, num_partitions = (1, 1) if key == "one device" else (8, key)
      running.append(((mode, key), name,
                      _start_infer(setup, name, devices, num_partitions, MODES[mode])))
    run_key, name, process = running.pop(0)
    results[run_key] = _finished_run(setup, name, process)
  return results


def _finished_run(setup: Setup, name: str, process: subprocess.Popen) -> tuple[list, dict]:
  """(records, summary) that the infer `process` wrote into directory `name`."""
  output, _ = process.communicate(timeout=600)
  assert process.returncode == 0, f"{name} failed:\n{output}"
  out = setup.directory / name
  records = [json.loads(line) for line in
             (out / infer_outputs.PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()]
  return records, json.loads((out / infer_outputs.SUMMARY_FILE).read_text())


def _assert_same_numbers(got: dict, want: dict, what: str) -> None:
  assert set(got) == set(want), what
  for name, value in want.items():
    if isinstance(value, float):
      assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-5), f"{what}: {name}"
    else:
      assert got[name] == value, f"{what}: {name}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_partitions", NUM_PARTITIONS)
def test_infer_matches_one_device(infer_runs, mode, num_partitions):
  _assert_same_run(infer_runs[mode, num_partitions], infer_runs[mode, "one device"])


def _assert_same_run(got: tuple[list, dict], want: tuple[list, dict]) -> None:
  """Two infer runs' (records, summary) agree: texts exactly, numbers to float rounding."""
  (records, summary), (want_records, want_summary) = got, want
  assert len(records) == len(want_records) == len(TEXTS)
  for i, (record, want) in enumerate(zip(records, want_records)):
    assert set(record) == set(want)
    for key in ("inputs", "prediction", "baseline_prediction", "identical"):
      assert record.get(key) == want.get(key), (i, key)
    assert record["score"] == pytest.approx(want["score"], rel=1e-5, abs=1e-5)
    _assert_same_numbers(record["stats"], want["stats"], f"example {i}")
  for name in decoding.SpeculativeStats.counter_names():
    assert summary[name] == pytest.approx(want_summary[name], rel=1e-6), name
  assert summary["alpha"] == pytest.approx(want_summary["alpha"], rel=1e-6)
  assert summary.get("identical_outputs") == want_summary.get("identical_outputs")


def test_infer_runs_are_not_trivial(infer_runs):
  """Greedy speculative decoding reproduces the baseline; drafts are both accepted and
  rejected; sampling changes the outputs."""
  greedy, _ = infer_runs["greedy", "one device"]
  sampled, _ = infer_runs["sampled", "one device"]
  assert all(r["identical"] for r in greedy)
  assert [r["prediction"] for r in greedy] != [r["prediction"] for r in sampled]
  for records in (greedy, sampled):
    accepted = sum(r["stats"]["accepted_tokens"] for r in records)
    assert 0 < accepted < sum(r["stats"]["drafted_tokens"] for r in records)


def test_two_processes_match_one_device(setup, infer_runs):
  """`python -m spec_decode.infer` as one distributed system of 2 processes with 4 CPU devices
  each (T5X's --multiprocess_gpu flags; num_partitions=2: the (4, 2) mesh spans both) gives the
  predictions of the single-device run, and only process 0 writes them."""
  with socket.socket() as probe:  # a free port for the coordinator
    probe.bind(("localhost", 0))
    port = probe.getsockname()[1]
  processes = [_start_infer(setup, f"two_processes_{index}", 4, 2, MODES["sampled"], [
      "--multiprocess_gpu", f"--coordinator_address=localhost:{port}", "--process_count=2",
      f"--process_index={index}"]) for index in range(2)]
  output, _ = processes[1].communicate(timeout=600)
  assert processes[1].returncode == 0, f"process 1 failed:\n{output}"
  _assert_same_run(_finished_run(setup, "two_processes_0", processes[0]),
                   infer_runs["sampled", "one device"])
  assert not (setup.directory / "two_processes_1").exists()


# --------------------------------------------------------------------------- restore and plan


def _layout(num_partitions: int) -> decode_layout.DecodeLayout:
  return decode_layout.decode_layout(partitioning.PjitPartitioner(num_partitions=num_partitions),
                                    TARGET, DRAFT)


def _expected_spec(path: tuple) -> PartitionSpec:
  keys = tuple(entry.key for entry in path)
  return T5X_SPECS["scale"] if keys[-1] == "scale" else T5X_SPECS[keys[-2:]]


@pytest.mark.parametrize("source", ["t5x", "hf"])
@pytest.mark.parametrize("num_partitions", [2, 8])
def test_restored_parameters_follow_t5x_rules(setup, num_partitions, source):
  layout = _layout(num_partitions)
  path = setup.target_checkpoint if source == "t5x" else setup.hf_folder
  params = layout.restore("target", network.Transformer(TARGET), path)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  assert len(leaves) == len(jax.tree_util.tree_leaves(setup.target_params))
  for (path_, array), expected in zip(leaves, jax.tree_util.tree_leaves(setup.target_params)):
    name = jax.tree_util.keystr(path_)
    spec = _expected_spec(path_)
    assert array.sharding.is_equivalent_to(NamedSharding(layout.mesh, spec), array.ndim), name
    for shard in array.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index], err_msg=name)
      if "model" in spec:  # model-split: no device holds the whole kernel
        assert shard.data.size * num_partitions == array.size, name
  draft_params = layout.restore("draft", network.Transformer(DRAFT), setup.draft_checkpoint)
  for array in jax.tree_util.tree_leaves(draft_params):
    assert len(array.addressable_shards) == 8
    assert all(shard.data.shape == array.shape for shard in array.addressable_shards)


def _bytes_per_device(arrays) -> dict:
  totals = {}
  for array in arrays:
    for shard in array.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals


@pytest.mark.parametrize("num_partitions", [1, 4, 8])
def test_each_device_holds_the_plans_bytes(setup, num_partitions):
  layout = _layout(num_partitions)
  target_plan, draft_plan = plan.layout_bytes(layout, BATCH_SIZE, INPUT_LENGTH, TARGET_LENGTH)
  before = jax.live_arrays()  # held: their ids stay unique
  params = layout.restore("target", network.Transformer(TARGET), setup.target_checkpoint)
  draft_params = layout.restore("draft", network.Transformer(DRAFT), setup.draft_checkpoint)
  known = {id(array) for array in before}
  # Everything the restore left on the devices, not only the arrays it returned.
  restored = [array for array in jax.live_arrays() if id(array) not in known]
  assert _bytes_per_device(restored) == {device: target_plan.params + draft_plan.params
                                         for device in layout.mesh.devices.flat}
  assert _bytes_per_device(jax.tree_util.tree_leaves(params)) == {
      device: target_plan.params for device in layout.mesh.devices.flat}

  # The caches as the decode creates them (pinned by the layout).
  tokens = layout.put_batch(np.ones((BATCH_SIZE, INPUT_LENGTH), np.int32))
  caches = jax.jit(lambda params, draft_params, tokens: (
      layout.init_cache("target", TARGET, params, tokens, TARGET_LENGTH),
      layout.init_cache("draft", DRAFT, draft_params, tokens, TARGET_LENGTH)))(
          params, draft_params, tokens)
  for cache, model_plan in zip(caches, (target_plan, draft_plan)):
    assert _bytes_per_device(jax.tree_util.tree_leaves(cache)) == {
        device: model_plan.cache for device in layout.mesh.devices.flat}


# --------------------------------------------------------------------------- the compiled loop


LOOP_MESH = (2, 4)


@pytest.fixture(scope="module")
def infer_loop(setup):
  """(layout, target params, draft params, `comparable_loop_collectives`) of the loop infer
  compiles: speculative, sampled, on LOOP_MESH."""
  layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=LOOP_MESH),
                                       TARGET, DRAFT)
  vocabulary = vocab.SentencePieceVocabulary(str(VOCAB_FILE))
  model = models.SpeculativeEncoderDecoderModel(
      network.Transformer(TARGET), vocabulary, vocabulary,
      draft_checkpoint_path=setup.draft_checkpoint, temperature=1.0, gamma=GAMMA)
  params = layout.restore("target", model.module, setup.target_checkpoint)
  draft_params = layout.restore("draft", model.draft_module, setup.draft_checkpoint)
  batch = {"encoder_input_tokens": np.ones((BATCH_SIZE, INPUT_LENGTH), np.int32),
           "decoder_input_tokens": np.zeros((BATCH_SIZE, TARGET_LENGTH), np.int32)}
  compiled = layout.partition_predict(model.decoder, vocabulary.eos_id).lower(
      params, draft_params, layout.put_batch(batch),
      layout.put_replicated(jax.random.PRNGKey(0))).compile()
  return layout, params, draft_params, comparable_loop_collectives(compiled)


def test_infer_loop_only_all_reduces_in_its_model_calls(infer_loop):
  """The loop infer compiles: each model call's only collectives are its 'model'-split
  matmuls' all-reduces (attention out, mlp wo, embedding), and nothing is permuted or exchanged
  all-to-all (the rest: reductions over the vocabulary-split logits)."""
  layout, params, draft_params, found = infer_loop
  # The op's place in the parameter tree: its name from the first 'decoder/' scope on (the
  # methods it was called through come before).
  model_ops = {(op, re.search(r"(?:^|/)(decoder/.*)", name).group(1)) for op, name in found
               if "decode_chunk" in name}
  assert model_ops == {
      ("all-reduce", "decoder/token_embedder/jit(_take)/gather"),
      ("all-reduce", "decoder/layers_0/self_attention.attend/out/dot_general"),
      ("all-reduce", "decoder/layers_0/encoder_decoder_attention.attend/out/dot_general"),
      ("all-reduce", "decoder/layers_0/mlp/wo/dot_general")}, model_ops
  assert not [c for c in found if c[0] in ("all-to-all", "collective-permute")], found



# --------------------------------------------------------------------------- the bench's decoders


BENCH_VARIANTS = {"greedy": bench.Variant(0.0, gamma=GAMMA),
                  "sampled": bench.Variant(1.0, gamma=GAMMA),
                  "sampled baseline": bench.Variant(1.0)}


@pytest.fixture(scope="module")
def bench_runs(setup):
  """{(variant name, 'one device' | LOOP_MESH): bench.RunOutput} of the bench's PairDecoders
  on the test pair (batch BATCH_SIZE, repetition 1: its inputs and rng), and the PairDecoders
  on LOOP_MESH."""
  pair = bench.Pair(
      "tiny", bench.Model("target", network.Transformer(TARGET), setup.target_params),
      bench.Model("draft", network.Transformer(DRAFT), setup.draft_params),
      bench_pairs.random_inputs(TARGET.vocab_size, INPUT_LENGTH, 2 * BATCH_SIZE, seed=3),
      eos_id=vocab.EOS_ID, max_decode_len=TARGET_LENGTH, description="test pair")
  decoders = {"one device": bench.PairDecoders(pair, {}),
              LOOP_MESH: bench.PairDecoders(pair, {}, partitioning.PjitPartitioner(
                  mesh_shape=LOOP_MESH))}
  runs = {(name, mesh): decoders[mesh].run(variant, 1, BATCH_SIZE)
          for name, variant in BENCH_VARIANTS.items() for mesh in decoders}
  return runs, decoders[LOOP_MESH]


@pytest.mark.parametrize("name", BENCH_VARIANTS)
def test_bench_decoders_on_a_mesh_match_one_device(bench_runs, name):
  runs, _ = bench_runs
  got, want = runs[name, LOOP_MESH], runs[name, "one device"]
  np.testing.assert_array_equal(got.decodes, want.decodes)
  assert got.tokens == want.tokens
  if want.stats is None:
    assert got.stats is None
  else:
    _assert_same_numbers(got.stats, want.stats, name)


def test_bench_runs_are_not_trivial(bench_runs):
  runs, _ = bench_runs
  greedy, sampled = runs["greedy", "one device"], runs["sampled", "one device"]
  assert not np.array_equal(greedy.decodes, sampled.decodes)
  for run in (greedy, sampled):
    assert 0 < run.stats["accepted_tokens"] < run.stats["drafted_tokens"]


def test_bench_loop_has_infers_collectives(bench_runs, infer_loop):
  _, decoders = bench_runs
  lowered = decoders.lower_loop(BENCH_VARIANTS["sampled"], 1, BATCH_SIZE)
  assert comparable_loop_collectives(lowered.compile()) == infer_loop[3]


# --------------------------------------------------------------------------- refusals


@pytest.fixture
def run_main(capsys, monkeypatch):
  """infer.main in this process, failing if anything is restored: (status, stderr lines)."""

  def no_restore(*args, **kwargs):
    raise AssertionError("restored before refusing")

  monkeypatch.setattr(decode_layout, "restore_params", no_restore)
  return functools.partial(tiny_t5.run_infer_main, capsys=capsys)


def test_run_over_the_memory_budget_is_refused_before_restore(setup, run_main, tmp_path):
  out = tmp_path / "out"
  status, stderr = run_main([f"--gin_file={setup.run_gin}", f"--gin.{NUM_PARTITIONS_BINDING}=2",
                             "--gin.DEVICE_MEMORY_GIB=0.0001", f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 2 and len(stderr) == 1, stderr
  target_plan, draft_plan = plan.layout_bytes(_layout(2), BATCH_SIZE, INPUT_LENGTH,
                                              TARGET_LENGTH)
  needed = target_plan.total + draft_plan.total
  assert stderr[0].startswith("spec_decode.infer: error: num_partitions=2 (mesh {'data': 4, "
                              "'model': 2}) needs " + plan.format_bytes(needed)), stderr
  for n in (target_plan.params, target_plan.cache, draft_plan.params, draft_plan.cache):
    assert plan.format_bytes(n) in stderr[0]
  assert "more than the 104.86 KiB per device budget" in stderr[0]
  assert not out.exists()


def test_batch_the_data_axis_does_not_divide_is_refused(setup, run_main, tmp_path):
  out = tmp_path / "out"
  status, stderr = run_main([f"--gin_file={setup.run_gin}", f"--gin.{NUM_PARTITIONS_BINDING}=1",
                             "--gin.BATCH_SIZE=4", f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 2 and stderr == [
      "spec_decode.infer: error: BATCH_SIZE=4 is not a multiple of the mesh's 'data' axis "
      "({'data': 8, 'model': 1}, num_partitions=1): use 8"]
  status, stderr = run_main([f"--gin_file={setup.run_gin}", f"--gin.{NUM_PARTITIONS_BINDING}=2",
                             "--gin.BATCH_SIZE=6", f"--gin.INFER_OUTPUT_DIR='{out}'"])
  assert status == 2 and stderr[0].endswith("num_partitions=2): use 4 or 8"), stderr
  assert not out.exists()
