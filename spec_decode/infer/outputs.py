"""What `spec_decode.infer` writes and prints, and the checks that it can.

`summarize(model, source, cfg, examples, run=, baseline=, costs=, eos_id=)` -> (summary, records):
one record per example (inputs, prediction, target when known, score, the decode's counters;
the baseline's prediction and whether it is identical when compared) and the run's summary
(wall time, tokens/s, the loop's counters summed and their ratios (`engine.stats`: alpha and
tokens per target call, or beam steps per target call and coverage by tree depth; the target
calls saved); with the baseline its time, the speedup and whether the outputs are identical,
meaningful at temperature 0 and for beam search (timed side by side where asked:
`timing`); with measured call costs, Theorem 3.8's
prediction on this machine and where a (gamma+1)-token call costs one token's). `write` puts
INFER_OUTPUT_DIR/predictions.jsonl and summary.json in place whole (temporary file, then rename;
the usual mode, not a temporary file's 0600); `check_output_dir` refuses, before anything runs,
a place they could not be written; `print_report` is the screen report; `progress` says what a
decode is doing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from spec_decode import models
from spec_decode.engine import drafting
from spec_decode.engine import sampling
from spec_decode.engine import token_tree
from spec_decode.gin_utils import UsageError
from spec_decode.infer import inputs
from spec_decode.t5 import vocab

PREDICTIONS_FILE = "predictions.jsonl"
SUMMARY_FILE = "summary.json"


@dataclasses.dataclass
class DecodeRun:
  """Per-example outputs of one model over all batches, and the time of its compiled calls."""
  decodes: list[np.ndarray]  # [L] each
  aux: list[dict[str, Any]]
  compile_seconds: float
  seconds: float


def write_atomically(path: pathlib.Path, text: str) -> None:
  with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False,
                                   prefix=f".{path.name}.") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())  # on disk before it is renamed into place: whole after a crash too
  # A temporary file is private (0600); the output gets the usual mode (0644 under umask 022).
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(f.name, 0o666 & ~umask)
  os.replace(f.name, path)


def write(output_dir: str, summary: Mapping[str, Any],
          records: Sequence[Mapping[str, Any]]) -> pathlib.Path:
  """Writes predictions.jsonl and summary.json into output_dir (made if needed); returns it."""
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  for name in (PREDICTIONS_FILE, SUMMARY_FILE):
    for stale in out.glob(f".{name}.*"):  # the temporary file of a write that was killed
      stale.unlink()
  write_atomically(out / PREDICTIONS_FILE, "".join(
      json.dumps(record, ensure_ascii=False) + "\n" for record in records))
  write_atomically(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
  return out


def check_output_dir(output_dir: str) -> None:
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


def count(number: int, noun: str) -> str:
  return f"{number} {noun}" + ("" if number == 1 else "es" if noun.endswith("ch") else "s")


def progress(name: str) -> Callable[[str, int, int], None]:
  """Prints what a decode_all run is doing: compiling, then every tenth of the batches."""
  def report(stage: str, done: int, total: int) -> None:
    if stage == "compiling":
      print(f"{name}: compiling, then decoding", flush=True)
    elif total >= 10 and done % max(total // 10, 1) == 0 and done < total:
      print(f"{name}: {done}/{total} batches", flush=True)
  return report


def summarize(model: models.BaseTransformerModel, source: str, cfg: inputs.DatasetConfig,
               examples: Sequence[inputs.Example], *, run: DecodeRun, baseline: DecodeRun | None,
               costs: Mapping[str, float] | None, eos_id: int,
               side_by_side: Mapping[str, float] | None = None, timing_rounds: int = 0
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """(summary, per-example records): see the module docstring. `cfg` is the run's dataset
  config, `examples` its inputs; `side_by_side`: the seconds of
  `timing.side_by_side` in `timing_rounds` rounds, which the speedup then comes from."""
  settings = model.decode_settings
  # Greedy decoding and beam search (no temperature) draw nothing: their outputs must be the
  # baseline's.
  deterministic = (settings.get("temperature") is None
                   or sampling.is_greedy(settings["temperature"]))
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
      if deterministic:
        record["identical"] = bool(np.array_equal(run.decodes[i], baseline.decodes[i]))
    records.append(record)

  generated = sum(r["stats"]["generated_tokens"] for r in records)
  summary: dict[str, Any] = {
      "source": source, "split": cfg.split if cfg.mixture_or_task_name else None,
      "num_examples": len(examples), "batch_size": cfg.batch_size,
      "task_feature_lengths": dict(cfg.task_feature_lengths),
      "speculative": model.is_speculative, "decode_loop": model.decoder.loop_name,
      "decode_settings": settings, "num_decodes": model.num_decodes,
      "draft": model.decoder.draft_description if model.is_speculative else None,
      "generated_tokens": generated, "compile_seconds": run.compile_seconds,
      "wall_seconds": run.seconds, "tokens_per_second": generated / max(run.seconds, 1e-9)}
  stats_class = model.decoder.loop.stats
  if stats_class is not None:  # the run's counters, and their ratios (of sums)
    totals = {name: np.sum([r["stats"][name] for r in records], axis=0).tolist()
              for name in stats_class.counter_names()}
    summary.update(totals)
    summary.update({name: np.asarray(value).tolist()
                    for name, value in stats_class.ratios(totals).items()})
  if baseline is not None:
    summary["baseline"] = {
        "compile_seconds": baseline.compile_seconds, "wall_seconds": baseline.seconds,
        "tokens_per_second": sum(len(vocab.until_eos(d, eos_id)) for d in baseline.decodes)
                             / max(baseline.seconds, 1e-9)}
    summary["speedup"] = baseline.seconds / max(run.seconds, 1e-9)
    if side_by_side is not None:
      summary["side_by_side"] = {"rounds": timing_rounds, **side_by_side}
      summary["speedup_one_pass"] = summary["speedup"]
      summary["speedup"] = side_by_side["baseline"] / max(side_by_side["decoder"], 1e-9)
    summary["identical_outputs"] = (all(r["identical"] for r in records) if deterministic
                                    else None)
    if deterministic:
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


def print_report(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                  num_printed: int, output_dir: pathlib.Path) -> None:
  for record in records[:num_printed]:
    print(f"> {shorten(record['inputs'])}\n  {shorten(record['prediction'])}")
  if len(records) > num_printed:
    print(f"  ... ({len(records) - num_printed} more in {output_dir / PREDICTIONS_FILE})")
  line = (f"{count(summary['num_examples'], 'example')}, {summary['generated_tokens']} tokens in "
          f"{summary['wall_seconds']:.2f}s ({summary['tokens_per_second']:.0f} tokens/s)")
  gamma = summary["decode_settings"].get("gamma")
  if "alpha" in summary:
    line += (f"; alpha {summary['alpha']:.2f}, {summary['tokens_per_target_call']:.2f} tokens "
             f"per target call (gamma {gamma})")
  if "beam_steps_per_target_call" in summary:
    line += (f"; {summary['num_decodes']} beams, {summary['beam_steps_per_target_call']:.2f} "
             f"beam steps per target call (gamma {gamma})")
  if "accepted_depth_share" in summary:
    settings = summary["decode_settings"]
    tree = (f"widths {tuple(settings['tree_widths'])} chosen per row"
            if settings.get("tree_widths")
            else token_tree.DEFAULT_BRANCHING if settings["tree_branching"] is None
            else tuple(settings["tree_branching"]))
    line += (f"; {summary['tokens_per_target_call']:.2f} tokens per target call (tree {tree}, "
             f"{summary['accepted_per_iteration']:.2f} nodes accepted per call)")
  print(line)
  if "coverage_by_depth" in summary:
    print("target calls whose tree held every beam selected at depth 1..gamma: " + ", ".join(
        f"{share:.0%}" for share in summary["coverage_by_depth"]))
  if "baseline" in summary:
    identical = {True: "yes", False: "no", None: "n/a (temperature > 0)"}[
        summary["identical_outputs"]]
    if "side_by_side" in summary:
      timed = summary["side_by_side"]
      how = (f"each batch's fastest call in {count(timed['rounds'], 'round')} side by side: "
             f"{timed['decoder']:.2f}s against {timed['baseline']:.2f}s; one pass "
             f"{summary['speedup_one_pass']:.2f}x")
    else:
      how = "measured, wall clock"
    print(f"baseline (target alone): {summary['baseline']['wall_seconds']:.2f}s; speedup "
          f"{summary['speedup']:.2f}x ({how}); identical output: {identical}")
  if "costs" in summary:
    costs = summary["costs"]
    print(f"what it means: {summary['target_calls_saved']:.0%} fewer target calls than the "
          f"baseline ({summary['tokens_per_target_call']:.2f} tokens per call). On this "
          f"machine a {gamma + 1}-token target call costs {costs['v']:.2f}x a 1-token call and "
          f"a draft call {costs['c']:.2f}x, so the paper's formula (Theorem 3.8) predicts "
          f"{summary['predicted_speedup_this_machine']:.2f}x here; where a {gamma + 1}-token "
          f"call costs what a 1-token call does (TPU/GPU at batch 1, the paper's setting) it "
          f"predicts {summary['predicted_speedup_v1']:.2f}x for this alpha.")
  print(f"wrote {output_dir / PREDICTIONS_FILE} and {output_dir / SUMMARY_FILE}")


def shorten(text: str, limit: int = 120) -> str:
  return text if len(text) <= limit else text[:limit - 1] + "…"


