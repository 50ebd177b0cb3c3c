"""Decodes compiled for a TPU topology from this CPU host (`spec_decode.aot`, libtpu's
compile-only client): the speculative decode, its baseline and speculative beam search compile
for TPU v4 devices with no CPU custom call (the platform follows the devices, not the host), as
does a decoder-only language model's run, XLA's memory analysis agrees with the plan's formula,
a T5 and a decoder-only decode hold no copy of a decoder kernel through their loops (the TPU's
decoder projections) and keep their temporaries to the bound of their baselines', the plan
bisects to the largest batch that fits, and the command reports it."""

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import test_cpu_kernels
import tiny_t5
from spec_decode import core
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode import paths
from spec_decode import plan
from spec_decode.runtime import platforms
from spec_decode.aot import cli
from spec_decode.aot import placement
from spec_decode.aot import programs
from spec_decode.aot import report
from spec_decode.aot import runs
from spec_decode.aot import topologies
from spec_decode.t5 import cpu_kernels
from spec_decode.t5 import layers
from spec_decode.t5 import network

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is absent
    return False


needs_tpu_compiler = pytest.mark.skipif(
    not _installed("libtpu"),
    reason="needs libtpu, XLA's TPU compiler: pip install 'jax[tpu]' (Python 3.12; "
           "scripts/test_newest.sh installs it)")

VOCAB_SIZE = 512
# Small, but in whole TPU tiles (128 lanes): XLA:TPU pads an array to its tiles, so a model of
# 8- or 16-wide matrices takes several times its bytes there, which no formula of shapes sees.
TPU_SHAPED = dict(tiny_t5.SHRINK, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256)
TARGET = tiny_t5.tiny_config(VOCAB_SIZE, TPU_SHAPED)
DRAFT = tiny_t5.tiny_config(VOCAB_SIZE, dict(TPU_SHAPED, mlp_dim=128))
BATCH, INPUT_LENGTH, TARGET_LENGTH = 2, 16, 12
DECODERS = {
    "speculative_sample": dict(gamma=3, temperature=1.0),
    "speculative_beam_search": dict(gamma=2, draft_beams=4),
}


@pytest.fixture(scope="module")
def tpu_devices():
  return topologies.topology("v4-8").devices()


@pytest.fixture(scope="module")
def layout(tpu_devices):
  """A ('data', 'model') = (1, 2) mesh over two of a v4-8's chips."""
  partitioner = partitioning.PjitPartitioner(num_partitions=2, devices=tpu_devices[:2])
  return decode_layout.decode_layout(partitioner, TARGET, DRAFT)


@needs_tpu_compiler
def test_the_platform_follows_the_devices_not_the_host(layout):
  """TPU devices of a topology get the TPU's products (XLA's) on whatever host compiles for
  them (this suite's CPU, a GPU host)."""
  assert layout.platform == platforms.Platform("tpu", 2)
  assert layout.platform.module(TARGET).ops == platforms.TPU_OPS


def _compile(layout, decoder, num_decodes=1):
  return programs.predict_program(layout, decoder, eos_id=1, num_decodes=num_decodes,
                                  batch_size=BATCH, input_length=INPUT_LENGTH,
                                  target_length=TARGET_LENGTH)


@needs_tpu_compiler
@pytest.mark.parametrize("loop", sorted(DECODERS))
def test_decodes_compile_for_tpu_with_no_cpu_custom_call(layout, loop):
  """The decode and its baseline, as infer compiles them: TPU programs, their arguments the
  plan formula's parameters (plus the batch and rng), caches and activations in temporaries,
  and inside the loop no collective but all-reduces."""
  num_decodes = 4 if loop == "speculative_beam_search" else 1
  speculative = core.Decoder.create(loop, network.Transformer(TARGET), network.Transformer(DRAFT),
                                    **DECODERS[loop])
  target, draft = plan.layout_bytes(layout, BATCH * num_decodes, INPUT_LENGTH, TARGET_LENGTH)
  inputs = BATCH * (INPUT_LENGTH + TARGET_LENGTH) * 4 + 8  # int32 tokens and the rng
  for decoder, params in ((speculative, target.params + draft.params),
                          (speculative.baseline(), target.params)):
    program = _compile(layout, decoder, num_decodes)
    assert not [name for name in program.custom_calls if name.startswith("spec_decode")]
    # The formula's shapes against XLA's buffers: within 2% (the vectors' tile padding).
    assert abs(program.argument_bytes - (params + inputs)) <= 0.02 * params, (
        program.argument_bytes, params, inputs)
    assert program.temp_bytes > 0 and program.code_bytes > 0
    # Never a permute or an all-to-all. Beam search's top-k runs over beams x vocabulary,
    # which 'model' splits: each step gathers the [B, beams, V] log-probs (T5X's beam_search
    # compiles to the same). Sampling: the matmuls' all-reduces, and the draw's block sums
    # ([B, blocks] per shard), which XLA:TPU sums across shards by gathering them.
    collectives = program.loop_collectives
    assert {op for op, _ in collectives} <= {"all-reduce", "all-gather"}, collectives
    if "beam" not in decoder.loop_name:
      gathered = [name for op, name in collectives if op == "all-gather"]
      assert all(name.endswith("reduce_sum") for name in gathered), gathered


def test_the_same_decode_on_this_cpu_holds_the_kernel():
  """The control: on the host's one CPU device the same program holds the CPU custom call that
  the TPU program must not (so the check above can fail). The host's CPU, whatever JAX's
  default backend is."""
  test_cpu_kernels.require_kernel()
  cpu = decode_layout.decode_layout(
      partitioning.PjitPartitioner(mesh_shape=(1, 1), devices=jax.devices("cpu")[:1]), TARGET,
      DRAFT)
  decoder = core.Decoder.create("speculative_sample", network.Transformer(TARGET),
                                network.Transformer(DRAFT), gamma=3, temperature=1.0)
  assert cpu_kernels.TARGET_NAME in _compile(cpu, decoder).custom_calls


def _decoder_kernels(config: network.NetworkConfig, tree: str) -> set[str]:
  """The kernels the decode loop projects its fed tokens with: each decoder layer's
  self-attention query, key and value and, in an encoder-decoder, its cross-attention query."""
  blocks = [("self_attention", ("query", "key", "value"))]
  if not network.is_decoder_only(config):
    blocks.append(("encoder_decoder_attention", ("query",)))
  return {f"{tree}/decoder/layers_{i}/{block}/{name}/kernel"
          for i in range(config.num_decoder_layers) for block, names in blocks
          for name in names}


# Decodes on one v4 chip whose decoder kernels are large beside their loop's small state (a
# tiny model's state, in whole TPU tiles, would hide copies of 128-wide kernels): gamma 7,
# bfloat16 as the Table 2 runs, a target of two decoder layers and a draft of one, a T5 pair and
# a decoder-only pair (tied output projection in the target, as T5X's decoder-only example).
COPY_SHAPED = dict(dtype="bfloat16", emb_dim=512, num_heads=8, head_dim=64, mlp_dim=1024)
COPY_PAIRS = {
    "t5": (tiny_t5.tiny_config(VOCAB_SIZE, dict(TPU_SHAPED, **COPY_SHAPED,
                                                num_decoder_layers=2)),
           tiny_t5.tiny_config(VOCAB_SIZE, dict(TPU_SHAPED, **dict(COPY_SHAPED, mlp_dim=512)))),
    "decoder_only": tuple(
        network.DecoderOnlyConfig(vocab_size=VOCAB_SIZE, mlp_activations=("gelu", "linear"),
                                  dropout_rate=0.0, **shape)
        for shape in (dict(COPY_SHAPED, num_layers=2, logits_via_embedding=True),
                      dict(COPY_SHAPED, num_layers=1, mlp_dim=512))),
}


def _one_chip_decode(family: str, input_length: int = INPUT_LENGTH) -> dict:
  """The decode of COPY_PAIRS[family] with the products `platforms.TPU_OPS` gives it now:
  {'relaid': the weights copied before its loop and held through it, name: bytes;
  'relaid_state': of the decode and of its baseline, the computed values copied into another
  layout at the loop's entry, [(shape, bytes)]; 'temp_bytes': its temporaries; 'bound':
  `report.temporaries_bound` against its baseline's}."""
  target, draft = COPY_PAIRS[family]
  topology = topologies.topology("v4:1x1x1")
  one_chip = decode_layout.decode_layout(
      partitioning.PjitPartitioner(num_partitions=1, devices=topology.devices()), target, draft)
  decoder = core.Decoder.create("speculative_sample", network.module_of(target),
                                network.module_of(draft), gamma=7, temperature=0.0)
  decode, baseline = (
      programs.predict_program(one_chip, each, eos_id=1, num_decodes=1, batch_size=1,
                               input_length=input_length, target_length=TARGET_LENGTH,
                               param_dtype="bfloat16")
      for each in (decoder, decoder.baseline()))
  target_bytes, draft_bytes = plan.layout_bytes(
      one_chip, 1, input_length, network.decode_length(target, input_length, TARGET_LENGTH),
      "bfloat16")
  bound = report.temporaries_bound(
      report.compare_with_plan(decode, target_bytes, draft_bytes, topology.chip),
      report.compare_with_plan(baseline, target_bytes, None, topology.chip))
  return {"relaid": dict(decode.loop_relaid_parameters),
          "relaid_state": {"decode": list(decode.loop_relaid_state),
                           "baseline": list(baseline.loop_relaid_state)},
          "temp_bytes": decode.temp_bytes, "bound": bound}


def _weights(relaid: dict) -> dict:
  """The weight matrices among `relaid`: all but the relative-position tables, [heads,
  buckets], which XLA:TPU lays out anew for the loop at a few hundred bytes."""
  return {name: size for name, size in relaid.items() if not name.endswith("/rel_embedding")}


@needs_tpu_compiler
@pytest.mark.parametrize("family", COPY_PAIRS)
def test_the_tpu_decode_copies_no_decoder_weight_for_its_loop(monkeypatch, family):
  """With the TPU's products no weight matrix is copied before the loop and held through it;
  with plain XLA (the control, what TPU programs took before) XLA:TPU makes transposed copies
  of exactly the decoder's projection kernels of both models, which a T5.1.1-XXL decode holds
  as 3 GiB."""
  assert _weights(_one_chip_decode(family)["relaid"]) == {}
  monkeypatch.setattr(platforms, "TPU_OPS", network.Ops())
  relaid = _weights(_one_chip_decode(family)["relaid"])
  target, draft = COPY_PAIRS[family]
  assert set(relaid) == (_decoder_kernels(target, "params")
                         | _decoder_kernels(draft, "draft_params"))
  joined_kv = COPY_SHAPED["num_heads"] * COPY_SHAPED["head_dim"]
  assert set(relaid.values()) == {COPY_SHAPED["emb_dim"] * joined_kv * 2}  # bfloat16 [E, H*D]


@needs_tpu_compiler
def test_the_tpu_decode_relays_no_cache_at_its_loops_entry(monkeypatch):
  """The cross-attention caches, held as XLA:TPU's prefill writes them ([B, H, D, Le],
  `spec_decode.t5.layers.to_cross_cache`), enter the loops of the speculative decode and of its
  baseline as they are. Held as [B, Le, H, D] (the control: the cache before), the prefill still
  writes them length-minor and XLA:TPU copies them into the loop's layout at its entry, both
  live there (48 MiB a row of batch for T5.1.1-XXL on a v4-8). 512 encoder tokens, as Table 2's
  inputs: tiles hide a short encoder's layout."""
  found = _one_chip_decode("t5", input_length=512)["relaid_state"]
  assert found == {"decode": [], "baseline": []}
  monkeypatch.setattr(layers, "to_cross_cache", lambda projected: projected)
  monkeypatch.setattr(layers, "from_cross_cache", lambda cached: cached)
  control = _one_chip_decode("t5", input_length=512)["relaid_state"]
  target, _ = COPY_PAIRS["t5"]
  cross_cache = f"bf16[1,512,{target.num_heads},{target.head_dim}]"
  assert {shape for shape, _ in control["baseline"]} == {cross_cache}, control
  assert {shape for shape, _ in control["decode"]} == {cross_cache}, control


# What a speculative loop's own small state (tokens, positions, the draft's probabilities, each
# in whole TPU tiles) takes beyond its baseline's, whatever the weights' size: 0.5-1.7 MiB in
# the tiny models compiled with CMEM prefetching off; beside a Table 2 row's baseline, hundreds
# of MiB, the bound's 10% covers it.
LOOP_STATE_BYTES = 2 * 2**20


@needs_tpu_compiler
def test_the_tpu_decodes_temporaries_keep_to_the_bound_of_their_baselines():
  """Each pair's decode takes at most `report.temporaries_bound` (plus the small state above) of
  temporaries; with plain XLA's products (the control) the held copies (3-6 MiB) take it past
  the bound. Compiled with XLA:TPU's CMEM prefetching off, in a process of its own (libtpu
  reads its flags once, when it starts): its prefetches into a v4 chip's 128 MiB CMEM count
  among the temporaries and take every weight of models this small, the draft's as well
  (docs/TPU_COMPILE.md), which would be the difference and hide the copies."""
  code = ("import json, test_aot\n"
          "from spec_decode.runtime import platforms\n"
          "from spec_decode.t5 import network\n"
          "found = {name: [test_aot._one_chip_decode(name)] for name in test_aot.COPY_PAIRS}\n"
          "platforms.TPU_OPS = network.Ops()\n"
          "for name in found: found[name].append(test_aot._one_chip_decode(name))\n"
          "print(json.dumps(found))\n")
  tests = str(paths.ROOT / "tests")
  environment = {
      **os.environ, "LIBTPU_INIT_ARGS": "--xla_tpu_cmem_memory_space_assignment=false",
      "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
  done = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, env=environment,
                        capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  for family, (tpu, plain) in json.loads(done.stdout.splitlines()[-1]).items():
    assert _weights(tpu["relaid"]) == {}, family
    assert tpu["temp_bytes"] <= tpu["bound"] + LOOP_STATE_BYTES, (family, tpu)
    assert _weights(plain["relaid"]), family
    assert plain["temp_bytes"] > plain["bound"] + LOOP_STATE_BYTES, (family, plain)


@needs_tpu_compiler
def test_single_calls_report_their_costs(layout):
  one = programs.call_program(layout, "target", batch_rows=BATCH, input_length=INPUT_LENGTH,
                              max_decode_len=TARGET_LENGTH, num_tokens=1)
  four = programs.call_program(layout, "target", batch_rows=BATCH, input_length=INPUT_LENGTH,
                               max_decode_len=TARGET_LENGTH, num_tokens=4)
  assert 3 * one.flops < four.flops < 5 * one.flops  # the products grow with the fed tokens
  # The same weights and cache: only the fed tokens [B, k] grow (within a tile's padding).
  assert 0 <= four.argument_bytes - one.argument_bytes <= 4096


@needs_tpu_compiler
def test_tree_calls_compile_with_their_positions_and_mask(layout):
  """A tree call (speculative_tree_sample's) is its own program: the contract's token positions
  [B, k] and mask [B, k, k] are arguments the model reads (its relative-position bias is taken
  per pair of fed tokens), on the chain call's weights and cache; its products grow with k."""
  calls = {(k, tree): programs.call_program(
      layout, "target", batch_rows=BATCH, input_length=INPUT_LENGTH,
      max_decode_len=TARGET_LENGTH, num_tokens=k, tree=tree) for k in (4, 16) for tree in
      (False, True)}
  for k in (4, 16):
    chain, tree = calls[k, False], calls[k, True]
    assert tree.name == f"target tree call k={k}"
    assert 0 < tree.argument_bytes - chain.argument_bytes <= 8192
    assert chain.flops < tree.flops < 1.1 * chain.flops
  assert 3 * calls[4, True].flops < calls[16, True].flops < 5 * calls[4, True].flops


@needs_tpu_compiler
def test_the_command_compiles_the_demo_for_one_v4_chip(tmp_path, capsys):
  out = tmp_path / "demo.json"
  assert cli.main(["--topology=v4:1x1x1", "--call_tokens=1,2", f"--output_json={out}"]) == 0
  printed = capsys.readouterr().out
  assert "Compiled by XLA for TPU v4" in printed and "not run" in printed
  assert "(the baseline's plus the draft's caches, plus 10%)" in printed
  figures = json.loads(out.read_text())
  assert figures["mesh"] == {"data": 1, "model": 1}
  assert [p["name"] for p in figures["programs"]] == ["speculative decode",
                                                      "baseline (target alone)"]
  assert all(p["custom_calls"] == [] or not any(c.startswith("spec_decode")
                                                for c in p["custom_calls"])
             for p in figures["programs"])
  assert all(entry["fits"] for entry in figures["plan"].values())
  roofline = figures["estimates"][0]
  assert roofline["name"] == "roofline" and set(roofline["v"]) == {"1", "2"}
  assert 0 < roofline["c"] < 1  # the demo's draft is the smaller model


@needs_tpu_compiler
def test_a_decoder_only_run_compiles_for_one_v4_chip(tmp_path, capsys):
  """A language model's run (prefill of its prompts, then the loop over prompt + continuation
  positions) compiles for a TPU from its config alone, with no CPU custom call."""
  from spec_decode.checkpoints import tiny_lm_pair  # pylint: disable=g-import-not-at-top
  tiny_lm_pair.write_pair(tmp_path)
  out = tmp_path / "lm.json"
  assert cli.main([f"--gin_file={tmp_path / 'infer.gin'}", "--topology=v4:1x1x1",
                   "--call_tokens=1,4", f"--output_json={out}"]) == 0
  assert "Compiled by XLA for TPU v4" in capsys.readouterr().out
  figures = json.loads(out.read_text())
  assert [p["name"] for p in figures["programs"]] == ["speculative decode",
                                                      "baseline (target alone)"]
  assert not any(name.startswith("spec_decode") for p in figures["programs"]
                 for name in p["custom_calls"])
  assert all(entry["fits"] for entry in figures["plan"].values())


@needs_tpu_compiler
def test_bad_topologies_and_meshes_are_one_line_errors(capsys):
  assert cli.main(["--topology=v9-8"]) == 2
  assert "unknown topology 'v9-8'" in capsys.readouterr().err
  # The demo's batch of 1 on a v4-8 with P = 1: a 'data' axis of 4 cannot split it.
  assert cli.main(["--topology=v4-8", "--num_partitions=1"]) == 2
  assert "batch size 1 is not a multiple of the mesh's 'data' axis" in capsys.readouterr().err


@needs_tpu_compiler
def test_plan_prints_xlas_temporaries_beside_its_formula(capsys):
  assert plan.main(["--gin_file=configs/demo/infer.gin", "--compile_for=v4-8"]) == 0
  printed = capsys.readouterr().out
  compiled = [line for line in printed.splitlines() if line.startswith("P=")
              and "temporaries" in line]
  assert [line.split(":")[0] for line in compiled] == ["P=1", "P=2", "P=4"], printed
  # Where the target is split, the draft's placements are priced and one is chosen.
  chosen = [line for line in printed.splitlines() if line.startswith("P=") and "use: " in line]
  assert [line.split()[0] for line in chosen] == ["P=2", "P=4"], printed
  # The demo's draft has 2 heads: 4 chips cannot split it like the target.
  assert "P=4 sharded: not possible: " in printed and "P=4 use: replicated" in printed, printed


@needs_tpu_compiler
def test_plan_bisects_to_the_largest_batch_that_fits(monkeypatch, capsys):
  """A v4 chip whose HBM lies halfway between what the demo's decode takes at batch 4 and at
  batch 5 (compiled here first): the plan's bisection up to 5 (5, 1, 3, 4 compiled) answers 4,
  with batch 5's figures beside. Memory grows with the batch: each row's caches and logits."""
  devices = topologies.topology("v4:1x1x1").devices()

  def device_bytes(batch_size):
    run = runs.read_run(argparse.Namespace(
        gin_file=["configs/demo/infer.gin"], draft_gin_file=None, num_partitions=1,
        batch_size=batch_size, input_length=None, target_length=None), [], devices)
    return programs.predict_program(
        run.layout, run.model.decoder, eos_id=runs.EOS_ID, num_decodes=1,
        batch_size=batch_size, input_length=run.input_length, target_length=run.target_length,
        param_dtype=run.checkpoint_dtype).device_bytes

  four, five = device_bytes(4), device_bytes(5)
  assert four < five
  monkeypatch.setitem(topologies.CHIPS, "v4", dataclasses.replace(
      topologies.CHIPS["v4"], hbm_bytes=(four + five) // 2))
  assert plan.main(["--gin_file=configs/demo/infer.gin", "--compile_for=v4:1x1x1",
                    "--largest_batch_up_to=5"]) == 0
  found = [line for line in capsys.readouterr().out.splitlines() if "largest batch" in line]
  assert len(found) == 1 and found[0].startswith("P=1: largest batch up to 5 that fits "), found
  assert ": 4 (arguments " in found[0] and "; batch 5: arguments " in found[0], found
  assert found[0].endswith("; 4 batches tried"), found


@needs_tpu_compiler
def test_a_batch_xla_refuses_for_want_of_hbm_does_not_fit(monkeypatch, capsys):
  """XLA:TPU refuses to compile a decode whose temporaries exceed the HBM it leaves them
  (RESOURCE_EXHAUSTED, as it refused T5.1.1-XXL's ende_small_t0 at batch 64 on one v4 chip:
  docs/TPU_COMPILE.md); such a batch does not fit. Here XLA's refusal stands in for the compile
  of every batch above 2 (a real one compiles for minutes first), batches 1 and 2 compile."""
  compile_decode = programs.predict_program
  refusal = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the "
             "total memory required for HLO temporaries (40.23G) exceeds available HBM (30.75G).")

  def refusing(*args, batch_size, **kwargs):
    if batch_size > 2:
      raise jax.errors.JaxRuntimeError(refusal)
    return compile_decode(*args, batch_size=batch_size, **kwargs)

  monkeypatch.setattr(programs, "predict_program", refusing)
  assert plan.main(["--gin_file=configs/demo/infer.gin", "--compile_for=v4:1x1x1",
                    "--largest_batch_up_to=4"]) == 0
  found = [line for line in capsys.readouterr().out.splitlines() if "largest batch" in line]
  assert len(found) == 1 and ": 2 (arguments " in found[0], found
  assert found[0].endswith(f"; batch 3: not compiled, XLA: {refusal}; 4 batches tried"), (
      found)


@pytest.mark.skipif(not _installed("jax_plugins.xla_cuda13"),
                    reason="needs JAX's CUDA plugin, XLA's GPU compiler: pip install "
                           "'jax[cuda13]' (several GB; not in CI)")
def test_the_demo_compiles_for_an_h200_without_a_gpu(tmp_path):
  """In a process of its own: JAX loads its CUDA plugin once, when its backends first start, and
  only a process that asked for a GPU topology before that skips the plugin's driver check."""
  out = tmp_path / "h200.json"
  done = subprocess.run([sys.executable, "-m", "spec_decode.aot", "--topology=h200",
                         "--programs=decode", f"--output_json={out}"], cwd=paths.ROOT,
                        capture_output=True, text=True, timeout=1200, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  program = json.loads(out.read_text())["programs"][0]
  assert program["argument_bytes"] > 0
  assert not any(name.startswith("spec_decode") for name in program["custom_calls"])


# A compiled module's text as XLA prints it, cut down: a prefetch, a loop of 3 known iterations
# whose body runs a kernel and a fused all-reduce, then a custom call and a copy.
SCHEDULED_HLO = """HloModule m, is_scheduled=true

%fused_add (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %add.1 = f32[4]{0} add(%p0, %p0)
}

%fused_reduce (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %all-reduce.1 = f32[4]{0} all-reduce(%p0), replica_groups={}, to_apply=%sum
}

%body (state: (s32[], f32[4])) -> (s32[], f32[4]) {
  %state = (s32[], f32[4]{0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%state), index=0
  %gte.1 = f32[4]{0} get-tuple-element(%state), index=1
  %fusion.2 = f32[4]{0} fusion(%gte.1), kind=kLoop, calls=%fused_add
  %fusion.3 = f32[4]{0} fusion(%fusion.2), kind=kOutput, calls=%fused_reduce
  ROOT %tuple.1 = (s32[], f32[4]{0}) tuple(%gte.0, %fusion.3)
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %copy-start.1 = (f32[4]{0}, f32[4]{0:S(1)}, u32[]) copy-start(%x)
  %copy-done.1 = f32[4]{0:S(1)} copy-done(%copy-start.1)
  %constant.1 = s32[] constant(0)
  %tuple.0 = (s32[], f32[4]{0}) tuple(%constant.1, %copy-done.1)
  %while.1 = (s32[], f32[4]{0}) while(%tuple.0), condition=%cond, body=%body, TRIPS
  %gte.2 = f32[4]{0} get-tuple-element(%while.1), index=1
  %custom-call.1 = f32[4]{0} custom-call(%gte.2), custom_call_target="Foo"
  ROOT %copy.1 = f32[4]{0} copy(%custom-call.1)
}
"""


def test_sequential_ops_count_each_loop_iteration_and_skip_what_runs_nothing():
  known = SCHEDULED_HLO.replace("TRIPS", 'backend_config={"known_trip_count":{"n":"3"}}')
  assert programs.sequential_ops(known) == ["fusion", "all-reduce"] * 3 + ["custom-call",
                                                                           "copy"]
  # A loop whose trip count XLA does not know is counted once.
  unknown = SCHEDULED_HLO.replace("TRIPS", "backend_config={}")
  assert programs.sequential_ops(unknown) == ["fusion", "all-reduce", "custom-call", "copy"]


def _synthetic_rows(op_latency):
  """Rows of made-up calls whose 'measured' speedups are Theorem 3.8 with each call's roofline
  plus `op_latency` per sequential operation, computed here, not by the code under test."""
  rows = []
  for name, (alpha, gamma, draft_seconds, draft_ops) in {
      "shallow": (0.75, 7, 1e-4, 150), "middle": (0.8, 5, 3e-4, 300),
      "deep": (0.82, 3, 8e-4, 600), "deep_t1": (0.6, 3, 8e-4, 600)}.items():
    target, verify = (1e-2, 900), (1.05e-2, 950)
    seconds = lambda call: call[0] + call[1] * op_latency
    c = seconds((draft_seconds, draft_ops)) / seconds(target)
    v = seconds(verify) / seconds(target)
    speedup = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + v))
    rows.append(report.CallCosts(name, alpha, gamma, speedup, target, verify,
                                 (draft_seconds, draft_ops)))
  return rows


@pytest.mark.parametrize("planted", [0.0, 2e-6, 1.5e-5])
def test_the_fit_recovers_a_planted_latency_per_operation(planted):
  rows = _synthetic_rows(planted)
  assert report.fit_op_latency(rows) == pytest.approx(planted, rel=1e-3, abs=1e-9)
  for row, latency, predicted in report.leave_one_out(rows):
    assert latency == pytest.approx(planted, rel=1e-3, abs=1e-9)
    assert predicted == pytest.approx(row.speedup, rel=1e-4)
  if planted:  # without the term, the deep drafts are overpredicted
    assert rows[2].predicted_speedup(0.0) > 1.1 * rows[2].speedup


def test_no_cost_model_of_the_same_calls_beats_half_their_spread():
  """Two rows of the same calls and gamma whose measured speedups ask for denominators
  (gamma c + v) 1.44 times apart: whatever c and v, one of them is 20% off (sqrt(1.44)), and a
  scan of the shared denominator finds nothing better; a row of another draft call is no
  group."""
  expected_tokens = lambda alpha, gamma: (1 - alpha ** (gamma + 1)) / (1 - alpha)
  target, verify, draft = (1e-2, 900), (1.05e-2, 950), (1e-4, 150)
  rows = [report.CallCosts("a", 0.5, 3, expected_tokens(0.5, 3) / 1.5, target, verify, draft),
          report.CallCosts("b", 0.8, 3, expected_tokens(0.8, 3) / 2.16, target, verify, draft),
          report.CallCosts("other", 0.8, 3, 2.0, target, verify, (8e-4, 600))]
  [(names, error)] = report.least_worst_errors(rows)
  assert names == ("a", "b") and error == pytest.approx(1.2)
  best = min(max(abs(math.log(expected_tokens(row.alpha, 3) / x / row.speedup))
                 for row in rows[:2]) for x in np.linspace(1.0, 3.0, 20001))
  assert math.exp(best) == pytest.approx(1.2, rel=1e-4)


def test_the_fit_needs_measured_speedups():
  rows = _synthetic_rows(1e-6)
  with pytest.raises(ValueError, match="measured speedups"):
    report.fit_op_latency([dataclasses.replace(rows[0], speedup=0.0)] + rows[1:])


@needs_tpu_compiler
def test_the_draft_placement_is_priced_by_its_bytes_and_its_collectives(layout):
  """On 2 chips a sharded draft reads half its weights per chip but runs collectives inside its
  call, the replicated one none: free collectives favour sharding, dear ones replication."""
  calls = placement.draft_placement_calls(layout, batch_rows=BATCH, input_length=INPUT_LENGTH,
                                         max_decode_len=TARGET_LENGTH)
  replicated, sharded = calls["replicated"], calls["sharded"]
  assert replicated.sequential_collectives == 0 < sharded.sequential_collectives
  assert sharded.argument_bytes < 0.75 * replicated.argument_bytes
  chip = topologies.topology("v4-8").chip
  free = placement.draft_placements(calls, chip, collective_latency=0.0)
  assert [p.placement for p in free] == ["sharded", "replicated"]
  dear = placement.draft_placements(calls, chip, collective_latency=1e-3)
  assert [p.placement for p in dear] == ["replicated", "sharded"]
  assert dear[1].seconds == pytest.approx(
      dear[1].roofline_seconds + 1e-3 * sharded.sequential_collectives)
  assert "use: replicated (the T5X hook's SHARD_DRAFT=False)" in placement.format_draft_placements(
      dear)[-1]
  with pytest.raises(ValueError, match="collective latency"):
    placement.draft_placements(calls, chip, collective_latency=-1.0)
