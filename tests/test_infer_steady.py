"""`spec_decode.infer`'s decode loop over hundreds of batches: one compile per decoder (the padded
last batch included) and host memory that stays flat after warm-up.

A tiny random target/draft pair decodes 701 inputs in 351 batches of 2 (the last one padded),
speculatively and with the target alone, each in a process of its own (this file run as a
program) started with `steadiness.MEASURED_ALLOCATOR_ENV`, so that what is resident is what the
loop holds; the >= 2,000-example figure on the demo pair is docs/PERFORMANCE.md's
(scripts/long_run_steadiness.py).
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

import tiny_t5
from spec_decode import infer
from spec_decode.infer import inputs as infer_inputs
from spec_decode.infer import run as infer_run
from spec_decode import models
from spec_decode import core
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode.bench import steadiness
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.t5 import vocab

# The slow tier (long runs, counting compilations and memory).
pytestmark = pytest.mark.slow

NUM_EXAMPLES, BATCH_SIZE = 701, 2
NUM_BATCHES = (NUM_EXAMPLES + BATCH_SIZE - 1) // BATCH_SIZE
WARM_UP_BATCHES = 100
# After warm-up, RSS is read at these batches: 5 windows of about 50 batches each.
WINDOW_ENDS = (WARM_UP_BATCHES, 150, 200, 250, 300, NUM_BATCHES)
# Memory is read as `steadiness.live_rss_bytes()`: RSS with free memory handed back to the OS,
# else a leak would not show while it reuses memory freed earlier. A steady leak is growth in
# every window; the median window's rate must stay below LEAK_PER_BATCH. What the run keeps per
# example (8 token ids and about 15 counters, about 0.6 KiB measured over 3,000 examples) is
# about 1.2 KiB per batch. The median, not the total, so that one step (a region the allocator
# takes once) does not decide. Measured (JAX 0.10, 2-core AMD EPYC): every window's rate within
# 1.3 KiB per batch of zero for both decoders, 15.8-16.8 with the negative control's leak of
# twice the bound.
LEAK_PER_BATCH = 8 * 2**10


def _pair():
  """The decoder, its layout and parameters, the batches and the EOS id the loop decodes with."""
  vocabulary = vocab.SentencePieceVocabulary(str(tiny_t5.DEMO_VOCAB_FILE))
  target_config = tiny_t5.tiny_config(8000, tiny_t5.SHRINK)
  draft_config = tiny_t5.tiny_config(8000, tiny_t5.DRAFT_SHRINK)
  target = network.Transformer(target_config)
  model = models.EncoderDecoderModel(target, vocabulary, vocabulary)
  decoder = core.Decoder.create("speculative_sample", target, network.Transformer(draft_config),
                                gamma=3, temperature=1.0)
  layout = decode_layout.decode_layout(partitioning.PjitPartitioner(mesh_shape=(1, 1)),
                                       target_config, draft_config)
  params = layout.put_params("target", t5x_format.random_params(target_config, 1))
  draft_params = layout.put_params("draft", t5x_format.random_params(draft_config, 2))
  texts = [f"Sentence number {i} is about {'a dog' if i % 2 else 'two cats'}."
           for i in range(NUM_EXAMPLES)]
  examples = infer_inputs.read_examples(infer.DatasetConfig(
      texts=texts, task_feature_lengths={"inputs": 16, "targets": 8}, batch_size=BATCH_SIZE),
      model)
  batches = infer_inputs.make_batches(examples, BATCH_SIZE, 16, 8)
  assert len(batches) == NUM_BATCHES and batches[-1][1] == 1  # the last batch is padded
  return decoder, layout, params, draft_params, batches, vocabulary.eos_id


def _decode_all(which: str, leak_per_batch: int) -> dict:
  """Decodes every batch with `which` decoder, in this process -> the number of decodes, RSS at
  WINDOW_ENDS and the compilations counted there; `leak_per_batch` bytes are kept per batch
  (a negative control)."""
  decoder, layout, params, draft_params, batches, eos_id = _pair()
  if which == "baseline":
    decoder, draft_params = decoder.baseline(), None
  rss, compiled_by, kept = {}, {}, []
  with steadiness.CompileCounter() as compiles:

    def progress(stage, done, total):
      del total
      if stage == "decoding":
        kept.append(os.urandom(leak_per_batch))  # random: every page of it is touched
        if done in WINDOW_ENDS:
          rss[done] = steadiness.live_rss_bytes()
          compiled_by[done] = compiles.total

    run = infer_run.decode_all(decoder, eos_id, params, draft_params, batches=batches, seed=0,
                               layout=layout, progress=progress)
  return {"decodes": len(run.decodes), "rss": rss, "compiled_by": compiled_by,
          "by_name": dict(compiles.by_name)}


def _decode_all_measured(which: str, leak_per_batch: int = 0) -> dict:
  """`_decode_all` in a child process started with `steadiness.MEASURED_ALLOCATOR_ENV`."""
  child = subprocess.run([sys.executable, __file__, which, str(leak_per_batch)],
                         env={**os.environ, **steadiness.MEASURED_ALLOCATOR_ENV},
                         capture_output=True, text=True, check=False)
  assert child.returncode == 0, child.stderr[-3000:]
  measured = json.loads(child.stdout.splitlines()[-1])
  for key in ("rss", "compiled_by"):  # JSON's keys are strings
    measured[key] = {int(batch): value for batch, value in measured[key].items()}
  return measured


def _median_rate(rss):
  rates = [(rss[end] - rss[start]) / (end - start)
           for start, end in zip(WINDOW_ENDS, WINDOW_ENDS[1:])]
  return statistics.median(rates), [f"{rate / 2**10:.1f}" for rate in rates]


needs_proc = pytest.mark.skipif(not os.path.exists(steadiness.STATM),
                                reason=f"{steadiness.STATM} is absent: RSS is read from /proc")


@needs_proc
@pytest.mark.parametrize("which", ["speculative", "baseline"])
def test_one_compile_per_decoder_and_flat_memory(which):
  measured = _decode_all_measured(which)
  by_name, compiled_by = measured["by_name"], measured["compiled_by"]
  assert measured["decodes"] == NUM_EXAMPLES
  assert by_name["jit(predict)"] == 1, by_name
  # Nothing at all is compiled once the loop is warm (no per-batch recompiles of anything).
  assert compiled_by[NUM_BATCHES] == compiled_by[WARM_UP_BATCHES], by_name
  median, rates = _median_rate(measured["rss"])
  assert median < LEAK_PER_BATCH, \
      f"RSS grew by {rates} KiB per batch in the windows ending at batches {WINDOW_ENDS[1:]}"


@needs_proc
def test_a_steady_leak_fails_the_memory_check():
  rss = _decode_all_measured("baseline", leak_per_batch=2 * LEAK_PER_BATCH)["rss"]
  assert _median_rate(rss)[0] >= LEAK_PER_BATCH, _median_rate(rss)[1]


if __name__ == "__main__":
  print(json.dumps(_decode_all(sys.argv[1], int(sys.argv[2]))))
