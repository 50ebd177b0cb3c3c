"""Exact speculative beam search: `beam_search`'s output with fewer target calls.

Every beam of a row sits at the row's position i. A beam's "pending" tokens are those it took
in the last iteration (positions p0..i, 1 to gamma + 1 of them, the same count for every beam
of a row): the caches hold positions < p0 only. Each iteration, for every row that goes on:
1. the draft is fed each beam's pending chain (one call, k = gamma + 1, the chain padded on
   the right: padding lands on stale positions), then runs beam search itself for gamma steps
   (`beam_search.beam_step` on its own log-probs, one k = 1 call per further step, its caches
   gathered per beam), keeping W = `draft_beams` >= K beams (default K; the K live beams
   padded with fillers to start). Its live beams after each step form a tree over the row's K
   live beams: W * gamma nodes, node (d, j) the j-th draft beam after d steps, its parent the
   draft beam it extends; a wider draft search holds the target's K choices more often. Each
   target beam scores the nodes of its own subtree, ancestors first, at most
   `nodes_per_beam` of them (default: W * gamma, the whole tree, so no node is ever left out;
   a smaller budget makes the target call cheaper and may cover fewer steps).
2. the target is called ONCE per beam with [pending chain, tree] (a tree call, see the model
   contract in `contract`): the chain is written to its cache; each node sits at position i + d,
   attends to the cache, the pending chain and its own ancestors, and is never read later
   (positions > i are stale). A target that takes no tree call (it never reads the contract's
   token_positions and token_mask) gets chain calls instead: the pending chain, then each
   scored node's path, one call each (`_path_calls`; the stats count every call).
3. `beam_search.beam_step` is replayed from the roots' target log-probs. After a step every new
   live beam is a path root -> tokens; when each is a node its root's call scored, its target
   log-probs were computed and the next step is replayed; otherwise the replay stops. The step
   that leaves the tree still counts (it used only computed log-probs), so a row advances at
   least 1 and at most gamma + 1 steps per target call.
4. each new beam takes its root's target cache (pending chain written) and its root's draft
   cache as fed in step 1; the tokens it took become its pending chain.
Exactness is by construction: every step is `beam_step` on the target's log-probs of the beam's
own prefix (up to float rounding of a k-token call against a 1-token call), exactly what
`beam_search` computes; the draft decides only how many steps one call covers. Rows are
independent, each stopping by itself (`beam_search.continues`: the same output as
`beam_search`'s batch-wide stop, see there).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.engine import beam_search
from spec_decode.engine import contract
from spec_decode.engine import decode_rows
from spec_decode.engine import loops
from spec_decode.engine import speculative_sampling
from spec_decode.engine.stats import BeamSearchStats

BeamState = beam_search.BeamState


@flax.struct.dataclass
class _LoopState:
  beams: BeamState
  num_pending: jax.Array  # [B] pending tokens of every beam of the row
  cache: Any
  draft_cache: Any
  stats: BeamSearchStats


@flax.struct.dataclass
class _Tree:
  """The draft's tree of each row: node q = d * K + j is the j-th draft beam after d + 1
  steps. Ids: 0..K-1 are the roots (the row's live beams), K + q the nodes."""
  tokens: jax.Array  # [B, T] each node's token (at position i + depth)
  parent_ids: jax.Array  # [B, T] the id of each node's parent
  roots: jax.Array  # [B, T] the root each node descends from
  ancestors: jax.Array  # [B, T, T] node q' is an ancestor of (or is) node q
  depths: jax.Array  # [T] 1..gamma
  # What each beam's target call scores: its root's nodes, ancestors first, at most the budget.
  slots: jax.Array  # [B, K, budget] the node in each slot of each beam's call
  slot: jax.Array  # [B, T] each node's slot in its root's call
  scored: jax.Array  # [B, T] the node fits its root's budget: the target scores it


def check_speculative_beam_settings(
    gamma: int | None = None, alpha: float = 0.6, max_decode_step: int = -1,
    nodes_per_beam: int | None = None, draft_beams: int | None = None,
    min_log_prob: float = beam_search.DEFAULT_MIN_LOG_PROB, max_decode_len: int | None = None,
    **_: Any) -> None:
  """ValueError for a gamma, alpha, node budget, draft beam count, min_log_prob or decode
  length speculative beam search cannot run with."""
  speculative_sampling.check_speculative_settings(gamma)
  beam_search.check_beam_settings(alpha, max_decode_step, min_log_prob, max_decode_len)
  if min_log_prob != beam_search.DEFAULT_MIN_LOG_PROB:
    raise ValueError(f"speculative_beam_search takes only T5X's default min_log_prob "
                     f"({beam_search.DEFAULT_MIN_LOG_PROB}), got {min_log_prob!r}: T5X stops a "
                     f"whole batch once no row's best live beam passes it, and this loop's rows "
                     f"advance at their own pace (beam_search takes it)")
  for name, value in (("nodes_per_beam", nodes_per_beam), ("draft_beams", draft_beams)):
    if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
      raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")


def _log_softmax(logits: jax.Array) -> jax.Array:
  return jax.nn.log_softmax(logits.astype(jnp.float32))


def _widen(beams: BeamState, width: int) -> tuple[BeamState, jax.Array]:
  """The K live beams as a `width`-beam state (fillers scored NEG_INF after them, which no
  step selects while real candidates remain) and each beam's source among the K [B, width]."""
  batch_size, num_beams = beams.live_log_probs.shape
  extra = width - num_beams
  pad = lambda x, value: jnp.concatenate(
      [x, jnp.full((batch_size, extra) + x.shape[2:], value, x.dtype)], axis=1)
  source = jnp.broadcast_to(jnp.minimum(jnp.arange(width), num_beams - 1), (batch_size, width))
  wide = BeamState(
      index=beams.index, live_log_probs=pad(beams.live_log_probs, beam_search.NEG_INF),
      live_seqs=jnp.take_along_axis(beams.live_seqs, source[:, :, None], axis=1),
      finished_scores=pad(beams.finished_scores, beam_search.NEG_INF),
      finished_seqs=jnp.take_along_axis(beams.finished_seqs, source[:, :, None], axis=1),
      finished_flags=pad(beams.finished_flags, False))
  return wide, source


def _draft_tree(problem: beam_search.BeamProblem, draft_tokens_to_logits, *, gamma: int,
                width: int, beams: BeamState, root_log_probs: jax.Array, draft_cache: Any,
                active: jax.Array, budget: int) -> _Tree:
  """The draft's beam search of `width` beams, gamma steps from the K live beams (gamma - 1
  draft calls after the one that gave `root_log_probs` [B * K, V]) -> its tree."""
  batch_size, num_beams = beams.live_log_probs.shape
  beams, source = _widen(beams, width)

  def step(beams, log_probs):
    beams, parents = beam_search.beam_step(
        problem, beams, log_probs.reshape(batch_size, width, -1), active)
    tokens = jnp.take_along_axis(beams.live_seqs, beams.index[:, None, None], axis=2)[..., 0]
    return beams, (tokens, parents)

  def further_step(carry, _):
    beams, cache, (tokens, parents) = carry
    cache = beam_search.gather_cache(cache, parents)
    index = jnp.repeat(beams.index, width)
    logits, cache = draft_tokens_to_logits(contract.DecodingState(
        cur_index=index, cur_token=beam_search.flat(tokens)[:, None],
        sequences=beam_search.flat(beams.live_seqs), cache=cache))
    beams, new = step(beams, _log_softmax(logits[:, 0]))
    return (beams, cache, new), new

  wide_root_log_probs = jnp.take_along_axis(
      root_log_probs.reshape(batch_size, num_beams, -1), source[:, :, None], axis=1)
  beams, first = step(beams, wide_root_log_probs)
  cache = beam_search.gather_cache(draft_cache, source, source_beams=num_beams)
  _, rest = jax.lax.scan(further_step, (beams, cache, first), None, length=gamma - 1)
  tokens, parents = jax.tree_util.tree_map(
      lambda a, b: jnp.concatenate([a[None], b], axis=0), first, rest)  # [G, B, width]
  return _tree(tokens, parents, num_beams, budget)


def _tree(tokens: jax.Array, parents: jax.Array, num_roots: int, budget: int) -> _Tree:
  """The tree of draft beams `tokens`, `parents` [G, B, W] (parent: index among the previous
  step's W beams, among the K = `num_roots` roots for the first; a first-step parent past them
  is a filler, whose descendants are never scored), each root's first `budget` nodes to be
  scored."""
  gamma, batch_size, width = tokens.shape
  take = lambda x, i: jnp.take_along_axis(x, i.reshape(i.shape + (1,) * (x.ndim - 2)), axis=1)
  real = [parents[0] < num_roots]
  first_roots = jnp.minimum(parents[0], num_roots - 1)
  roots, parent_ids, ancestors = [first_roots], [first_roots], []
  own = jnp.eye(gamma * width, dtype=bool)
  ancestors.append(jnp.broadcast_to(own[:width], (batch_size, width, gamma * width)))
  for depth in range(1, gamma):
    roots.append(take(roots[-1], parents[depth]))
    real.append(take(real[-1], parents[depth]))
    parent_ids.append(num_roots + (depth - 1) * width + parents[depth])
    ancestors.append(own[depth * width:(depth + 1) * width][None]
                     | take(ancestors[-1], parents[depth]))
  join = lambda xs: jnp.concatenate(xs, axis=1)
  roots = join(roots)
  # Per beam r, its own nodes first in node order (so ancestors before descendants).
  order = jnp.argsort(roots[:, None, :] != jnp.arange(num_roots)[None, :, None], axis=2,
                      stable=True)
  slot_in_row = jnp.argsort(order, axis=2)  # [B, K, T]: node q's place in beam r's order
  slot = jnp.take_along_axis(slot_in_row, roots[:, None, :], axis=1)[:, 0]
  return _Tree(tokens=join(list(tokens)), parent_ids=join(parent_ids), roots=roots,
               ancestors=join(ancestors),
               depths=jnp.repeat(jnp.arange(1, gamma + 1), width),
               slots=order[:, :, :budget], slot=slot, scored=(slot < budget) & join(real))


def _tree_call(tokens_to_logits, gamma: int, beams: BeamState, num_pending: jax.Array,
               tree: _Tree, cache: Any) -> tuple[jax.Array, jax.Array, Any, int]:
  """The target's one call per beam on [pending chain, its slots of the tree] -> (root
  log-probs [N, V], log-probs [N, budget, V] of its slots, cache with the pending chains
  written, the number of target calls made: 1, or `_path_calls`' for a model that takes no
  tree call)."""
  num_beams = beams.live_log_probs.shape[1]
  repeat = lambda x: jnp.repeat(x, num_beams, axis=0)
  chain_length = gamma + 1
  slots = beam_search.flat(tree.slots)  # [N, budget]
  num_nodes = slots.shape[1]
  start = repeat(beams.index - num_pending + 1)
  chain_positions = start[:, None] + jnp.arange(chain_length)
  seqs = beam_search.flat(beams.live_seqs)
  positions = jnp.concatenate(
      [chain_positions, repeat(beams.index)[:, None] + tree.depths[slots]], axis=1)
  ancestors = jnp.take_along_axis(
      jnp.take_along_axis(repeat(tree.ancestors), slots[:, :, None], axis=1),
      slots[:, None, :], axis=2)
  pending = jnp.arange(chain_length)[None] < repeat(num_pending)[:, None]  # [N, G+1]
  chain_mask = jnp.broadcast_to(jnp.tril(jnp.ones((chain_length, chain_length), bool)),
                                (seqs.shape[0], chain_length, chain_length))
  mask = jnp.concatenate([
      jnp.concatenate([chain_mask, jnp.zeros(chain_mask.shape[:2] + (num_nodes,), bool)],
                      axis=2),
      jnp.concatenate([jnp.broadcast_to(pending[:, None], (seqs.shape[0], num_nodes,
                                                           chain_length)),
                       ancestors], axis=2)], axis=1)
  fed = jnp.concatenate([jnp.take_along_axis(seqs, chain_positions, axis=1),
                         jnp.take_along_axis(repeat(tree.tokens), slots, axis=1)], axis=1)
  state = contract.DecodingState(cur_index=start, cur_token=fed, sequences=seqs, cache=cache,
                                 token_positions=positions, token_mask=mask)
  last_pending = repeat(num_pending - 1)[:, None, None]
  if not contract.reads_fields(tokens_to_logits, state, ("token_positions", "token_mask")):
    return _path_calls(tokens_to_logits, gamma, beams, tree, state, last_pending)
  logits, cache = tokens_to_logits(state)
  root_log_probs = _log_softmax(jnp.take_along_axis(logits, last_pending, axis=1)[:, 0])
  return root_log_probs, _log_softmax(logits[:, chain_length:]), cache, 1


def _path_calls(tokens_to_logits, gamma: int, beams: BeamState, tree: _Tree,
                tree_state: contract.DecodingState, last_pending: jax.Array
                ) -> tuple[jax.Array, jax.Array, Any, int]:
  """`_tree_call`'s result from chain calls, for a model that takes no tree call: the pending
  chain of `tree_state` in one call (the root log-probs, the cache it writes), then each slot's
  path (its node's ancestors, one per depth, at positions i + 1..) in one call per slot, each
  on that cache (the positions it writes are stale past i)."""
  num_beams = beams.live_log_probs.shape[1]
  repeat = lambda x: jnp.repeat(x, num_beams, axis=0)
  seqs = tree_state.sequences
  logits, cache = tokens_to_logits(contract.DecodingState(
      cur_index=tree_state.cur_index, cur_token=tree_state.cur_token[:, :gamma + 1],
      sequences=seqs, cache=tree_state.cache))
  root_log_probs = _log_softmax(jnp.take_along_axis(logits, last_pending, axis=1)[:, 0])
  slots = beam_search.flat(tree.slots)  # [N, budget]
  node_logits = path_logits(tokens_to_logits, cur_index=repeat(beams.index) + 1, sequences=seqs,
                            cache=cache, tokens=repeat(tree.tokens),
                            ancestors=repeat(tree.ancestors), depths=tree.depths, slots=slots,
                            max_depth=gamma)
  return root_log_probs, _log_softmax(node_logits), cache, 1 + slots.shape[1]


def path_logits(tokens_to_logits: contract.TokensToLogits, *, cur_index: jax.Array,
                sequences: jax.Array, cache: Any, tokens: jax.Array, ancestors: jax.Array,
                depths: jax.Array, slots: jax.Array, max_depth: int) -> jax.Array:
  """The logits [N, S, V] of the tree nodes `slots [N, S]` from chain calls, one per slot, for
  a model that takes no tree call: each slot's path (its node's ancestors, one per depth, at
  positions cur_index..) fed on `cache`, which holds every position < cur_index (the positions
  the calls write are stale there). `tokens [N, T]` each node's token, `ancestors [N, T, T]`
  node q' is an ancestor of (or is) node q, `depths [T]` 1..`max_depth`."""
  at_depth = ancestors[jnp.arange(slots.shape[0])[:, None], slots][:, :, None, :] & (
      depths == jnp.arange(1, max_depth + 1)[:, None])[None, None]  # [N, S, D, T]
  paths = jnp.sum(jnp.where(at_depth, tokens[:, None, None, :], 0), axis=-1)

  def logits_of(path: jax.Array) -> jax.Array:
    return tokens_to_logits(contract.DecodingState(
        cur_index=cur_index, cur_token=path, sequences=sequences, cache=cache))[0]

  logits = jnp.moveaxis(jax.lax.map(logits_of, jnp.moveaxis(paths, 1, 0)), 0, 1)
  depth = depths[slots]  # a node's logits are those of its path's last token
  return jnp.take_along_axis(logits, (depth - 1)[:, :, None, None], axis=2)[:, :, 0]


def _coverage(tree: _Tree, parent_ids: jax.Array, tokens: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """For new beams extending `parent_ids` [B, K] by `tokens` [B, K]: whether each is a node
  of the tree that the target scored, and its id there."""
  num_beams = parent_ids.shape[1]
  match = ((tree.parent_ids[:, None, :] == parent_ids[:, :, None])
           & (tree.tokens[:, None, :] == tokens[:, :, None])
           & tree.scored[:, None, :])  # [B, K, T]
  return jnp.any(match, axis=2), num_beams + jnp.argmax(match, axis=2)


def _replay(problem: beam_search.BeamProblem, gamma: int, beams: BeamState, tree: _Tree,
            root_log_probs: jax.Array, node_log_probs: jax.Array, active: jax.Array
            ) -> tuple[BeamState, jax.Array, jax.Array]:
  """Beam-search steps from the target's log-probs for as long as they were computed ->
  (beams, steps taken [B], each new live beam's root [B, K])."""
  batch_size, num_beams = beams.live_log_probs.shape
  rows = jnp.arange(batch_size)[:, None]
  root_log_probs = root_log_probs.reshape(batch_size, num_beams, -1)
  node_log_probs = node_log_probs.reshape((batch_size, num_beams) + node_log_probs.shape[1:])

  def log_probs_of(ids):
    node = jnp.clip(ids - num_beams, 0)
    root = jnp.where(ids < num_beams, ids,
                     jnp.take_along_axis(tree.roots, node, axis=1))
    from_root = root_log_probs[rows, jnp.minimum(ids, num_beams - 1)]
    from_node = node_log_probs[rows, root, jnp.take_along_axis(tree.slot, node, axis=1)]
    return jnp.where((ids < num_beams)[..., None], from_root, from_node)

  def step(carry):
    beams, ids, roots, going, steps, depth = carry
    beams, parents = beam_search.beam_step(problem, beams, log_probs_of(ids), going)
    take = lambda x: jnp.take_along_axis(x, parents, axis=1)
    tokens = jnp.take_along_axis(beams.live_seqs, beams.index[:, None, None], axis=2)[..., 0]
    covered, new_ids = _coverage(tree, take(ids), tokens)
    steps = steps + going
    going = going & jnp.all(covered, axis=1) & beam_search.continues(problem, beams)
    return beams, new_ids, take(roots), going, steps, depth + 1

  identity = jnp.broadcast_to(jnp.arange(num_beams), (batch_size, num_beams))
  beams, _, roots, _, steps, _ = jax.lax.while_loop(
      lambda carry: jnp.any(carry[3]) & (carry[5] <= gamma), step,
      (beams, identity, identity, active, jnp.zeros((batch_size,), jnp.int32), 0))
  return beams, steps, roots


def _iteration(problem: beam_search.BeamProblem, tokens_to_logits, draft_tokens_to_logits,
               gamma: int, width: int, budget: int, state: _LoopState) -> _LoopState:
  beams = state.beams
  num_beams = beams.live_log_probs.shape[1]
  active = beam_search.continues(problem, beams)
  start = jnp.repeat(beams.index - state.num_pending + 1, num_beams)
  seqs = beam_search.flat(beams.live_seqs)
  chain_positions = start[:, None] + jnp.arange(gamma + 1)
  draft_logits, draft_cache = contract.logits_of_one(
      draft_tokens_to_logits, contract.DecodingState(
          cur_index=start, cur_token=jnp.take_along_axis(seqs, chain_positions, axis=1),
          sequences=seqs, cache=state.draft_cache),
      jnp.repeat(state.num_pending - 1, num_beams))
  draft_root = _log_softmax(draft_logits)
  tree = _draft_tree(problem, draft_tokens_to_logits, gamma=gamma, width=width, beams=beams,
                     root_log_probs=draft_root, draft_cache=draft_cache, active=active,
                     budget=budget)
  root_log_probs, node_log_probs, cache, num_calls = _tree_call(
      tokens_to_logits, gamma, beams, state.num_pending, tree, state.cache)
  beams, steps, roots = _replay(problem, gamma, beams, tree, root_log_probs, node_log_probs,
                                active)
  stats = state.stats
  count = active.astype(jnp.int32)
  past_depth = steps[:, None] > jnp.arange(1, gamma + 1)[None]
  stats = BeamSearchStats(
      target_calls=stats.target_calls + count * num_calls,
      draft_calls=stats.draft_calls + count * gamma,
      beam_steps=stats.beam_steps + steps,
      tree_nodes=stats.tree_nodes + count * budget,
      covered_past_depth=stats.covered_past_depth + past_depth)
  return _LoopState(beams, jnp.where(active, steps, state.num_pending),
                    beam_search.gather_cache(cache, roots),
                    beam_search.gather_cache(draft_cache, roots), stats)


@loops.register("speculative_beam_search", uses_draft=True,
                check_settings=check_speculative_beam_settings, baseline="beam_search",
                stats=BeamSearchStats)
def speculative_beam_search(inputs: jax.Array, cache: Any,
                            tokens_to_logits: contract.TokensToLogits, eos_id: int, *,
                            draft_cache: Any, draft_tokens_to_logits: contract.TokensToLogits,
                            gamma: int, decode_rng: jax.Array | None = None,
                            num_decodes: int = 4, alpha: float = 0.6,
                            max_decode_len: int | None = None, max_decode_step: int = -1,
                            nodes_per_beam: int | None = None,
                            draft_beams: int | None = None,
                            min_log_prob: float = beam_search.DEFAULT_MIN_LOG_PROB,
                            initial_index: jax.Array | None = None
                            ) -> tuple[jax.Array, jax.Array, BeamSearchStats]:
  """`beam_search.beam_search`'s output (num_decodes beams, brevity alpha, decode length
  max_decode_len, step cap max_decode_step), the draft proposing up to gamma steps per target call (see the module
  docstring). The draft's own
  search keeps `draft_beams` >= num_decodes beams (None: num_decodes), so its tree has
  draft_beams * gamma nodes; each beam's target call scores at most `nodes_per_beam` of them
  (None: all).

  Returns (decodes [B, num_decodes, L], scores [B, num_decodes], stats with [B, num_decodes]
  fields). `decode_rng` is unused, as in T5X.
  """
  del decode_rng
  check_speculative_beam_settings(gamma, alpha, max_decode_step, nodes_per_beam, draft_beams,
                                  min_log_prob, max_decode_len)
  inputs = beam_search.validate(inputs, eos_id, num_decodes, initial_index, max_decode_len)
  width = num_decodes if draft_beams is None else draft_beams
  if width < num_decodes:
    raise ValueError(f"draft_beams ({draft_beams}) must be at least the beam count "
                     f"num_decodes ({num_decodes}): the draft's tree must be able to hold them")
  budget = width * gamma if nodes_per_beam is None else min(nodes_per_beam, width * gamma)
  problem, beams = beam_search.init(inputs, num_decodes, eos_id, alpha, scratch=gamma + 1,
                                    max_decode_step=max_decode_step,
                                    initial_index=initial_index)
  batch_size = inputs.shape[0]
  cache, draft_cache = decode_rows.expand((cache, draft_cache), num_decodes)
  initial = _LoopState(beams, jnp.ones((batch_size,), jnp.int32), cache, draft_cache,
                       BeamSearchStats.zeros(batch_size, gamma))
  iteration = functools.partial(_iteration, problem, tokens_to_logits, draft_tokens_to_logits,
                                gamma, width, budget)
  final = jax.lax.while_loop(lambda s: jnp.any(beam_search.continues(problem, s.beams)),
                             iteration, initial)
  decodes, scores = beam_search.results(problem, final.beams)
  stats = jax.tree_util.tree_map(
      lambda x: jnp.broadcast_to(x[:, None], (batch_size, num_decodes) + x.shape[1:]),
      final.stats)
  return decodes, scores, stats
