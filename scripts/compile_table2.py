"""Table 2 as XLA:TPU compiles it: every row of configs/table2/ (T5.1.1-XXL target) and of
configs/table2/t5_1_0/ (T5 1.0 11B target) compiled by `python -m spec_decode.aot` for one v4
chip (P = 1, topology v4:1x1x1) and for the 4 chips of a v4-8 (P = 4), plus target calls at
batch 1 / 8 / 32 and one row on a v4-32 slice (16 chips, 4 hosts); then docs/table2/compiled.md
written from the figures.

Run (Python 3.12 with `pip install -e . "jax[tpu]"`): `python scripts/compile_table2.py
[--family t5_1_1|t5_1_0 ...] [--stage S ...] [--num_partitions P ...] [--render_only]`. Each
job writes docs/table2/compiled/<family>/<job>.json and is skipped when that file exists, so an
interrupted run resumes. Per family and P: each row's speculative decode, one baseline per (task,
temperature), the target's calls of k = 1 and every row's gamma + 1 once per task, and each
draft's call; then (stage 'ops', jobs ops_p1_*) those calls on one chip again with the
operations each runs in sequence counted, for the fitted cost model of compiled.md's last
section. Nothing here is run on a TPU: memory and costs are the compiler's.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys
import time

from spec_decode import paths
from spec_decode.aot import cli
from spec_decode.aot import report
from spec_decode.bench import paper

OUT = paths.ROOT / "docs" / "table2" / "compiled"
FAMILIES = {
    # family: (harness gin file, row folder, the drafts' model gin files)
    "t5_1_1": ("configs/table2/spec_decode.gin", "configs/table2", "configs/models/t5_1_1"),
    "t5_1_0": ("configs/table2/t5_1_0/spec_decode.gin", "configs/table2/t5_1_0",
               "configs/models/t5_1_0"),
}
TARGET = {"t5_1_1": "T5.1.1-XXL", "t5_1_0": "T5 1.0 11B"}
# When each family's calls alone (the 'ops' and 'placement' jobs) were compiled.
CALLS_COMPILED = {"t5_1_1": "2026-12-05, load average about 5 from other work",
                  "t5_1_0": "2026-12-06, load average 2-3"}
PARTITIONS = {1: "v4:1x1x1", 4: "v4-8"}  # P: topology
CALL_BATCHES = (1, 8, 32)
# Both tasks' configs take 512 input and 128 target tokens, so their model calls are the same
# programs, and so are a baseline of one temperature and the decodes of one draft, gamma and
# temperature: compiled once, for this task's rows (the calls for every gamma + 1).
CALLS_TASK = "ende"


def _compiled_as(row_name: str) -> str:
  """The row whose compiled decode is `row_name`'s: a CALLS_TASK row of the same draft, gamma
  and temperature where there is one, else the row itself."""
  row = paper.TABLE2[row_name]
  return next((name for name, other in paper.TABLE2.items()
               if name.startswith(CALLS_TASK) and other.draft == row.draft
               and (other.gamma, other.temperature) == (row.gamma, row.temperature)),
              row_name)


def _row_args(family: str, row: str) -> list[str]:
  harness, folder, drafts = FAMILIES[family]
  draft_size = row.split("_")[1]
  return [f"--gin_file={harness}", f"--gin_file={folder}/{row}.gin",
          f"--draft_gin_file={drafts}/{draft_size}.gin"]


def jobs(family: str) -> list[tuple[str, str, list[str]]]:
  """(stage, job name, aot arguments) of one family: stage 'p1' and 'p4' the programs of every
  row on one chip and on four, 'more' the batch sweep and the multi-host row, 'ops' the calls
  on one chip again with their sequential operations counted."""
  found = []
  for num_partitions, topology in PARTITIONS.items():
    stage = f"p{num_partitions}"
    where = [f"--topology={topology}", f"--num_partitions={num_partitions}"]
    if num_partitions > 1:  # one chip's calls are the 'ops' jobs'
      tokens = sorted({1} | {row.gamma + 1 for row in paper.TABLE2.values()})
      found.append((stage, f"p{num_partitions}_{CALLS_TASK}_target_calls",
                    _row_args(family, f"{CALLS_TASK}_small_t0") + where + [
                        "--programs=target_calls",
                        f"--call_tokens={','.join(map(str, tokens))}"]))
    for task in ("ende", "cnndm"):
      rows = [name for name in paper.TABLE2 if name.startswith(task)]
      for name in rows:
        if _compiled_as(name) != name:
          continue
        programs = ["decode"]
        if name.split("_")[1] == "small" and task == CALLS_TASK:  # one baseline per temperature
          programs.append("baseline")
        if name.endswith("_t0") and num_partitions > 1 and task == CALLS_TASK:  # one per draft
          programs.append("draft_call")
        found.append((stage, f"p{num_partitions}_{name}",
                      _row_args(family, name) + where + [f"--programs={','.join(programs)}"]))
  for batch in CALL_BATCHES[1:]:
    found.append(("more", f"p4_ende_target_calls_b{batch}",
                  _row_args(family, "ende_small_t0") + [
                      "--topology=v4-8", "--num_partitions=4", f"--batch_size={batch}",
                      "--programs=target_calls,draft_call", "--call_tokens=1,8"]))
  found.append(("more", "p16_v4-32_ende_small_t0",
                _row_args(family, "ende_small_t0") + ["--topology=v4-32", "--num_partitions=16",
                                                      "--programs=decode"]))
  # The calls alone again with their sequential operations counted (`programs.sequential_ops`),
  # for the cost model fitted in `report.fit_op_latency`: per task the target's calls and each
  # draft's, on one chip (the paper's setting).
  for task in ("ende", "cnndm"):
    rows = [name for name in paper.TABLE2 if name.startswith(task)]
    tokens = sorted({1} | {paper.TABLE2[name].gamma + 1 for name in rows})
    for size in ("small", "base", "large"):
      programs = ["draft_call"] + (["target_calls"] if size == "small" else [])
      found.append(("ops", f"ops_p1_{task}_{size}",
                    _row_args(family, f"{task}_{size}_t0") + [
                        "--topology=v4:1x1x1", "--num_partitions=1",
                        f"--programs={','.join(programs)}",
                        f"--call_tokens={','.join(map(str, tokens))}"]))
  # Each draft's call on a v4-8 (P = 4) replicated and sharded like the target, for the
  # placement each row should use (`placement.draft_placements`).
  for size in ("small", "base", "large"):
    found.append(("ops", f"placement_p4_{CALLS_TASK}_{size}",
                  _row_args(family, f"{CALLS_TASK}_{size}_t0") + [
                      "--topology=v4-8", "--num_partitions=4", "--programs=draft_placement"]))
  # The largest batch whose decode fits a chip, per compiled row and P (`_largest_batch`), the
  # rows most apart in their caches first.
  order = sorted((name for name in paper.TABLE2 if _compiled_as(name) == name),
                 key=lambda name: (name.endswith("_t1"), name.split("_")[1] == "base"))
  for name in order:
    for num_partitions in PARTITIONS:
      found.append(("largest", f"largest_p{num_partitions}_{name}", [name]))
  return found


STAGES = ("p1", "p4", "largest", "ops", "more")


def run(families: list[str], stages: list[str], partitions: list[int]) -> None:
  """Every job of `stages` and `partitions` (P) not yet written, stage by stage (one chip,
  then four, then the rest), so an interrupted run has the paper's own setting first."""
  for stage in [stage for stage in STAGES if stage in stages]:
    for family in families:
      (OUT / family).mkdir(parents=True, exist_ok=True)
      for job_stage, name, arguments in jobs(family):
        if job_stage == stage and _partitions_of(name) in partitions:
          _run_job(family, name, arguments)


def _partitions_of(name: str) -> int:
  """P of a job, from its name: p4_..., largest_p1_..., ops_p1_..., p16_v4-32_..."""
  return int(re.search(r"(?:^|_)p(\d+)_", name).group(1))


def _run_job(family: str, name: str, arguments: list[str]) -> None:
  out = OUT / family / f"{name}.json"
  if out.exists():
    return
  if name.startswith("largest_") and not (OUT / family / name.replace("largest_", "")
                                          ).with_suffix(".json").exists():
    print(f"=== {family} {name}: skipped, its decode at batch 1 is not compiled yet", flush=True)
    return
  running = out.with_suffix(".running")  # another run of this script compiles it now
  try:
    running.touch(exist_ok=False)
  except FileExistsError:
    return
  print(f"=== {family} {name}", flush=True)
  start = time.perf_counter()
  try:
    if name.startswith("largest_"):
      status = _largest_batch(family, arguments[0], int(name.split("_")[1][1:]), out)
    else:
      status = cli.main(arguments + [f"--output_json={out}"])
  finally:
    running.unlink(missing_ok=True)
  print(f"=== {family} {name}: status {status} in {time.perf_counter() - start:.0f} s",
        flush=True)


# XLA:TPU leaves a program about this much less than a v4 chip's 32 GiB (its refusals: "exceeds
# available HBM (30.75G)"); only the first guess of the largest batch uses it, compiles decide.
XLA_RESERVED_BYTES = int(1.25 * 2**30)


def _largest_batch(family: str, row: str, num_partitions: int, out: pathlib.Path) -> int:
  """The largest batch whose speculative decode of `row` fits one chip at `num_partitions`,
  by compiles (`plan.largest_batch`, a batch fitting where XLA compiles it and its
  arguments, temporaries and code fit the chip's HBM): a probe at three quarters of what the
  plan's formula (caches growing with the batch) leaves room for, then a guess from the line
  through the probe's and batch 1's compiled bytes, searched from there. Needs the row's
  decode at batch 1 (stage p1 / p4). Writes every batch tried."""
  from spec_decode import plan  # pylint: disable=g-import-not-at-top
  from spec_decode.aot import runs  # pylint: disable=g-import-not-at-top
  from spec_decode.aot import topologies  # pylint: disable=g-import-not-at-top
  one = json.loads((OUT / family / f"p{num_partitions}_{row}.json").read_text())
  program, formula = one["programs"][0], one["plan"][one["programs"][0]["name"]]
  topology = topologies.topology(PARTITIONS[num_partitions])
  devices = topology.devices()
  harness, folder, drafts = FAMILIES[family]
  hbm = topology.chip.hbm_bytes
  tried: dict[int, dict | str] = {}

  def fits(batch_size: int) -> bool:
    if batch_size not in tried:
      run = runs.read_run(argparse.Namespace(
          gin_file=[harness, f"{folder}/{row}.gin"],
          draft_gin_file=f"{drafts}/{row.split('_')[1]}.gin", num_partitions=num_partitions,
          batch_size=batch_size, input_length=None, target_length=None), [], devices)
      found = runs.decode_program(run, lambda message: print(f"  batch {batch_size}: {message}",
                                                             flush=True))
      tried[batch_size] = found if isinstance(found, str) else {
          key: getattr(found, key) for key in ("argument_bytes", "temp_bytes", "code_bytes",
                                               "device_bytes", "compile_seconds")}
    found = tried[batch_size]
    return not isinstance(found, str) and found["device_bytes"] <= hbm

  room = hbm - XLA_RESERVED_BYTES - program["device_bytes"]
  probe = max(2, int(0.75 * room / formula["formula_cache"]))
  if not fits(probe):
    guess = probe // 2
  else:
    per_row = (tried[probe]["device_bytes"] - program["device_bytes"]) / (probe - 1)
    guess = 1 + int(room / per_row)
  largest = plan.largest_batch(fits, up_to=4 * probe, guess=guess)
  out.write_text(json.dumps({
      "row": row, "num_partitions": num_partitions, "topology": PARTITIONS[num_partitions],
      "probe": probe, "guess": guess, "largest": largest,
      "batch_1": {key: program[key] for key in ("argument_bytes", "temp_bytes", "code_bytes",
                                                 "device_bytes")},
      "tried": {str(batch): found for batch, found in sorted(tried.items())}}, indent=1) + "\n")
  return 0


# --------------------------------------------------------------------------- the document


def _load(family: str, folder: str = "") -> dict[str, dict]:
  """The figures of a family's jobs; `folder` 'before': those compiled before the TPU's decoder
  projections (`network.kernel_first_dot`), kept for the comparison."""
  return {path.stem: json.loads(path.read_text())
          for path in sorted((OUT / family / folder).glob("*.json"))}


def _goal(decode: dict, baseline: dict | None) -> tuple[float, bool] | None:
  """(the bound, whether the decode's temporaries keep to it): `report.temporaries_bound`."""
  if baseline is None:
    return None
  spec, base = (report.PlanComparison.from_json(entry)
                for entry in (decode["plan"][decode["programs"][0]["name"]],
                              baseline["plan"][baseline["programs"][1]["name"]]))
  bound = report.temporaries_bound(spec, base)
  return bound, spec.temp_bytes <= bound


def _baseline(figures: dict[str, dict], prefix: str, row_name: str) -> dict | None:
  """The figures of the job that compiled `row_name`'s baseline (the target alone at the row's
  temperature), where there is one."""
  for task in (row_name.split("_")[0], CALLS_TASK):
    found = figures.get(f"{prefix}{task}_small_t{row_name[-1]}")
    if found is not None and len(found["programs"]) > 1:
      return found
  return None


# Marks a largest batch searched on an earlier program of the row than the one in the table (its
# batch 1 compiled to other bytes): the cross-attention caches in their earlier layout.
EARLIER_PROGRAM = "*"


def _largest_cells(largest: dict | None, before: dict | None, program: dict) -> str:
  """'before -> after': after the largest batch found by compiles; before predicted from it:
  the batches the weight copies' bytes (the pre-fix decode's bytes at batch 1 less this one's)
  would take at the bytes each batch adds (compiled: batch 1 to the largest). `program`: the
  row's decode at batch 1 now; a search of another program is marked EARLIER_PROGRAM."""
  if largest is None:
    return "not searched"
  after = largest["largest"]
  if not after:
    return "none fits"
  mark = "" if largest["batch_1"]["temp_bytes"] == program["temp_bytes"] else EARLIER_PROGRAM
  found = largest["tried"][str(after)]
  if before is None or after == 1:
    return f"{after}{mark}"
  per_batch = (found["device_bytes"] - largest["batch_1"]["device_bytes"]) / (after - 1)
  extra = before["programs"][0]["device_bytes"] - largest["batch_1"]["device_bytes"]
  return f"{max(after - math.ceil(extra / per_batch), 0)} -> {after}{mark}"


def _gib(n: float) -> str:
  return f"{n / 2**30:.2f}"


def _roofline(call: dict, chip: dict) -> float:
  return max(call["flops"] / chip["bf16_flops_per_second"],
             call["argument_bytes"] / chip["hbm_bytes_per_second"])


def _calls(figures: dict[str, dict], num_partitions: int, row_name: str
           ) -> tuple[dict[str, dict], dict | None]:
  """A row's target calls ({k: figures}) and its draft's 1-token call: on one chip those of
  the 'ops' jobs, on more those compiled beside the decodes."""
  task, size, _ = row_name.split("_")
  if num_partitions == 1 and f"ops_p1_{task}_small" in figures:
    return (figures.get(f"ops_p1_{task}_small", {}).get("target_calls", {}),
            figures.get(f"ops_p1_{task}_{size}", {}).get("draft_call"))
  prefix = f"p{num_partitions}_"
  task = task if f"{prefix}{task}_target_calls" in figures else CALLS_TASK
  # The replicated draft's call of the placement jobs is the same program as the decode's.
  placed = figures.get(f"placement_{prefix}{CALLS_TASK}_{size}", {}).get("draft_placement", {})
  return (figures.get(f"{prefix}{task}_target_calls", {}).get("target_calls", {}),
          (figures.get(f"{prefix}{task}_{size}_t0") or {}).get("draft_call")
          or placed.get("replicated"))


def _reading(figures: dict[str, dict], prefix: str) -> list[str]:
  """What the table's compiled decodes say, computed from them."""
  found = {name: figures[prefix + _compiled_as(name)] for name in paper.TABLE2
           if prefix + _compiled_as(name) in figures}
  decodes = [decode["programs"][0] | {"plan": decode["plan"][decode["programs"][0]["name"]]}
             for decode in found.values()]
  if not decodes:
    return []
  largest = max(d["device_bytes"] for d in decodes)
  deviation = max(abs(d["argument_bytes"] / d["plan"]["formula_params"] - 1) for d in decodes)
  extra = [d["temp_bytes"] - d["plan"]["formula_cache"] for d in decodes]
  goals = [_goal(decode, _baseline(figures, prefix, name)) for name, decode in found.items()]
  goals = [goal for goal in goals if goal is not None]
  held = sorted({len(d["loop_relaid_parameters"]) for d in decodes
                 if "loop_relaid_parameters" in d})
  read = [d for d in decodes if "loop_relaid_state" in d]  # figures compiled since it is read
  relaid = [d["loop_relaid_state"] for d in read]
  return [f"{len(decodes)} rows compiled: the largest needs {_gib(largest)} GiB per chip "
          f"(arguments, temporaries, output and code), "
          f"{'every row fits' if all(d['plan']['fits'] for d in decodes) else 'NOT every row fits'}"
          f" a v4's 32 GiB; XLA's arguments are the plan formula's parameters to within "
          f"{max(deviation, 1e-4):.2%}; XLA's temporaries exceed the formula's caches by "
          f"{_gib(min(extra))}-{_gib(max(extra))} GiB"
          + ("" if not held else "; weights copied before the loop and held through it "
             f"(`programs.loop_relaid_parameters`): {' or '.join(map(str, held))} per decode")
          + ("" if not relaid else "; values copied into another layout at the loop's entry "
             f"(`programs.loop_relaid_state`): at most {max(map(len, relaid))} per decode, "
             f"{max(sum(size for _, size in found) for found in relaid) / 2**10:.1f} KiB"
             + ("" if len(read) == len(decodes) else f" (read in {len(read)} of them)"))
          + f"; {sum(kept for _, kept in goals)} of {len(goals)} rows with their baseline "
          "compiled keep to the goal."]


# What each fitted latency is paid for: a call figure's count of it.
LATENCY_TERMS = {
    "per operation in sequence": lambda call: call["sequential_ops"],
    "per call (a launch, a loop iteration)": lambda call: 1,
}


def _op_latency_rows(figures: dict[str, dict], count=LATENCY_TERMS["per operation in sequence"]
                     ) -> list:
  """Each Table 2 row's `report.CallCosts` from the 'ops' jobs (calls on one chip with their
  sequential operations counted), each call's count of the fixed latency `count` of its
  figures; empty until they are compiled."""
  rows = []
  for row_name, row in paper.TABLE2.items():
    if f"ops_p1_{row_name.split('_')[0]}_small" not in figures:
      return []
    calls, draft = _calls(figures, 1, row_name)
    if not draft or "1" not in calls or str(row.gamma + 1) not in calls:
      return []
    chip = figures[f"ops_p1_{row_name.split('_')[0]}_small"]["chip"]
    cost = lambda call, chip=chip: (_roofline(call, chip), count(call))
    rows.append(report.CallCosts(row_name, row.alpha, row.gamma, row.speedup, cost(calls["1"]),
                                 cost(calls[str(row.gamma + 1)]), cost(draft)))
  return rows


def _op_latency_section(family: str, figures: dict[str, dict]) -> list[str]:
  """The roofline plus one fitted latency per operation, or per call, against the paper's rows,
  and what no model of these calls' costs can reach."""
  from spec_decode.bench import theory  # pylint: disable=g-import-not-at-top
  terms = {name: _op_latency_rows(figures, count) for name, count in LATENCY_TERMS.items()}
  if not all(terms.values()):
    return []
  rows = terms["per operation in sequence"]
  error = lambda predicted, row: predicted / row.speedup - 1
  rms = lambda predicted: math.sqrt(sum(math.log(p / row.speedup) ** 2
                                        for row, p in zip(rows, predicted)) / len(rows))
  roofline = [row.predicted_speedup(0.0) for row in rows]
  fits = {}
  for name, term_rows in terms.items():
    latency = report.fit_op_latency(term_rows)
    fits[name] = (latency, [row.predicted_speedup(latency) for row in term_rows],
                  report.leave_one_out(term_rows))
  lines = [
      "### A fixed latency per operation or per call (P = 1, compiled and fitted, not measured)",
      "",
      "Each call's time is its roofline plus one fixed latency for every operation its compiled "
      "program runs in sequence (`programs.sequential_ops`: fusions, copies, custom calls, "
      "collectives; prefetches and views left out), or plus one per call (a launch, a loop "
      "iteration: the same for a draft's call and a target's), the one latency fitted to the "
      "paper's speedups (`report.fit_op_latency`, least squares of log(predicted / paper)); "
      "'left out' fits it on the 11 other rows and predicts the row with that. At P = 1 no "
      "call runs a collective, so a latency per collective is nothing here. The calls were "
      "compiled alone for one v4 chip with the TPU's decoder projections (the 'ops' jobs of "
      f"`python scripts/compile_table2.py --family {family}`, {CALLS_COMPILED[family]}). "
      "Percentages: predicted / paper - 1.", "",
      "| row | target k=1: roofline ms, ops | k=gamma+1: ops | draft k=1: roofline ms, ops | "
      "roofline | per operation: fitted, left out | per call: fitted, left out | paper |",
      "|---|---|---|---|---|---|---|---|"]
  for i, (row, plain) in enumerate(zip(rows, roofline)):
    cells = []
    for latency, fitted, held_out in fits.values():
      cells.append(f"{fitted[i]:.2f}x ({error(fitted[i], row):+.0%}), "
                   f"{held_out[i][2]:.2f}x ({error(held_out[i][2], row):+.0%})")
    lines.append(f"| {row.name} | {row.target[0] * 1e3:.2f}, {row.target[1]} | "
                 f"{row.verify[1]} | {row.draft[0] * 1e3:.3f}, {row.draft[1]} | "
                 f"{plain:.2f}x ({error(plain, row):+.0%}) | {' | '.join(cells)} | "
                 f"{row.speedup}x |")
  lines.append("")
  worst = lambda predicted: max(abs(error(p, row)) for row, p in zip(rows, predicted))
  lines.append(f"Roofline alone: RMS of log(predicted / paper) {rms(roofline):.3f}, worst row "
               f"{worst(roofline):.0%} off.")
  for name, (latency, fitted, held_out) in fits.items():
    alone = [predicted for _, _, predicted in held_out]
    spread = [held * 1e6 for _, held, _ in held_out]
    lines.append(f"{name[0].upper()}{name[1:]}: fitted {latency * 1e6:.2f} us (left out: "
                 f"{min(spread):.2f}-{max(spread):.2f} us); RMS {rms(fitted):.3f} fitted, "
                 f"{rms(alone):.3f} left out; worst row left out {worst(alone):.0%} off, "
                 f"{sum(abs(error(p, row)) <= 0.15 for row, p in zip(rows, alone))} of "
                 f"{len(rows)} rows within 15%.")
  large = next(row for row in rows if row.name == "ende_large_t0")
  small = next(row for row in rows if row.name == "ende_small_t0")
  alone = report.fit_op_latency([large])
  groups = report.least_worst_errors(rows)
  same = "; ".join(f"{', '.join(names)}: {factor - 1:.0%}"
                   for names, factor in sorted(groups, key=lambda group: -group[1]))
  asked = lambda name: (theory.predicted_speedup(paper.TABLE2[name].alpha,
                                                 paper.TABLE2[name].gamma, 0.0, 1.0)
                        / paper.TABLE2[name].speedup)
  lines += [
      "", f"What it says. Neither term explains the large drafts. The {TARGET[family]} target "
      f"runs about as many operations in sequence ({large.target[1]} at k=1) as the T5-large draft "
      f"({large.draft[1]}): both have 24 decoder layers, so a cost per operation (or per layer) "
      "lengthens target and draft calls alike and c barely moves; a cost per call does the "
      "same to every draft. The latency per operation that alone gives ende_large_t0 the "
      f"paper's {large.speedup}x is {alone * 1e6:.2f} us, and with it ende_small_t0 falls to "
      f"{small.predicted_speedup(alone):.2f}x (paper {small.speedup}x): fitted on all rows, "
      "each term trades the small drafts' fit for the large ones'.", "",
      "**No model of these calls' costs reaches 15% on every row.** EnDe and CNNDM compile to "
      "the same calls here (both tasks' configs take 512 input and 128 target tokens), so rows "
      "of one draft and one gamma share c and v(gamma+1) under any cost model, and Theorem 3.8 "
      "gives each E / (gamma c + v) with its own E = (1 - alpha^(gamma+1)) / (1 - alpha) from "
      "the paper's alpha: the shared denominator that serves them best still leaves one of them "
      "off by half the spread of E / paper (`report.least_worst_errors`): "
      f"{same}. The paper's ende_large_t1 (alpha {paper.TABLE2['ende_large_t1'].alpha}, "
      f"{paper.TABLE2['ende_large_t1'].speedup}x) and cnndm_large_t0 (alpha "
      f"{paper.TABLE2['cnndm_large_t0'].alpha}, {paper.TABLE2['cnndm_large_t0'].speedup}x) "
      "both draft 3 tokens with T5-large for the same target, yet ask for denominators "
      f"{asked('ende_large_t1') / asked('cnndm_large_t0'):.2f} times apart: the paper's own "
      "alpha and speedups are not one function of c and v, so the "
      "missing cost is not in the calls (the paper's own implementation, per-task serving "
      "costs, or alpha measured differently from the speedup are what remain; none is "
      "testable here). The 15% leave-one-out goal is out of reach for any model of the "
      "calls' costs, whatever its terms and parameters.", "",
      "How far to trust this: 12 rows but 3 draft calls and one target call per task, one chip "
      "kind, every time a roofline of a compiled program and none measured, and the paper's "
      "speedups measured on its own implementation; the counts are exact for these programs, "
      "the latencies only what fits best. The least-worst errors need no timing at all: they "
      "follow from the paper's alpha, gamma and speedups and the fact that the calls are the "
      "same programs.", ""]
  return lines


def _placement_section(family: str, figures: dict[str, dict]) -> list[str]:
  """Each draft's call on a v4-8 replicated and sharded like the target, and which to use."""
  found = {size: figures.get(f"placement_p4_ende_{size}") for size in ("small", "base", "large")}
  if not all(found.values()):
    return []
  latency = next(iter(found.values()))["draft_placements"][0]["collective_latency"]
  lines = [
      "### Draft placement on a v4-8 (P = 4, EnDe; compiled, the collective latency assumed)",
      "",
      "Each draft's 1-token call compiled alone with its parameters replicated on the 4 chips "
      "(`decode_layout`'s default) and sharded like the target's (the T5X hook's SHARD_DRAFT): "
      "its roofline per chip plus the collectives the call runs (counted in its compiled HLO) "
      f"at an assumed {latency * 1e6:.3g} us each (`placement.COLLECTIVE_LATENCY`, not measured; "
      "`python -m spec_decode.aot --programs=draft_placement --collective_latency=S`). "
      "'Break-even' is the collective latency below which the sharded draft is the cheaper: "
      "the roofline it saves over its collectives. The 'placement' jobs of "
      f"`python scripts/compile_table2.py --family {family}`, {CALLS_COMPILED[family]}.", "",
      "| draft | replicated: roofline ms, collectives | sharded: roofline ms, collectives | "
      "break-even us | use |", "|---|---|---|---|---|"]
  for size, figures_of in found.items():
    placements = {p["placement"]: p for p in figures_of["draft_placements"]}
    replicated, sharded = placements["replicated"], placements["sharded"]
    cell = lambda p: (f"not possible ({p['impossible'].split(': ')[-1].split(' (e.g.')[0]})"
                      if p["impossible"]
                      else f"{p['roofline_seconds'] * 1e3:.3f}, {p['collectives']}")
    even = "-"
    if not sharded["impossible"] and sharded["collectives"]:
      saved = replicated["roofline_seconds"] - sharded["roofline_seconds"]
      even = f"{saved / sharded['collectives'] * 1e6:.2f}"
    best = figures_of["draft_placements"][0]["placement"]
    lines.append(f"| T5-{size} | {cell(replicated)} | {cell(sharded)} | {even} | {best} |")
  return lines + [
      "", "A sharded draft runs collectives inside its call (three per decoder layer and one "
      "more, by the counts above), so the choice turns on the latency of one small collective "
      "on the chips' interconnect, which no compile gives: below the "
      "break-even the sharded draft is the cheaper, above it the replicated one. Measure it "
      "on a TPU before trusting the 'use' column.", "",
      "Every Table 2 row takes its draft's verdict (CNNDM's calls are EnDe's: the same "
      "lengths), and the configs already run it: the draft replicated is `decode_layout`'s "
      "default and the T5X hook's (`SHARD_DRAFT = False`, configs/t5x/speculative.gin), and "
      "configs/table2 sets neither. So at P = 4 the predicted speedups stay below P = 1's (the "
      "P = 4 table: c four times P = 1's); where a TPU measures a collective below the "
      "break-even, the sharded draft's c is its roofline plus its collectives over the "
      "target's, and at no collective cost it is P = 1's c again, P = 1's speedup.", ""]


def render() -> str:
  from spec_decode.bench import theory  # pylint: disable=g-import-not-at-top
  lines = [
      "# Table 2 as XLA:TPU compiles it",
      "",
      "Every program below was **compiled, not run**: XLA's TPU compiler (libtpu's "
      "compile-only client) built it on a 2-core CPU host with no TPU "
      "(`python scripts/compile_table2.py`, one `python -m spec_decode.aot` per job). Memory "
      "is XLA's per-device `memory_analysis()`. Call times are not measurements: 'roofline' "
      "is max(flops / 275 TFLOP/s, argument bytes / 1200 GB/s), the published bf16 and HBM "
      "peaks of a v4 chip, a bound no call beats; XLA's own `optimal_seconds` is negative "
      "for these programs and is left out (see docs/TPU_COMPILE.md). Theorem 3.8's speedup "
      "uses the paper's alpha for the row with c and v(gamma+1) from those rooflines; the "
      "paper's measured speedup is beside it. `scripts/accelerator_check.sh` is the check "
      "for when a TPU is lent.",
      "",
      "The decodes are compiled with the TPU's decoder projections (`network.kernel_first_dot`, "
      "docs/TPU_COMPILE.md), which keep XLA:TPU from copying the decoder's attention kernels "
      "into another layout before the loop and holding the copies through it, and with the "
      "cross-attention caches held as the prefill writes them ([B, H, D, Le]), which keeps it "
      "from copying those at the loop's entry (every row of both families compiled so on "
      "2026-12-06 on an AMD EPYC host of 2 cores, at load averages of 2-5 from the test suite "
      "or another compile beside them, which the compile seconds in the figures reflect; the "
      "calls compiled alone in the 'ops', 'placement' and 'more' jobs on 2026-12-05 and -06 "
      "with the caches in their earlier layout, the same argument bytes). 'Before' is the "
      "same decode compiled before that change (at commit b8e1366, kept in a `before` folder "
      "beside each family's figures in docs/table2/compiled). The goal for each row: its "
      "speculative decode's temporaries at most its baseline's (the target alone, same task "
      "and temperature) plus the draft's caches (the plan formula's), plus "
      f"{report.TEMPORARIES_MARGIN:.0%} (`report.temporaries_bound`); XLA's temporaries include "
      "what XLA:TPU prefetches into a v4 chip's 128 MiB CMEM, beside its HBM, which is what the "
      "rows that miss the goal miss it by: compiled with CMEM's prefetching off, EnDe's T = 0 "
      "rows keep to it on one chip and on four (docs/TPU_COMPILE.md: the decode prefetches the "
      "draft's weights, the baseline the target's). 'Largest batch': the largest "
      "batch "
      "whose speculative decode fits the chip, by compiles (the 'largest' stage: a probe batch, "
      "a guess from the line through its bytes and batch 1's, `plan.largest_batch` searching "
      "from the guess; XLA:TPU refusing to compile a batch, RESOURCE_EXHAUSTED, counts as not "
      "fitting); before the change it is predicted, not compiled: the after figure less the "
      "batches that the copies' bytes (the pre-change decode's bytes at batch 1 less this "
      "one's; the copies are weights, the same at every batch) take at the bytes each batch "
      "adds. Both tasks' configs take 512 input and 128 target tokens, so a CNNDM row with "
      "an EnDe row's draft, gamma and temperature is that row's program and shows its figures.",
      "",
      "How to read c and the prediction. At batch 1 every call is bound by reading its weights "
      "(v(gamma+1) = 1.00 by the roofline in every row: a verification call of up to 8 tokens "
      "costs what a 1-token call does, the paper's assumption), so c is the ratio of the "
      "draft's and the target decoder's bytes per chip. The draft is replicated on every chip "
      "(`decode_layout`'s default), the target split: at P = 4 a chip holds a quarter of the "
      "target's weights but all of the draft's, so c is four times P = 1's and the predicted "
      "speedup falls; sharding the draft like the target (`decode_layout`'s "
      "`draft_logical_axis_rules`, the T5X hook's SHARD_DRAFT) would keep P = 1's c. Against "
      "the paper's measurements (one TPU-v4, their fine-tuned models and alpha), the roofline "
      "predicts the small drafts' speedups closely and overpredicts the large drafts'; one "
      "fixed latency per operation run in sequence or per call, fitted on the paper's rows, "
      "does not explain that, and no model of the calls' costs can bring every row within 15% "
      "(the sections on fixed latencies).",
      ""]
  for family in FAMILIES:
    figures, before = _load(family), _load(family, "before")
    lines += [f"## {TARGET[family]} target ({FAMILIES[family][1]})", ""]
    if not any(name.startswith(tuple(f"p{p}_" for p in PARTITIONS)) for name in figures):
      if not before:
        continue
      figures, before = before, {}
      lines += ["**Compiled before the TPU's decoder projections and not compiled again**: the "
                "temporaries below include the weight copies they no longer make.", ""]
    for num_partitions, topology in PARTITIONS.items():
      prefix = f"p{num_partitions}_"
      lines += [f"### P = {num_partitions} ({topology}: {num_partitions} v4 chip"
                f"{'s' if num_partitions > 1 else ''}, batch 1, bfloat16 target)", "",
                "| row | gamma | decode: arguments + temporaries GiB (plan formula: params + "
                "cache) | temporaries before GiB | code MiB (before) | baseline temporaries "
                "GiB | goal: at most GiB | loop collectives | largest batch: before (predicted) "
                "-> after (compiled) | c | v(gamma+1) | Theorem 3.8 (roofline) | paper |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
      earlier = False  # a largest batch marked EARLIER_PROGRAM
      for row_name, row in paper.TABLE2.items():
        calls, draft = _calls(figures, num_partitions, row_name)
        c = v = predicted = None
        if calls and draft:
          chip = next(found["chip"] for found in figures.values() if "chip" in found)
          one = _roofline(calls["1"], chip)
          c = _roofline(draft, chip) / one
          if str(row.gamma + 1) in calls:
            v = _roofline(calls[str(row.gamma + 1)], chip) / one
            predicted = theory.predicted_speedup(row.alpha, row.gamma, c, v)
        estimate = (f"{'-' if c is None else f'{c:.3f}'} | {'-' if v is None else f'{v:.2f}'} | "
                    f"{'-' if predicted is None else f'{predicted:.2f}x'} | {row.speedup}x |")
        decode = figures.get(prefix + _compiled_as(row_name)) or figures.get(prefix + row_name)
        if decode is None:
          old = before.get(prefix + row_name)
          old_cells = (" | |" if old is None else
                       f" {_gib(old['programs'][0]['temp_bytes'])} | "
                       f"({old['programs'][0]['code_bytes'] / 2**20:.0f}) |")
          lines.append(f"| {row_name} | {row.gamma} | not compiled again |{old_cells}" + " |" * 4
                       + f" {estimate}")
          continue
        program = decode["programs"][0]
        plan = decode["plan"][program["name"]]
        baseline = _baseline(figures, prefix, row_name)
        old = before.get(prefix + row_name)
        collectives = {}
        for op, _ in program["loop_collectives"]:
          collectives[op] = collectives.get(op, 0) + 1
        goal = _goal(decode, baseline)
        goal_text = "" if goal is None else ("kept" if goal[1] else "MISSED")
        code_before = ("" if old is None else
                       f" ({old['programs'][0]['code_bytes'] / 2**20:.0f})")
        largest = _largest_cells(figures.get(f"largest_{prefix}{_compiled_as(row_name)}"), old,
                                 program)
        earlier |= largest.endswith(EARLIER_PROGRAM)
        lines.append(
            f"| {row_name} | {row.gamma} | {_gib(program['argument_bytes'])} + "
            f"{_gib(program['temp_bytes'])} ({_gib(plan['formula_params'])} + "
            f"{_gib(plan['formula_cache'])}) | "
            f"{'-' if old is None else _gib(old['programs'][0]['temp_bytes'])} | "
            f"{program['code_bytes'] / 2**20:.0f}{code_before} | "
            f"{'-' if baseline is None else _gib(baseline['programs'][1]['temp_bytes'])} | "
            f"{'-' if goal is None else f'{_gib(goal[0])}: {goal_text}'} | "
            f"{', '.join(f'{op} x{n}' for op, n in sorted(collectives.items())) or 'none'} | "
            f"{largest} | {estimate}")
      lines += _reading(figures, prefix) + [""]
      if earlier:
        lines += [f"{EARLIER_PROGRAM} The largest batch of the row's decode with the "
                  "cross-attention caches in their earlier layout ([B, Le, H, D], which XLA:TPU "
                  "copied into the loop's layout at its entry; docs/TPU_COMPILE.md), not "
                  "searched again.", ""]
    # A call alone holds no loop, so no weight copy outlives it: the calls' rooflines compiled
    # before the TPU's decoder projections stand, where they are not compiled again.
    sweep = [(batch, figures.get(name) or before.get(name)) for batch, name in (
        (batch, "p4_ende_target_calls" if batch == 1 else f"p4_ende_target_calls_b{batch}")
        for batch in CALL_BATCHES)]
    sweep = [(batch, found) for batch, found in sweep if found]
    if sweep:
      old = [str(batch) for batch in CALL_BATCHES[1:]
             if f"p4_ende_target_calls_b{batch}" not in figures]
      lines += ["### How v grows with the batch (EnDe, P = 4, roofline)", ""]
      if old:
        lines += [f"Batches {' and '.join(old)} compiled before the TPU's decoder projections (a "
                  "call alone holds no loop, so no weight copy outlives it; its flops and "
                  "arguments are the same).", ""]
      lines += ["| batch | target k=1 GFLOP / chip | k=8 GFLOP / chip | arguments GiB | "
                "v(8) | c |", "|---|---|---|---|---|---|"]
      for batch, found in sweep:
        calls, chip = found["target_calls"], found["chip"]
        one = _roofline(calls["1"], chip)
        draft = found.get("draft_call") or figures.get("p4_ende_small_t0", {}).get("draft_call")
        lines.append(f"| {batch} | {calls['1']['flops'] / 1e9:.1f} | "
                     f"{calls['8']['flops'] / 1e9:.1f} | {_gib(calls['1']['argument_bytes'])} | "
                     f"{_roofline(calls['8'], chip) / one:.2f} | "
                     f"{'-' if not draft else f'{_roofline(draft, chip) / one:.3f}'} |")
      lines.append("")
    multi = figures.get("p16_v4-32_ende_small_t0") or before.get("p16_v4-32_ende_small_t0")
    if multi:
      program = multi["programs"][0]
      lines += [f"### Multi-host: ende_small_t0 on a v4-32 (16 chips, {multi['num_hosts']} "
                f"hosts, mesh {multi['mesh']})", "",
                ("" if "p16_v4-32_ende_small_t0" in figures else
                 "Compiled before the TPU's decoder projections, not compiled again. ")
                + f"Compiled in {program['compile_seconds']:.0f} s: "
                f"{_gib(program['argument_bytes'])} GiB arguments, "
                f"{_gib(program['temp_bytes'])} GiB temporaries, "
                f"{program['code_bytes'] / 2**20:.0f} MiB code per chip; collectives inside "
                f"the loop: {len(program['loop_collectives'])}, all "
                f"{sorted({op for op, _ in program['loop_collectives']})}.", ""]
    lines += _op_latency_section(family, figures) + _placement_section(family, figures)
    times = [p["compile_seconds"] for f in figures.values() for p in f.get("programs", [])]
    if times:
      lines += [f"Whole decodes compiled in {min(times):.0f}-{max(times):.0f} s each on this "
                "host.", ""]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
  parser.add_argument("--stage", action="append", choices=STAGES,
                      help="only these stages' jobs (default: all)")
  parser.add_argument("--num_partitions", action="append", type=int,
                      help="only the jobs of this P (default: all; P = 4's largest-batch "
                           "searches take minutes a batch)")
  parser.add_argument("--render_only", action="store_true")
  args = parser.parse_args(argv)
  known = sorted({_partitions_of(name) for family in FAMILIES for _, name, _ in jobs(family)})
  unknown = sorted(set(args.num_partitions or []) - set(known))
  if unknown:
    parser.error(f"no job has --num_partitions {unknown}: the jobs' P are {known}")
  if not args.render_only:
    run(args.family or list(FAMILIES), args.stage or list(STAGES),
        args.num_partitions or known)
  (OUT.parent / "compiled.md").write_text(render() + "\n")
  print(f"wrote {OUT.parent / 'compiled.md'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
