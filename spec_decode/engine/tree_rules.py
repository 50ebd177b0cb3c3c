"""Token-tree rules: how a node's children are drafted and how the target accepts one of them.

A rule is a pair of pure functions over the nodes of one depth, `[...]` any leading shape:

    draw(draft_probs [..., V], draft_logits [..., V], uniforms [..., b]) -> children [..., b]
    verify(target_probs [..., V], draft_probs [..., V], children [..., b])
      -> (accept_probs [..., b], residual [..., V])
    verify_fixed(target_probs [..., V], children [..., b], present [..., b])
      -> (accept_probs [..., b], residual [..., V])   (rules of deterministic children only)
    verify_among(target_probs [..., V], draft_probs [..., V], children [..., b],
                 present [..., b]) -> (accept_probs [..., b], residual [..., V])
                                                      (rules that draw their children only)

`draw` drafts a node's b children from the draft's law q at the node (`sampling.logits_to_probs`
of its logits: temperature, top-k, top-p), one uniform each. `verify` is the exact law of the
walk at a node given the target's law p there: the children are tried in order, child k
(reached only when children 0..k-1 were all rejected) is accepted with probability
`accept_probs[..., k]`, and when every child is rejected the next token is drawn from
`residual`. What follows an accepted child is the same walk at the child, with the target's
law after it (or, at a leaf, the bonus token from it): `token_tree` does the walk.
`verify_fixed`, which only the rules whose children are deterministic have, verifies children
fixed by what was drafted before them however they were chosen (a tree chosen per row from the
draft's likeliest paths, `token_tree`'s `tree_widths`), `present` False marking a candidate that
is not a child of the node: never accepted, the residual left as it was. `verify_among`, which
the rules that draw their children have, is `verify` of the `present` children among a depth's
nodes, drawn from q in the order they stand (a tree chosen per row whose children are drawn:
each node's count of children set before anything is drawn at it, `token_tree`'s `tree_widths`
with a drawing rule); the others are skipped as above.

Every registered rule is exact: the token the walk emits at a node is distributed as p, given
everything drafted so far. The argument (recursive rejection sampling; SpecInfer, Miao et al.
2024; Jeon et al. 2024): with r_0 = p, child k drawn from a law q_k fixed by the children
before it, accepted with min(1, r_k(x)/q_k(x)), and r_{k+1} = norm(max(r_k - q_k, 0)), the
chance to emit y at step k or later is min(q_k(y), r_k(y)) + P(reject) r_{k+1}(y), and P(reject)
= sum_x max(q_k(x) - r_k(x), 0) = sum_x max(r_k(x) - q_k(x), 0), so it is r_k(y); by induction
from the last step (emit from r_b) the walk emits from r_0 = p. An accepted child's subtree
was drafted from the draft alone, so the walk below it is exact in turn.

  multi_round          children drawn independently from q (with replacement); q_k = q.
  without_replacement  children drawn without replacement: child k from q with the children
                       before it removed (renormalized), q_k; a child whose q_k has no mass
                       left (q's support exhausted) is never accepted.
  most_likely          greedy only (every law a point mass): the children are the draft's b
                       likeliest tokens, one is accepted when it is the target's token.
  deterministic        the draft's b likeliest tokens at any temperature: children fixed by
                       what was drafted before them, not drawn, so q_k is the point mass at
                       child k. Child k is accepted with probability r_k(x_k), the target's
                       residual probability of it (min(1, r_k(x_k) / 1)), and a rejection
                       removes it: r_{k+1} = r_k with x_k taken out, renormalized (max(r_k -
                       delta, 0) is r_k without x_k). The argument above holds for any q_k fixed
                       before child k is tried, a point mass included, so the walk emits p.
                       A child repeated (or marked absent, `deterministic_walk`) has q_k's mass
                       on an id of residual 0, or none: it is never accepted and changes
                       nothing. At a greedy temperature it accepts what most_likely accepts.

`deterministic_walk` verifies any deterministic children so, with a mask of the absent ones:
the branches an n-gram lookup copies from the input and the output (`token_tree`).
"""

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from spec_decode.engine import sampling

Draw = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
Verify = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
VerifyFixed = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
VerifyAmong = Callable[[jax.Array, jax.Array, jax.Array, jax.Array],
                       tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class TreeRule:
  """A registered rule: its drafting and its verification (see the module docstring);
  `greedy_only`: exact only where every law is a point mass (a greedy temperature)."""
  name: str
  draw: Draw
  verify: Verify
  greedy_only: bool = False
  verify_fixed: VerifyFixed | None = None
  verify_among: VerifyAmong | None = None


def _prob_of(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs, tokens, axis=-1)


def _normalize_or(weights: jax.Array, fallback: jax.Array) -> jax.Array:
  """`weights [..., V]` normalized; where they have no mass, `fallback` (reached with
  probability zero: r_k = q_k exactly accepts every child)."""
  total = jnp.sum(weights, axis=-1, keepdims=True)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), fallback)


def without(probs: jax.Array, tokens: jax.Array) -> jax.Array:
  """`probs [..., V]` with the ids `tokens [..., n]` removed (unnormalized)."""
  removed = jnp.any(tokens[..., :, None] == jnp.arange(probs.shape[-1]), axis=-2)
  return jnp.where(removed, 0.0, probs)


def _child_laws(draft_probs: jax.Array, children: jax.Array, present: jax.Array,
                with_replacement: bool) -> jax.Array:
  """q_k [..., b, V]: the law child k was drawn from (unnormalized where mass was removed), of
  the `present` children only: an absent one has none, and removes no id from those after it."""
  if with_replacement:
    laws = jnp.broadcast_to(draft_probs[..., None, :], children.shape + draft_probs.shape[-1:])
  else:
    drawn = jnp.where(present, children, -1)  # -1: no id
    laws = jnp.stack([without(draft_probs, drawn[..., :k]) for k in range(children.shape[-1])],
                     axis=-2)
  return jnp.where(present[..., None], laws, 0.0)


def rejection_walk(target_probs: jax.Array, child_laws: jax.Array, children: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """Recursive rejection sampling (the module docstring) of `children [..., b]`, child k drawn
  from `child_laws[..., k, :]` (unnormalized; no mass: the child is never accepted) ->
  (accept_probs [..., b], residual [..., V])."""
  residual = target_probs
  accept = []
  for k in range(children.shape[-1]):
    law = _normalize_or(child_laws[..., k, :], jnp.zeros_like(residual))
    x = children[..., k:k + 1]
    q_x, r_x = _prob_of(law, x)[..., 0], _prob_of(residual, x)[..., 0]
    accept.append(jnp.where(q_x > 0, jnp.minimum(1.0, r_x / jnp.where(q_x > 0, q_x, 1.0)),
                            0.0))
    residual = _normalize_or(jnp.maximum(residual - law, 0.0), residual)
  return jnp.stack(accept, axis=-1), residual


def draw_with_replacement(draft_probs: jax.Array, draft_logits: jax.Array,
                          uniforms: jax.Array) -> jax.Array:
  """Each child independently from q."""
  del draft_logits
  laws = jnp.broadcast_to(draft_probs[..., None, :], uniforms.shape + draft_probs.shape[-1:])
  return sampling.sample_from_uniform(uniforms, laws)


def draw_without_replacement(draft_probs: jax.Array, draft_logits: jax.Array,
                             uniforms: jax.Array) -> jax.Array:
  """Child k from q with children 0..k-1 removed; once q's support is spent, a child
  repeats an id of probability 0 under its law (`rejection_walk` never accepts it)."""
  del draft_logits
  children, left = [], draft_probs
  for k in range(uniforms.shape[-1]):
    children.append(sampling.sample_from_uniform(uniforms[..., k], left))
    left = without(left, children[-1][..., None])
  return jnp.stack(children, axis=-1)


def multi_round_among(target_probs, draft_probs, children, present):
  """`multi_round` of the `present` children."""
  return rejection_walk(target_probs, _child_laws(draft_probs, children, present, True),
                        children)


def without_replacement_among(target_probs, draft_probs, children, present):
  """`without_replacement` of the `present` children (each drawn without the present ones
  before it)."""
  return rejection_walk(target_probs, _child_laws(draft_probs, children, present, False),
                        children)


def multi_round(target_probs, draft_probs, children):
  """SpecInfer's multi-round rejection sampling, children drawn with replacement."""
  return multi_round_among(target_probs, draft_probs, children, jnp.ones(children.shape, bool))


def without_replacement(target_probs, draft_probs, children):
  """Recursive rejection sampling of children drawn without replacement (Jeon et al.)."""
  return without_replacement_among(target_probs, draft_probs, children,
                                   jnp.ones(children.shape, bool))


def draw_likeliest(draft_probs: jax.Array, draft_logits: jax.Array,
                   uniforms: jax.Array) -> jax.Array:
  """The draft's b likeliest ids, its point mass first (the forced id's stand-in at a forced
  position, where the point mass is not its logits' argmax)."""
  scores = jnp.where(draft_probs > 0, jnp.inf, draft_logits.astype(jnp.float32))
  return jax.lax.top_k(scores, uniforms.shape[-1])[1].astype(jnp.int32)


def draw_top(draft_probs: jax.Array, draft_logits: jax.Array,
             uniforms: jax.Array) -> jax.Array:
  """The b ids of the largest draft probabilities (a point mass's id first: at a forced
  position, the forced id's stand-in)."""
  del draft_logits
  return jax.lax.top_k(draft_probs, uniforms.shape[-1])[1].astype(jnp.int32)


def deterministic_walk(target_probs: jax.Array, children: jax.Array, present: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
  """Recursive rejection sampling of deterministic `children [..., b]` (each the point mass
  q_k = delta(x_k), the module docstring's 'deterministic'); `present [..., b]` False marks an
  absent child (no proposal: q_k has no mass), never accepted, the residual left as it was.
  -> (accept_probs [..., b], residual [..., V])."""
  vocab_size = target_probs.shape[-1]
  laws = jax.nn.one_hot(children, vocab_size, dtype=target_probs.dtype)
  return rejection_walk(target_probs, jnp.where(present[..., None], laws, 0.0), children)


def deterministic(target_probs, draft_probs, children):
  """Deterministic children (the draft's likeliest, `draw_top`), each accepted with the
  target's residual probability of it."""
  del draft_probs
  return deterministic_walk(target_probs, children, jnp.ones(children.shape, bool))


def most_likely(target_probs, draft_probs, children):
  """Greedy: a child is accepted when it is the target's point mass; the residual is p."""
  del draft_probs
  return most_likely_fixed(target_probs, children, jnp.ones(children.shape, bool))


def most_likely_fixed(target_probs: jax.Array, children: jax.Array, present: jax.Array
                      ) -> tuple[jax.Array, jax.Array]:
  """`most_likely` of the `present` children; the residual is p."""
  accept = (_prob_of(target_probs, children) > 0.5) & present
  return accept.astype(jnp.float32), target_probs


RULES: dict[str, TreeRule] = {}


def register_rule(rule: TreeRule) -> None:
  """Makes `rule` available as `speculative_tree_sample(..., tree_rule=rule.name)`."""
  if rule.name in RULES:
    raise ValueError(f"a tree rule named {rule.name!r} is already registered")
  RULES[rule.name] = rule


def get_rule(name: str) -> TreeRule:
  if name not in RULES:
    raise ValueError(f"tree_rule must be one of {sorted(RULES)}, got {name!r}")
  return RULES[name]


register_rule(TreeRule("multi_round", draw_with_replacement, multi_round,
                       verify_among=multi_round_among))
register_rule(TreeRule("without_replacement", draw_without_replacement, without_replacement,
                       verify_among=without_replacement_among))
register_rule(TreeRule("most_likely", draw_likeliest, most_likely, greedy_only=True,
                       verify_fixed=most_likely_fixed))
register_rule(TreeRule("deterministic", draw_top, deterministic,
                       verify_fixed=deterministic_walk))
