"""`tree_choice`: expected tokens per target call of a tree from positional acceptance, worked by
hand and checked against a simulated walk; the shapes within a node budget; the choice under a
platform's v(k); acceptance measured from greedy ranks by replaying the walk; Theorem 3.8's tree
analogue, its chain case the paper's; acceptance by rank from one alpha; compiled costs read
back; the calls of decodes of given lengths (the last cut), from positional acceptance and from
the ranks' chain, by hand and against simulated greedy decodes; a sampled decode's calls
following from its output's ranks under the rule 'deterministic'; drawn trees chosen per row by
hand, and the acceptance of drawn children of a hand-worked pair."""

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toy_setup
from spec_decode.bench import theory
from spec_decode.engine import token_tree
from spec_decode.engine import tree_choice


def test_expected_tokens_of_a_hand_worked_tree():
  # (2, 1): the root's two children accepted with 0.5 and 0.2, then the one grandchild with 0.6:
  # 0.7 of calls keep a depth-1 node, 0.7 * 0.6 = 0.42 a depth-2 one, then one token more.
  acceptance = np.array([[0.5, 0.2], [0.6, 0.1]])
  assert tree_choice.expected_tokens((2, 1), acceptance) == pytest.approx(1 + 0.7 + 0.42)
  # Depths past the table take its last row; ranks past it are never accepted.
  assert tree_choice.expected_tokens((1, 1, 1), np.array([[0.5]])) == pytest.approx(
      1 + 0.5 + 0.25 + 0.125)
  assert tree_choice.expected_tokens((4,), np.array([[0.5, 0.2]])) == pytest.approx(1.7)


def test_expected_tokens_match_a_simulated_walk():
  """The walk drawn node by node under the positional model, 200,000 times."""
  rng = np.random.default_rng(0)
  acceptance = np.array([[0.4, 0.2, 0.1], [0.5, 0.2, 0.0], [0.3, 0.3, 0.1]])
  branching = (3, 2, 2)
  draws = 200_000
  emitted = np.ones(draws)
  walking = np.ones(draws, bool)
  for depth, width in enumerate(branching):
    outcome = rng.random(draws)  # rank k accepted when it falls in its slice of [0, 1)
    accepted = outcome < np.sum(acceptance[depth, :width])
    walking &= accepted
    emitted += walking
  assert tree_choice.expected_tokens(branching, acceptance) == pytest.approx(
      emitted.mean(), abs=4 * emitted.std() / np.sqrt(draws))


def test_bad_acceptance_is_a_one_line_error():
  with pytest.raises(ValueError, match="acceptance must be"):
    tree_choice.expected_tokens((2,), np.array([[0.8, 0.4]]))


def test_shapes_within_a_budget():
  assert sorted(tree_choice.shapes_within(3, 2)) == [(1,), (1, 1), (1, 2), (2,), (3,)]
  for branching in tree_choice.shapes_within(12, 4):
    assert token_tree.TreeShape(branching).num_nodes <= 12


def test_call_widths():
  # (2, 2): the pending chain padded to 3, then 2 + 4 nodes; the draft: the chain, then the 2
  # depth-1 nodes.
  assert tree_choice.call_widths((2, 2)) == (9, [3, 2])


def test_the_choice_follows_the_platforms_costs():
  acceptance = np.array([[0.5, 0.3], [0.5, 0.3]])
  flat = {k: 1.0 for k in range(1, 40)}
  best = tree_choice.rank_trees(acceptance, 3, 2, flat)[0]
  # (1, 2): 1 + 0.5 (1 + 0.8) = 1.9 beats (2,) and (3,) (1.8) and (1, 1) (1.75).
  assert best.branching == (1, 2) and best.tokens_per_call == pytest.approx(1.9)
  linear = {k: float(k) for k in range(1, 40)}  # every fed token costs as much as a call
  assert tree_choice.rank_trees(acceptance, 3, 2, linear)[0].branching == (1,)
  with pytest.raises(ValueError, match="call costs give widths"):
    tree_choice.rank_trees(acceptance, 3, 2, {1: 1.0, 4: 1.2})


def test_greedy_acceptance_replays_the_walk():
  # max_depth 2, ranks 0..1 drafted. Decode 1: ranks 0, 1 accepted, the third token is the
  # bonus; then 0 accepted at depth 0 and the decode ends. Decode 2: rank 3 rejected at the
  # root (its token drawn), then 0 accepted.
  acceptance = tree_choice.greedy_acceptance([np.array([0, 1, 5, 0]), np.array([3, 0])], 2, 2)
  np.testing.assert_allclose(acceptance, [[3 / 4, 0], [0, 1]])


@pytest.mark.parametrize("alpha, gamma, c, v", [(0.75, 7, 0.01, 1.0), (0.4, 3, 0.3, 1.6),
                                                (0.9, 1, 0.05, 1.2)])
def test_a_chain_is_theorem_3_8(alpha, gamma, c, v):
  """One child per node, acceptance alpha, counted as the paper counts: gamma one-token draft
  calls and a target call of gamma + 1 tokens give the paper's speedup."""
  acceptance = np.full((gamma, 3), 0.0)
  acceptance[:, 0] = alpha
  predicted = tree_choice.predicted_speedup((1,) * gamma, acceptance,
                                            {1: 1.0, gamma + 1: v}, {1: c})
  assert predicted == pytest.approx(theory.predicted_speedup(alpha, gamma, c, v), rel=1e-6)
  # The same chain from the model of ranks: decay or not, the chain keeps rank 0's alpha.
  for decay in (0.0, 0.5, 1.0):
    assert tree_choice.predicted_speedup(
        (1,) * gamma, tree_choice.rank_acceptance(alpha, gamma, 4, decay),
        {1: 1.0, gamma + 1: v}, {1: c}) == pytest.approx(predicted, rel=1e-12)


def test_the_tree_speedup_of_a_hand_worked_tree():
  # (2, 1): 1 + 0.7 + 0.7 * 0.6 = 2.12 tokens per call. Counted as the paper counts, the draft
  # calls feed the root (1 token), then the 2 depth-1 nodes (2): 0.1 + 0.12; the target feeds the
  # root and the 4 nodes, 5 tokens: v(5) = 1 + (5 - 1) / (8 - 1) * 0.5, between v(1) and v(8).
  acceptance = np.array([[0.5, 0.2], [0.6, 0.1]])
  target_costs, draft_costs = {1: 1.0, 8: 1.5}, {1: 0.1, 2: 0.12, 4: 0.2}
  time = 0.1 + 0.12 + 1 + 4 / 7 * 0.5
  assert tree_choice.node_widths((2, 1)) == (5, [1, 2])
  assert tree_choice.predicted_speedup((2, 1), acceptance, target_costs,
                                       draft_costs) == pytest.approx(2.12 / time)
  # As speculative_tree_sample calls: the target feeds the pending chain padded to 3 and the 4
  # nodes (7), the draft the chain (3) then the 2 depth-1 nodes.
  loop = tree_choice.predict((2, 1), acceptance, target_costs, draft_costs=draft_costs)
  assert loop.relative_time == pytest.approx(1 + 6 / 7 * 0.5 + (0.12 + 0.5 * 0.08) + 0.12)
  with pytest.raises(ValueError, match="not both"):
    tree_choice.iteration_time((2, 1), target_costs, draft_cost=0.1, draft_costs=draft_costs)


def test_a_tree_beats_the_chain_only_where_siblings_are_accepted():
  flat = {k: 1.0 for k in (1, 64)}
  draft = {k: 0.02 for k in (1, 64)}
  geometric = tree_choice.rank_acceptance(0.6, 4, 4)
  chain = tree_choice.predicted_speedup((1, 1, 1, 1), geometric, flat, draft)
  assert tree_choice.predicted_speedup((2, 2, 1, 1), geometric, flat, draft) > chain
  first_only = tree_choice.rank_acceptance(0.6, 4, 4, decay=0.0)
  assert tree_choice.predicted_speedup((2, 2, 1, 1), first_only, flat, draft) == pytest.approx(
      chain)


def test_rank_acceptance_from_one_alpha():
  np.testing.assert_allclose(tree_choice.rank_acceptance(0.6, 2, 3),
                             [[0.6, 0.24, 0.096]] * 2)
  # decay 0.5: rank 1 tried with 0.3 after 0.4 of rank 0's rejections, rank 2 with 0.15.
  np.testing.assert_allclose(tree_choice.rank_acceptance(0.6, 1, 3, 0.5),
                             [[0.6, 0.4 * 0.3, 0.4 * 0.7 * 0.15]])
  with pytest.raises(ValueError, match="alpha and decay"):
    tree_choice.rank_acceptance(1.2, 2, 2)


def test_compiled_costs_read_back(tmp_path):
  call = lambda seconds: {"roofline_seconds": seconds}
  path = tmp_path / "costs.json"
  path.write_text(json.dumps({"platforms": {"v4-8": {"models": {
      "target": {"1": {"1": call(0.01), "8": call(0.012)}},
      "small": {"1": {"1": call(0.0004), "4": call(0.0005)}}}}}}))
  figures = tree_choice.load_call_costs(path)
  assert tree_choice.relative_costs(figures, "v4-8", "target", 1) == pytest.approx(
      {1: 1.0, 8: 1.2})
  assert tree_choice.relative_costs(figures, "v4-8", "small", 1) == pytest.approx(
      {1: 0.04, 4: 0.05})
  with pytest.raises(ValueError, match="no call costs for platform"):
    tree_choice.relative_costs(figures, "v5e-8", "target", 1)
  with pytest.raises(ValueError, match="at batch 8"):
    tree_choice.relative_costs(figures, "v4-8", "target", 8)


def test_accepted_depth_law_of_a_hand_worked_tree():
  # (2, 1) as above: 0.3 of iterations reject both of the root's children, 0.7 * 0.4 = 0.28 keep
  # one node and 0.7 * 0.6 = 0.42 two.
  acceptance = np.array([[0.5, 0.2], [0.6, 0.1]])
  np.testing.assert_allclose(tree_choice.accepted_depth_law((2, 1), acceptance),
                             [0.3, 0.28, 0.42])


def test_calls_of_decodes_of_a_given_length_by_hand():
  # The chain (1,) accepting half its drafts emits 1 or 2 tokens a call: one token takes a call;
  # two take 1, then one more call in the half that emitted 1: 1.5; three: 1 + (1.5 + 1) / 2.
  half = np.array([[0.5]])
  np.testing.assert_allclose(tree_choice.expected_calls((1,), half, [1, 2, 3]), [1, 1.5, 2.25])
  assert tree_choice.tokens_per_call((1,), half, [1, 2, 3]) == pytest.approx(6 / 4.75)
  # (2, 1): two tokens take one call, unless the root's children are both rejected (0.3).
  acceptance = np.array([[0.5, 0.2], [0.6, 0.1]])
  np.testing.assert_allclose(tree_choice.expected_calls((2, 1), acceptance, [2, 1]), [1.3, 1])
  # Long decodes lose a call's fraction only: tokens per call tend to 1 + E(0) = 1.5.
  assert tree_choice.tokens_per_call((1,), half, [30_000]) == pytest.approx(1.5, rel=1e-4)
  # Without lengths, every call counts whole, and the prediction is expected_tokens's.
  assert tree_choice.tokens_per_call((2, 1), acceptance) == pytest.approx(2.12)
  choice = tree_choice.predict((1,), half, {1: 1.0, 4: 1.0}, output_lengths=[1, 2, 3])
  assert choice.tokens_per_call == pytest.approx(6 / 4.75)
  assert choice.tokens_per_time == pytest.approx(6 / 4.75 / choice.relative_time)


# Rank classes 0 and 1 (1: rank 1 or more, never accepted); rows: after a rank 0, after a rank
# of 1 or more, and the first token.
TRANSITIONS = np.array([[0.8, 0.2], [0.4, 0.6], [0.5, 0.5]])


def test_rank_chain_calls_by_hand():
  chain = tree_choice.RankChain(TRANSITIONS)
  # (1,), three tokens: the first token accepted (0.5) leaves one token, one call; rejected
  # (0.5), two left after a rank >= 1: accepted (0.4) one call more, else (0.6) two.
  np.testing.assert_allclose(tree_choice.expected_calls((1,), chain, [1, 2, 3]),
                             [1, 1.5, 1 + 0.5 * 1 + 0.5 * (0.4 * 1 + 0.6 * 2)])
  # Children past the ranks counted are never accepted: (2,) is (1,) here.
  np.testing.assert_allclose(tree_choice.expected_calls((2,), chain, [1, 2, 3]),
                             [1, 1.5, 2.3])
  # (1, 1), three tokens: the first two accepted (0.5 * 0.8) end it in one call; the first
  # accepted, the second not (0.5 * 0.2): one token left, one call; the first rejected (0.5): two
  # tokens left after a rank >= 1, one call if its next is accepted (0.4), else two.
  assert tree_choice.expected_calls((1, 1), chain, [3])[0] == pytest.approx(
      1 + 0.5 * 0.2 * 1 + 0.5 * (0.4 * 1 + 0.6 * 2))
  with pytest.raises(ValueError, match="pass output_lengths"):
    tree_choice.tokens_per_call((1,), chain)
  with pytest.raises(ValueError, match="RankChain's transitions"):
    tree_choice.tokens_per_call((1,), tree_choice.RankChain(TRANSITIONS[:2]), [3])
  with pytest.raises(ValueError, match="output_lengths must be"):
    tree_choice.tokens_per_call((1,), chain, [3, 0])


def test_a_rank_chain_without_memory_is_positional_acceptance():
  law = np.array([0.6, 0.3, 0.1])  # every token's rank class, whatever came before
  chain = tree_choice.RankChain(np.tile(law, (4, 1)))
  lengths = [5, 9, 17, 1]
  for branching in [(1, 1, 1), (2, 1, 2), (3, 2)]:
    assert tree_choice.tokens_per_call(branching, chain, lengths) == pytest.approx(
        tree_choice.tokens_per_call(branching, np.array([law[:2]]), lengths), rel=1e-12)


def test_rank_chain_matches_simulated_greedy_decodes():
  """Rank sequences drawn from the chain, each decode walked as the greedy tree walks it (the
  node of rank k at depth d accepted when the token's rank is k < branching[d]), 12,000 times."""
  rng = np.random.default_rng(0)
  chain = tree_choice.RankChain(TRANSITIONS)
  branching, lengths = (2, 1, 1), [2, 7, 12]
  calls = {n: [] for n in lengths}
  for n in lengths:
    for _ in range(4000):
      ranks, previous = [], 2
      for _ in range(n):
        previous = int(rng.random() >= TRANSITIONS[previous, 0])  # 0, or 1 for rank >= 1
        ranks.append(previous)
      position, made = 0, 0
      while position < n:
        depth = 0
        while depth < len(branching) and position + depth < n and (
            ranks[position + depth] < min(branching[depth], 1)):
          depth += 1
        position += depth + 1
        made += 1
      calls[n].append(made)
  predicted = tree_choice.expected_calls(branching, chain, lengths)
  for n, expected in zip(lengths, predicted):
    assert expected == pytest.approx(np.mean(calls[n]),
                                     abs=4 * np.std(calls[n]) / np.sqrt(len(calls[n])) + 1e-9)


def test_greedy_rank_chain_counts_transitions():
  # Classes (max_rank 2): [0, 1, 2, 0] and [2, 0]. After none: 0 and 2; after 0: 1; after 1: 2;
  # after 2: 0 twice.
  chain = tree_choice.greedy_rank_chain([np.array([0, 1, 5, 0]), np.array([3, 0])], 2)
  np.testing.assert_allclose(chain.transitions, [[0, 1, 0], [0, 0, 1], [1, 0, 0], [0.5, 0, 0.5]])
  # Classes [0, 0, 2]: no token follows a 1 or a 2, whose rows take every token's law.
  chain = tree_choice.greedy_rank_chain([np.array([0, 0, 4])], 2)
  np.testing.assert_allclose(chain.transitions,
                             [[0.5, 0, 0.5], [2 / 3, 0, 1 / 3], [2 / 3, 0, 1 / 3], [1, 0, 0]])


def _replayed_calls(ranks: np.ndarray, branching: tuple[int, ...]) -> int:
  """The target calls of the walk that accepts the node of rank k at depth d when the output's
  next token is the draft's k-th likeliest and k < branching[d]."""
  position, calls = 0, 0
  while position < len(ranks):
    depth = 0
    while (depth < len(branching) and position + depth < len(ranks)
           and ranks[position + depth] < branching[depth]):
      depth += 1
    position, calls = position + depth + 1, calls + 1
  return calls


@pytest.mark.parametrize("rule, follows", [("deterministic", True),
                                           ("without_replacement", False)])
def test_sampled_calls_follow_the_outputs_ranks(rule, follows):
  """At temperature 1 the rule 'deterministic' accepts a node exactly when the token the walk
  emits there ranks among the draft's likeliest `branching[d]` (the module docstring of
  tree_choice): every decode's target calls are its own output's replay. Children drawn at
  random ('without_replacement') are not: some decode's calls differ."""
  target, draft = toy_setup.make_pair(5, "near", seed=1, eos_shift=-3.0)
  rows, length, branching = 500, 8, (2, 1, 1)
  inputs = jnp.zeros((rows, length), jnp.int32)
  decodes, _, stats = jax.jit(lambda rng: token_tree.speculative_tree_sample(
      inputs, target.init_cache(rows, length), target.tokens_to_logits, toy_setup.EOS,
      draft_cache=draft.init_cache(rows, length), draft_tokens_to_logits=draft.tokens_to_logits,
      tree_branching=branching, tree_rule=rule, decode_rng=rng, temperature=1.0))(
          jax.random.PRNGKey(0))
  outputs = np.asarray(decodes[:, 0])
  ranks = np.zeros(outputs.shape, np.int64)
  for t in range(length):  # the draft's logits after BOS and the output before t
    logits = np.asarray(draft.next_token_logits(np.pad(outputs[:, :t], ((0, 0), (1, 0)))))
    ranks[:, t] = np.sum(logits > np.take_along_axis(logits, outputs[:, t:t + 1], axis=1), axis=1)
  replayed = [_replayed_calls(row_ranks[:np.sum(row > 0)], branching)
              for row, row_ranks in zip(outputs, ranks)]
  assert np.mean(np.sum(outputs > 0, axis=1)) > 3  # decodes long enough to walk the depths
  assert np.array_equal(replayed, np.asarray(stats.target_calls).reshape(rows)) == follows


def test_replayed_tokens_per_call_by_hand():
  # (2, 1) over ranks [0, 1, 5, 0]: rank 0 accepted at depth 0, rank 1 rejected at depth 1 (one
  # child there): 2 tokens; rank 5 rejected at the root: 1; rank 0 accepted, then the end: 1.
  # Over [3, 0]: rank 3 rejected: 1 token; rank 0 accepted, the end: 1. 6 tokens, 5 calls.
  assert tree_choice.replayed_tokens_per_call([np.array([0, 1, 5, 0]), np.array([3, 0])],
                                              (2, 1)) == pytest.approx(6 / 5)
  assert tree_choice.replayed_tokens_per_call([np.array([0, 0, 0, 0])], (1, 1)) == 2


def test_a_drawn_tree_by_hand():
  """Widths (2, 3): the root's two drawn children (ranks 0 and 1), then the three paths of the
  least rank sums, the first child's first two children and the second child's first. Accepted
  at depth 1 with 0.5 + 0.2, at depth 2 with 0.5 (0.4 + 0.1) + 0.2 * 0.4."""
  acceptance = np.array([[0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])
  law = tree_choice.drawn_depth_law((2, 3), acceptance)
  np.testing.assert_allclose(law, [0.3, 0.7 - 0.33, 0.33])
  assert tree_choice.drawn_tokens_per_call((2, 3), acceptance) == pytest.approx(1 + 0.7 + 0.33)
  # A drawn chain is the chain of positional acceptance, whole and cut at given lengths.
  np.testing.assert_allclose(tree_choice.drawn_depth_law((1, 1, 1), acceptance),
                             tree_choice.accepted_depth_law((1, 1, 1), acceptance))
  assert tree_choice.drawn_tokens_per_call((1, 1, 1), acceptance, [3, 7]) == pytest.approx(
      tree_choice.tokens_per_call((1, 1, 1), acceptance, [3, 7]))


def test_the_best_static_tree_by_hand():
  """Acceptance 0.5, 0.2, 0.1 by rank at every depth, five nodes: reaches 0.5 (the root's first
  child), 0.25 (its first), 0.2 (the root's second), 0.125 (the first's first's first), then
  three of 0.1 (the first's second, the second's first, the root's third) of which path order
  takes the first's second. Accepted: 0.7 at depth 1, 0.35 at 2, 0.125 at 3."""
  acceptance = np.array([[0.5, 0.2, 0.1]])
  counts = tree_choice.best_static_tree(acceptance, 5)
  assert counts == ((2,), (2, 0), (1, 0))
  law = tree_choice.static_depth_law(counts, acceptance)
  np.testing.assert_allclose(law, [0.3, 0.35, 0.225, 0.125])
  assert tree_choice.law_tokens_per_call(law) == pytest.approx(1 + 0.7 + 0.35 + 0.125)
  # One node per depth where only first children are ever accepted: the chain.
  assert tree_choice.best_static_tree(np.array([[0.9, 0.0]]), 4) == ((1,), (1,), (1,), (1,))
  with pytest.raises(ValueError, match=r"child_counts\[1\] has 1 counts for the 2 nodes"):
    tree_choice.static_depth_law(((2,), (1,)), acceptance)


def test_no_drawn_tree_of_a_budget_beats_the_best_static_tree():
  """Against every drawn tree of at most 8 nodes (widths of each depth up to 4), under
  acceptance falling with the rank, every call whole."""
  acceptance = np.array([[0.55, 0.2, 0.08, 0.04], [0.45, 0.2, 0.1, 0.05]])
  best = tree_choice.static_depth_law(tree_choice.best_static_tree(acceptance, 8), acceptance)
  widths = [w for depth in range(1, 9) for w in itertools.product(range(1, 5), repeat=depth)
            if sum(w) <= 8]
  drawn = [tree_choice.drawn_depth_law(w, acceptance) for w in widths]
  assert max(tree_choice.law_tokens_per_call(law) for law in drawn) <= (
      tree_choice.law_tokens_per_call(best) + 1e-12)


def test_drawn_acceptance_of_a_hand_worked_pair():
  """Target [1, 0], draft [0.5, 0.5], two children drawn without replacement: the first is id 0
  (accepted) or id 1 (rejected) with 0.5 each, and after id 1 the second is id 0, accepted from
  the residual [1, 0]: 0.5 and 0.5 by rank. A draft equal to the target: the first child always.
  """
  target = jnp.asarray([[1.0, 0.0]])
  uniforms = jax.random.uniform(jax.random.PRNGKey(0), (1, 4000, 2))
  found = tree_choice.drawn_acceptance(target, jnp.asarray([[0.5, 0.5]]), "without_replacement",
                                       uniforms)
  np.testing.assert_allclose(found[0], [0.5, 0.5], atol=0.03)
  same = tree_choice.drawn_acceptance(target, target, "without_replacement", uniforms)
  np.testing.assert_allclose(same[0], [1.0, 0.0])
