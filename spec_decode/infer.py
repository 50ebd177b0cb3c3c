"""`python -m spec_decode.infer`: T5X-style inference from gin, speculative and baseline.

Run: `python -m spec_decode.infer --gin_file=FILE [--gin.MACRO=VALUE ...] [--gin_bindings=B ...]
[--text "sentence" ...] [--input_file FILE] [--data_dir DIR] [--tfds_data_dir DIR] [--restart]`;
without --gin_file, `configs/demo/infer.gin` (the shipped demo pair). Run configs include
`configs/runs/infer.gin`, whose macros are T5X's: MODEL, CHECKPOINT_PATH (T5X checkpoint,
Hugging Face folder or Hub id hf://ORG/NAME, or demo .safetensors), MIXTURE_OR_TASK_NAME (a
`spec_decode.tasks` task: --data_dir is the file tasks' data root, --tfds_data_dir where TFDS
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
     (`infer_chunks`): a rerun resumes after the last committed chunk (a different run in an
     unfinished output dir is refused, naming what differs; --restart starts over);
     SIGTERM/SIGINT commit what is decoded and exit 128 + the signal (`stop_signals`); then,
     with TIMING_ROUNDS, both decoders' compiled calls timed again side by side
     (`infer_timing`), and for speculative sampling with COMPARE_WITH_BASELINE, Theorem 3.8's
     c and v (`call_costs`);
  5. writes predictions.jsonl and summary.json from the chunks and prints what it measured.
Multi-host: every process runs the same command with T5X's `--multiprocess_gpu
--coordinator_address --process_count --process_index` (any backend), restores its shards and
decodes its rows; process 0 alone reads and writes chunks and outputs, and says where to resume.

A usage error (a missing gin file, an ineffective binding, an unset macro, an unknown task, a
missing, truncated, corrupt or non-finite checkpoint (`checkpoint_faults` names the file and
parameter), a bad setting, a different run in an unfinished output dir) is one line
`spec_decode.infer: error: ...` and exit status 2, writing nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import gin
import jax
import numpy as np

from spec_decode import call_costs
from spec_decode import core
from spec_decode import corpora
from spec_decode import gin_utils
from spec_decode import decode_layout
from spec_decode import infer_chunks
from spec_decode import infer_outputs
from spec_decode import infer_timing
from spec_decode import models
from spec_decode import partitioning
from spec_decode import plan
from spec_decode import stop_signals
from spec_decode.engine import stats
from spec_decode.gin_utils import UsageError
from spec_decode.t5 import vocab

DEFAULT_GIN_FILE = "configs/demo/infer.gin"


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
  """Where inputs come from: exactly one of a seqio task, a text file or inline texts."""
  mixture_or_task_name: str | None = None
  task_feature_lengths: Mapping[str, int] | None = None
  split: str = "test"
  batch_size: int = 32
  num_examples: int | None = None
  input_file: str | None = None
  texts: Sequence[str] | None = None
  input_prefix: str = ""


@dataclasses.dataclass(frozen=True)
class Example:
  inputs: str  # the text the model reads (prefix included)
  input_ids: list[int]  # EOS-terminated, at most task_feature_lengths['inputs'] long
  target: str | None = None


# --------------------------------------------------------------------------- inputs


def _check_dataset_config(cfg: DatasetConfig) -> tuple[int, int]:
  """(input length, target length) after checking the config."""
  sources = [name for name, value in (("mixture_or_task_name", cfg.mixture_or_task_name),
                                      ("input_file", cfg.input_file), ("texts", cfg.texts))
             if value is not None]
  if len(sources) != 1:
    raise UsageError("give exactly one input source: MIXTURE_OR_TASK_NAME, --input_file or "
                     f"--text (got {', '.join(sources) or 'none'})")
  lengths = cfg.task_feature_lengths
  if (not isinstance(lengths, Mapping) or set(lengths) != {"inputs", "targets"}
      or not all(isinstance(n, int) and n >= 2 for n in lengths.values())):
    raise UsageError("TASK_FEATURE_LENGTHS must be {'inputs': int >= 2, 'targets': int >= 2}, "
                     f"got {lengths!r}")
  if not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
    raise UsageError(f"BATCH_SIZE must be an integer >= 1, got {cfg.batch_size!r}")
  if cfg.num_examples is not None and (not isinstance(cfg.num_examples, int)
                                       or cfg.num_examples < 1):
    raise UsageError(f"NUM_EXAMPLES must be an integer >= 1 or None, got {cfg.num_examples!r}")
  return lengths["inputs"], lengths["targets"]


def _vocabulary_signature(vocabulary: Any) -> tuple[int, int, bytes]:
  """(vocab_size, extra_ids, model file bytes): equal for seqio's and spec_decode.t5.vocab's
  SentencePiece vocabularies exactly when they tokenize alike."""
  with open(vocabulary.sentencepiece_model_file, "rb") as f:
    return vocabulary.vocab_size, vocabulary.extra_ids, f.read()


def _task_examples(cfg: DatasetConfig, model: models.EncoderDecoderModel) -> list[Example]:
  from spec_decode import tasks  # pylint: disable=g-import-not-at-top (TensorFlow: only for tasks)
  vocabularies = tasks.output_vocabularies(cfg.mixture_or_task_name)
  for feature, model_vocabulary in (("inputs", model.input_vocabulary),
                                    ("targets", model.output_vocabulary)):
    if _vocabulary_signature(vocabularies[feature]) != _vocabulary_signature(model_vocabulary):
      raise UsageError(
          f"task {cfg.mixture_or_task_name!r} and the model have different {feature} "
          f"vocabularies ({vocabularies[feature].sentencepiece_model_file}, "
          f"{vocabularies[feature].vocab_size} ids vs "
          f"{model_vocabulary.sentencepiece_model_file}, {model_vocabulary.vocab_size} ids)")
  rows = tasks.load_examples(cfg.mixture_or_task_name, cfg.split, cfg.task_feature_lengths,
                             cfg.num_examples)
  return [Example(row["inputs_pretokenized"], row["inputs"], row.get("targets_pretokenized"))
          for row in rows]


def _text_examples(cfg: DatasetConfig, model: models.EncoderDecoderModel,
                   input_length: int) -> list[Example]:
  if cfg.texts is not None:
    if isinstance(cfg.texts, str):
      raise UsageError("texts must be a list of strings, got one string")
    texts = list(cfg.texts)
  else:
    texts = corpora.read_input_lines(cfg.input_file)
  texts = texts[:cfg.num_examples] if cfg.num_examples is not None else texts
  vocabulary = model.input_vocabulary
  examples, num_cut, most_cut = [], 0, 0
  for text in texts:
    inputs = cfg.input_prefix + text
    ids = vocabulary.encode(inputs)
    if len(ids) > input_length - 1:  # room for EOS
      num_cut, most_cut = num_cut + 1, max(most_cut, len(ids) - (input_length - 1))
    examples.append(Example(inputs, vocab.trim_with_eos(ids, input_length, vocabulary.eos_id)))
  if num_cut:
    print(f"warning: {num_cut} of {len(examples)} inputs are longer than "
          f"TASK_FEATURE_LENGTHS['inputs'] = {input_length} tokens (EOS included) and were cut, "
          f"by up to {most_cut} tokens", file=sys.stderr)
  return examples


def read_examples(cfg: DatasetConfig, model: models.EncoderDecoderModel) -> list[Example]:
  """The run's inputs (see the module docstring); UsageError when there are none."""
  input_length, _ = _check_dataset_config(cfg)
  examples = (_task_examples(cfg, model) if cfg.mixture_or_task_name is not None
              else _text_examples(cfg, model, input_length))
  if not examples:
    raise UsageError("no input examples")
  return examples


def make_batches(examples: Sequence[Example], batch_size: int, input_length: int,
                 target_length: int) -> list[tuple[dict[str, np.ndarray], int]]:
  """(batch, number of real rows) pairs of seqio encoder-decoder features, all one shape; the
  last batch is completed with copies of its last example, which finish when it does."""
  batches = []
  for start in range(0, len(examples), batch_size):
    rows = list(examples[start:start + batch_size])
    num_real = len(rows)
    rows += [rows[-1]] * (batch_size - num_real)
    encoder_input_tokens = np.zeros((batch_size, input_length), np.int32)
    for i, row in enumerate(rows):
      encoder_input_tokens[i, :len(row.input_ids)] = row.input_ids
    batches.append(({"encoder_input_tokens": encoder_input_tokens,
                     "decoder_input_tokens": np.zeros((batch_size, target_length), np.int32)},
                    num_real))
  return batches


# --------------------------------------------------------------------------- decoding


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  """Where a decode commits its outputs (`infer_chunks`), every how many batches, and the
  signals that stop it between batches."""
  store: infer_chunks.ChunkStore
  period: int
  stop: stop_signals.StopRequest


def _batch_arguments(params: Any, draft_params: Any,
                     batches: Sequence[tuple[dict[str, np.ndarray], int]], seed: int,
                     layout: decode_layout.DecodeLayout) -> Callable[[int], tuple[Any, ...]]:
  """i -> the compiled predict's arguments for batch i, placed on `layout`."""
  return lambda i: (params, draft_params, layout.put_batch(batches[i][0]),
                    layout.put_replicated(jax.random.fold_in(jax.random.PRNGKey(seed), i)))


def decode_all(decoder: core.Decoder, eos_id: int, params: Any, draft_params: Any, *,
               batches: Sequence[tuple[dict[str, np.ndarray], int]], seed: int,
               layout: decode_layout.DecodeLayout,
               progress: Callable[[str, int, int], None] = lambda *_: None,
               checkpointing: Checkpointing | None = None, name: str = "decoder",
               num_decodes: int = 1, timed_calls: dict[str, Any] | None = None
               ) -> infer_outputs.DecodeRun:
  """Compiles `decoder.predict` (`num_decodes` per input, the best kept) once on `layout`
  (`DecodeLayout.partition_predict`) and runs it over `batches`; `params`/`draft_params` as `layout.restore` placed them. Batch i is decoded
  with the rng fold_in(PRNGKey(seed), i), whatever batch a run starts at.

  With `checkpointing`, the batches `name` already committed are read instead of decoded, the
  new ones are committed every `period` batches (and not kept in memory: the outputs returned
  are the committed chunks, read back), and a stop request (SIGTERM/SIGINT) ends the loop after
  the batch in flight: its batches are committed, then `stop_signals.Stopped`.
  `progress(stage, batches done, batches)` is called when compiling starts and after each batch.
  `timed_calls`, where given, gets `name`: (the compiled predict, its arguments by batch) for
  `infer_timing.side_by_side`, compiled here if no batch was left to decode."""
  run = infer_outputs.DecodeRun([], [], 0.0, 0.0)  # without checkpointing: kept in memory
  first, writer = 0, None
  if checkpointing is not None:
    first = checkpointing.store.committed_batches(name)
    writer = infer_chunks.ChunkWriter(checkpointing.store, name, checkpointing.period, first)
    if first:
      print(f"{name}: {first} of {infer_outputs.count(len(batches), 'batch')} committed by an "
            f"earlier run, resuming after them", flush=True)
  compiled, arguments = None, _batch_arguments(params, draft_params, batches, seed, layout)

  def compile_for(args: tuple[Any, ...]) -> Any:
    start = time.perf_counter()
    executable = layout.partition_predict(decoder, eos_id, num_decodes).lower(*args).compile()
    run.compile_seconds = time.perf_counter() - start
    # One untimed call: the first execution of an executable pays one-off costs.
    jax.block_until_ready(executable(*args))
    return executable

  for i in range(first, len(batches)):
    if checkpointing is not None and checkpointing.stop.requested():
      break
    num_real = batches[i][1]
    args = arguments(i)
    if compiled is None:
      progress("compiling", i, len(batches))
      compiled = compile_for(args)
    start = time.perf_counter()
    outputs = jax.block_until_ready(compiled(*args))
    seconds = time.perf_counter() - start
    progress("decoding", i + 1, len(batches))
    batch_decodes, batch_aux = decode_layout.gather(outputs)
    decodes = [batch_decodes[row] for row in range(num_real)]
    aux = [{key: value[row].tolist() for key, value in batch_aux.items()}
           for row in range(num_real)]
    if writer is None:
      run.decodes += decodes
      run.aux += aux
      run.seconds += seconds
    else:
      writer.add(i, decodes, aux, seconds, compile_seconds=run.compile_seconds)
      run.compile_seconds = 0.0  # counted once, in the chunk of the batch that compiled
  if writer is not None:
    writer.flush()
    if writer.first < len(batches) and checkpointing.stop.requested():
      raise stop_signals.Stopped(
          checkpointing.stop.signum,
          f"stopped by {checkpointing.stop.name} after {writer.first} of "
          f"{infer_outputs.count(len(batches), 'batch')} of the {name} (committed in "
          f"{checkpointing.store.directory}); rerun the same command to resume")
  if timed_calls is not None:
    timed_calls[name] = (compiled or compile_for(arguments(0)), arguments)
  # The committed chunks are the outputs: memory stays flat while decoding, and a resumed run's
  # outputs are read exactly as an uninterrupted run's are.
  return run if writer is None else checkpointing.store.read(name)


def _check_batch_size(layout: decode_layout.DecodeLayout, batch_size: int) -> None:
  data = layout.mesh.shape["data"]
  if batch_size % data:
    lower, upper = batch_size // data * data, (batch_size // data + 1) * data
    nearest = f"{lower} or {upper}" if lower else f"{upper}"
    raise UsageError(f"BATCH_SIZE={batch_size} is not a multiple of the mesh's 'data' axis "
                     f"({dict(layout.mesh.shape)}, num_partitions={layout.mesh.shape['model']}):"
                     f" use {nearest}")


def infer(model: models.EncoderDecoderModel = gin.REQUIRED,
          dataset_cfg: DatasetConfig = gin.REQUIRED, checkpoint_path: str = gin.REQUIRED,
          output_dir: str = gin.REQUIRED, compare_with_baseline: bool = False,
          partitioner: Any = None, seed: int = 0, num_printed: int = 10,
          checkpoint_dtype: str | None = None,
          device_memory_gib: float | None = None, checkpoint_period: int = 100,
          timing_rounds: int = 0, restart: bool = False) -> dict[str, Any] | None:
  """Runs inference as described in the module docstring; returns the summary.

  `checkpoint_dtype`: both models' parameters are cast to it on restore (T5X's infer restores
  in 'bfloat16', the hook's draft too); None keeps the checkpoints' dtypes. `device_memory_gib`: the per-device
  memory budget the run's plan must fit (None: the device's own memory where its runtime
  reports it, else unchecked). `checkpoint_period`: batches per committed chunk
  (`infer_chunks`); `timing_rounds` > 0 (with `compare_with_baseline`): the speedup is also
  measured side by side, that many interleaved rounds (`infer_timing`); `restart`: start over
  in an output dir that holds another run's chunks. Returns the summary on process 0, None on
  the others.
  """
  if not isinstance(model, models.EncoderDecoderModel):
    raise UsageError(f"MODEL must be a models.EncoderDecoderModel, got {type(model).__name__}")
  if compare_with_baseline and not model.is_speculative:
    raise UsageError("COMPARE_WITH_BASELINE needs a decode loop with a draft (DECODE_LOOP, "
                     "e.g. 'speculative_sample')")
  if isinstance(checkpoint_period, bool) or not isinstance(checkpoint_period, int) or (
      checkpoint_period < 1):
    raise UsageError(f"CHECKPOINT_PERIOD must be an integer >= 1, got {checkpoint_period!r}")
  if isinstance(timing_rounds, bool) or not isinstance(timing_rounds, int) or timing_rounds < 0:
    raise UsageError(f"TIMING_ROUNDS must be an integer >= 0, got {timing_rounds!r}")
  if timing_rounds and not compare_with_baseline:
    raise UsageError("TIMING_ROUNDS times the decoder beside the baseline: it needs "
                     "COMPARE_WITH_BASELINE = True")
  infer_outputs.check_output_dir(output_dir)
  start = time.perf_counter()
  examples = read_examples(dataset_cfg, model)
  input_length, target_length = _check_dataset_config(dataset_cfg)
  source = dataset_cfg.mixture_or_task_name or dataset_cfg.input_file or "--text"
  store = infer_chunks.ChunkStore.open(output_dir, _run_identity(
      model, dataset_cfg, source=source, examples=examples, checkpoint_path=checkpoint_path,
      checkpoint_dtype=checkpoint_dtype, seed=seed,
      compare_with_baseline=compare_with_baseline), restart)
  if partitioner is None:  # one device, the same path
    partitioner = partitioning.PjitPartitioner(mesh_shape=(1, 1))
  draft_module = model.draft_module if model.is_speculative else None  # None: a lookup alone
  layout = decode_layout.decode_layout(
      partitioner, model.module.config, None if draft_module is None else draft_module.config)
  _check_batch_size(layout, dataset_cfg.batch_size)
  # Every decode of an input (a beam) has its own caches.
  plan.check_fits(layout, dataset_cfg.batch_size * model.num_decodes, input_length,
                  target_length, checkpoint_dtype, device_memory_gib)
  # Straight into their shards, once: the baseline run reuses the same arrays.
  params = layout.restore("target", model.module, checkpoint_path, checkpoint_dtype)
  draft_params = (None if draft_module is None else
                  layout.restore("draft", draft_module, model.draft_checkpoint_path,
                                 checkpoint_dtype))
  batches = make_batches(examples, dataset_cfg.batch_size, input_length, target_length)
  print(f"{infer_outputs.count(len(examples), 'example')} in "
        f"{infer_outputs.count(len(batches), 'batch')} of {dataset_cfg.batch_size}")

  name = (f"speculative decoder (target + {model.decoder.draft_description})"
          if model.is_speculative else "target")
  eos_id = model.output_vocabulary.eos_id
  stop = stop_signals.StopRequest()
  with stop.handling():
    checkpointing = Checkpointing(store, checkpoint_period, stop)
    timed_calls = {} if timing_rounds else None
    shared = dict(batches=batches, seed=seed, layout=layout, checkpointing=checkpointing,
                  num_decodes=model.num_decodes, timed_calls=timed_calls)
    run = decode_all(model.decoder, eos_id, params, draft_params,
                     progress=infer_outputs.progress(name), name="decoder", **shared)
    baseline = costs = side_by_side = None
    if compare_with_baseline:
      baseline = decode_all(model.decoder.baseline(), eos_id, params, None,
                            progress=infer_outputs.progress("baseline (target alone)"),
                            name="baseline", **shared)
    if timed_calls:
      print(f"timing both side by side: {infer_outputs.count(timing_rounds, 'round')}")
      side_by_side = infer_timing.side_by_side(timed_calls, len(batches), timing_rounds,
                                               stop.requested)
      if side_by_side is None:
        raise stop_signals.Stopped(
            stop.signum, f"stopped by {stop.name} while timing side by side (every output is "
            f"committed in {store.directory}); rerun the same command to finish")
    # Theorem 3.8 is speculative sampling's; a lookup's calls cost ~nothing.
    if (baseline is not None and draft_module is not None
        and model.decoder.loop.stats is stats.SpeculativeStats):
      print("measuring one target call of 1 and of gamma + 1 tokens, and one draft call")
      costs = call_costs.verification_costs(
          (model.module, params), (model.draft_module, draft_params),
          model.decode_settings["gamma"], dataset_cfg.batch_size, input_length, target_length)
  if jax.process_index() != 0:  # process 0 alone holds the committed outputs
    return None
  summary, records = infer_outputs.summarize(
      model, source, dataset_cfg, examples, run=run, baseline=baseline, costs=costs,
      eos_id=model.output_vocabulary.eos_id, side_by_side=side_by_side,
      timing_rounds=timing_rounds)
  summary["run_seconds"] = time.perf_counter() - start  # this run's inputs, restore, decode
  out = infer_outputs.write(output_dir, summary, records)
  store.finish()
  infer_outputs.print_report(summary, records, num_printed, out)
  return summary


def _run_identity(model: models.EncoderDecoderModel, cfg: DatasetConfig, *, source: str,
                  examples: Sequence[Example], checkpoint_path: str,
                  checkpoint_dtype: str | None, seed: int, compare_with_baseline: bool
                  ) -> dict[str, Any]:
  """What fixes a run's outputs, compared by `infer_chunks.ChunkStore` when a run resumes."""
  speculative = model.is_speculative
  return {
      "target": dataclasses.asdict(model.module.config), "checkpoint_path": checkpoint_path,
      "checkpoint_dtype": checkpoint_dtype,
      "draft": model.decoder.draft_description if speculative else None,
      "draft_checkpoint_path": getattr(model, "draft_checkpoint_path", None),
      "decode_loop": model.decoder.loop_name, "decode_settings": model.decode_settings,
      "num_decodes": model.num_decodes,
      "compare_with_baseline": compare_with_baseline, "seed": seed,
      "batch_size": cfg.batch_size, "task_feature_lengths": dict(cfg.task_feature_lengths),
      "source": source, "split": cfg.split if cfg.mixture_or_task_name else None,
      "num_examples": len(examples), "inputs": infer_chunks.inputs_digest(examples)}


# --------------------------------------------------------------------------- command line


def _task_directory_bindings(args: argparse.Namespace) -> list[str]:
  """--data_dir and --tfds_data_dir as the bindings of `spec_decode.tasks` they stand for."""
  bindings = [f"tasks.{name}.path = {value!r}" for name, value in (
      ("data_dir", args.data_dir), ("tfds_data_dir", args.tfds_data_dir)) if value is not None]
  if not bindings:
    return []
  return ["from __gin__ import dynamic_registration", "from spec_decode import tasks", *bindings]


def _task_settings(dataset_config_cls: type[DatasetConfig]) -> list[Callable[..., Any]]:
  """The `spec_decode.tasks` functions whose bindings the config's task reads (none without a
  task): they take effect although `infer` reaches them through no gin reference."""
  cfg = gin_utils.configured(dataset_config_cls)()
  if cfg.mixture_or_task_name is None:
    return []
  from spec_decode import tasks  # pylint: disable=g-import-not-at-top (TensorFlow: only for tasks)
  return tasks.settings_read_by(cfg.mixture_or_task_name)


def _run(args: argparse.Namespace, bindings: list[str]) -> int:
  if args.text is not None and args.input_file is not None:
    raise UsageError("give --text or --input_file, not both")
  gin_utils.initialize_distributed(args)
  command_line_settings = infer_timing.after_the_command_line(bindings)
  # The flags replace the config's input source, so they come after every other binding.
  if args.text is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.input_file = None",
                 f"infer.DatasetConfig.texts = {args.text!r}"]
  if args.input_file is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.texts = None",
                 f"infer.DatasetConfig.input_file = {args.input_file!r}"]
  bindings += _task_directory_bindings(args)
  gin_utils.parse_config(args.gin_file or [DEFAULT_GIN_FILE], bindings, args.gin_search_paths)
  # The function the configs bind: they import `spec_decode.infer`, which is not this module
  # when it runs as `python -m spec_decode.infer` (__main__).
  module = importlib.import_module("spec_decode.infer")
  try:
    gin_utils.check_bindings_take_effect([module.infer, *_task_settings(module.DatasetConfig)])
    gin.get_configurable(module.infer)(restart=args.restart, **command_line_settings)
  except (ValueError, FileNotFoundError) as e:  # a model, checkpoint or input the config names
    raise UsageError(gin_utils.first_line(e)) from None
  except stop_signals.Stopped as e:
    print(f"spec_decode.infer: {gin_utils.first_line(e)}", file=sys.stderr)
    return e.status
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m spec_decode.infer",
      description="T5X-style inference with speculative decoding (see the module docstring).")
  gin_utils.add_gin_arguments(parser, DEFAULT_GIN_FILE)
  parser.add_argument("--text", action="append", default=None,
                      help="an input to decode instead of the config's (repeatable)")
  parser.add_argument("--input_file", default=None,
                      help="decode this file's lines instead of the config's inputs")
  parser.add_argument("--data_dir", default=None,
                      help="data root of the file tasks (binds tasks.data_dir.path)")
  parser.add_argument("--tfds_data_dir", default=None,
                      help="where the TFDS tasks' datasets are prepared (T5X's flag; binds "
                           "tasks.tfds_data_dir.path)")
  parser.add_argument("--restart", action="store_true",
                      help="start over in an INFER_OUTPUT_DIR holding another run's chunks "
                           "(without it a rerun resumes there, or is refused if it differs)")
  gin_utils.add_distributed_arguments(parser)
  args, bindings = gin_utils.parse_args(parser, sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.infer", lambda: _run(args, bindings))


if __name__ == "__main__":
  sys.exit(main())
