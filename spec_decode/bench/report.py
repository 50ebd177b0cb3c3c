"""The report of a run: `write_report(report, output_dir)` writes `bench.json` (every number,
the machine and the operative gin config, via `plain`) and `bench.md` (`to_markdown`: one section
of tables per suite that ran, then the thresholds).

A report is `{"machine": describe_machine(), "compiler_options": {...}, "mesh": {"data": 1,
"model": num_partitions}, "suites": {name: result}, "timings_s": {name: seconds}, "thresholds":
[...], "gin_config": str}`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from spec_decode.bench import paper
from spec_decode.bench.simulated import SIMULATED

JSON_FILE = "bench.json"
MARKDOWN_FILE = "bench.md"

_THEORY_NOTE = (
    "tok/s and speedup: whole calls (encoders included). Loop speedup: the decoding loops "
    "alone, which Theorem 3.8 predicts. Predictions (`bench.compare_with_theory`), each "
    "dropping one assumption: from alpha (the paper's formula, i.i.d. acceptance, endless "
    "output); from the realized tokens per target call; and the same priced with one "
    "iteration's model calls timed together (interleaved) rather than each model alone. Loop "
    "speedup / the last = the engine's own overhead.")


def plain(value: Any) -> Any:
  """JSON-ready copy of a result: numpy scalars and arrays become Python numbers and lists."""
  if isinstance(value, Mapping):
    return {str(key): plain(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [plain(item) for item in value]
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value


def _number(value: Any, digits: int = 3) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}"
  return str(value)


def _rate(summary: Mapping[str, Any]) -> str:
  """tokens/s as 'median [min-max]'."""
  return (f"{summary['tokens_per_s']:.1f} [{summary['tokens_per_s_min']:.1f}-"
          f"{summary['tokens_per_s_max']:.1f}]")


def _predictions(row: Mapping[str, Any]) -> str:
  return (f"{row['predicted_speedup']:.2f} / {row['predicted_speedup_realized']:.2f} / "
          f"{row['predicted_speedup_interleaved']:.2f}")


def _over_predictions(row: Mapping[str, Any]) -> str:
  return (f"{row['measured_over_predicted']:.2f} / {row['measured_over_realized']:.2f} / "
          f"{row['measured_over_interleaved']:.2f}")


def _model_call_shares(baseline: Mapping[str, Any], speculative: Mapping[str, Any]) -> str:
  return f"{baseline['model_call_share']:.2f} / {speculative['model_call_share']:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_number(cell) for cell in row) + " |" for row in rows]
  return lines + [""]


def _own_baseline_section(own: Mapping[str, Any]) -> list[str]:
  lines = [f"## own_baseline: {own['pair']['description']}", ""]
  rows = []
  for group in own["groups"]:
    spec = group["speculative"]
    rows.append([group["temperature"], group["batch_size"], group["gamma"],
                 _rate(group["baseline"]), _rate(spec), spec["speedup"],
                 spec["decode_speedup"], spec["alpha"], spec["tokens_per_target_call"],
                 spec["c"], spec["v"], spec["interleaved_over_isolated"], _predictions(spec),
                 _over_predictions(spec), _model_call_shares(group["baseline"], spec)])
  lines += [_THEORY_NOTE, ""]
  lines += _table(["T", "batch", "gamma", "baseline tok/s", "speculative tok/s", "speedup",
                   "loop speedup", "alpha", "tokens/target call", "c", "v",
                   "interleaved / isolated calls", "predicted: alpha / realized / interleaved",
                   "loop speedup / each prediction", "model-call share base / spec"], rows)
  rows = []
  for group in own["groups"]:
    if "best_fixed" not in group:
      continue
    for label, row in group["variants"].items():
      rows.append([group["temperature"], group["batch_size"],
                   label + (" (best fixed)" if label == group["best_fixed"] else ""),
                   _rate(row), row["speedup"], group["tokens_per_s_over_best_fixed"][label],
                   row["accepted_per_target_call"], row["tokens_per_target_call"],
                   row["alpha"]])
  if rows:
    lines += ["### Verifiers and drafting policies", ""]
    lines += _table(["T", "batch", "decoder", "tok/s", "speedup", "vs best fixed",
                     "accepted/target call", "tokens/target call", "alpha"], rows)
  return lines


def _peer_section(peer: Mapping[str, Any]) -> list[str]:
  peers = ("T5X's sampler" if "torch_version" not in peer else
           f"Hugging Face generate (torch {peer['torch_version']}, "
           f"transformers {peer.get('transformers_version')}, on {peer.get('torch_device')}, "
           f"{peer['torch_num_threads']} threads, its own process)")
  # A language model's rows decode the rest of their decode after prompts of any length.
  decodes = (f"prompts continued to {peer['decode_length']} positions"
             if peer.get("decoder_only") else f"{peer['max_decode_len']} new tokens")
  lines = [f"## peer: {peers}, batch 1, gamma {peer['gamma']}, {decodes}", "",
           f"Pair: {peer['pair_description']}; target {peer['target_params'] / 1e6:.0f}M params, "
           f"draft {peer['draft_params'] / 1e6:.0f}M params (its own count, shared arrays "
           "included). Speedups: speculative over the same framework's baseline.", ""]
  if "error" in peer:
    lines += [f"Hugging Face not run: {peer['error']}", ""]
  if "t5x_error" in peer:
    lines += [f"T5X's sampler not run: {peer['t5x_error']}", ""]
  rows = []
  for entry in peer["temperatures"]:
    if "error" in entry:
      rows.append([peer["pair"], entry["temperature"], f"error: {entry['error']}"] + [""] * 9)
      continue
    agreement = entry.get("greedy_agreement_with_ours_baseline")
    agree = "-" if agreement is None else ", ".join(
        f"{label} {a['identical']}/{a['compared']}" for label, a in agreement.items())
    rows.append([peer["pair"], entry["temperature"], _rate(entry["ours baseline"]),
                 _rate(entry["ours speculative"]), entry["ours_speedup"],
                 *([_rate(entry["hf generate"]), _rate(entry["hf assisted"])]
                   if "hf generate" in entry else ["-", "-"]),
                 entry.get("hf_speedup"), entry.get("ours_speculative_over_hf_assisted"),
                 _rate(entry["t5x sampler"]) if "t5x sampler" in entry else "-",
                 entry.get("ours_speculative_over_t5x_sampler"),
                 entry["ours speculative"]["alpha"], agree])
  return lines + _table(["target", "T", "ours baseline tok/s", "ours speculative tok/s",
                         "ours speedup", "HF baseline tok/s", "HF assisted tok/s", "HF speedup",
                         "ours spec / HF assisted", "T5X sampler tok/s",
                         "ours spec / T5X sampler", "alpha (ours)",
                         "greedy identical to ours baseline"], rows)


def _simulated_table2_section(table2: Mapping[str, Any]) -> list[str]:
  lines = [f"## simulated_table2 ({SIMULATED})", "", table2["note"] + "; target "
           f"{table2['pair']['target']['num_params'] / 1e6:.3g}M params, draft "
           f"{table2['pair']['draft']['num_params'] / 1e6:.3g}M params.", "", _THEORY_NOTE, ""]
  rows = [[row["label"], row["gamma"], row["forced_alpha"], row["paper_speedup"],
           f"{row['speculative']['tokens_per_target_call']:.2f} / "
           f"{row['expected_tokens_per_target_call']:.2f}", row["c"], row["v"],
           row["interleaved_over_isolated"], _predictions(row), row["decode_speedup"],
           _over_predictions(row), _model_call_shares(row["baseline"], row["speculative"])]
          for row in table2["rows"]]
  return lines + _table(["row", "gamma", "alpha (forced)",
                         f"paper speedup ({paper.TARGET}, {paper.HARDWARE})",
                         "tokens/call realized / expected", "c", "v",
                         "interleaved / isolated calls",
                         "predicted: alpha / realized / interleaved", "measured loop speedup",
                         "loop speedup / each prediction", "model-call share base / spec"],
                        rows)


def _engine_cost_section(cost: Mapping[str, Any]) -> list[str]:
  lines = ["## engine_cost", "",
           "Per iteration of the speculative loop (per step of the baseline), batch 1: kernels "
           "the compiled loop executes outside / inside the model calls, seconds, the seconds "
           "of its model calls made alone, and the engine's share of the iteration.", ""]
  for which, groups in cost.items():
    for group in groups:
      lines += [f"### {which}, temperature {group['temperature']}", ""]
      rows = [["baseline", group["baseline"]]] + [[f"gamma {row['gamma']}", row]
                                                 for row in group["speculative"]]
      lines += _table(["decoder", "engine kernels", "model kernels", "ms / iteration",
                       "model ms", "engine share", "speedup"],
                      [[label, row["engine_kernels"], row["model_kernels"],
                        row["seconds"] * 1e3, row["model_seconds"] * 1e3, row["engine_share"],
                        row.get("speedup")] for label, row in rows])
  return lines


def _physical_limit_section(limit: Mapping[str, Any]) -> list[str]:
  copy = limit["copy"]
  lines = ["## physical_limit", "", f"Copy bandwidth: {copy['bytes_per_s'] / 1e9:.2f} GB/s "
           f"(read + write of a {copy['array_bytes'] / 2**20:.0f} MiB array; XLA "
           f"{copy['xla_bytes_per_s'] / 1e9:.2f}, numpy {copy['numpy_bytes_per_s'] / 1e9:.2f})."
           " Weights that fit in the CPU caches can exceed it.", ""]
  rows = [[t["model"], f"{t['num_params'] / 1e6:.3g}M", t["weight_bytes_per_step"] / 1e6,
           t["step_s"] * 1e3, t["weight_bytes_per_s"] / 1e9, t["fraction_of_copy_bandwidth"],
           t["fraction_with_kv_cache"]] for t in limit["targets"]]
  return lines + _table(["target", "params", "weight MB/step", "step ms", "weights GB/s",
                         "fraction of copy", "fraction incl. KV cache"], rows)


def _verify_cost_section(cost: Mapping[str, Any]) -> list[str]:
  read, matmul = cost["read_bandwidth"], cost["matmul"]
  lines = ["## verify_cost", "",
           f"v(k) = a k-token cached decoder call / a 1-token call, batch 1, cache "
           f"{cost['cache_length']}, input {cost['input_length']} (medians of "
           f"{cost['repetitions']} interleaved loops of {cost['calls_per_loop']} calls). Read "
           f"bandwidth {read['bytes_per_s'] / 1e9:.2f} GB/s (the best of row sums, a "
           f"matrix-vector product and numpy's sum over a {read['array_bytes'] / 2**20:.0f} MiB "
           "array), matmul "
           f"{cost['matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s ([{matmul['rows']}, "
           f"{matmul['size']}] x [{matmul['size']}, {matmul['size']}]). Roofline v: reading "
           "and computing overlapped; serial v: not overlapped.", ""]
  for model in cost["models"]:
    fraction = model.get("read_bandwidth_fraction")
    lines += [f"### {model['model']}: {model['num_params'] / 1e6:.0f}M params, "
              f"{model['weight_bytes_per_step'] / 1e6:.0f} MB of weights per step"
              + (f", 1-token call at {fraction:.0%} of the read bandwidth" if fraction else ""),
              ""]
    rows = [[row["k"], row["step_s"] * 1e3, row.get("v"),
             row["xla_step_s"] * 1e3 if "xla_step_s" in row else None, row.get("xla_v"),
             row["roofline_v"], row["serial_v"]] for row in model["rows"]]
    lines += _table(["k", "ours ms", "ours v", "XLA defaults ms", "XLA defaults v",
                     "roofline v", "serial v"], rows)
  return lines


_SECTIONS = (("own_baseline", _own_baseline_section), ("engine_cost", _engine_cost_section),
             ("peer", _peer_section),
             ("simulated_table2", _simulated_table2_section),
             ("physical_limit", _physical_limit_section),
             ("verify_cost", _verify_cost_section))


def to_markdown(report: Mapping[str, Any]) -> str:
  """The report's tables: one section per suite that ran, then the thresholds."""
  machine = report["machine"]
  load = machine["load_average_at_start"]
  load = "unknown" if load is None else " ".join(f"{value:.1f}" for value in load)
  lines = ["# spec_decode benchmark", "",
           f"{machine['cpu_model']}, {machine['usable_cores']} usable cores, load average at "
           f"start {load}; jax {machine['jax_version']} "
           f"({machine['jax_backend']}); our decoders on mesh {report['mesh']}. tokens/s are "
           "medians [min-max] over interleaved repetitions.", ""]
  if report["compiler_options"]:
    lines += [f"**XLA compiler options {report['compiler_options']}: compiled for a quick "
              "check, so these timings are not representative.**", ""]
  for suite, section in _SECTIONS:
    if report["suites"].get(suite):
      lines += section(report["suites"][suite])
  lines += ["## Thresholds (recorded, not asserted)", ""]
  lines += _table(["goal", "measured", "target", "status"],
                  [[g["goal"], g["measured"], g["target"], g["status"]]
                   for g in report["thresholds"]])
  return "\n".join(lines)


def write_report(report: Mapping[str, Any], output_dir: str) -> str:
  """Writes bench.json and bench.md to output_dir; returns the markdown."""
  markdown = to_markdown(report)
  with open(os.path.join(output_dir, JSON_FILE), "w") as f:
    json.dump(plain(report), f, indent=2)
  with open(os.path.join(output_dir, MARKDOWN_FILE), "w") as f:
    f.write(markdown + "\n")
  return markdown
