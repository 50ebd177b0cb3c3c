"""`spec_decode.infer`'s decode loop over hundreds of batches: one compile per decoder (the padded
last batch included) and host memory that stays flat after warm-up.

A tiny random target/draft pair decodes 701 inputs in 351 batches of 2 (the last one padded),
speculatively and with the target alone, in this process; the >= 2,000-example figure on the
demo pair is docs/PERFORMANCE.md's (scripts/long_run_steadiness.py).
"""

import os
import statistics

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
# about 1.2 KiB per batch. The median, not the total: the process also grows by one-off steps
# of about 1 MiB at batches that vary from run to run (one or two in 351 batches, also with
# free memory handed back: not a per-batch cost), and one inside the measured stretch would
# fail a total over 251 batches against any bound that a leak of 8 KiB per batch passes.
# A window's rate moves by a few KiB per batch from run to run (up to about 7 under JAX 0.12),
# so the negative control plants twice the bound: a leak near the bound may pass one run.
LEAK_PER_BATCH = 8 * 2**10


@pytest.fixture(scope="module")
def pair():
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


def _decode_all(pair, which, leak_per_batch=0):
  """Decodes every batch with `which` decoder -> (the run, RSS per batch in WINDOW_ENDS, the
  compilations counted there); `leak_per_batch` bytes are kept per batch (a negative control)."""
  decoder, layout, params, draft_params, batches, eos_id = pair
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
  return run, rss, compiled_by, compiles.by_name


def _median_rate(rss):
  rates = [(rss[end] - rss[start]) / (end - start)
           for start, end in zip(WINDOW_ENDS, WINDOW_ENDS[1:])]
  return statistics.median(rates), [f"{rate / 2**10:.1f}" for rate in rates]


needs_proc = pytest.mark.skipif(not os.path.exists(steadiness.STATM),
                                reason=f"{steadiness.STATM} is absent: RSS is read from /proc")


@needs_proc
@pytest.mark.parametrize("which", ["speculative", "baseline"])
def test_one_compile_per_decoder_and_flat_memory(pair, which):
  run, rss, compiled_by, by_name = _decode_all(pair, which)
  assert len(run.decodes) == NUM_EXAMPLES
  assert by_name["jit(predict)"] == 1, dict(by_name)
  # Nothing at all is compiled once the loop is warm (no per-batch recompiles of anything).
  assert compiled_by[NUM_BATCHES] == compiled_by[WARM_UP_BATCHES], dict(by_name)
  median, rates = _median_rate(rss)
  assert median < LEAK_PER_BATCH, \
      f"RSS grew by {rates} KiB per batch in the windows ending at batches {WINDOW_ENDS[1:]}"


@needs_proc
def test_a_steady_leak_fails_the_memory_check(pair):
  _, rss, _, _ = _decode_all(pair, "baseline", leak_per_batch=2 * LEAK_PER_BATCH)
  assert _median_rate(rss)[0] >= LEAK_PER_BATCH, _median_rate(rss)[1]
