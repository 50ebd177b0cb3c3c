"""The shape of a token tree (`token_tree.speculative_tree_sample`): its static envelope, the
settings that give it, and the per-row choice of a tree chosen per row.

A tree's model nodes are fixed (`tree_branching`: children per node at each depth), drawn
(`tree_widths` under a rule that draws children: nodes per depth, each node's count of children
set by the child ranks along its path, `drawn_child_counts`) or the likeliest (`tree_widths`
under a rule of deterministic children: each row's nodes of a depth are the children of its
depth above whose paths its draft finds likeliest, `likeliest_paths`, their parents data that
the tree masks of both models' calls follow, `with_parents`). Fixed and drawn trees have one
shape in every row and step, their edges static (`TreeShape.child_counts`); either way what a
compiled decode feeds its calls has static shapes.
"""

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import sampling
from spec_decode.engine import tree_rules

# The tree when neither tree_branching nor tree_widths is set: 4 + 8 + 8 = 20 nodes.
DEFAULT_BRANCHING = (4, 2, 1)
# Ranks the ids a draft gives no mass (top-k, top-p) after every id it does.
UNLIKELY = -1e4


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """The static envelope of a tree: the draft model's nodes, numbered depth by depth, each
  node's children together in its depth's order, then `lookup_branches` chains of
  `lookup_depth` nodes hanging from the root (the lookup's branches, branch b's node at depth d
  numbered `lookup_node(b, d)`). The model's nodes are a fixed tree, `branching[d]` children
  per node at depth d; or `row_widths[d - 1]` nodes at depth d (`chosen_per_row`), the same
  tree in every row with each node's count of children by the child ranks along its path when
  `drawn` (`drawn_child_counts`), else the likeliest paths of each row
  (`likeliest_paths`)."""
  branching: tuple[int, ...]
  lookup_branches: int = 0
  lookup_depth: int = 0
  row_widths: tuple[int, ...] = ()
  drawn: bool = False

  @property
  def chosen_per_row(self) -> bool:
    return bool(self.row_widths)

  @property
  def model_depth(self) -> int:
    return len(self.row_widths or self.branching)

  @property
  def max_depth(self) -> int:
    return max(self.model_depth, self.lookup_depth if self.lookup_branches else 0)

  @property
  def widths(self) -> tuple[int, ...]:
    """The model's nodes per depth, 1 (the root) first."""
    if self.chosen_per_row:
      return (1,) + self.row_widths
    return tuple(int(np.prod(self.branching[:d])) for d in range(self.model_depth + 1))

  @property
  def child_counts(self) -> tuple[tuple[int, ...], ...] | None:
    """Per depth d < model_depth, each model node of depth d's count of children (the root
    first), for a tree whose edges are static (fixed or drawn); None where each row chooses
    its parents (the likeliest paths)."""
    if not self.chosen_per_row:
      return tuple((b,) * w for b, w in zip(self.branching, self.widths))
    if self.drawn:
      return drawn_child_counts(self.row_widths)
    return None

  def parents(self, depth: int) -> np.ndarray:
    """[widths[depth]]: each static model node of `depth` (>= 1)'s parent, its index in the
    depth above."""
    counts = self.child_counts[depth - 1]
    return np.repeat(np.arange(len(counts)), counts).astype(np.int32)

  @property
  def tries(self) -> tuple[int, ...]:
    """Per depth d, the children the walk tries at a node of depth d: as many as the most a
    node of depth d has in a static tree (those a node lacks absent), every node of depth
    d + 1 where each row chooses the parents (those of other parents absent)."""
    if self.child_counts is None:
      return self.widths[1:]
    return tuple(max(counts) for counts in self.child_counts)

  @property
  def draws_per_depth(self) -> tuple[int, ...]:
    """Per depth d >= 1, the uniforms a row draws its model's nodes of depth d with: in a
    static tree, `tries[d - 1]` for each node of depth d - 1 with children (a node with fewer
    keeps the first it draws), none for the likeliest."""
    if self.child_counts is None:
      return (0,) * self.model_depth
    return tuple(sum(c > 0 for c in counts) * max(counts) for counts in self.child_counts)

  @property
  def draw_offsets(self) -> tuple[int, ...]:
    """Where each depth's uniforms start in a row's draws (depth 1 at 0), and their count last."""
    return tuple(int(x) for x in np.cumsum((0,) + self.draws_per_depth))

  @property
  def num_draws(self) -> int:
    """Uniforms a row draws its model's nodes with per iteration."""
    return self.draw_offsets[-1]

  @property
  def offsets(self) -> tuple[int, ...]:
    """The id of each depth's first model node (depth 1 at 0), and their count last."""
    return tuple(int(x) for x in np.cumsum((0,) + self.widths[1:]))

  @property
  def num_model_nodes(self) -> int:
    return self.offsets[-1]

  @property
  def num_nodes(self) -> int:
    """Every node the target scores: the model's, then the lookup's."""
    return self.num_model_nodes + self.lookup_branches * self.lookup_depth

  def lookup_node(self, branch: Any, depth: Any) -> Any:
    """The id of lookup branch `branch`'s node at `depth` (1..lookup_depth)."""
    return self.num_model_nodes + branch * self.lookup_depth + depth - 1

  def depths(self) -> np.ndarray:
    """[T] each node's depth, 1..D."""
    model = np.repeat(np.arange(1, self.model_depth + 1), self.widths[1:])
    return np.concatenate([model, np.tile(np.arange(1, self.lookup_depth + 1),
                                          self.lookup_branches)]).astype(np.int32)

  def ancestors(self) -> np.ndarray:
    """[T, T] node q' is an ancestor of (or is) node q, for the edges the shape fixes: a tree
    of the likeliest paths adds its model nodes' own per row (`with_parents`)."""
    mask = np.eye(self.num_nodes, dtype=bool)
    static_depth = 0 if self.child_counts is None else self.model_depth
    for depth in range(2, static_depth + 1):
      for j, parent in enumerate(self.parents(depth)):
        mask[self.offsets[depth - 1] + j] |= mask[self.offsets[depth - 2] + parent]
    for branch in range(self.lookup_branches):
      for depth in range(2, self.lookup_depth + 1):
        node = self.lookup_node(branch, depth)
        mask[node] |= mask[node - 1]
    return mask


def _is_count(value: Any, least: int) -> bool:
  return (not isinstance(value, bool) and isinstance(value, (int, np.integer))
          and value >= least)


def check_tree_settings(tree_branching: Sequence[int] | None = None,
                        tree_rule: str | tree_rules.TreeRule = "multi_round",
                        temperature: Any = 1.0, lookup_branches: int = 0,
                        lookup_depth: int | None = None,
                        tree_widths: Sequence[int] | None = None,
                        **sampling_settings: Any) -> None:
  """ValueError for a tree shape, rule or sampling setting `speculative_tree_sample` cannot
  run with."""
  if not _is_count(lookup_branches, 0):
    raise ValueError(f"lookup_branches must be an integer >= 0 (the n-gram lookup's branches "
                     f"at the root), got {lookup_branches!r}")
  if lookup_branches and not _is_count(lookup_depth, 1):
    raise ValueError(f"lookup_depth must be an integer >= 1 (the tokens each of the "
                     f"{lookup_branches} lookup branches copies), got {lookup_depth!r}")
  if not lookup_branches and lookup_depth is not None:
    raise ValueError(f"lookup_depth {lookup_depth!r} is set but lookup_branches is 0: no "
                     f"lookup branch to take it")
  rule = tree_rules.get_rule(tree_rule) if isinstance(tree_rule, str) else tree_rule
  if tree_widths is not None:
    if tree_branching is not None:
      raise ValueError(f"tree_branching {tree_branching!r} and tree_widths {tree_widths!r} are "
                       f"both set: a tree is fixed (tree_branching) or chosen per row "
                       f"(tree_widths); leave the other unset (None)")
    if (not isinstance(tree_widths, (tuple, list)) or not tree_widths
        or any(not _is_count(w, 1) for w in tree_widths)):
      raise ValueError(f"tree_widths must be a non-empty sequence of integers >= 1 (nodes at "
                       f"each depth of a tree chosen per row), got {tree_widths!r}")
    if rule.verify_fixed is None and rule.verify_among is None:
      raise ValueError(f"tree_rule {rule.name!r} has no verification of a tree chosen per row "
                       f"(tree_widths): neither verify_fixed (deterministic children) nor "
                       f"verify_among (drawn children)")
  elif tree_branching is not None and (
      not isinstance(tree_branching, (tuple, list))
      or not (tree_branching or lookup_branches)
      or any(not _is_count(b, 1) for b in tree_branching)):
    raise ValueError(f"tree_branching must be a non-empty sequence of integers >= 1 (children "
                     f"per node at each depth; empty only beside lookup branches), got "
                     f"{tree_branching!r}")
  if rule.greedy_only and not sampling.is_greedy(temperature):
    raise ValueError(f"tree_rule {rule.name!r} is exact only at a greedy temperature (a number "
                     f"<= {sampling.GREEDY_TEMPERATURE}), got temperature {temperature!r}")
  sampling.check_settings(temperature=temperature, **sampling_settings)


def ranking_log_probs(draft_probs: jax.Array, draft_logits: jax.Array) -> jax.Array:
  """[..., V] the log-probabilities a tree chosen per row ranks a node's children by: the
  draft's law q (its temperature, top-k and top-p); ids q gives no mass after every id it
  does, by the draft's logits. Where q is a point mass (a greedy temperature, a forced
  position) its id first, then the rest by the draft's logits at temperature 1: greedy, the
  likeliest alternatives to the argmax."""
  logits = draft_logits.astype(jnp.float32)
  point_mass = jnp.max(draft_probs, axis=-1, keepdims=True) >= 1.0
  top = jnp.max(logits, axis=-1, keepdims=True)
  greedy = jax.nn.log_softmax(jnp.where(draft_probs > 0, top + 1.0, logits))
  sampled = jnp.where(draft_probs > 0, jnp.log(jnp.where(draft_probs > 0, draft_probs, 1.0)),
                      UNLIKELY + jax.nn.log_softmax(logits))
  return jnp.where(point_mass, greedy, sampled)


def check_width(num_nodes: int, vocab_size: int, width: int) -> None:
  """ValueError when `num_nodes` parents have fewer than `width` distinct children."""
  if num_nodes * min(width, vocab_size) < width:
    raise ValueError(f"tree_widths asks for {width} nodes at a depth whose {num_nodes} parents "
                     f"have only {num_nodes * vocab_size} children in a vocabulary of "
                     f"{vocab_size}")


def likeliest_paths(draft_probs: jax.Array, draft_logits: jax.Array, path_scores: jax.Array,
                     width: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The next depth of a tree chosen per row: of every child of the n nodes of this depth
  (`draft_probs`, `draft_logits [N, n, V]`, `path_scores [N, n]`: the log-probability of each
  node's path), the `width` whose paths the draft finds likeliest (EAGLE-2's expansion,
  Li et al. 2024) -> (ids [N, width], parents [N, width]: each one's node of this depth,
  path_scores [N, width]), likeliest first but for node 0: the likeliest child of node 0, the
  draft's own chain, whatever its path's score (so a tree holds the chain of its depth). Each
  node's candidates are its distinct likeliest ids, so siblings never repeat an id."""
  num_rows, num_nodes, vocab_size = draft_probs.shape
  check_width(num_nodes, vocab_size, width)
  per_node = min(width, vocab_size)
  scores, ids = jax.lax.top_k(ranking_log_probs(draft_probs, draft_logits), per_node)
  candidates = (path_scores[:, :, None] + scores).reshape(num_rows, -1)
  _, chosen = jax.lax.top_k(candidates.at[:, 0].set(jnp.inf), width)
  path_scores = jnp.take_along_axis(candidates, chosen, axis=1)
  children = jnp.take_along_axis(ids.reshape(num_rows, -1), chosen, axis=1).astype(jnp.int32)
  return children, (chosen // per_node).astype(jnp.int32), path_scores


def drawn_child_counts(widths: Sequence[int]) -> tuple[tuple[int, ...], ...]:
  """Per depth d < len(widths), each node of depth d's count of children in a drawn tree of
  `widths[d]` nodes at depth d + 1 (the root's, `(widths[0],)`, first).

  The walk tries a node's drawn children in order and, whatever their ids, takes the first
  mostly: were the target the draft, it would always take it. So a child is placed by its rank,
  not by its draft probability: depth d + 1 holds the `widths[d]` children of the smallest sums
  of child ranks along their paths (a path of more second or later children is less likely to
  be walked; at a rate a of first children taken, the k-th child of a node is reached with
  a (1 - a)^k of its parent's chance, and within a depth that orders the paths by their sums of
  ranks whatever a is), equal sums in node order, then rank order. The counts come from the
  ranks alone, never from what is drawn: a node's children are the first it draws from its law
  (with or without replacement, as drawn), which is what the rule's `verify_among` verifies."""
  counts, path_ranks = [], np.zeros(1, np.int64)
  for width in widths:
    node, rank = np.divmod(np.arange(path_ranks.size * width), width)
    order = np.lexsort((rank, node, path_ranks[node] + rank))[:width]
    count = np.bincount(node[order], minlength=path_ranks.size)
    counts.append(tuple(int(c) for c in count))
    path_ranks = np.concatenate([path_ranks[j] + np.arange(c) for j, c in enumerate(count)])
  return tuple(counts)


def with_parents(ancestors: jax.Array, shape: TreeShape, depth: int, parents: jax.Array
                  ) -> jax.Array:
  """`ancestors [N, T, T]` with the nodes of `depth` under `parents [N, w]` (their nodes of
  depth - 1): each one's row is its parent's and itself."""
  if depth == 1:  # under the root: itself only, as the shape has it
    return ancestors
  first, end = shape.offsets[depth - 1], shape.offsets[depth]
  above = jnp.take_along_axis(ancestors, (shape.offsets[depth - 2] + parents)[:, :, None],
                              axis=1)
  itself = jnp.arange(shape.num_nodes) == jnp.arange(first, end)[:, None]
  return ancestors.at[:, first:end].set(above | itself)
