"""Choosing a token tree (Sequoia, Chen et al. 2024): expected tokens per target call from
positional acceptance rates, and the best `speculative_tree_sample` shape for a node budget and a
platform's cost of a call.

Positional acceptance: `acceptance[d, k]`, the chance that at a node of depth d (0: the root)
the walk accepts the node's child of rank k (the k-th tried: for 'most_likely' the draft's k-th
likeliest token), given that it reached the node. The ranks are disjoint events (one child at
most is accepted), so a row sums to at most 1; for the rules of `tree_rules` the chance for rank
k does not depend on how many children follow it, so one table serves every shape. Assuming it
independent of the path above (Sequoia's model), a static shape of `branching[d]` children per
node at depth d accepts, from a node at depth d, an expected

    E(d) = sum_{k < branching[d]} acceptance[d, k] (1 + E(d + 1)),   E(D) = 0

nodes, and each target call emits 1 + E(0) tokens (the accepted path, then one drawn token).
Depths past the table's last row take that row; ranks past its last column are never accepted.

Cost: each iteration makes one target call and D draft calls. As `speculative_tree_sample`
makes them (`call_widths`), the target's call feeds D + 1 + T tokens (the pending chain, padded
to D + 1, then the T nodes) and the draft's the chain, then one tree call on the nodes of depths
1..d for d < D (a node's cache entry sits at its position, which its siblings share, so the
draft is fed its ancestors again). Counted as Theorem 3.8 counts a chain (`node_widths`), each
call feeds only the tokens new to it: the draft's call at depth d the nodes of depth d (the
root's one token at d = 0), the target's the root's token and the T nodes; a chain of gamma is
then the paper's gamma one-token draft calls and one call of gamma + 1 on the target.
`target_costs` maps a call's width k to its time relative to a one-token call (the paper's v,
here per width: v(k)); the draft's cost is either `draft_cost`, a draft call's time relative to
the target's of the same width (the paper's c), or `draft_costs`, its time per width relative
to the target's one-token call (c(k), as compiled: `relative_costs`).

Theorem 3.8's tree analogue (`predicted_speedup`): the expected walltime improvement of a
static tree over the target alone is its tokens per target call over one iteration's time in
one-token target calls,

    (1 + E(0)) / (sum_d c(w_d) + v(w)),

and with one child per node (`acceptance[d, 0]` = alpha, `node_widths`) it is the paper's
(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + v(gamma + 1))).

A platform's compiled costs are one JSON file (`load_call_costs`; scripts/compile_tree_costs.py
writes XLA:TPU's): per topology, per model ('target' or a draft's name), per batch, per width
k, the call's roofline seconds; `relative_costs` reads v(k) or a draft's c(k) from it.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from spec_decode.engine import token_tree


def expected_tokens(branching: Sequence[int], acceptance: np.ndarray) -> float:
  """Expected tokens per target call of the tree `branching` (the module docstring)."""
  acceptance = np.asarray(acceptance, np.float64)
  if acceptance.ndim != 2 or np.any(acceptance < 0) or np.any(acceptance.sum(axis=1) > 1 + 1e-9):
    raise ValueError(f"acceptance must be [depths, ranks] of chances summing to at most 1 per "
                     f"depth, got shape {acceptance.shape}")
  below = 0.0
  for depth in reversed(range(len(branching))):
    rates = acceptance[min(depth, len(acceptance) - 1), :branching[depth]]
    below = float(np.sum(rates)) * (1.0 + below)
  return 1.0 + below


def call_widths(branching: Sequence[int]) -> tuple[int, list[int]]:
  """(the target call's width, the draft calls' widths) of one iteration of the tree."""
  shape = token_tree.TreeShape(tuple(branching))
  chain = shape.max_depth + 1
  return chain + shape.num_nodes, [chain] + [shape.offsets[d] for d in range(1, shape.max_depth)]


def node_widths(branching: Sequence[int]) -> tuple[int, list[int]]:
  """(the target call's width, the draft calls' widths) of one iteration of the tree when each
  call feeds only the tokens new to it (Theorem 3.8's accounting; the module docstring)."""
  widths = [1] + list(itertools.accumulate(branching, lambda width, b: width * b))
  return sum(widths), widths[:-1]  # the root's token and every node; nodes per depth < D


def relative_cost(width: int, target_costs: Mapping[int, float]) -> float:
  """v(width), interpolated linearly between the widths `target_costs` gives."""
  widths = sorted(target_costs)
  if not widths or width > widths[-1] or width < widths[0]:
    raise ValueError(f"the call costs give widths {widths}, not the width {width} a tree needs")
  return float(np.interp(width, widths, [target_costs[w] for w in widths]))


def shapes_within(node_budget: int, max_depth: int) -> list[tuple[int, ...]]:
  """Every branching of depth 1..max_depth with at most `node_budget` nodes."""
  found = []

  def extend(prefix: tuple[int, ...], nodes: int, width: int) -> None:
    if prefix:
      found.append(prefix)
    if len(prefix) == max_depth:
      return
    for children in itertools.count(1):
      if nodes + width * children > node_budget:
        return
      extend(prefix + (children,), nodes + width * children, width * children)

  extend((), 0, 1)
  return found


Widths = Callable[[Sequence[int]], tuple[int, list[int]]]


class Choice(NamedTuple):
  branching: tuple[int, ...]
  tokens_per_call: float  # predicted: 1 + E(0)
  relative_time: float  # one iteration's, in one-token target calls
  tokens_per_time: float  # tokens_per_call / relative_time: what is maximized


def iteration_time(branching: Sequence[int], target_costs: Mapping[int, float],
                   draft_cost: float = 0.0, draft_costs: Mapping[int, float] | None = None,
                   widths: Widths = call_widths) -> float:
  """One iteration's time in one-token target calls: the target's call and the draft's, of the
  `widths` the tree's calls feed (the module docstring)."""
  if draft_costs is not None and draft_cost:
    raise ValueError("give the draft's cost as draft_cost (relative to the target's call of "
                     "the same width) or draft_costs (per width), not both")
  target_width, draft_widths = widths(branching)
  if draft_costs is None:
    draft = draft_cost * sum(relative_cost(w, target_costs) for w in draft_widths)
  else:
    draft = sum(relative_cost(w, draft_costs) for w in draft_widths)
  return relative_cost(target_width, target_costs) + draft


def predict(branching: Sequence[int], acceptance: np.ndarray, target_costs: Mapping[int, float],
            draft_cost: float = 0.0, draft_costs: Mapping[int, float] | None = None,
            widths: Widths = call_widths) -> Choice:
  """The tree's predicted tokens per call, iteration time and their ratio: Theorem 3.8's tree
  analogue, the expected walltime improvement over the target alone (the module docstring)."""
  tokens = expected_tokens(branching, acceptance)
  time = iteration_time(branching, target_costs, draft_cost, draft_costs, widths)
  return Choice(tuple(branching), tokens, time, tokens / time)


def predicted_speedup(branching: Sequence[int], acceptance: np.ndarray,
                      target_costs: Mapping[int, float], draft_costs: Mapping[int, float],
                      widths: Widths = node_widths) -> float:
  """Theorem 3.8's tree analogue (the module docstring), counted as the paper counts a chain
  unless `widths` says otherwise."""
  return predict(branching, acceptance, target_costs, draft_costs=draft_costs,
                 widths=widths).tokens_per_time


def rank_trees(acceptance: np.ndarray, node_budget: int, max_depth: int,
               target_costs: Mapping[int, float], draft_cost: float = 0.0,
               draft_costs: Mapping[int, float] | None = None,
               widths: Widths = call_widths) -> list[Choice]:
  """Every shape within the budget, the one emitting most tokens per unit of time first."""
  if int(node_budget) != node_budget or node_budget < 1:
    raise ValueError(f"node_budget must be an integer >= 1, got {node_budget!r}")
  choices = [predict(branching, acceptance, target_costs, draft_cost, draft_costs, widths)
             for branching in shapes_within(node_budget, max_depth)]
  return sorted(choices, key=lambda c: (-c.tokens_per_time, c.branching))


def rank_acceptance(alpha: float, max_depth: int, max_rank: int,
                    decay: float = 1.0) -> np.ndarray:
  """`acceptance [max_depth, max_rank]` from one acceptance rate alone, for a pair whose
  acceptance by rank is not measured (an assumption, not a measurement): at every depth the
  child of rank r, tried after the r before it were rejected, is accepted with chance
  alpha * decay^r, so acceptance[d, r] = alpha decay^r prod_{s < r} (1 - alpha decay^s).
  decay 1 is the geometric model (every child tried is as likely as the first, alpha (1 -
  alpha)^r); decay 0 leaves the first child alone (a chain's alpha)."""
  if not 0 <= alpha <= 1 or not 0 <= decay <= 1:
    raise ValueError(f"alpha and decay must be in [0, 1], got {alpha!r} and {decay!r}")
  tried = alpha * decay ** np.arange(max_rank, dtype=np.float64)
  reached = np.concatenate([[1.0], np.cumprod(1 - tried)[:-1]])
  return np.broadcast_to(tried * reached, (max_depth, max_rank)).copy()


def load_call_costs(path: str | os.PathLike) -> dict[str, Any]:
  """A platform's compiled call costs (the module docstring's format)."""
  with open(path, encoding="utf-8") as f:
    figures = json.load(f)
  if not isinstance(figures, dict) or not isinstance(figures.get("platforms"), dict):
    raise ValueError(f"{path} holds no call costs (a 'platforms' mapping)")
  return figures


def relative_costs(figures: Mapping[str, Any], platform: str, model: str,
                   batch: int) -> dict[int, float]:
  """{k: the roofline of `model`'s call of width k at `batch` on `platform` / the target's
  one-token call's there}: v(k) for model 'target', the draft's c(k) for a draft's name."""
  platforms = figures["platforms"]
  if platform not in platforms:
    raise ValueError(f"no call costs for platform {platform!r}; there are {sorted(platforms)}")
  models = platforms[platform]["models"]
  calls = models.get(model, {}).get(str(batch))
  one = models.get("target", {}).get(str(batch), {}).get("1")
  if not calls or one is None:
    raise ValueError(f"no compiled calls of {model!r} and of the target's one token at batch "
                     f"{batch} on {platform}")
  return {int(k): call["roofline_seconds"] / one["roofline_seconds"]
          for k, call in sorted(calls.items(), key=lambda item: int(item[0]))}


def greedy_acceptance(ranks: Sequence[np.ndarray], max_depth: int, max_rank: int) -> np.ndarray:
  """`acceptance [max_depth, max_rank]` of greedy decoding with the rule 'most_likely', measured
  by replaying the walk of the tree (max_rank,) * max_depth: `ranks`, per decode, the rank of
  each output token among the draft's logits after the output before it (0: the draft's
  likeliest). At greedy temperature that rank alone decides acceptance: a node of rank k is
  accepted when the target's token is the draft's k-th likeliest, and its children are then
  drafted after the target's own prefix."""
  reached = np.zeros(max_depth)
  accepted = np.zeros((max_depth, max_rank))
  for row in ranks:
    position = 0
    while position < len(row):
      depth = 0
      while depth < max_depth and position + depth < len(row):
        reached[depth] += 1
        rank = row[position + depth]
        if rank >= max_rank:
          break
        accepted[depth, rank] += 1
        depth += 1
      position += depth + 1
  return accepted / np.maximum(reached, 1)[:, None]
