"""`python -m spec_decode.infer`: T5X-style inference from gin, speculative and baseline.

Run: `python -m spec_decode.infer --gin_file=FILE [--gin.MACRO=VALUE ...] [--gin_bindings=B ...]
[--text "sentence" ...] [--input_file FILE] [--data_dir DIR]`. Without --gin_file it runs
`spec_decode/configs/demo/infer.gin` (the shipped demo pair on bundled English sentences). Run configs
include `spec_decode/configs/runs/infer.gin`, whose macros are T5X's: MODEL (a `models.*Model`),
CHECKPOINT_PATH (the target's: T5X checkpoint, Hugging Face folder or demo .safetensors),
MIXTURE_OR_TASK_NAME (a seqio task of `spec_decode.tasks`), TASK_FEATURE_LENGTHS ({'inputs': Le,
'targets': L}), BATCH_SIZE, INFER_OUTPUT_DIR, plus SPLIT, NUM_EXAMPLES, INPUT_PREFIX and
COMPARE_WITH_BASELINE. `--text` (repeatable) and `--input_file` (one input per line) replace
the task by plain text, prefixed with INPUT_PREFIX.

What `infer` does, in this order (every check before anything is compiled or written):
  1. reads the inputs (task examples, trimmed to TASK_FEATURE_LENGTHS with EOS kept; or text,
     tokenized with the model's input vocabulary) and checks the task's vocabulary is the
     model's;
  2. restores the target's parameters (`models.load_params`) and the draft's
     (`model.draft_params`);
  3. jits `model.predict_batch_with_aux` with the parameters as ARGUMENTS and compiles it once
     for the one batch shape [BATCH_SIZE, Le] (the last batch is padded with copies of its last
     example); with COMPARE_WITH_BASELINE, also `model.baseline()` (the target alone, same
     sampling settings). A `partitioner` (`partitioning.PjitPartitioner`) replaces jax.jit by
     its `partition` with parameter, batch and replicated shardings: the one place it plugs in;
  4. decodes every batch, timing the compiled calls only;
  5. writes INFER_OUTPUT_DIR/predictions.jsonl (one line per example: inputs, prediction,
     target when known, score and the per-example stats; the baseline's prediction when
     compared) and INFER_OUTPUT_DIR/summary.json (alpha = sum of acceptance_sum / sum of
     verified_positions, tokens per target call = generated / target calls, wall time and
     tokens/s, and with the baseline its time, the speedup and whether the outputs are
     identical — meaningful at temperature 0; null otherwise), each written whole (temporary
     file, then rename);
  6. prints the first predictions and a short summary.
A usage error (unset required macro, unknown task, missing checkpoint or data, different
vocabularies, bad setting) prints one line `spec_decode.infer: error: ...` on stderr and exits
with status 2, leaving no output file behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import gin
import jax
import numpy as np

from spec_decode import paths
from spec_decode import call_costs
from spec_decode import compile_options
from spec_decode import gin_utils
from spec_decode import models
from spec_decode.gin_utils import UsageError
from spec_decode.engine import decoding
from spec_decode.engine import drafting
from spec_decode.t5 import vocab

DEFAULT_GIN_FILE = "spec_decode/configs/demo/infer.gin"
PREDICTIONS_FILE = "predictions.jsonl"
SUMMARY_FILE = "summary.json"


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
    texts = _read_input_file(cfg.input_file)
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


def _read_input_file(input_file: str) -> list[str]:
  """The non-blank lines of a UTF-8 text file; UsageError naming the file (and line)."""
  path = paths.resolve(input_file)
  if not os.path.isfile(path):
    raise UsageError(f"input file not found: {input_file}")
  with open(path, "rb") as f:
    raw_lines = f.read().split(b"\n")
  lines = []
  for number, raw in enumerate(raw_lines, start=1):
    try:
      lines.append(raw.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise UsageError(f"input file {input_file}, line {number}: not UTF-8 ({e.reason} at "
                       f"byte {e.start})") from None
  texts = [line for line in lines if line.strip()]
  if not texts:
    raise UsageError(f"input file {input_file} is empty")
  return texts


def read_examples(cfg: DatasetConfig, model: models.EncoderDecoderModel) -> list[Example]:
  """The run's inputs (see the module docstring); UsageError when there are none."""
  input_length, _ = _check_dataset_config(cfg)
  if cfg.mixture_or_task_name is not None:
    examples = _task_examples(cfg, model)
  else:
    examples = _text_examples(cfg, model, input_length)
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


@dataclasses.dataclass
class DecodeRun:
  """Per-example outputs of one model over all batches, and the time of its compiled calls."""
  decodes: list[np.ndarray]  # [L] each
  aux: list[dict[str, Any]]
  compile_seconds: float
  seconds: float


def _jit(fn: Callable, model: models.EncoderDecoderModel, partitioner: Any
         ) -> tuple[Callable, Callable[[Any, Any], tuple[Any, Any]]]:
  """(jitted fn(params, draft_params, batch, rng), place(params, draft_params) putting the
  parameters where the jitted function expects them)."""
  if partitioner is None:
    return (jax.jit(fn, compiler_options=compile_options.decode_compiler_options()),
            lambda params, draft_params: jax.device_put((params, draft_params)))
  from spec_decode import partitioning  # pylint: disable=g-import-not-at-top
  shapes, axes = partitioning.abstract_params(model.module.config)
  params_shardings = partitioner.logical_shardings(axes, shapes, what="parameter")
  draft_shardings = None
  if isinstance(model, models.SpeculativeEncoderDecoderModel) and model.is_speculative:
    # As partitioning.partition_decoders: a draft step is latency-bound, keep it local.
    draft_shapes, draft_axes = partitioning.abstract_params(model.draft_module.config)
    draft_shardings = partitioner.logical_shardings(
        draft_axes, draft_shapes,
        partitioning.replicated_parameter_rules(partitioner.logical_axis_rules),
        what="parameter")
  batch = partitioner.batch_sharding
  jitted = partitioner.partition(
      fn, (params_shardings, draft_shardings, batch, partitioner.replicated), batch)

  def place(params: Any, draft_params: Any) -> tuple[Any, Any]:
    return (jax.device_put(params, params_shardings),
            None if draft_params is None else jax.device_put(draft_params, draft_shardings))

  return jitted, place


def decode_all(model: models.EncoderDecoderModel, params: Any, draft_params: Any,
               batches: Sequence[tuple[dict[str, np.ndarray], int]], seed: int,
               partitioner: Any = None,
               progress: Callable[[str, int, int], None] = lambda *_: None) -> DecodeRun:
  """Compiles model.predict_batch_with_aux once and runs it over `batches`; `progress(stage,
  batches done, batches)` is called when compiling starts and after each batch."""

  def predict(params, draft_params, batch, rng):
    if draft_params is None:
      return model.predict_batch_with_aux(params, batch, rng=rng)
    return model.predict_batch_with_aux(params, batch, rng=rng, draft_params=draft_params)

  jitted, place = _jit(predict, model, partitioner)
  params, draft_params = place(params, draft_params)
  rngs = [jax.random.fold_in(jax.random.PRNGKey(seed), i) for i in range(len(batches))]
  progress("compiling", 0, len(batches))
  start = time.perf_counter()
  compiled = jitted.lower(params, draft_params, batches[0][0], rngs[0]).compile()
  compile_seconds = time.perf_counter() - start
  # One untimed call: the first execution of an executable pays one-off costs.
  jax.block_until_ready(compiled(params, draft_params, batches[0][0], rngs[0]))
  decodes, aux, seconds = [], [], 0.0
  for done, ((batch, num_real), rng) in enumerate(zip(batches, rngs), start=1):
    start = time.perf_counter()
    outputs = jax.block_until_ready(compiled(params, draft_params, batch, rng))
    seconds += time.perf_counter() - start
    progress("decoding", done, len(batches))
    batch_decodes, batch_aux = jax.device_get(outputs)
    for i in range(num_real):
      decodes.append(batch_decodes[i])
      aux.append({name: value[i].item() for name, value in batch_aux.items()})
  return DecodeRun(decodes, aux, compile_seconds, seconds)


# --------------------------------------------------------------------------- outputs


def _write_atomically(path: pathlib.Path, text: str) -> None:
  with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False,
                                   prefix=f".{path.name}.") as f:
    f.write(text)
  # A temporary file is private (0600); the output gets the usual mode (0644 under umask 022).
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(f.name, 0o666 & ~umask)
  os.replace(f.name, path)


def _check_output_dir(output_dir: str) -> None:
  """UsageError naming INFER_OUTPUT_DIR when outputs could not be written there."""
  out = pathlib.Path(output_dir)
  if out.exists() and not out.is_dir():
    raise UsageError(f"INFER_OUTPUT_DIR {output_dir} exists and is not a directory")
  existing = out
  while not existing.exists():
    existing = existing.parent
  if not existing.is_dir():
    raise UsageError(f"INFER_OUTPUT_DIR {output_dir} is under {existing}, which is a file")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f"INFER_OUTPUT_DIR {output_dir}: {existing} is not writable")


def _count(number: int, noun: str) -> str:
  return f"{number} {noun}" + ("" if number == 1 else "es" if noun.endswith("ch") else "s")


def _progress(name: str) -> Callable[[str, int, int], None]:
  """Prints what a decode_all run is doing: compiling, then every tenth of the batches."""
  def report(stage: str, done: int, total: int) -> None:
    if stage == "compiling":
      print(f"{name}: compiling, then decoding", flush=True)
    elif total >= 10 and done % max(total // 10, 1) == 0 and done < total:
      print(f"{name}: {done}/{total} batches", flush=True)
  return report


def _summarize(model: models.EncoderDecoderModel, source: str, cfg: DatasetConfig,
               examples: Sequence[Example], run: DecodeRun, baseline: DecodeRun | None,
               costs: Mapping[str, float] | None, eos_id: int
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """(summary, per-example records)."""
  settings = model.decode_settings
  greedy = settings.get("temperature") is not None and settings["temperature"] <= 1e-4
  records = []
  for i, example in enumerate(examples):
    tokens = vocab.until_eos(run.decodes[i], eos_id)
    record = {"inputs": example.inputs,
              "prediction": model.output_vocabulary.decode(tokens)}
    if example.target is not None:
      record["target"] = example.target
    record["score"] = run.aux[i]["scores"]
    record["stats"] = {name: value for name, value in run.aux[i].items() if name != "scores"}
    record["stats"].setdefault("generated_tokens", len(tokens))
    if baseline is not None:
      baseline_tokens = vocab.until_eos(baseline.decodes[i], eos_id)
      record["baseline_prediction"] = model.output_vocabulary.decode(baseline_tokens)
      if greedy:
        record["identical"] = bool(np.array_equal(run.decodes[i], baseline.decodes[i]))
    records.append(record)

  generated = sum(r["stats"]["generated_tokens"] for r in records)
  summary: dict[str, Any] = {
      "source": source, "split": cfg.split if cfg.mixture_or_task_name else None,
      "num_examples": len(examples), "batch_size": cfg.batch_size,
      "task_feature_lengths": dict(cfg.task_feature_lengths),
      "speculative": model.is_speculative, "decode_settings": settings,
      "generated_tokens": generated, "compile_seconds": run.compile_seconds,
      "wall_seconds": run.seconds, "tokens_per_second": generated / max(run.seconds, 1e-9)}
  if model.is_speculative:
    totals = {name: sum(r["stats"][name] for r in records) 
              for name in decoding.SpeculativeStats.counter_names()}
    summary.update(totals)
    summary["alpha"] = totals["acceptance_sum"] / max(totals["verified_positions"], 1)
    summary["tokens_per_target_call"] = totals["generated_tokens"] / max(totals["target_calls"], 1)
  if baseline is not None:
    summary["baseline"] = {
        "compile_seconds": baseline.compile_seconds, "wall_seconds": baseline.seconds,
        "tokens_per_second": sum(len(vocab.until_eos(d, eos_id)) for d in baseline.decodes)
                             / max(baseline.seconds, 1e-9)}
    summary["speedup"] = baseline.seconds / max(run.seconds, 1e-9)
    summary["target_calls_saved"] = 1 - totals["target_calls"] / max(generated, 1)
    summary["identical_outputs"] = (all(r["identical"] for r in records) if greedy else None)
    if greedy:
      summary["num_identical"] = sum(r["identical"] for r in records)
  if costs is not None:
    # Theorem 3.8 with this run's alpha: on this machine (its measured c and v), and where a
    # (gamma+1)-token call costs what a 1-token call does (v = 1: TPU/GPU at batch 1).
    gamma, alpha = settings["gamma"], summary["alpha"]
    summary["costs"] = dict(costs)
    summary["predicted_speedup_this_machine"] = float(drafting.expected_tokens_per_cost(
        alpha, gamma, costs["c"], costs["v"]))
    summary["predicted_speedup_v1"] = float(drafting.expected_tokens_per_cost(
        alpha, gamma, costs["c"], 1.0))
  return summary, records


def _print_report(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  num_printed: int, output_dir: pathlib.Path) -> None:
  for record in records[:num_printed]:
    print(f"> {_shorten(record['inputs'])}\n  {_shorten(record['prediction'])}")
  if len(records) > num_printed:
    print(f"  ... ({len(records) - num_printed} more in {output_dir / PREDICTIONS_FILE})")
  line = (f"{_count(summary['num_examples'], 'example')}, {summary['generated_tokens']} tokens in "
          f"{summary['wall_seconds']:.2f}s ({summary['tokens_per_second']:.0f} tokens/s)")
  if summary["speculative"]:
    line += (f"; alpha {summary['alpha']:.2f}, {summary['tokens_per_target_call']:.2f} tokens "
             f"per target call (gamma {summary['decode_settings']['gamma']})")
  print(line)
  if "baseline" in summary:
    identical = {True: "yes", False: "no", None: "n/a (temperature > 0)"}[
        summary["identical_outputs"]]
    print(f"baseline (target alone): {summary['baseline']['wall_seconds']:.2f}s; speedup "
          f"{summary['speedup']:.2f}x (measured, wall clock); identical output: {identical}")
  if "costs" in summary:
    gamma, costs = summary["decode_settings"]["gamma"], summary["costs"]
    print(f"what it means: {summary['target_calls_saved']:.0%} fewer target calls than the "
          f"baseline ({summary['tokens_per_target_call']:.2f} tokens per call). On this "
          f"machine a {gamma + 1}-token target call costs {costs['v']:.2f}x a 1-token call and "
          f"a draft call {costs['c']:.2f}x, so the paper's formula (Theorem 3.8) predicts "
          f"{summary['predicted_speedup_this_machine']:.2f}x here; where a {gamma + 1}-token "
          f"call costs what a 1-token call does (TPU/GPU at batch 1, the paper's setting) it "
          f"predicts {summary['predicted_speedup_v1']:.2f}x for this alpha.")
  print(f"wrote {output_dir / PREDICTIONS_FILE} and {output_dir / SUMMARY_FILE}")


def _shorten(text: str, limit: int = 120) -> str:
  return text if len(text) <= limit else text[:limit - 1] + "…"


def infer(model: models.EncoderDecoderModel = gin.REQUIRED,
          dataset_cfg: DatasetConfig = gin.REQUIRED, checkpoint_path: str = gin.REQUIRED,
          output_dir: str = gin.REQUIRED, compare_with_baseline: bool = False,
          partitioner: Any = None, seed: int = 0, num_printed: int = 10,
          checkpoint_dtype: str | None = None) -> dict[str, Any]:
  """Runs inference as described in the module docstring; returns the summary.

  `checkpoint_dtype`: the target's parameters are cast to it on restore (T5X's infer restores
  in 'bfloat16'); None keeps the checkpoint's dtype.
  """
  if not isinstance(model, models.EncoderDecoderModel):
    raise UsageError(f"MODEL must be a models.EncoderDecoderModel, got {type(model).__name__}")
  if compare_with_baseline and not model.is_speculative:
    raise UsageError("COMPARE_WITH_BASELINE needs a speculative decode_fn "
                     "(decoding.speculative_sample)")
  _check_output_dir(output_dir)
  start = time.perf_counter()
  examples = read_examples(dataset_cfg, model)
  # On the device once: the baseline run then reuses the same arrays.
  params = jax.device_put(models.load_params(model.module, checkpoint_path, checkpoint_dtype))
  draft_params = model.draft_params if model.is_speculative else None
  input_length, target_length = _check_dataset_config(dataset_cfg)
  batches = make_batches(examples, dataset_cfg.batch_size, input_length, target_length)
  print(f"{_count(len(examples), 'example')} in {_count(len(batches), 'batch')} of "
        f"{dataset_cfg.batch_size}")

  name = "speculative decoder (target + draft)" if model.is_speculative else "target"
  run = decode_all(model, params, draft_params, batches, seed, partitioner,
                   progress=_progress(name))
  baseline = costs = None
  if compare_with_baseline:
    baseline = decode_all(model.baseline(), params, None, batches, seed, partitioner,
                          progress=_progress("baseline (target alone)"))
    print("measuring one target call of 1 and of gamma + 1 tokens, and one draft call")
    costs = call_costs.verification_costs(
        (model.module, params), (model.draft_module, draft_params),
        model.decode_settings["gamma"], dataset_cfg.batch_size, input_length, target_length)
  source = dataset_cfg.mixture_or_task_name or dataset_cfg.input_file or "--text"
  summary, records = _summarize(model, source, dataset_cfg, examples, run, baseline, costs,
                                model.output_vocabulary.eos_id)
  summary["run_seconds"] = time.perf_counter() - start  # inputs, restore, compile and decode

  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  _write_atomically(out / PREDICTIONS_FILE, "".join(
      json.dumps(record, ensure_ascii=False) + "\n" for record in records))
  _write_atomically(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
  _print_report(summary, records, num_printed, out)
  return summary


# --------------------------------------------------------------------------- command line


def _run(args: argparse.Namespace, bindings: list[str]) -> None:
  if args.text is not None and args.input_file is not None:
    raise UsageError("give --text or --input_file, not both")
  # The flags replace the config's input source, so they come after every other binding.
  if args.text is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.input_file = None",
                 f"infer.DatasetConfig.texts = {args.text!r}"]
  if args.input_file is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.texts = None",
                 f"infer.DatasetConfig.input_file = {args.input_file!r}"]
  if args.data_dir is not None:
    bindings += ["from __gin__ import dynamic_registration", "from spec_decode import tasks",
                 f"tasks.data_dir.path = {args.data_dir!r}"]
  gin_utils.parse_config(args.gin_file or [DEFAULT_GIN_FILE], bindings, args.gin_search_paths)
  # The function the configs bind: they import `spec_decode.infer`, which is not this module
  # when it runs as `python -m spec_decode.infer` (__main__).
  infer_fn = importlib.import_module("spec_decode.infer").infer
  gin_utils.check_bindings_take_effect([infer_fn])
  try:
    gin.get_configurable(infer_fn)()
  except (ValueError, FileNotFoundError) as e:  # a model, checkpoint or input the config names
    raise UsageError(gin_utils.first_line(e)) from None


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
                      help="data root of the seqio tasks (binds tasks.data_dir.path)")
  args, bindings = gin_utils.parse_args(parser, sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.infer", lambda: _run(args, bindings))


if __name__ == "__main__":
  sys.exit(main())
