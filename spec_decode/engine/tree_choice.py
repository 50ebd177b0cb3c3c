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

A decode's length: 1 + E(0) counts every call whole, but a sentence's last call is cut at EOS
(or the output's length limit), which for short outputs is a large share of the calls. An
iteration accepts a nodes with chance P(A = a) = P(A >= a) - P(A >= a + 1), P(A >= a) =
prod_{d < a} s_d, s_d = sum_{k < branching[d]} acceptance[d, k] (`accepted_depth_law`), and
emits a + 1 tokens; a decode of n tokens then makes, in expectation (a renewal count),

    C(n) = 1 + sum_a P(A = a) C(n - a - 1),   C(m) = 0 for m <= 0

target calls, and decodes of lengths n_i emit sum_i n_i / sum_i C(n_i) tokens per call
(`tokens_per_call` with `output_lengths`).

Greedy acceptance along the path (`RankChain`): at a greedy temperature with the rule
'most_likely' the walk accepts the node of rank k at depth d exactly when the target's token
there is the draft's k-th likeliest after the target's own prefix and k < branching[d], so the
whole decode follows from the sequence of its output tokens' ranks among the draft's logits.
Positional acceptance treats those ranks as independent per depth, but they are not: a token
the draft ranks first tends to follow one it ranked first, and an iteration's root follows a
rejected (badly ranked) token or the bonus token. `RankChain` takes the ranks as a Markov chain
instead: `transitions[c, k]`, the chance that a token's rank class is k given the previous
token's class c (classes 0..R-1: that rank; R: rank R or more, never accepted; row R + 1: no
previous token, the output's first). An iteration from a previous class c then ends, having
emitted e tokens, with its last token of class c' (the rejected token's class, or the bonus
token's after the full depth), and the renewal count runs over (tokens left, class):

    C(m, c) = 1 + sum_{e, c'} P(e, c' | c) C(m - e, c'),   C(m, c) = 0 for m <= 0,

from the class 'no previous token' (`tokens_per_call`, given a `RankChain`).

Sampled: with the rule 'deterministic' (children: the draft's likeliest ids) at any
temperature, the walk at a node accepts child k with the target's probability p(x_k) of it, and
the token it emits there (the accepted child, else a draw from the residual, which excludes the
children) follows p: the emitted tokens are a sample of the target's, and a node is accepted
exactly when the emitted token is among its children, i.e. ranks below branching[d] among the
draft's. The calls of a sampled decode therefore follow from its output's ranks as a greedy
decode's do, and `greedy_acceptance` and `greedy_rank_chain` measure 'deterministic' from the
ranks of the target's sampled outputs (in law: the decode draws its own sample).

Drawn trees (`tree_widths` with a rule that draws its children): their nodes go by the child
ranks along their paths (`tree_shape.drawn_child_counts`), one shape in every row, so the
positional model predicts them as it does a fixed shape (`drawn_depth_law`,
`drawn_tokens_per_call`), from the acceptance of drawn children by rank: drawn, not ranked by
the draft, they are not read from the output's ranks, and `drawn_acceptance` estimates them from
the two laws at each position, by drawing the rule's children and taking its acceptance of each.

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

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import token_tree
from spec_decode.engine import tree_rules
from spec_decode.engine import tree_shape


class RankChain(NamedTuple):
  """Greedy acceptance along the path (the module docstring): `transitions [R + 2, R + 1]`,
  row c the law of a token's rank class given the previous token's class c (R + 1: none)."""
  transitions: np.ndarray


Acceptance = np.ndarray | RankChain


def _checked(acceptance: np.ndarray) -> np.ndarray:
  acceptance = np.asarray(acceptance, np.float64)
  if acceptance.ndim != 2 or np.any(acceptance < 0) or np.any(acceptance.sum(axis=1) > 1 + 1e-9):
    raise ValueError(f"acceptance must be [depths, ranks] of chances summing to at most 1 per "
                     f"depth, got shape {acceptance.shape}")
  return acceptance


def _depth_rates(branching: Sequence[int], acceptance: np.ndarray) -> list[float]:
  """s_d: the chance the walk accepts a child at depth d, given that it reached depth d."""
  return [float(np.sum(acceptance[min(depth, len(acceptance) - 1), :branching[depth]]))
          for depth in range(len(branching))]


def expected_tokens(branching: Sequence[int], acceptance: np.ndarray) -> float:
  """Expected tokens per target call of the tree `branching`, every call counted whole (the
  module docstring)."""
  below = 0.0
  for rate in reversed(_depth_rates(branching, _checked(acceptance))):
    below = rate * (1.0 + below)
  return 1.0 + below


def accepted_depth_law(branching: Sequence[int], acceptance: np.ndarray) -> np.ndarray:
  """[D + 1]: the chance that an iteration accepts a nodes, a = 0..D (the module docstring)."""
  reached = np.cumprod([1.0] + _depth_rates(branching, _checked(acceptance)))
  return np.append(reached[:-1] - reached[1:], reached[-1])


def _chain_outcomes(branching: Sequence[int], chain: RankChain) -> np.ndarray:
  """[R + 2, D + 2, R + 2]: from the previous token's class, the chance that an iteration emits
  e tokens (e = 1..D + 1; e = 0 never) and its last token is of class c'."""
  transitions = np.asarray(chain.transitions, np.float64)
  num_ranks = transitions.shape[-1] - 1
  if (transitions.ndim != 2 or transitions.shape[0] != num_ranks + 2 or num_ranks < 1
      or np.any(transitions < 0) or not np.allclose(transitions.sum(axis=1), 1)):
    raise ValueError(f"a RankChain's transitions must be [R + 2, R + 1] laws (rows summing to "
                     f"1), got shape {transitions.shape}")
  states = num_ranks + 2
  outcomes = np.zeros((states, len(branching) + 2, states))
  for previous in range(states):
    alive = np.eye(states)[previous]  # the walk's last accepted token's class, while walking
    for depth, children in enumerate(branching):
      drawn = alive @ transitions
      kept = np.where(np.arange(num_ranks + 1) < min(children, num_ranks), drawn, 0.0)
      outcomes[previous, depth + 1, :num_ranks + 1] += drawn - kept
      alive = np.append(kept, 0.0)
    outcomes[previous, len(branching) + 1, :num_ranks + 1] += alive @ transitions
  return outcomes


def expected_calls(branching: Sequence[int], acceptance: Acceptance,
                   output_lengths: Sequence[int]) -> np.ndarray:
  """Per decode of `output_lengths` tokens (EOS included), the expected target calls that emit
  them, the last one cut (the renewal counts of the module docstring)."""
  lengths = _lengths(output_lengths)
  if isinstance(acceptance, RankChain):
    outcomes = _chain_outcomes(branching, acceptance)
    return _renewal_calls(outcomes, outcomes.shape[0] - 1, lengths)
  return _renewal_calls(_law_outcomes(accepted_depth_law(branching, acceptance)), 0, lengths)


def _lengths(output_lengths: Sequence[int]) -> np.ndarray:
  lengths = np.asarray(output_lengths)
  if lengths.ndim != 1 or not len(lengths) or np.any(lengths < 1):
    raise ValueError(f"output_lengths must be decodes' lengths >= 1, got {output_lengths!r}")
  return lengths


def _law_outcomes(law: np.ndarray) -> np.ndarray:
  """[1, D + 2, 1]: `law` of the accepted nodes a as the chance of emitting a + 1 tokens."""
  outcomes = np.zeros((1, len(law) + 1, 1))
  outcomes[0, 1:, 0] = law
  return outcomes


def _renewal_calls(outcomes: np.ndarray, start: int, lengths: np.ndarray) -> np.ndarray:
  """The renewal counts C(n) of decodes of `lengths` from state `start`, an iteration from
  state s emitting e tokens and ending in state c with chance `outcomes[s, e, c]`."""
  num_emitted = outcomes.shape[1]
  calls = np.zeros((int(lengths.max()) + num_emitted, outcomes.shape[0]))  # row m - 1 + E: m left
  for left in range(1, int(lengths.max()) + 1):
    after = calls[left:left + num_emitted][::-1]  # row e: left - e tokens left
    calls[left - 1 + num_emitted] = 1 + np.einsum("sec,ec->s", outcomes, after)
  return calls[lengths - 1 + num_emitted, start]


def tokens_per_call(branching: Sequence[int], acceptance: Acceptance,
                    output_lengths: Sequence[int] | None = None) -> float:
  """Predicted tokens per target call: of decodes of `output_lengths` tokens, sum n / sum C(n);
  without them, every call counted whole (`expected_tokens`; a RankChain needs lengths)."""
  if not isinstance(acceptance, RankChain):
    return law_tokens_per_call(accepted_depth_law(branching, acceptance), output_lengths)
  if output_lengths is None:
    raise ValueError("a RankChain predicts decodes of given lengths: pass output_lengths")
  return float(np.sum(output_lengths) / np.sum(expected_calls(branching, acceptance,
                                                              output_lengths)))


def static_depth_law(child_counts: Sequence[Sequence[int]], acceptance: np.ndarray
                     ) -> np.ndarray:
  """[D + 1]: the chance that an iteration of a static tree of drawn children accepts a nodes,
  a = 0..D, the tree given by each node's count of children depth by depth
  (`tree_shape.TreeShape.child_counts`: the root's first, each depth's nodes in the order of
  the counts above them), where a node of depth d's child of rank k is accepted with
  `acceptance[d, k]` of its parent's chance (positional acceptance of the rule's drawn
  children, the module docstring's; the last row for deeper depths)."""
  acceptance = _checked(acceptance)
  reach, reached = np.ones(1), [1.0]
  for depth, counts in enumerate(child_counts):
    if len(counts) != reach.size:
      raise ValueError(f"child_counts[{depth}] has {len(counts)} counts for the {reach.size} "
                       f"nodes of depth {depth}")
    parents = np.repeat(np.arange(len(counts)), counts)
    ranks = np.concatenate([np.arange(c) for c in counts])
    row = acceptance[min(depth, len(acceptance) - 1)]
    reach = reach[parents] * np.where(ranks < row.size, row[np.minimum(ranks, row.size - 1)],
                                      0.0)
    reached.append(float(reach.sum()))
  reached = np.asarray(reached)
  return np.append(reached[:-1] - reached[1:], reached[-1])


def drawn_depth_law(widths: Sequence[int], acceptance: np.ndarray) -> np.ndarray:
  """`static_depth_law` of the drawn tree of `widths` (`widths[d]` nodes at depth d + 1, each
  node's count of children `tree_shape.drawn_child_counts`'s)."""
  return static_depth_law(tree_shape.drawn_child_counts(widths), acceptance)


def best_static_tree(acceptance: np.ndarray, num_nodes: int) -> tuple[tuple[int, ...], ...]:
  """The child counts (as `static_depth_law` takes them) of the static tree of at most
  `num_nodes` drawn children whose iterations accept the most nodes on average under
  `acceptance`: the nodes of the largest reach (the product of their path's acceptance) taken
  one at a time, each after its parent and its siblings of lower rank (Sequoia's tree, Chen et
  al. 2024; the best of all such trees where acceptance falls with the rank, as drawn
  children's does). Equal reaches go in path order."""
  acceptance = _checked(acceptance)
  row = lambda depth: acceptance[min(depth, len(acceptance) - 1)]
  reach = lambda path: float(np.prod([row(depth)[rank] for depth, rank in enumerate(path)]))
  counts: dict[tuple[int, ...], int] = {(): 0}  # a taken node's path (its child ranks): children
  frontier = {(0,)}  # the nodes that could be taken next
  while sum(counts.values()) < num_nodes:
    ranked = sorted((-reach(path), path) for path in frontier
                    if path[-1] < row(len(path) - 1).size)
    if not ranked or ranked[0][0] >= 0:
      break
    path = ranked[0][1]
    frontier.remove(path)
    counts[path[:-1]] += 1
    counts[path] = 0
    frontier |= {path + (0,), path[:-1] + (path[-1] + 1,)}
  by_depth = [[()]]
  while below := [path + (rank,) for path in by_depth[-1] for rank in range(counts[path])]:
    by_depth.append(below)
  return tuple(tuple(counts[path] for path in paths) for paths in by_depth[:-1])


def law_tokens_per_call(law: np.ndarray, output_lengths: Sequence[int] | None = None) -> float:
  """Tokens per target call of iterations accepting a nodes with chance `law[a]`: every call
  whole (1 + a tokens), else of decodes of `output_lengths` (the renewal count)."""
  if output_lengths is None:
    return float(np.sum(law * np.arange(1, len(law) + 1)))
  lengths = _lengths(output_lengths)
  return float(np.sum(lengths) / np.sum(_renewal_calls(_law_outcomes(law), 0, lengths)))


def drawn_tokens_per_call(widths: Sequence[int], acceptance: np.ndarray,
                          output_lengths: Sequence[int] | None = None) -> float:
  """Predicted tokens per target call of the drawn tree of `widths` (`drawn_depth_law`): of
  decodes of `output_lengths` tokens, else every call whole."""
  return law_tokens_per_call(drawn_depth_law(widths, acceptance), output_lengths)


def drawn_acceptance(target_probs: jax.Array, draft_probs: jax.Array, rule: str,
                     uniforms: jax.Array) -> jax.Array:
  """[P, K]: at each of P positions, the chance that a node's walk accepts its drawn child of
  rank k (k < K), given that it reached the node, for K children drawn by the tree rule `rule`
  from the draft's law there (`draft_probs [P, V]`) and verified against the target's
  (`target_probs [P, V]`): the mean over M draws of K children (`uniforms [P, M, K]`) of
  a_k prod_{j < k} (1 - a_j), a_k the rule's acceptance of child k. Its mean over positions is
  a row of positional acceptance."""
  rule_of = tree_rules.get_rule(rule)
  laws = lambda probs: jnp.broadcast_to(probs[:, None], uniforms.shape[:2] + probs.shape[-1:])
  draft, target = laws(draft_probs), laws(target_probs)
  children = rule_of.draw(draft, jnp.log(draft), uniforms)
  accept, _ = rule_of.verify(target, draft, children)
  reached = jnp.cumprod(jnp.concatenate([jnp.ones_like(accept[..., :1]), 1 - accept[..., :-1]],
                                        axis=-1), axis=-1)
  return jnp.mean(reached * accept, axis=1)


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
  tokens_per_call: float  # predicted: 1 + E(0), or of decodes of given lengths
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


def predict(branching: Sequence[int], acceptance: Acceptance, target_costs: Mapping[int, float],
            draft_cost: float = 0.0, draft_costs: Mapping[int, float] | None = None,
            widths: Widths = call_widths,
            output_lengths: Sequence[int] | None = None) -> Choice:
  """The tree's predicted tokens per call (`tokens_per_call`), iteration time and their ratio:
  Theorem 3.8's tree analogue, the expected walltime improvement over the target alone (the
  module docstring)."""
  tokens = tokens_per_call(branching, acceptance, output_lengths)
  time = iteration_time(branching, target_costs, draft_cost, draft_costs, widths)
  return Choice(tuple(branching), tokens, time, tokens / time)


def predicted_speedup(branching: Sequence[int], acceptance: Acceptance,
                      target_costs: Mapping[int, float], draft_costs: Mapping[int, float],
                      widths: Widths = node_widths,
                      output_lengths: Sequence[int] | None = None) -> float:
  """Theorem 3.8's tree analogue (the module docstring), counted as the paper counts a chain
  unless `widths` says otherwise; of decodes of `output_lengths` tokens where given."""
  return predict(branching, acceptance, target_costs, draft_costs=draft_costs, widths=widths,
                 output_lengths=output_lengths).tokens_per_time


def rank_trees(acceptance: Acceptance, node_budget: int, max_depth: int,
               target_costs: Mapping[int, float], draft_cost: float = 0.0,
               draft_costs: Mapping[int, float] | None = None,
               widths: Widths = call_widths,
               output_lengths: Sequence[int] | None = None) -> list[Choice]:
  """Every shape within the budget, the one emitting most tokens per unit of time first (of
  decodes of `output_lengths` tokens where given)."""
  if int(node_budget) != node_budget or node_budget < 1:
    raise ValueError(f"node_budget must be an integer >= 1, got {node_budget!r}")
  choices = [predict(branching, acceptance, target_costs, draft_cost, draft_costs, widths,
                     output_lengths) for branching in shapes_within(node_budget, max_depth)]
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


def _walk(ranks: np.ndarray, branching: Sequence[int]) -> list[tuple[int, int]]:
  """(the position it starts at, the nodes it accepts) of each iteration of the walk of
  `branching` over a decode whose output tokens have `ranks` (`greedy_acceptance`): at depth d
  the node of rank k is accepted when the output's token there has rank k < branching[d]."""
  iterations, position = [], 0
  while position < len(ranks):
    depth = 0
    while (depth < len(branching) and position + depth < len(ranks)
           and ranks[position + depth] < branching[depth]):
      depth += 1
    iterations.append((position, depth))
    position += depth + 1
  return iterations


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
    for position, depth in _walk(row, (max_rank,) * max_depth):
      for below in range(depth):
        accepted[below, row[position + below]] += 1
      reached[:depth] += 1
      if depth < max_depth and position + depth < len(row):
        reached[depth] += 1  # the node rejected there
  return accepted / np.maximum(reached, 1)[:, None]


def replayed_tokens_per_call(ranks: Sequence[np.ndarray], branching: Sequence[int]) -> float:
  """Tokens per target call of the decodes of `ranks` (`greedy_acceptance`) by the tree
  `branching`, greedy with 'most_likely' or sampled with 'deterministic' (the module docstring):
  the walk replayed, the last call of each cut at its end."""
  return sum(len(row) for row in ranks) / sum(len(_walk(row, branching)) for row in ranks)


def greedy_rank_chain(ranks: Sequence[np.ndarray], max_rank: int) -> RankChain:
  """The `RankChain` of greedy decoding with the rule 'most_likely' from `ranks` (as
  `greedy_acceptance` takes them): each token's rank class (its rank, or `max_rank` for rank
  `max_rank` or more) counted after the previous token's class, or after none for each decode's
  first. A class never seen before a token takes the law of every token's class."""
  counts = np.zeros((max_rank + 2, max_rank + 1))
  for row in ranks:
    classes = np.minimum(np.asarray(row), max_rank)
    np.add.at(counts, (np.concatenate([[max_rank + 1], classes[:-1]]), classes), 1)
  if not counts.sum():
    raise ValueError("no ranks to count: every decode is empty")
  seen = counts.sum(axis=1, keepdims=True)
  overall = counts.sum(axis=0) / counts.sum()
  return RankChain(np.where(seen > 0, counts / np.maximum(seen, 1), overall))
