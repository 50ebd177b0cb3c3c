"""`spec_decode.infer`'s decode loop over hundreds of batches: one compile per decoder (the padded
last batch included) and host memory that stays flat after warm-up.

A tiny random target/draft pair decodes 701 inputs in 351 batches of 2 (the last one padded),
speculatively and with the target alone, in this process; the >= 2,000-example figure on the
demo pair is docs/PERFORMANCE.md's (scripts/long_run_steadiness.py).
"""

import os

import pytest

import tiny_t5
from spec_decode import infer
from spec_decode import models
from spec_decode import core
from spec_decode import decode_layout
from spec_decode import partitioning
from spec_decode.bench import steadiness
from spec_decode.t5 import checkpoints
from spec_decode.t5 import network
from spec_decode.t5 import vocab

# The slow tier (long runs, counting compilations and memory).
pytestmark = pytest.mark.slow

NUM_EXAMPLES, BATCH_SIZE = 701, 2
NUM_BATCHES = (NUM_EXAMPLES + BATCH_SIZE - 1) // BATCH_SIZE
WARM_UP_BATCHES = 100
# Growth allowed from the end of warm-up to the last batch (251 batches): what the run keeps per
# example (8 token ids and about 15 counters, about 0.6 KiB measured over 3,000 examples) is
# about 0.3 MiB here; a steady leak of 8 KiB or more per batch fails.
RSS_TOLERANCE = 2 * 2**20


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
  params = layout.put_params("target", checkpoints.random_params(target_config, 1))
  draft_params = layout.put_params("draft", checkpoints.random_params(draft_config, 2))
  texts = [f"Sentence number {i} is about {'a dog' if i % 2 else 'two cats'}."
           for i in range(NUM_EXAMPLES)]
  examples = infer.read_examples(infer.DatasetConfig(
      texts=texts, task_feature_lengths={"inputs": 16, "targets": 8}, batch_size=BATCH_SIZE),
      model)
  batches = infer.make_batches(examples, BATCH_SIZE, 16, 8)
  assert len(batches) == NUM_BATCHES and batches[-1][1] == 1  # the last batch is padded
  return decoder, layout, params, draft_params, batches, vocabulary.eos_id


@pytest.mark.parametrize("which", ["speculative", "baseline"])
def test_one_compile_per_decoder_and_flat_memory(pair, which):
  if not os.path.exists(steadiness.STATM):
    pytest.skip(f"{steadiness.STATM} is absent: RSS is read from Linux's /proc")
  decoder, layout, params, draft_params, batches, eos_id = pair
  if which == "baseline":
    decoder, draft_params = decoder.baseline(), None
  rss = {}
  with steadiness.CompileCounter() as compiles:
    after_warm_up = {}

    def progress(stage, done, total):
      del total
      if stage == "decoding" and done in (WARM_UP_BATCHES, NUM_BATCHES):
        rss[done] = steadiness.rss_bytes()
        after_warm_up.setdefault(done, compiles.total)

    run = infer.decode_all(decoder, eos_id, params, draft_params, batches=batches, seed=0,
                           layout=layout, progress=progress)
  assert len(run.decodes) == NUM_EXAMPLES
  assert compiles.by_name["jit(predict)"] == 1, dict(compiles.by_name)
  # Nothing at all is compiled once the loop is warm (no per-batch recompiles of anything).
  assert after_warm_up[NUM_BATCHES] == after_warm_up[WARM_UP_BATCHES], dict(compiles.by_name)
  growth = rss[NUM_BATCHES] - rss[WARM_UP_BATCHES]
  assert growth < RSS_TOLERANCE, f"RSS grew by {growth / 2**20:.1f} MiB over " \
                                 f"{NUM_BATCHES - WARM_UP_BATCHES} batches"
