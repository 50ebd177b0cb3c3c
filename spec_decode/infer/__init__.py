"""`python -m spec_decode.infer`: T5X-style inference from gin, speculative and baseline.

Run: `python -m spec_decode.infer --gin_file=FILE [--gin.MACRO=VALUE ...] [--gin_bindings=B ...]
[--text "sentence" ...] [--input_file FILE] [--data_dir DIR] [--tfds_data_dir DIR] [--restart]`;
without --gin_file, `configs/demo/infer.gin` (the shipped demo pair). Run configs include
`configs/runs/infer.gin`, whose macros are T5X's: MODEL, CHECKPOINT_PATH (T5X checkpoint,
Hugging Face folder or Hub id hf://ORG/NAME, or demo .safetensors), MIXTURE_OR_TASK_NAME (a
`spec_decode.data.tasks` task: --data_dir is the file tasks' data root, --tfds_data_dir where TFDS
datasets are prepared), TASK_FEATURE_LENGTHS, BATCH_SIZE, INFER_OUTPUT_DIR, plus SPLIT,
NUM_EXAMPLES, INPUT_PREFIX, COMPARE_WITH_BASELINE, TIMING_ROUNDS and CHECKPOINT_PERIOD.
`--text` (repeatable) and `--input_file` (one input per line) replace the task by text
prefixed with INPUT_PREFIX.

What `infer` does, in this order (every check before anything is compiled or written):
  1. reads the inputs (task examples trimmed to TASK_FEATURE_LENGTHS with EOS kept, or text) and
     checks the task's vocabulary is the model's;
  2. lays the decode out on the mesh (`decode_layout.decode_layout`): BATCH_SIZE a multiple of
     its 'data' axis, the plan's per-device bytes within DEVICE_MEMORY_GIB (`spec_decode.plan`);
  3. restores both models' parameters straight into their shards (`DecodeLayout.restore`), the
     draft replicated, and compiles `core.Decoder.predict` once for the batch shape with the
     parameters as arguments (`DecodeLayout.partition_predict`; the last batch is padded), and
     with COMPARE_WITH_BASELINE `Decoder.baseline()` too;
  4. decodes every batch (the model's num_decodes per input, the best kept), timing the
     compiled calls only, gathering every process's outputs (`decode_layout.gather`),
     committing them to INFER_OUTPUT_DIR/chunks every CHECKPOINT_PERIOD batches
     (`chunks`): a rerun resumes after the last committed chunk (a different run in an
     unfinished output dir is refused, naming what differs; --restart starts over);
     SIGTERM/SIGINT commit what is decoded and exit 128 + the signal (`stop_signals`); then,
     with TIMING_ROUNDS, both decoders' compiled calls timed again side by side
     (`timing`), and for speculative sampling with COMPARE_WITH_BASELINE, Theorem 3.8's
     c and v (`call_costs`);
  5. writes predictions.jsonl and summary.json from the chunks and prints what it measured.
Multi-host: every process runs the same command with T5X's `--multiprocess_gpu
--coordinator_address --process_count --process_index` (any backend), restores its shards and
decodes its rows; process 0 alone reads and writes chunks and outputs, and says where to resume.

The package's modules: `cli` (flags to gin bindings, exit status), `run` (`infer` and
`decode_all`: steps 2 to 5), `inputs` (step 1: `DatasetConfig`, `read_examples`,
`make_batches`), `chunks` and `stop_signals` (step 4's commits and stops), `timing` (step 4's
side-by-side rounds), `outputs` (step 5).

A usage error (a missing gin file, an ineffective binding, an unset macro, an unknown task, a
missing, truncated, corrupt or non-finite checkpoint (`checkpoint_faults` names the file and
parameter), a bad setting, a different run in an unfinished output dir) is one line
`spec_decode.infer: error: ...` and exit status 2, writing nothing.
"""

from spec_decode.infer.cli import main
from spec_decode.infer.inputs import DatasetConfig
from spec_decode.infer.run import infer

# What configs bind (`infer.infer`, `infer.DatasetConfig`, as T5X's) and the entry point.
__all__ = ["DatasetConfig", "infer", "main"]
