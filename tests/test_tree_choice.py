"""`tree_choice`: expected tokens per target call of a tree from positional acceptance, worked by
hand and checked against a simulated walk; the shapes within a node budget; the choice under a
platform's v(k); acceptance measured from greedy ranks by replaying the walk."""

import numpy as np
import pytest

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
  with pytest.raises(ValueError, match="target_costs gives widths"):
    tree_choice.rank_trees(acceptance, 3, 2, {1: 1.0, 4: 1.2})


def test_greedy_acceptance_replays_the_walk():
  # max_depth 2, ranks 0..1 drafted. Decode 1: ranks 0, 1 accepted, the third token is the
  # bonus; then 0 accepted at depth 0 and the decode ends. Decode 2: rank 3 rejected at the
  # root (its token drawn), then 0 accepted.
  acceptance = tree_choice.greedy_acceptance([np.array([0, 1, 5, 0]), np.array([3, 0])], 2, 2)
  np.testing.assert_allclose(acceptance, [[3 / 4, 0], [0, 1]])
