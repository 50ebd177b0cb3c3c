"""The token tree's calls as XLA:TPU compiles them: v(k) of ONE tree call of the T5.1.1-XXL
target scoring k tokens, and the Table 2 drafts' tree calls, for one v4 chip and for a v4-8,
then Theorem 3.8's tree analogue for every Table 2 row from those costs.

Run (Python 3.12 with `pip install -e . "jax[tpu]"`): `python scripts/compile_tree_costs.py
[--render_only] [--max_depth 8]`. Each call is a tree call of the model contract
(`programs.call_program(..., tree=True)`: token positions and a tree mask, as
`speculative_tree_sample` makes), compiled alone with the Table 2 configs' sizes (inputs 512,
targets 128, bfloat16; both tasks have the same), its parameters laid out as
`python -m spec_decode.aot` lays them (the target split P ways, the draft replicated); the
target at batch 1 and 8 for k in TARGET_TOKENS, each draft (T5.1.1 small, base, large) at batch
1 for k in DRAFT_TOKENS. Each call's figures and roofline go into COSTS
(`tree_choice.load_call_costs` reads it: the one format of a platform's compiled v(k)) as soon
as it is compiled, and a call already there is skipped, so an interrupted run resumes.

Then, for each Table 2 row and P, the best chain and the best trees of at most 32 and 128 nodes
by `tree_choice.rank_trees`, with acceptance by depth and rank derived from the paper's alpha
(`tree_choice.rank_acceptance`: an assumption, not a measurement). Nothing here runs on a TPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from spec_decode import paths
from spec_decode.aot import programs
from spec_decode.aot import runs
from spec_decode.aot import topologies
from spec_decode.bench import paper
from spec_decode.engine import tree_choice

COSTS = paths.ROOT / "docs" / "token_trees" / "tpu_call_costs.json"
PLATFORMS = {"v4:1x1x1": 1, "v4-8": 4}  # topology: P
TARGET_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
# At batch 1 also 256: a tree of 128 nodes feeds its target call 129 tokens (or more).
WIDEST_TARGET_CALL = 256
TARGET_BATCHES = (1, 8)
DRAFTS = ("small", "base", "large")
# A draft call of a tree within 128 nodes feeds at most 64: its nodes before the last depth,
# of which there are at most as many as at the last.
DRAFT_TOKENS = (1, 2, 4, 8, 16, 32, 64)
NODE_BUDGETS = (32, 128)
# Rank-r child acceptance: alpha * DECAY^r given the ranks before it were rejected
# (`tree_choice.rank_acceptance`); 1 is the geometric model, 0.5 a more cautious one.
DECAYS = (1.0, 0.5)


def _args(topology: str, batch: int, draft: str) -> argparse.Namespace:
  return argparse.Namespace(
      gin_file=["configs/table2/spec_decode.gin", f"configs/table2/ende_{draft}_t0.gin"],
      draft_gin_file=f"configs/models/t5_1_1/{draft}.gin", num_partitions=PLATFORMS[topology],
      batch_size=batch, input_length=None, target_length=None)


def _jobs() -> list[tuple[str, str, int, int, str]]:
  """(topology, model, batch, k, draft config) in the order compiled: on one chip the target
  and the drafts at batch 1 (Table 2's setting); on four chips the target up to 64 tokens (a
  tree of 32 nodes needs no more) and the drafts' one-token calls (replicated, each chip runs
  the one chip's program: `_draft_costs`); the target at batch 8 at a few widths on one chip
  and on four; then every other call."""
  target = lambda topology, batch, tokens: [(topology, "target", batch, k, "small")
                                            for k in tokens]
  drafts = lambda topology, tokens: [(topology, draft, 1, k, draft) for draft in DRAFTS
                                     for k in tokens]
  one, four = PLATFORMS
  first = (target(one, 1, TARGET_TOKENS + (WIDEST_TARGET_CALL,)) + drafts(one, DRAFT_TOKENS)
           + target(four, 1, TARGET_TOKENS[:-1]) + drafts(four, (1,))
           + target(one, 8, (1, 8, 32, 128)) + target(four, 8, (1, 8, 32, 128)))
  rest = (target(four, 1, (128, WIDEST_TARGET_CALL)) + target(one, 8, TARGET_TOKENS)
          + target(four, 8, TARGET_TOKENS) + drafts(four, DRAFT_TOKENS))
  return first + [job for job in rest if job not in first]


def compile_all() -> None:
  figures = json.loads(COSTS.read_text()) if COSTS.exists() else {
      "about": "Roofline seconds of single tree calls compiled by XLA:TPU, not run: "
               "scripts/compile_tree_costs.py", "platforms": {}}
  start = time.perf_counter()
  for topology_name, model, batch, k, draft in _jobs():
    topology = topologies.topology(topology_name)
    platform = figures["platforms"].setdefault(topology_name, {
        "topology": topology.libtpu_name, "num_partitions": PLATFORMS[topology_name],
        "chip": dataclasses.asdict(topology.chip), "models": {}})
    calls = platform["models"].setdefault(model, {}).setdefault(str(batch), {})
    if str(k) in calls:
      continue
    run = runs.read_run(_args(topology_name, batch, draft), [], topology.devices())
    print(f"[{time.perf_counter() - start:6.0f} s] {topology_name} {model} batch {batch} k={k}",
          file=sys.stderr, flush=True)
    program = programs.call_program(
        run.layout, "target" if model == "target" else "draft",
        batch_rows=batch * run.model.num_decodes, input_length=run.input_length,
        max_decode_len=run.decode_length, num_tokens=k, param_dtype=run.checkpoint_dtype,
        tree=True)
    calls[str(k)] = {"flops": program.flops, "argument_bytes": program.argument_bytes,
                     "roofline_seconds": programs.roofline_seconds(program, topology.chip),
                     "temp_bytes": program.temp_bytes, "code_bytes": program.code_bytes,
                     "compile_seconds": round(program.compile_seconds, 1)}
    COSTS.parent.mkdir(parents=True, exist_ok=True)
    COSTS.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")


def _shape(branching: tuple[int, ...]) -> str:
  return "(" + ", ".join(map(str, branching)) + ")"


def _nodes(branching: tuple[int, ...]) -> int:
  return tree_choice.node_widths(branching)[0] - 1


def best_shapes(acceptance: np.ndarray, target_costs: dict[int, float],
                draft_costs: dict[int, float], max_depth: int, max_chain: int,
                budgets: tuple[int, ...], widths: tree_choice.Widths = tree_choice.node_widths
                ) -> dict[str | int, tree_choice.Choice]:
  """The best chain (gamma up to `max_chain`) and the best trees of at most each of `budgets`
  nodes and `max_depth` deep, by predicted speedup (`tree_choice.rank_trees`)."""
  chains = [tree_choice.predict((1,) * gamma, acceptance, target_costs, draft_costs=draft_costs,
                                widths=widths) for gamma in range(1, max_chain + 1)]
  found: dict[str | int, tree_choice.Choice] = {
      "chain": max(chains, key=lambda c: c.tokens_per_time)}
  ranked = tree_choice.rank_trees(acceptance, max(budgets), max_depth, target_costs,
                                  draft_costs=draft_costs, widths=widths)
  for budget in budgets:
    found[budget] = next(c for c in ranked if _nodes(c.branching) <= budget)
  return found


def _draft_costs(figures: dict, topology: str, draft: str) -> tuple[dict[int, float], bool]:
  """(the draft's c(k) on `topology`, whether they are the one chip's calls): its own compiled
  calls where every width is compiled; else, the draft being replicated (each chip of the
  slice runs the one chip's program), the one chip's calls over this slice's target one-token
  call, once the one-token call compiled on the slice has the one chip's roofline (within
  1%)."""
  costs = tree_choice.relative_costs(figures, topology, draft, 1)
  if max(costs) >= max(DRAFT_TOKENS):
    return costs, False
  platforms = figures["platforms"]
  one_chip = next(name for name, platform in platforms.items()
                  if platform["num_partitions"] == 1)
  alone = platforms[one_chip]["models"][draft]["1"]
  here = platforms[topology]["models"][draft]["1"]["1"]["roofline_seconds"]
  if abs(here / alone["1"]["roofline_seconds"] - 1) > 0.01:
    raise ValueError(f"{draft}'s one-token call on {topology} is not the one chip's: "
                     f"{here} s against {alone['1']['roofline_seconds']} s")
  target_one = platforms[topology]["models"]["target"]["1"]["1"]["roofline_seconds"]
  return {int(k): call["roofline_seconds"] / target_one for k, call in alone.items()}, True


def _v_table(figures: dict) -> list[str]:
  widths = TARGET_TOKENS + (WIDEST_TARGET_CALL,)
  lines = ["| platform | batch | target k=1 roofline ms | " + " | ".join(
      f"v({k})" for k in widths) + " |", "|---|---|---|" + "---|" * len(widths)]
  by_chips = sorted(figures["platforms"].items(), key=lambda item: item[1]["num_partitions"])
  for topology, platform in by_chips:
    target = platform["models"].get("target", {})
    for batch in sorted(target, key=int):
      costs = tree_choice.relative_costs(figures, topology, "target", int(batch))
      one = target[batch]["1"]["roofline_seconds"]
      lines.append(f"| {topology} (P = {platform['num_partitions']}) | {batch} | "
                   f"{one * 1e3:.2f} | " + " | ".join(
                       f"{costs[k]:.2f}" if k in costs else "-" for k in widths) + " |")
  lines += ["", "| platform | draft (batch 1) | " + " | ".join(
      f"c({k})" for k in DRAFT_TOKENS) + " |", "|---|---|" + "---|" * len(DRAFT_TOKENS)]
  for topology, _ in by_chips:
    for draft in DRAFTS:
      try:
        costs = tree_choice.relative_costs(figures, topology, draft, 1)
      except ValueError:
        continue
      lines.append(f"| {topology} | T5.1.1-{draft} | " + " | ".join(
          f"{costs[k]:.3f}" if k in costs else "-" for k in DRAFT_TOKENS) + " |")
  return lines


def _cell(choice: tree_choice.Choice, chain: tree_choice.Choice | None = None) -> str:
  ratio = "" if chain is None else f" ({choice.tokens_per_time / chain.tokens_per_time:.2f})"
  return (f"{_shape(choice.branching)}: {choice.tokens_per_call:.2f}, "
          f"{choice.tokens_per_time:.2f}x{ratio}")


def render(max_depth: int, max_chain: int, platforms: list[str] | None = None) -> str:
  """The v(k) tables and the per-row predictions (on `platforms`, default all), as markdown."""
  figures = tree_choice.load_call_costs(COSTS)
  lines = _v_table(figures)
  wins = {}
  for topology, platform in figures["platforms"].items():
    if platforms and topology not in platforms:
      continue
    lines += ["", f"{topology} (P = {platform['num_partitions']}), batch 1: best shape: tokens "
              "per target call, predicted speedup (over the best chain's)", "",
              "| row | alpha | paper (measured) | best chain (the paper's gamma) | best tree <= 32 "
              "nodes | best tree "
              "<= 128 nodes | decay 0.5: best tree <= 32, <= 128 | as the loop calls: chain, "
              "tree <= 32 |", "|---|---|---|---|---|---|---|---|"]
    for row_name, row in paper.TABLE2.items():
      draft = row_name.split("_")[1]
      try:
        target_costs = tree_choice.relative_costs(figures, topology, "target", 1)
        draft_costs, borrowed = _draft_costs(figures, topology, draft)
      except (ValueError, KeyError, StopIteration):
        continue
      # The budgets whose trees' calls are compiled: the target's feeds 1 + T tokens or more.
      budgets = tuple(b for b in NODE_BUDGETS if max(target_costs) >= b + max_depth + 1)
      if not budgets or max(draft_costs) < max(DRAFT_TOKENS):
        continue  # not compiled yet
      cells = []
      cell = lambda best, budget: (_cell(best[budget], best["chain"]) if budget in best
                                   else f"not compiled (v(k) up to k = {max(target_costs)})")
      for decay in DECAYS:
        acceptance = tree_choice.rank_acceptance(row.alpha, max(max_depth, max_chain), 8, decay)
        best = best_shapes(acceptance, target_costs, draft_costs, max_depth, max_chain, budgets)
        chain = best["chain"]
        for budget in budgets:
          wins.setdefault((decay, budget), []).append(
              best[budget].tokens_per_time > chain.tokens_per_time)
        if decay == DECAYS[0]:
          paper_gamma = tree_choice.predicted_speedup((1,) * row.gamma, acceptance,
                                                      target_costs, draft_costs)
          cells += [f"gamma {len(chain.branching)}: {chain.tokens_per_call:.2f}, "
                    f"{chain.tokens_per_time:.2f}x (gamma {row.gamma}: {paper_gamma:.2f}x)"]
          cells += [cell(best, budget) for budget in NODE_BUDGETS]
        else:
          cells.append(", ".join(cell(best, budget) for budget in NODE_BUDGETS))
      acceptance = tree_choice.rank_acceptance(row.alpha, max(max_depth, max_chain), 8)
      loop_chains = [tree_choice.predict((1,) * gamma, acceptance, target_costs,
                                         draft_costs=draft_costs)
                     for gamma in range(1, max_chain + 1)
                     if tree_choice.call_widths((1,) * gamma)[0] <= max(target_costs)]
      loop_chain = max(loop_chains, key=lambda c: c.tokens_per_time)
      loop_tree = tree_choice.rank_trees(acceptance, 32, max_depth, target_costs,
                                         draft_costs=draft_costs)[0]
      cells.append(f"{loop_chain.tokens_per_time:.2f}x (gamma {len(loop_chain.branching)}), "
                   f"{_cell(loop_tree, loop_chain)}")
      lines.append(f"| {row_name}{' *' if borrowed else ''} | {row.alpha:.2f} | "
                   f"{row.speedup}x | " + " | ".join(cells) + " |")
  lines += ["", "\\* the draft's calls of more than one token compiled on one chip (replicated "
            "on the slice, each chip runs that program: its one-token call compiled on the "
            "slice has the same roofline)", ""]
  for (decay, budget), won in sorted(wins.items()):
    lines.append(f"decay {decay}, <= {budget} nodes: the best tree beats the best chain on "
                 f"{sum(won)} of {len(won)} (row, platform)s")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--render_only", action="store_true")
  parser.add_argument("--max_depth", type=int, default=8, help="the deepest tree considered")
  parser.add_argument("--max_chain", type=int, default=32, help="the longest chain considered")
  parser.add_argument("--platforms", default="",
                      help="the platforms whose rows to predict, comma-separated (default all)")
  args = parser.parse_args(argv)
  if not args.render_only:
    compile_all()
  print(render(args.max_depth, args.max_chain, [p for p in args.platforms.split(",") if p]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
