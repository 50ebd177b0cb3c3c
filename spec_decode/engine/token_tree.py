"""Exact token-tree speculative sampling: `speculative_tree_sample`, `temperature_sample`'s law.

Where `speculative_sample` verifies one chain of drafts per target call, this loop verifies a
tree (SpecInfer, Miao et al. 2024; SpecTr; Jeon et al. 2024): per row the draft expands a tree
of static shape, `tree_branching[d]` children for every node at depth d ((4, 2, 1): 4 nodes at
depth 1, 8 at depth 2, 8 at depth 3), the target scores every node in ONE call, and a rule of
`spec_decode.engine.tree_rules` keeps the longest path it accepts. It follows the conventions
of `spec_decode.engine.decoding` (inputs, outputs, log_probs) and shares `decode_rows`' setup
and row bookkeeping.

Each iteration, for every row at its own position i (its last committed token), its "pending"
tokens being those it committed last iteration (positions p0..i, 1 to D + 1 of them for a tree
of depth D; at the start, the token at i alone), both caches holding the positions < p0:
1. the draft is fed the pending chain (one call, k = D + 1, padded on the right: padding lands
   on stale positions), whose logits at i give its law q at the root; the root's children are
   drawn from q by the rule, then depth by depth the draft scores the nodes drafted so far in
   one tree call (contract: each node at position i + depth attends to the cache and to its
   ancestors) and the rule draws their children: D draft calls per iteration;
2. the target is fed [pending chain, every node] in ONE tree call: the chain is written to its
   cache and its logits at i are the target's law p at the root; each node gets p after its
   path. The nodes' cache entries sit at positions > i: stale, never read;
3. the rule walks from the root: at a node, its children are tried in order, each accepted
   with the rule's probability against the target's law there (the residual updated on each
   rejection); when all are rejected, the next token is drawn from the residual; when the walk
   accepts a leaf, the bonus token is drawn from p at the leaf. The row commits the accepted
   path and that token (cut at EOS or its length limit), which become its pending chain.
The caches end as if the path had been decoded because the next iteration feeds it to both.
Exactness: each iteration emits tokens with the target's law given the prefix (the rule's
walk, `tree_rules`); the tree's shape is static and its tokens come from the draft alone.
`tree_widths[d - 1]` nodes at depth d instead: under a rule of deterministic children
('deterministic'; 'most_likely' greedy) each row's nodes of depth d are the children of its
depth d - 1 whose paths the draft finds likeliest (`tree_shape.likeliest_paths`), their parents
data that the tree masks of both models' calls follow, fixed by the draft before the target is
called and verified as such (the rule's `verify_fixed`, every node of depth d tried, other
parents' absent). Under a rule that draws its children ('without_replacement', 'multi_round')
the walk takes a node's first drawn child most often, whatever its id, so depth d's nodes go to
the nodes of depth d - 1 by the child ranks along their paths (`tree_shape.drawn_child_counts`):
a static tree, one shape in every row, each node's children the first it draws from its law (a
count set before anything is drawn at the node, so they are still the rule's draw), verified
as a fixed tree's (`verify_among` where a depth's nodes have different counts).
Lookup branches: with an n-gram lookup draft (`lookup`), `lookup_branches` chains of
`lookup_depth` tokens copied after earlier matches of the row's suffix (`lookup.branches`)
hang from the root beside the model's tree (or alone: no draft call at all). They are
deterministic children: the walk tries the root's lookup children first, each accepted with
the target's residual probability (`tree_rules.deterministic_walk`; a branch a row lacks is
absent, never accepted), then the model's children, drawn and verified from q with the
lookup's children removed; below a lookup node, its branch's next token is its one child.
A model that takes no tree call (it never reads the contract's token_positions and
token_mask) is given chain calls instead, one per node's path
(`speculative_beam_search.path_logits`; the stats count every call).
Forced prompt tokens: at a forced position p and q are the same point mass (`decode_rows`), so
the first child there is the forced token's stand-in and always accepted.
A logit callback (T5X's logit_callback_fn) is not taken: the loop is refused it by name.
"""

import functools
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import contract
from spec_decode.engine import decode_rows
from spec_decode.engine import lookup
from spec_decode.engine import loops
from spec_decode.engine import sampling
from spec_decode.engine import speculative_beam_search
from spec_decode.engine import tree_rules
from spec_decode.engine import tree_shape
from spec_decode.engine.tree_shape import DEFAULT_BRANCHING, TreeShape, check_tree_settings
from spec_decode.engine.contract import DecodingState, TokensToLogits
from spec_decode.engine.stats import TreeStats

TREE_FIELDS = ("token_positions", "token_mask")
def _lookup_parts(draft_tokens_to_logits: TokensToLogits, draft_cache: Any,
                  shape: "TreeShape") -> tuple[Any, TokensToLogits | None]:
  """(the lookup, or None without lookup branches; the draft model's tokens_to_logits, None
  for a lookup alone). ValueError for lookup branches without a lookup draft, a model tree
  without a model, or a model without a tree."""
  if not shape.lookup_branches:
    return None, draft_tokens_to_logits
  parts = lookup.parts(draft_tokens_to_logits, draft_cache)
  if parts is None:
    raise ValueError(f"lookup_branches {shape.lookup_branches} needs an n-gram lookup draft "
                     f"(draft_source 'lookup' or 'lookup+model'), not another draft")
  drafter, _, model, _ = parts
  if model is None and shape.model_depth:
    what = (f"tree_widths {shape.row_widths}" if shape.chosen_per_row
            else f"tree_branching {shape.branching}")
    raise ValueError(f"a lookup draft alone has no model to expand {what}: set "
                     f"tree_branching to () (lookup branches only)")
  if model is not None and not shape.model_depth:
    raise ValueError("tree_branching () leaves the draft model of 'lookup+model' unused: give "
                     "its tree, or draft with the lookup alone")
  return drafter, model


@flax.struct.dataclass
class TreeLoopState:
  rows: decode_rows.Rows
  num_pending: jax.Array  # [N] the row's pending tokens (positions index - n + 1 .. index)
  cache: Any
  draft_cache: Any
  stats: TreeStats
  iteration: jax.Array  # int32 scalar: which row of the decode's uniforms this step draws with


@loops.register("speculative_tree_sample", uses_draft=True, check_settings=check_tree_settings,
                stats=TreeStats, data_settings=decode_rows.SAMPLING_DATA)
def speculative_tree_sample(inputs: jax.Array, cache: Any, tokens_to_logits: TokensToLogits,
                            eos_id: int, *, draft_cache: Any,
                            draft_tokens_to_logits: TokensToLogits,
                            tree_branching: Sequence[int] | None = None,
                            tree_rule: str | tree_rules.TreeRule = "multi_round",
                            lookup_branches: int = 0, lookup_depth: int | None = None,
                            tree_widths: Sequence[int] | None = None,
                            decode_rng: jax.Array | None = None, num_decodes: int = 1,
                            temperature: float = 1.0, topk: int = 0, topp: float = 0.0,
                            max_decode_steps: int | None = None,
                            max_decode_steps_hard_limit: int | None = None,
                            rescale_log_probs: bool = True,
                            initial_index: jax.Array | None = None
                            ) -> tuple[jax.Array, jax.Array, TreeStats]:
  """Token-tree speculative sampling (see the module docstring): `temperature_sample`'s law.

  `tree_branching[d]`: children per node at depth d (unset: `DEFAULT_BRANCHING`); or
  `tree_widths[d - 1]` nodes at depth d, chosen per row (the module docstring); `tree_rule`
  names a rule of `spec_decode.engine.tree_rules` ('multi_round', 'without_replacement',
  'deterministic'; 'most_likely' at a greedy temperature) or is a `tree_rules.TreeRule`. With
  an n-gram lookup draft (`lookup.NGramLookup.tokens_to_logits`, or `lookup.with_model`'s),
  `lookup_branches` earlier matches of the row's suffix hang from the root as branches of
  `lookup_depth` copied tokens each, beside the model's tree (a lookup alone: `tree_branching`
  ()). Returns (decodes [B, num_decodes, L], log_probs [B, num_decodes]: the target's, as
  `temperature_sample` scores the same tokens, stats: TreeStats with [B, num_decodes] fields).
  """
  check_tree_settings(tree_branching, tree_rule, temperature, lookup_branches, lookup_depth,
                      tree_widths)
  if tree_branching is None and tree_widths is None:
    tree_branching = DEFAULT_BRANCHING
  rule = tree_rules.get_rule(tree_rule) if isinstance(tree_rule, str) else tree_rule
  shape = TreeShape(tuple(int(b) for b in tree_branching or ()), int(lookup_branches),
                    int(lookup_depth or 0), tuple(int(w) for w in tree_widths or ()),
                    drawn=tree_widths is not None and rule.verify_fixed is None)
  drafter, model = _lookup_parts(draft_tokens_to_logits, draft_cache, shape)
  problem, rows = decode_rows.setup(
      inputs, eos_id=eos_id, num_decodes=num_decodes, initial_index=initial_index,
      temperature=temperature, topk=topk, topp=topp, max_decode_steps=max_decode_steps,
      max_decode_steps_hard_limit=max_decode_steps_hard_limit,
      rescale_log_probs=rescale_log_probs, logit_callback_fn=None,
      block_size=shape.max_depth + 1)
  batch_size, max_decode_len = inputs.shape
  if shape.max_depth > max_decode_len:
    what = (f"lookup_depth {shape.lookup_depth}" if shape.model_depth < shape.max_depth
            else f"tree_widths {shape.row_widths}" if shape.chosen_per_row
            else f"tree_branching {shape.branching}")
    raise ValueError(f"{what} is {shape.max_depth} deep, deeper than the {max_decode_len} "
                     f"tokens a decode holds (max_decode_len): nodes past "
                     f"depth {max_decode_len} could never be kept")
  cache, draft_cache = decode_rows.expand((cache, draft_cache), num_decodes)
  num_rows = rows.index.shape[0]
  # Per iteration: one draw per drafted node, one per model child tried, one for the next
  # token, then one per lookup child tried.
  lookup_tries = shape.lookup_branches + max(shape.lookup_depth - 1, 0)
  uniforms = sampling.decode_uniforms(
      decode_rng, *rows.sequences.shape,
      shape.num_draws + sum(shape.tries) + 1 + lookup_tries)
  step = functools.partial(_tree_step, problem, tokens_to_logits, model, drafter,
                           shape=shape, rule=rule, decode_uniforms=uniforms)
  initial = TreeLoopState(rows, jnp.ones((num_rows,), jnp.int32), cache, draft_cache,
                          TreeStats.zeros(num_rows, shape.max_depth), jnp.int32(0))
  final = jax.lax.while_loop(lambda s: ~jnp.all(s.rows.done), step, initial)
  return decode_rows.finish(final.rows, max_decode_len, batch_size, num_decodes, final.stats)


def _reads_tree(tokens_to_logits: TokensToLogits, state: DecodingState) -> bool:
  return contract.reads_fields(tokens_to_logits, state, TREE_FIELDS)


def _node_logits(tokens_to_logits: TokensToLogits, shape: TreeShape, *, index: jax.Array,
                 sequences: jax.Array, cache: Any, fed: jax.Array, ancestors: jax.Array,
                 depth: int) -> tuple[jax.Array, Any, int]:
  """The draft's logits [N, n, V] of the n nodes at `depth`, from one tree call on the nodes of
  depths 1..depth (`fed [N, T]`: every node's token; `ancestors [N, T, T]`, known for those
  depths), over `cache` holding positions <= index -> (logits, cache, calls made: 1, or one
  per node for a model that takes no tree call)."""
  first, end = shape.offsets[depth - 1], shape.offsets[depth]
  num_rows = index.shape[0]
  state = DecodingState(
      cur_index=index + 1, cur_token=fed[:, :end], sequences=sequences, cache=cache,
      token_positions=index[:, None] + jnp.asarray(shape.depths()[:end]),
      token_mask=ancestors[:, :end, :end])
  if _reads_tree(tokens_to_logits, state):
    logits, cache = tokens_to_logits(state)
    return logits[:, first:end], cache, 1
  slots = jnp.broadcast_to(jnp.arange(first, end), (num_rows, end - first))
  return speculative_beam_search.path_logits(
      tokens_to_logits, cur_index=index + 1, sequences=sequences, cache=cache, tokens=fed,
      ancestors=ancestors, depths=jnp.asarray(shape.depths()), slots=slots,
      max_depth=shape.max_depth), cache, end - first


def _target_call(tokens_to_logits: TokensToLogits, shape: TreeShape, *, start: jax.Array,
                 index: jax.Array, num_pending: jax.Array, chain: jax.Array, fed: jax.Array,
                 ancestors: jax.Array, sequences: jax.Array, cache: Any
                 ) -> tuple[jax.Array, Any, int]:
  """The target's call on [pending chain, every node] (`ancestors [N, T, T]`) -> (logits
  [N, 1 + T, V]: the root's, then each node's; the cache with the chain written; target calls
  made)."""
  num_rows, chain_length = chain.shape
  num_nodes = shape.num_nodes
  chain_positions = start[:, None] + jnp.arange(chain_length)
  pending = jnp.arange(chain_length)[None] < num_pending[:, None]  # [N, D+1]
  chain_mask = jnp.broadcast_to(jnp.tril(jnp.ones((chain_length, chain_length), bool)),
                                (num_rows, chain_length, chain_length))
  mask = jnp.concatenate([
      jnp.concatenate([chain_mask, jnp.zeros((num_rows, chain_length, num_nodes), bool)],
                      axis=2),
      jnp.concatenate([jnp.broadcast_to(pending[:, None], (num_rows, num_nodes, chain_length)),
                       ancestors], axis=2)], axis=1)
  state = DecodingState(
      cur_index=start, cur_token=jnp.concatenate([chain, fed], axis=1), sequences=sequences,
      cache=cache, token_mask=mask, token_positions=jnp.concatenate(
          [chain_positions, index[:, None] + jnp.asarray(shape.depths())], axis=1))
  last_pending = (num_pending - 1)[:, None, None]
  if _reads_tree(tokens_to_logits, state):
    logits, cache = tokens_to_logits(state)
    root = jnp.take_along_axis(logits, last_pending, axis=1)
    return jnp.concatenate([root, logits[:, chain_length:]], axis=1), cache, 1
  logits, cache = tokens_to_logits(DecodingState(start, chain, sequences, cache))
  root = jnp.take_along_axis(logits, last_pending, axis=1)
  nodes = speculative_beam_search.path_logits(
      tokens_to_logits, cur_index=index + 1, sequences=sequences, cache=cache, tokens=fed,
      ancestors=ancestors, depths=jnp.asarray(shape.depths()),
      slots=jnp.broadcast_to(jnp.arange(num_nodes), (num_rows, num_nodes)),
      max_depth=shape.max_depth)
  return jnp.concatenate([root, nodes.astype(root.dtype)], axis=1), cache, 1 + num_nodes


def _static_children(rule: tree_rules.TreeRule, shape: TreeShape, depth: int, q: jax.Array,
                     draft_logits: jax.Array, draws: jax.Array) -> jax.Array:
  """The ids [N, w] of a static tree's nodes at `depth` + 1, drawn by `rule` from the laws of
  the nodes of `depth` (`q [N, n, V]`, `draft_logits`) with `draws [N, draws_per_depth]`:
  each node with children draws `tries[depth]` of them and keeps the first it counts (a first
  few of a rule's draw are that rule's draw of fewer)."""
  counts = shape.child_counts[depth]
  num_rows, vocab_size = q.shape[0], q.shape[-1]
  if shape.drawn:
    tree_shape.check_width(len(counts), vocab_size, sum(counts))
  drawing = np.flatnonzero(counts)  # the nodes with children
  if drawing.size < len(counts):
    q, draft_logits = q[:, drawing], draft_logits[:, drawing]
  drawn = rule.draw(q, draft_logits, draws.reshape(num_rows, drawing.size, -1))
  node = np.searchsorted(drawing, shape.parents(depth + 1))
  rank = np.arange(sum(counts)) - np.cumsum((0,) + counts)[shape.parents(depth + 1)]
  return drawn[:, node, rank].astype(jnp.int32)


def _model_cache(draft_cache: Any, drafter: Any) -> Any:
  """The draft model's part of the draft's cache (`lookup.init_combined_cache` with a lookup)."""
  return draft_cache if drafter is None else draft_cache["model"]


def _tree_step(problem: decode_rows.Problem, tokens_to_logits: TokensToLogits,
               draft_tokens_to_logits: TokensToLogits | None, drafter: Any,
               state: TreeLoopState, *, shape: TreeShape, rule: tree_rules.TreeRule,
               decode_uniforms: jax.Array) -> TreeLoopState:
  rows, num_pending = state.rows, state.num_pending
  uniforms = sampling.iteration_uniforms(decode_uniforms, state.iteration)
  num_rows = rows.index.shape[0]
  row_ids = jnp.arange(num_rows)
  index, max_depth, widths, offsets = rows.index, shape.max_depth, shape.widths, shape.offsets
  model_depth = shape.model_depth
  depths = jnp.asarray(shape.depths())
  start = index - num_pending + 1
  chain = decode_rows.gather(rows.sequences, start[:, None] + jnp.arange(max_depth + 1))
  node_positions = index[:, None] + depths  # [N, T]
  walk = uniforms[:, shape.num_draws:]
  lookup_walk = walk[:, sum(shape.tries) + 1:]

  # 0. The lookup's branches: tokens [N, M, Dl], copied from the source and the output.
  if drafter is not None:
    lookup_cache = state.draft_cache if draft_tokens_to_logits is None else (
        state.draft_cache["lookup"])
    lookup_ids, lookup_present = lookup.branches(
        lookup_cache.source, rows.sequences, index, num_branches=shape.lookup_branches,
        depth=shape.lookup_depth, max_ngram=drafter.max_ngram, min_ngram=drafter.min_ngram)
    root_lookup = jnp.where(lookup_present[:, :, 0], lookup_ids[:, :, 0], -1)  # -1: no id
  else:
    lookup_ids = jnp.zeros((num_rows, 0, 0), jnp.int32)

  # 1. The draft: q at the root from the pending chain, then depth by depth.
  draft_laws, ids, draft_calls = [], jnp.zeros((num_rows, 0), jnp.int32), 0
  # The likeliest paths: each depth's nodes' parents [N, w] (indices into the depth above),
  # and each node's path's log-probability by the draft's law.
  parents, path_scores = [], jnp.zeros((num_rows, 1), jnp.float32)
  ancestors = jnp.broadcast_to(jnp.asarray(shape.ancestors()),
                               (num_rows, shape.num_nodes, shape.num_nodes))
  draft_cache = state.draft_cache
  if model_depth:
    model_cache = _model_cache(state.draft_cache, drafter)
    draft_logits, model_cache = contract.logits_of_one(
        draft_tokens_to_logits, DecodingState(start, chain, rows.sequences, model_cache),
        num_pending - 1)
    draft_logits, draft_calls = draft_logits[:, None], 1
  for depth in range(model_depth):
    positions = jnp.broadcast_to((index + depth + 1)[:, None], draft_logits.shape[:2])
    q = decode_rows.target_probs(problem, draft_logits, positions)  # [N, n_d, V]
    if depth == 0 and drafter is not None:
      # The model's children of the root are drawn with the lookup's removed: q_k fixed by
      # the (deterministic) lookup children tried before them.
      removed = jnp.any(jax.nn.one_hot(root_lookup, q.shape[-1]) > 0, axis=1)[:, None]
      q = jnp.where(removed, 0.0, q)
      draft_logits = jnp.where(removed, -jnp.inf, draft_logits)
    draft_laws.append(q)
    draws = uniforms[:, shape.draw_offsets[depth]:shape.draw_offsets[depth + 1]]
    if shape.child_counts is None:
      children, parent, path_scores = tree_shape.likeliest_paths(q, draft_logits, path_scores,
                                                                 widths[depth + 1])
      parents.append(parent)
      ancestors = tree_shape.with_parents(ancestors, shape, depth + 1, parent)
    else:
      children = _static_children(rule, shape, depth, q, draft_logits, draws)
    ids = jnp.concatenate([ids, children], axis=1)
    fed = decode_rows.with_forced(problem, ids, node_positions[:, :ids.shape[1]])
    if depth + 1 < model_depth:
      fed_all = jnp.pad(fed, ((0, 0), (0, shape.num_nodes - fed.shape[1])))
      draft_logits, model_cache, calls = _node_logits(
          draft_tokens_to_logits, shape, index=index, sequences=rows.sequences,
          cache=model_cache, fed=fed_all, ancestors=ancestors, depth=depth + 1)
      draft_calls += calls
  if model_depth:
    draft_cache = model_cache if drafter is None else {**state.draft_cache,
                                                       "model": model_cache}
  ids = jnp.concatenate([ids, lookup_ids.reshape(num_rows, -1)], axis=1)  # every node's id
  fed = decode_rows.with_forced(problem, ids, node_positions)

  # 2. The target's one call.
  logits, cache, target_calls = _target_call(
      tokens_to_logits, shape, start=start, index=index, num_pending=num_pending, chain=chain,
      fed=fed, ancestors=ancestors, sequences=rows.sequences, cache=state.cache)
  if model_depth and logits.shape[-1] != draft_logits.shape[-1]:
    raise ValueError(f"target and draft vocabulary sizes differ: target logits have "
                     f"{logits.shape[-1]} entries, draft logits {draft_logits.shape[-1]}")
  target_laws = decode_rows.target_probs(
      problem, logits, jnp.concatenate([index[:, None], node_positions], axis=1) + 1)

  # 3. The walk: slot 0 is the root, slot 1 + t node t. At each depth the row's node tries its
  # lookup children (the root: one per branch; a lookup node: the next of its branch) first,
  # then its model children from what they left (the residual).
  slot = jnp.zeros((num_rows,), jnp.int32)
  node_in_depth = jnp.zeros((num_rows,), jnp.int32)  # of a model node
  branch = jnp.full((num_rows,), -1, jnp.int32)  # of a lookup node; -1: a model node or root
  walking = jnp.ones((num_rows,), bool)
  final_law = target_laws[:, 0]
  path_ids, path_slots = [], [slot]
  num_accepted = jnp.zeros((num_rows,), jnp.int32)
  lookup_accepted = jnp.zeros((num_rows,), jnp.int32)
  used, lookup_used = 0, 0
  for depth in range(max_depth):
    law = target_laws[row_ids, slot]
    took, child_id = jnp.zeros((num_rows,), bool), jnp.zeros((num_rows,), jnp.int32)
    to_slot, to_branch, to_node = slot, branch, node_in_depth
    residual = law
    if drafter is not None and depth < shape.lookup_depth:
      if depth == 0:
        tried = jnp.arange(shape.lookup_branches)
        children = lookup_ids[:, :, 0]
        present = lookup_present[:, :, 0]
      else:
        tried = jnp.maximum(branch, 0)[:, None]
        children = jnp.take_along_axis(lookup_ids[:, :, depth], tried, axis=1)
        present = jnp.take_along_axis(lookup_present[:, :, depth], tried, axis=1) & (
            branch >= 0)[:, None]
      accept, residual = tree_rules.deterministic_walk(law, children, present)
      width = children.shape[1]
      accepted = lookup_walk[:, lookup_used:lookup_used + width] < accept
      lookup_used += width
      first = jnp.argmax(accepted, axis=1)
      took = jnp.any(accepted, axis=1)
      child_id = jnp.take_along_axis(children, first[:, None], axis=1)[:, 0]
      to_branch = jnp.where(took, jnp.take_along_axis(
          jnp.broadcast_to(tried, children.shape), first[:, None], axis=1)[:, 0], branch)
      to_slot = jnp.where(took, 1 + shape.lookup_node(to_branch, depth + 1), slot)
    if depth < model_depth:
      width = shape.tries[depth]
      on_model = branch < 0  # the root, or a model node
      node_law = draft_laws[depth][row_ids, node_in_depth]
      if shape.child_counts is None:  # every node of the next depth, other parents' absent
        in_depth = jnp.broadcast_to(jnp.arange(width), (num_rows, width))
        children = ids[:, offsets[depth]:offsets[depth + 1]]
        present = parents[depth] == node_in_depth[:, None]
        accept, model_residual = rule.verify_fixed(residual, children, present)
      else:  # the node's own children, together in the next depth
        counts = shape.child_counts[depth]
        first_child = jnp.asarray(np.cumsum((0,) + counts[:-1]), jnp.int32)[node_in_depth]
        in_depth = jnp.minimum(first_child[:, None] + jnp.arange(width), widths[depth + 1] - 1)
        children = jnp.take_along_axis(ids, offsets[depth] + in_depth, axis=1)
        if len(set(counts)) == 1:
          accept, model_residual = rule.verify(residual, node_law, children)
        else:
          present = jnp.arange(width) < jnp.asarray(counts, jnp.int32)[node_in_depth][:, None]
          accept, model_residual = rule.verify_among(residual, node_law, children, present)
      accepted = (walk[:, used:used + width] < accept) & (on_model & ~took)[:, None]
      used += width
      first = jnp.argmax(accepted, axis=1)
      took_model = jnp.any(accepted, axis=1)
      residual = jnp.where(on_model[:, None], model_residual, residual)
      child_id = jnp.where(took_model, jnp.take_along_axis(children, first[:, None],
                                                           axis=1)[:, 0], child_id)
      chosen = jnp.take_along_axis(in_depth, first[:, None], axis=1)[:, 0]
      to_slot = jnp.where(took_model, 1 + offsets[depth] + chosen, to_slot)
      to_node = jnp.where(took_model, chosen, node_in_depth)
      took = took | took_model
    took &= walking
    final_law = jnp.where((walking & ~took)[:, None], residual, final_law)
    path_ids.append(child_id)
    slot = jnp.where(took, to_slot, slot)
    node_in_depth = jnp.where(took, to_node, node_in_depth)
    lookup_accepted += took & (to_branch >= 0)
    branch = jnp.where(took, to_branch, branch)
    path_slots.append(slot)
    num_accepted += took
    walking = took
  final_law = jnp.where(walking[:, None], target_laws[row_ids, slot], final_law)
  next_token = sampling.sample_from_uniform(walk[:, sum(shape.tries)], final_law)

  block = jnp.arange(max_depth + 1)
  candidates = jnp.where(block == num_accepted[:, None], next_token[:, None],
                         jnp.pad(jnp.stack(path_ids, axis=1), ((0, 0), (0, 1))))
  candidates = decode_rows.with_forced(problem, candidates, index[:, None] + 1 + block)
  predicting = jnp.take_along_axis(logits, jnp.stack(path_slots, axis=1)[:, :, None], axis=1)
  committed, num_committed = decode_rows.commit(problem, rows, candidates, num_accepted + 1,
                                                predicting)

  active = ~rows.done
  count = lambda x: jnp.where(active, x, 0).astype(jnp.int32)
  stats = state.stats
  # A path is the lookup's or the model's whole (lookup branches hang from the root).
  kept = jnp.minimum(num_accepted, num_committed)
  stats = TreeStats(
      target_calls=stats.target_calls + count(target_calls),
      draft_calls=stats.draft_calls + count(draft_calls),
      tree_nodes=stats.tree_nodes + count(shape.num_nodes),
      accepted_tokens=stats.accepted_tokens + kept,
      lookup_accepted_tokens=stats.lookup_accepted_tokens + jnp.minimum(lookup_accepted, kept),
      generated_tokens=stats.generated_tokens + num_committed,
      accepted_depths=stats.accepted_depths + (
          active[:, None] & (num_accepted[:, None] == block)).astype(jnp.int32))
  return TreeLoopState(committed, jnp.where(active, num_committed, num_pending), cache,
                       draft_cache, stats, state.iteration + 1)
