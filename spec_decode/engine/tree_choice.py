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

Cost: each iteration makes one target call on D + 1 + T tokens (the pending chain, padded to
D + 1, then the T nodes) and D draft calls (the chain, then one tree call on the nodes of depths
1..d for d < D; `token_tree`); `target_costs` maps a call's width k to its time relative to a
one-token call (the paper's v, here per width: v(k)), and `draft_cost` is a draft call's time
relative to the target's of the same width (the paper's c).
"""

from __future__ import annotations

import itertools
from typing import Mapping, NamedTuple, Sequence

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


def relative_cost(width: int, target_costs: Mapping[int, float]) -> float:
  """v(width), interpolated linearly between the widths `target_costs` gives."""
  widths = sorted(target_costs)
  if not widths or width > widths[-1] or width < widths[0]:
    raise ValueError(f"target_costs gives widths {widths}, not the width {width} a tree needs")
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


class Choice(NamedTuple):
  branching: tuple[int, ...]
  tokens_per_call: float  # predicted: 1 + E(0)
  relative_time: float  # one iteration's, in one-token target calls
  tokens_per_time: float  # tokens_per_call / relative_time: what is maximized


def rank_trees(acceptance: np.ndarray, node_budget: int, max_depth: int,
               target_costs: Mapping[int, float], draft_cost: float = 0.0) -> list[Choice]:
  """Every shape within the budget, the one emitting most tokens per unit of time first."""
  if int(node_budget) != node_budget or node_budget < 1:
    raise ValueError(f"node_budget must be an integer >= 1, got {node_budget!r}")
  choices = []
  for branching in shapes_within(node_budget, max_depth):
    target_width, draft_widths = call_widths(branching)
    time = relative_cost(target_width, target_costs) + draft_cost * sum(
        relative_cost(w, target_costs) for w in draft_widths)
    tokens = expected_tokens(branching, acceptance)
    choices.append(Choice(branching, tokens, time, tokens / time))
  return sorted(choices, key=lambda c: (-c.tokens_per_time, c.branching))


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
