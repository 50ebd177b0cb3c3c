"""`speculative_tree_sample` samples the target's law exactly, and decodes what the target alone
decodes where nothing is random.

Exactness: test_exactness's toy pair (VOCAB 5, LENGTH 4), its enumerated law over complete outputs
and its chi-square test at its floor, 100,000 sequences per law, for every sampling rule of
`tree_rules` at temperature 1 and with top-k and top-p, and one temperature per example given as
data; the same test must reject deliberately wrong rules (the negative controls: a residual never
updated, a rejection resampled from the target, children drawn without replacement verified as if
with it) and a wrong tree mask (nodes that see the other nodes of their depth), which the greedy
test must catch too. Greedy: the same decodes and scores as `temperature_sample` at temperature
0, on the toy models and on a tiny T5 at batch > 1 (rows finishing at different steps, prompts
prefilled), also for a target that takes no tree call (chain calls, one per path). Bad settings
(a tree deeper than the decode among them): one ValueError line each.
"""

import dataclasses
import functools
import json

import flax.struct
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_exactness
import tiers
import tiny_t5
import toy_setup
from spec_decode import core
from spec_decode import infer
from spec_decode.checkpoints import t5x_format
from spec_decode.infer import outputs as infer_outputs
from spec_decode.engine import decoding
from spec_decode.engine import loops
from spec_decode.engine import lookup as engine_lookup
from spec_decode.engine import toy
from spec_decode.engine import token_tree
from spec_decode.engine import tree_rules
from spec_decode.engine import tree_shape
from spec_decode.t5 import network
from test_exactness import LENGTH, NUM_SAMPLES, P_VALUE_FLOOR, VOCAB
from toy_setup import EOS

# Every registered rule exact at any temperature ('multi_round', 'without_replacement').
SAMPLING_RULES = tuple(name for name, rule in sorted(tree_rules.RULES.items())
                       if not rule.greedy_only)
# (draft, branching, (temperature, topk, topp)): each compiles the loop once.
CASES = {
    "temperature_1": ("near", (3, 2), (1.0, 0, 0.0)),
    "top_k_2": ("near", (2, 2), (1.0, 2, 0.0)),
    "top_p_0.8": ("far", (2, 1, 1), (1.0, 0, 0.8)),
    "far_draft": ("far", (3, 2), (1.0, 0, 0.0)),
}


@dataclasses.dataclass(frozen=True)
class Chosen:
  """A tree chosen per row: `widths[d - 1]` nodes at depth d (`tree_widths`)."""
  widths: tuple[int, ...]


def _tree_settings(tree):
  """The loop's shape settings for `tree`: children per depth (a tuple), or `Chosen`."""
  if isinstance(tree, Chosen):
    return {"tree_branching": None, "tree_widths": tree.widths}
  return {"tree_branching": tree}


# (draft, widths, (temperature, topk, topp)): trees chosen per row, under 'deterministic' (the
# likeliest paths) and every sampling rule (children drawn).
CHOSEN_CASES = {
    "chosen_temperature_1": ("near", Chosen((3, 3)), (1.0, 0, 0.0)),
    "chosen_top_k_2": ("near", Chosen((2, 3)), (1.0, 2, 0.0)),
    "chosen_top_p_0.8": ("far", Chosen((3, 2, 2)), (1.0, 0, 0.8)),
    "chosen_far_draft": ("far", Chosen((4, 4)), (1.0, 0, 0.0)),
}


@functools.partial(jax.jit, static_argnames=("branching", "rule", "sampling_args"))
def _tree(target, draft, inputs, rng, branching, rule, sampling_args=(1.0, 0, 0.0),
          initial_index=None, target_cache=None, draft_cache=None):
  """`branching`: children per depth, or `Chosen`."""
  temperature, topk, topp = sampling_args
  return token_tree.speculative_tree_sample(
      inputs, target.init_cache(*inputs.shape) if target_cache is None else target_cache,
      target.tokens_to_logits, EOS,
      draft_cache=draft.init_cache(*inputs.shape) if draft_cache is None else draft_cache,
      draft_tokens_to_logits=draft.tokens_to_logits, tree_rule=rule, decode_rng=rng,
      temperature=temperature, topk=topk, topp=topp, initial_index=initial_index,
      **_tree_settings(branching))


def _draw(case, rule, seed=0):
  draft_kind, branching, sampling_args = {**CASES, **CHOSEN_CASES}[case]
  target, draft = toy_setup.make_pair(VOCAB, draft_kind, seed=1)
  decodes, _, stats = _tree(target, draft, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                            jax.random.PRNGKey(seed), branching, rule, sampling_args)
  law = test_exactness.exact_law(target, sampling_args)
  return np.asarray(decodes[:, 0]), law, stats


@pytest.mark.slow
@pytest.mark.parametrize("case,rule", tiers.newest_among(
    [(case, rule) for case in CASES for rule in SAMPLING_RULES],
    [("temperature_1", "without_replacement")]))
def test_sequences_follow_the_target_law(case, rule):
  decodes, law, stats = _draw(case, rule)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value > P_VALUE_FLOOR, f"{case}/{rule}: p = {p_value:.2e}"
  # The tree was used: some iterations accepted a drafted node.
  assert int(np.sum(stats.accepted_tokens)) > 0.1 * NUM_SAMPLES


@pytest.mark.slow
@pytest.mark.parametrize("case,rule", tiers.newest_among(
    [(case, rule) for case in CHOSEN_CASES for rule in SAMPLING_RULES],
    [("chosen_top_p_0.8", "deterministic"), ("chosen_temperature_1", "without_replacement")]))
def test_trees_chosen_per_row_follow_the_target_law(case, rule):
  """'deterministic': the draft's likeliest paths as the tree, verified as deterministic
  children; a sampling rule: children drawn, each node's count by the child ranks along its
  path."""
  decodes, law, stats = _draw(case, rule)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value > P_VALUE_FLOOR, f"{case}/{rule}: p = {p_value:.2e}"
  assert int(np.sum(stats.accepted_tokens)) > 0.1 * NUM_SAMPLES


def _walk_taking_other_parents_children(target_probs, children, present):
  """A node's candidates verified as its children whatever their parent."""
  return tree_rules.deterministic_walk(target_probs, children, jnp.ones_like(present))


def test_drawn_children_go_where_the_walk_is_likely_to_be():
  """Widths (3, 5, 3): the root's three children have rank sums 0, 1, 2; of depth 2's
  candidates (node j's child k: sum j + k) the five least are sums 0, 1, 1, 2, 2 with equal sums
  in node order, then rank order: node 0's first three (0, 1, 2) and node 1's first two (1, 2),
  not node 2's first (2, after them). Depth 3 over those paths' sums (0, 1, 2, 1, 2): node 0's
  first (0), then the sums of 1 in node order, node 0's second and node 1's first."""
  assert tree_shape.drawn_child_counts((3, 5, 3)) == ((3,), (3, 2, 0), (2, 1, 0, 0, 0))
  shape = token_tree.TreeShape((), row_widths=(3, 5, 3), drawn=True)
  np.testing.assert_array_equal(shape.parents(2), [0, 0, 0, 1, 1])
  assert shape.tries == (3, 3, 2)
  # Nodes 1 and 0 of depth 2 draw (3 each); nodes 0 and 1 of depth 3 (2 each).
  assert shape.draws_per_depth == (3, 6, 4)
  # Depth 2's node 3 is node 1's first child; depth 3's node 2 is depth 2's node 1's first,
  # which is the root's first's second (nodes numbered depth by depth: 3, then 5, then 3).
  ancestors = shape.ancestors()
  np.testing.assert_array_equal(np.flatnonzero(ancestors[3 + 3]), [1, 3 + 3])
  np.testing.assert_array_equal(np.flatnonzero(ancestors[8 + 2]), [0, 3 + 1, 8 + 2])


def _drawn_then_ranked(draft_probs, draft_logits, uniforms):
  """Children drawn without replacement, then tried likeliest first (their order chosen by
  what was drawn)."""
  children = tree_rules.draw_without_replacement(draft_probs, draft_logits, uniforms)
  order = jnp.argsort(-jnp.take_along_axis(draft_probs, children, axis=-1), axis=-1)
  return jnp.take_along_axis(children, order, axis=-1)


def _among_taking_absent_children(target_probs, draft_probs, children, present):
  """Every slot the walk tries at a node taken as its child: past a node's own children, the
  slots of a depth's widest node hold other nodes' children (or its own last again)."""
  return tree_rules.without_replacement_among(target_probs, draft_probs, children,
                                              jnp.ones_like(present))


DRAWN_WRONG_RULES = {
    "drawn_then_ranked": tree_rules.TreeRule(
        "drawn_then_ranked", _drawn_then_ranked, tree_rules.without_replacement,
        verify_among=tree_rules.without_replacement_among),
    "absent_children_taken": tree_rules.TreeRule(
        "absent_children_taken", tree_rules.draw_without_replacement,
        tree_rules.without_replacement, verify_among=_among_taking_absent_children),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DRAWN_WRONG_RULES))
def test_wrong_walks_of_drawn_chosen_trees_fail(name):
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=1)
  decodes, _, _ = _tree(target, draft, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                        jax.random.PRNGKey(0), Chosen((3, 3)), DRAWN_WRONG_RULES[name])
  p_value = test_exactness.chi_square_p_value(
      np.asarray(decodes[:, 0]), test_exactness.exact_law(target, (1.0, 0, 0.0)))
  assert p_value < P_VALUE_FLOOR, f"{name} was not caught: p = {p_value:.2e}"


@pytest.mark.slow
def test_a_chosen_tree_walked_through_other_parents_children_fails():
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=1)
  wrong = tree_rules.TreeRule("other_parents", tree_rules.draw_top, tree_rules.deterministic,
                              verify_fixed=_walk_taking_other_parents_children)
  decodes, _, _ = _tree(target, draft, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                        jax.random.PRNGKey(0), Chosen((3, 3)), wrong)
  p_value = test_exactness.chi_square_p_value(
      np.asarray(decodes[:, 0]), test_exactness.exact_law(target, (1.0, 0, 0.0)))
  assert p_value < P_VALUE_FLOOR, f"other parents' children were not caught: p = {p_value:.2e}"


@pytest.mark.slow
def test_per_example_temperatures_follow_each_examples_law():
  """Temperatures given as data, one per example (T5X's decoder_params), alternating: each row
  follows the law at its own temperature."""
  temperatures = np.tile(test_exactness.PER_EXAMPLE, NUM_SAMPLES)
  target, draft = toy_setup.make_pair(VOCAB, "near", seed=1)
  decodes, _, _ = _tree_with_data(target, draft, jnp.zeros((len(temperatures), LENGTH), jnp.int32),
                                  jax.random.PRNGKey(0), jnp.asarray(temperatures, jnp.float32))
  for i, temperature in enumerate(test_exactness.PER_EXAMPLE):
    p_value = test_exactness.chi_square_p_value(
        np.asarray(decodes[i::2, 0]), test_exactness.exact_law(target, (temperature, 0, 0.0)))
    assert p_value > P_VALUE_FLOOR, f"temperature {temperature}: p = {p_value:.2e}"


@jax.jit
def _tree_with_data(target, draft, inputs, rng, temperature):
  return token_tree.speculative_tree_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      draft_cache=draft.init_cache(*inputs.shape), draft_tokens_to_logits=draft.tokens_to_logits,
      tree_branching=(3, 2), tree_rule="without_replacement", decode_rng=rng,
      temperature=temperature)


def _never_update_the_residual(target_probs, draft_probs, children):
  """Every child tried against p itself, and p again after all are rejected."""
  p_x = jnp.take_along_axis(target_probs, children, axis=-1)
  q_x = jnp.take_along_axis(draft_probs, children, axis=-1)
  return jnp.minimum(1.0, p_x / q_x), target_probs


def _resample_from_the_target(target_probs, draft_probs, children):
  accept, _ = tree_rules.multi_round(target_probs, draft_probs, children)
  return accept, target_probs


def _verify_as_with_replacement(target_probs, draft_probs, children):
  return tree_rules.multi_round(target_probs, draft_probs, children)


WRONG_RULES = {
    "residual_never_updated": tree_rules.TreeRule(
        "residual_never_updated", tree_rules.draw_with_replacement, _never_update_the_residual),
    "resampled_from_the_target": tree_rules.TreeRule(
        "resampled_from_the_target", tree_rules.draw_with_replacement,
        _resample_from_the_target),
    "rejected_kept_in_q": tree_rules.TreeRule(
        "rejected_kept_in_q", tree_rules.draw_without_replacement, _verify_as_with_replacement),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", tiers.newest_among(sorted(WRONG_RULES), ["rejected_kept_in_q"]))
def test_negative_controls_fail(name):
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=1)
  decodes, _, _ = _tree(target, draft, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                        jax.random.PRNGKey(0), (3, 2), WRONG_RULES[name])
  p_value = test_exactness.chi_square_p_value(
      np.asarray(decodes[:, 0]), test_exactness.exact_law(target, (1.0, 0, 0.0)))
  assert p_value < P_VALUE_FLOOR, f"{name} was not caught: p = {p_value:.2e}"


@flax.struct.dataclass
class _SiblingsSeeEachOther:
  """A target whose tree call is given a mask that also lets each node see the nodes of its
  depth (its siblings and cousins): the toy model then continues the first of them instead of
  the node's parent, so every node but the first of its depth is scored after a wrong path."""
  model: toy.PrefixHashModel
  num_nodes: int = flax.struct.field(pytree_node=False)

  def init_cache(self, *shape):
    return self.model.init_cache(*shape)

  def tokens_to_logits(self, state):
    nodes = state.token_positions[:, -self.num_nodes:]  # the tree call feeds the nodes last
    same_depth = nodes[:, :, None] == nodes[:, None, :]
    mask = state.token_mask.at[:, -self.num_nodes:, -self.num_nodes:].set(
        state.token_mask[:, -self.num_nodes:, -self.num_nodes:] | same_depth)
    return self.model.tokens_to_logits(dataclasses.replace(state, token_mask=mask))


@pytest.mark.slow
def test_a_mask_that_lets_siblings_see_each_other_fails():
  """The mask is the loop's to get right: the exact-law test catches a target call whose nodes
  see the other nodes of their depth (a negative control: its p-value is no check of an exact
  decoder)."""
  target, draft = toy_setup.make_pair(VOCAB, "far", seed=1)
  branching = (3, 2)
  wrong = _SiblingsSeeEachOther(target, token_tree.TreeShape(branching).num_nodes)
  decodes, _, _ = _tree(wrong, draft, jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32),
                        jax.random.PRNGKey(0), branching, "multi_round")
  p_value = test_exactness.chi_square_p_value(
      np.asarray(decodes[:, 0]), test_exactness.exact_law(target, (1.0, 0, 0.0)))
  assert p_value < P_VALUE_FLOOR, f"siblings seeing each other was not caught: p = {p_value:.2e}"


GREEDY = (0.0, 0, 0.0)
TOY_VOCAB, TOY_LENGTH = 24, 9


def test_greedy_decodes_differ_where_siblings_see_each_other():
  """The greedy identity test has the power to catch the same wrong mask."""
  target, draft = toy_setup.make_pair(TOY_VOCAB, "near", seed=2)
  inputs = jnp.asarray(toy_setup.random_prompts(np.random.default_rng(0), 16, TOY_LENGTH,
                                                TOY_VOCAB, 3))
  want = jax.jit(lambda inputs: decoding.temperature_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      temperature=0.0))(inputs)
  branching = (3, 2)
  wrong = _SiblingsSeeEachOther(target, token_tree.TreeShape(branching).num_nodes)
  decodes, _, _ = _tree(wrong, draft, inputs, jax.random.PRNGKey(0), branching, "most_likely",
                        GREEDY)
  assert np.any(np.asarray(decodes) != np.asarray(want[0]))


def _first_form(tokens_to_logits):
  """A model that never reads the tree fields: the loop gives it chain calls, one per path."""
  return lambda state: tokens_to_logits(decoding.DecodingState(
      state.cur_index, state.cur_token, state.sequences, state.cache))


@flax.struct.dataclass
class _FirstForm:
  model: toy.PrefixHashModel

  def init_cache(self, *shape):
    return self.model.init_cache(*shape)

  @property
  def tokens_to_logits(self):
    return _first_form(self.model.tokens_to_logits)


def _check_greedy(got, want, lengths_differ=True):
  (decodes, scores, stats), (want_decodes, want_scores) = got, want
  np.testing.assert_array_equal(decodes, want_decodes)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
  lengths = np.sum(np.asarray(want_decodes)[:, 0] > 0, axis=1)
  if lengths_differ:
    assert len(set(lengths.tolist())) > 1  # rows finished at different steps
  iterations = np.asarray(stats.accepted_depths)[:, 0].sum(axis=1)
  generated = np.asarray(stats.generated_tokens)[:, 0]
  accepted = np.asarray(stats.accepted_tokens)[:, 0]
  # Each iteration commits its accepted path, then one token (the last cut at EOS or the limit).
  assert np.all((iterations <= generated) & (generated <= accepted + iterations))
  assert np.any(accepted > 0)
  return iterations


@pytest.mark.parametrize("rule,branching", [("most_likely", (3, 2)), ("most_likely", (2, 1, 1)),
                                            ("multi_round", (2, 2)),
                                            ("most_likely", Chosen((3, 3))),
                                            ("deterministic", Chosen((2, 3, 2))),
                                            ("without_replacement", Chosen((3, 2)))])
def test_greedy_decodes_are_the_targets_on_toy_models(rule, branching):
  """Forced prompts and prefilled ones, drafts agreeing often and always, EOS shifts that
  finish rows early and late, and a target taking chain calls only."""
  rng = np.random.default_rng(0)
  for draft_kind, eos_shift, prefill in (("near", 1.0, False), ("same", -2.0, True),
                                         ("near", -2.0, True)):
    target, draft = toy_setup.make_pair(TOY_VOCAB, draft_kind, seed=2, eos_shift=eos_shift)
    inputs = toy_setup.random_prompts(rng, 5, TOY_LENGTH, TOY_VOCAB, 3)
    target_cache = draft_cache = initial_index = None
    if prefill:
      target_cache, initial_index = toy_setup.prefilled(target, inputs)
      draft_cache, _ = toy_setup.prefilled(draft, inputs)
    want = jax.jit(lambda inputs, cache, initial_index: decoding.temperature_sample(
        inputs, cache, target.tokens_to_logits, EOS, temperature=0.0,
        initial_index=initial_index))(
            jnp.asarray(inputs), target.init_cache(*inputs.shape) if target_cache is None
            else target_cache, initial_index)
    got = _tree(target, draft, jnp.asarray(inputs), jax.random.PRNGKey(0), branching, rule,
                GREEDY, initial_index, target_cache, draft_cache)
    iterations = _check_greedy(got, want, lengths_differ=eos_shift > 0)
    if draft_kind == "same" and rule == "most_likely":  # every node the target's: whole paths
      np.testing.assert_array_equal(np.asarray(got[2].accepted_depths)[:, 0, :-1].sum(), 0)
    if not prefill:
      chain_only = _tree(_FirstForm(target), draft, jnp.asarray(inputs), jax.random.PRNGKey(0),
                         branching, rule, GREEDY)
      _check_greedy(chain_only, want)
      shape = (token_tree.TreeShape((), row_widths=branching.widths)
               if isinstance(branching, Chosen) else token_tree.TreeShape(branching))
      num_nodes = shape.num_nodes
      np.testing.assert_array_equal(chain_only[2].target_calls,
                                    (1 + num_nodes) * iterations[:, None])
      np.testing.assert_array_equal(got[2].target_calls, iterations[:, None])
      # The draft: the pending chain, then one tree call per depth but the last.
      np.testing.assert_array_equal(got[2].draft_calls,
                                    shape.model_depth * iterations[:, None])
      np.testing.assert_array_equal(got[2].tree_nodes, num_nodes * iterations[:, None])


def _tiny_t5(vocab_size, emb_dim, layers, seed):
  config = network.T5Config(vocab_size=vocab_size, emb_dim=emb_dim, num_heads=2, head_dim=8,
                            mlp_dim=2 * emb_dim, num_encoder_layers=layers,
                            num_decoder_layers=layers, mlp_activations=("gelu", "linear"),
                            dropout_rate=0.0)
  return config, t5x_format.random_params(config, seed)


@functools.partial(jax.jit, static_argnames=("target_config", "draft_config", "max_len",
                                             "chain_only", "tree"))
def _t5_decodes(target_params, draft_params, encoder_tokens, target_config, draft_config,
                max_len, chain_only=False, tree=(3, 2)):
  inputs = jnp.zeros((encoder_tokens.shape[0], max_len), jnp.int32)
  cache = network.init_decode_cache(target_config, target_params, encoder_tokens, max_len)
  target = network.make_tokens_to_logits(target_config, target_params)
  want = decoding.temperature_sample(inputs, cache, target, EOS, temperature=0.0)
  got = token_tree.speculative_tree_sample(
      inputs, cache, _first_form(target) if chain_only else target, EOS,
      draft_cache=network.init_decode_cache(draft_config, draft_params, encoder_tokens, max_len),
      draft_tokens_to_logits=network.make_tokens_to_logits(draft_config, draft_params),
      tree_rule="most_likely", temperature=0.0, **_tree_settings(tree))
  return want, got


def test_greedy_decodes_are_the_targets_on_t5():
  """A tiny T5 target at batch 5 (a padded row): with its own draft (every path accepted
  whole) taking tree calls, and with a smaller draft taking chain calls only."""
  target_config, target_params = _tiny_t5(32, 32, 2, 0)
  draft_config, draft_params = _tiny_t5(32, 16, 1, 1)
  encoder_tokens = jnp.asarray(np.random.default_rng(0).integers(2, 32, (5, 7)), jnp.int32)
  encoder_tokens = encoder_tokens.at[3, 4:].set(0)
  for (config, params), chain_only, tree in (
      ((target_config, target_params), False, (3, 2)),
      ((draft_config, draft_params), True, (3, 2)),
      ((draft_config, draft_params), False, Chosen((4, 4, 2)))):
    want, got = _t5_decodes(target_params, params, encoder_tokens, target_config, config, 12,
                            chain_only, tree)
    _check_greedy(got, want, lengths_differ=False)
    assert np.asarray(want[0]).any()


@pytest.mark.parametrize("settings,message", [
    ({"tree_branching": ()}, "tree_branching must be a non-empty sequence of integers >= 1"),
    ({"tree_branching": (2, 0)}, "tree_branching must be a non-empty sequence of integers >= 1"),
    ({"tree_branching": 4}, "tree_branching must be a non-empty sequence of integers >= 1"),
    ({"tree_branching": (2.0, 1)}, "tree_branching must be a non-empty sequence of integers"),
    ({"tree_branching": [[2], [1]]}, "tree_branching must be a non-empty sequence of integers"),
    ({"tree_branching": "42"}, "tree_branching must be a non-empty sequence of integers >= 1"),
    ({"tree_rule": "coin"}, "tree_rule must be one of"),
    ({"tree_rule": "most_likely", "temperature": 1.0},
     "tree_rule 'most_likely' is exact only at a greedy temperature"),
    ({"topk": 2, "topp": 0.5}, "at most one of topk"),
    ({"logit_callback_fn": lambda logits, state: logits},
     "decode loop 'speculative_tree_sample' takes no setting 'logit_callback_fn'"),
    ({"gamma": 4}, "decode loop 'speculative_tree_sample' takes no setting 'gamma'"),
    ({"lookup_branches": -1}, "lookup_branches must be an integer >= 0"),
    ({"lookup_branches": 2.0}, "lookup_branches must be an integer >= 0"),
    ({"lookup_branches": 2}, "lookup_depth must be an integer >= 1"),
    ({"lookup_branches": 2, "lookup_depth": 0}, "lookup_depth must be an integer >= 1"),
    ({"lookup_depth": 3}, "lookup_depth 3 is set but lookup_branches is 0"),
    ({"tree_branching": (), "lookup_depth": 3}, "lookup_depth 3 is set but lookup_branches is 0"),
    ({"tree_branching": (4, 2, 1), "tree_widths": (4, 4)},
     r"tree_branching \(4, 2, 1\) and tree_widths \(4, 4\) are both set"),
    ({"tree_branching": None, "tree_widths": ()}, "tree_widths must be a non-empty sequence"),
    ({"tree_branching": None, "tree_widths": (4, 0)}, "tree_widths must be a non-empty sequence"),
    ({"tree_branching": None, "tree_widths": 4}, "tree_widths must be a non-empty sequence"),
    ({"tree_branching": None, "tree_widths": (4, 4), "tree_rule": tree_rules.TreeRule(
        "chain_rule", tree_rules.draw_with_replacement, tree_rules.multi_round)},
     "tree_rule 'chain_rule' has no verification of a tree chosen per row"),
])
def test_bad_settings_are_one_line_errors(settings, message):
  loop = loops.get("speculative_tree_sample")
  with pytest.raises(ValueError, match=message) as error:
    loop.check(settings)
  assert "\n" not in str(error.value)
  target, draft = toy_setup.make_pair(VOCAB, "near")
  if "logit_callback_fn" not in settings and "gamma" not in settings:
    with pytest.raises(ValueError, match=message):  # the function itself, before tracing
      token_tree.speculative_tree_sample(
          jnp.zeros((2, LENGTH), jnp.int32), target.init_cache(2, LENGTH),
          target.tokens_to_logits, EOS, draft_cache=draft.init_cache(2, LENGTH),
          draft_tokens_to_logits=draft.tokens_to_logits, **settings)


def test_a_tree_deeper_than_the_decode_is_a_one_line_error():
  """A decode of LENGTH tokens keeps at most LENGTH nodes of a path; the loop says so before it
  traces anything (a tree exactly that deep is run)."""
  target, draft = toy_setup.make_pair(VOCAB, "near")
  run = lambda branching: token_tree.speculative_tree_sample(
      jnp.zeros((2, LENGTH), jnp.int32), target.init_cache(2, LENGTH), target.tokens_to_logits,
      EOS, draft_cache=draft.init_cache(2, LENGTH), draft_tokens_to_logits=draft.tokens_to_logits,
      tree_branching=branching, tree_rule="most_likely", temperature=0.0)
  with pytest.raises(ValueError, match=rf"tree_branching \(2, 1, 1, 1, 1\) is 5 deep, deeper "
                     rf"than the {LENGTH} tokens a decode holds") as error:
    run((2, 1, 1, 1, 1))
  assert "\n" not in str(error.value)
  want = decoding.temperature_sample(jnp.zeros((2, LENGTH), jnp.int32),
                                     target.init_cache(2, LENGTH), target.tokens_to_logits, EOS,
                                     temperature=0.0)
  np.testing.assert_array_equal(run((2,) + (1,) * (LENGTH - 1))[0], want[0])


def test_a_chosen_tree_too_wide_or_too_deep_is_a_one_line_error():
  target, draft = toy_setup.make_pair(VOCAB, "near")
  with pytest.raises(ValueError, match=rf"tree_widths asks for {VOCAB + 1} nodes at a depth "
                     rf"whose 1 parents have only {VOCAB} children") as error:
    jax.eval_shape(lambda: token_tree.speculative_tree_sample(
        jnp.zeros((2, LENGTH), jnp.int32), target.init_cache(2, LENGTH),
        target.tokens_to_logits, EOS, draft_cache=draft.init_cache(2, LENGTH),
        draft_tokens_to_logits=draft.tokens_to_logits, tree_branching=None,
        tree_widths=(VOCAB + 1,), tree_rule="deterministic"))
  assert "\n" not in str(error.value)
  with pytest.raises(ValueError, match=rf"tree_widths \(1, 1, 1, 1, 1\) is 5 deep, deeper than "
                     rf"the {LENGTH} tokens a decode holds"):
    token_tree.speculative_tree_sample(
        jnp.zeros((2, LENGTH), jnp.int32), target.init_cache(2, LENGTH),
        target.tokens_to_logits, EOS, draft_cache=draft.init_cache(2, LENGTH),
        draft_tokens_to_logits=draft.tokens_to_logits, tree_branching=None,
        tree_widths=(1,) * (LENGTH + 1), tree_rule="deterministic")


def test_lookup_branches_with_the_wrong_draft_are_one_line_errors():
  """Lookup branches without a lookup draft, a model's tree without a model, a model without
  a tree, and lookup branches deeper than the decode: refused before anything is traced."""
  target, draft = toy_setup.make_pair(VOCAB, "near")
  drafter = engine_lookup.NGramLookup(VOCAB)
  source = jnp.full((2, 3), 2, jnp.int32)
  alone = (drafter.init_cache(source), drafter.tokens_to_logits)
  combined = (engine_lookup.init_combined_cache(drafter, source, draft.init_cache(2, LENGTH)),
              engine_lookup.with_model(drafter, draft.tokens_to_logits))
  for (draft_cache, draft_tokens_to_logits), settings, message in (
      ((draft.init_cache(2, LENGTH), draft.tokens_to_logits), dict(tree_branching=(2,)),
       "lookup_branches 2 needs an n-gram lookup draft"),
      (alone, dict(tree_branching=(2,)),
       r"a lookup draft alone has no model to expand tree_branching \(2,\)"),
      (combined, dict(tree_branching=()),
       r"tree_branching \(\) leaves the draft model of 'lookup\+model' unused"),
      (alone, dict(tree_branching=(), lookup_depth=LENGTH + 1),
       rf"lookup_depth {LENGTH + 1} is {LENGTH + 1} deep, deeper than the {LENGTH} tokens")):
    with pytest.raises(ValueError, match=message) as error:
      jax.eval_shape(lambda: token_tree.speculative_tree_sample(
          jnp.zeros((2, LENGTH), jnp.int32), target.init_cache(2, LENGTH),
          target.tokens_to_logits, EOS, draft_cache=draft_cache,
          draft_tokens_to_logits=draft_tokens_to_logits,
          **{"lookup_branches": 2, "lookup_depth": 2, "tree_rule": "most_likely",
             "temperature": 0.0, **settings}))
    assert "\n" not in str(error.value)


def test_a_decoder_is_built_with_its_settings():
  config, _ = _tiny_t5(32, 16, 1, 0)
  decoder = core.Decoder.create("speculative_tree_sample", network.Transformer(config),
                                network.Transformer(config), tree_branching=[2, 2],
                                tree_rule="without_replacement")
  assert decoder.resolved_settings()["tree_branching"] == (2, 2)
  with pytest.raises(ValueError, match="tree_rule must be one of"):
    core.Decoder.create("speculative_tree_sample", network.Transformer(config),
                        network.Transformer(config), tree_rule="beam")


def test_infer_runs_the_tree_config(tmp_path, capsys):
  """configs/decoding/speculative_tree.gin through `spec_decode.infer` on a tiny pair, greedy:
  the baseline's outputs, the loop's settings and counters in the summary."""
  target, draft = tiny_t5.write_pair(tmp_path, vocab_size=8000)
  run_gin = tiny_t5.write_run_gin(
      tmp_path / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE, 0,
      {"inputs": 16, "targets": 8}, batch_size=2, extra="""
include 'configs/decoding/speculative_tree.gin'
TREE_BRANCHING = (2, 2)
TREE_RULE = 'most_likely'
""")
  out = tmp_path / "out"
  try:
    status = infer.main([f"--gin_file={run_gin}", "--text=A dog runs.", "--text=Two cats sleep.",
                         f"--gin.INFER_OUTPUT_DIR='{out}'"])
  finally:
    gin.clear_config()
  printed = capsys.readouterr()
  assert status == 0, printed.err
  summary = json.loads((out / infer_outputs.SUMMARY_FILE).read_text())
  assert (f"{summary['tokens_per_target_call']:.2f} tokens per target call (tree (2, 2), "
          f"{summary['accepted_per_iteration']:.2f} nodes accepted per call)") in printed.out
  assert summary["decode_loop"] == "speculative_tree_sample"
  assert summary["decode_settings"]["tree_branching"] == [2, 2]
  assert summary["decode_settings"]["tree_rule"] == "most_likely"
  assert summary["identical_outputs"] is True
  iterations = sum(summary["accepted_depths"])
  assert summary["target_calls"] == iterations > 0
  assert summary["tokens_per_target_call"] == pytest.approx(
      summary["generated_tokens"] / summary["target_calls"])


def test_a_gamma_given_to_the_tree_loop_is_a_one_line_error(tmp_path, capsys):
  target, draft = tiny_t5.write_pair(tmp_path, vocab_size=8000)
  run_gin = tiny_t5.write_run_gin(
      tmp_path / "run.gin", target, draft, tiny_t5.DEMO_VOCAB_FILE, 0,
      {"inputs": 16, "targets": 8}, batch_size=2,
      extra="include 'configs/decoding/speculative_tree.gin'\nGAMMA = 4\n")
  status, stderr = tiny_t5.run_infer_main(
      [f"--gin_file={run_gin}", "--text=Hello", f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'out'}'"],
      capsys)
  assert status == 2 and len(stderr) == 1, stderr
  assert "decode loop 'speculative_tree_sample' takes no setting 'gamma'" in stderr[0]


def test_greedy_decodes_are_the_targets_on_a_decoder_only_model():
  """Through `core.Decoder.predict`, a decoder-only target continuing prompts of different
  lengths (prefilled, each row starting at its own position), its own draft and a smaller
  one: the target's greedy continuations."""
  config = network.DecoderOnlyConfig(vocab_size=23, emb_dim=12, num_heads=2, num_layers=2,
                                     head_dim=5, mlp_dim=16, mlp_activations=("gelu", "linear"),
                                     dropout_rate=0.0)
  draft_config = dataclasses.replace(config, num_layers=1, emb_dim=8)
  tokens = jnp.ones((1, 12), jnp.int32)
  init = lambda c, seed: network.module_of(c).init(jax.random.PRNGKey(seed), tokens,
                                                    tokens)["params"]
  params, draft_params = init(config, 0), init(draft_config, 1)
  prompt = np.zeros((3, 12), np.int32)
  causal = np.zeros_like(prompt)
  for row, length in enumerate((3, 1, 5)):
    prompt[row, 1:1 + length] = np.arange(5, 5 + length)
    causal[row, :1 + length] = 1
  batch = {"decoder_input_tokens": prompt, "decoder_causal_attention": causal}
  module = network.DecoderOnlyTransformer(config)
  want, _ = core.Decoder.create("temperature_sample", module, temperature=0.0).predict(
      params, None, batch, eos_id=EOS)
  for draft, draft_weights in ((module, params),
                               (network.DecoderOnlyTransformer(draft_config), draft_params)):
    for tree in ((2, 2), Chosen((3, 3))):
      decoder = core.Decoder.create("speculative_tree_sample", module, draft, temperature=0.0,
                                    tree_rule="most_likely", **_tree_settings(tree))
      got, aux = decoder.predict(params, draft_weights, batch, eos_id=EOS)
      np.testing.assert_array_equal(got, want)
      assert np.asarray(want).any() and np.sum(aux["accepted_tokens"]) > 0


# --------------------------------------------------------------------------- lookup branches

# (drafter, branching, rule, (temperature, topk, topp)): n-gram lookup branches (3 of depth 2)
# alone, and beside a model's tree under every sampling rule. test_exactness's lookup sources:
# half the rows copy from a random source, half from their own output only, so rows with
# different numbers of matches (none, one, several) share every batch.
LOOKUP_CASES = {
    "lookup_temperature_1": ("lookup", (), "deterministic", (1.0, 0, 0.0)),
    "lookup_top_p_0.8": ("lookup", (), "deterministic", (1.0, 0, 0.8)),
    **{f"lookup+near_{rule}": ("lookup+near", (2, 1), rule, (1.0, 0, 0.0))
       for rule in SAMPLING_RULES},
    "lookup+near_chosen": ("lookup+near", Chosen((2, 2)), "deterministic", (1.0, 0, 0.0)),
    "lookup+near_chosen_drawn": ("lookup+near", Chosen((2, 2)), "without_replacement",
                                 (1.0, 0, 0.0)),
}
LOOKUP_BRANCHES, LOOKUP_DEPTH = 3, 2


@functools.partial(jax.jit, static_argnames=("drafter", "branching", "rule", "sampling_args",
                                             "lookup_walk"))
def _lookup_tree(target, draft, source, inputs, rng, drafter, branching, rule, sampling_args,
                 lookup_walk=None):
  """The tree loop with lookup branches over `source [B, Le]`, the lookup alone (`draft`
  None) or beside `draft`'s tree; `lookup_walk` replaces `tree_rules.deterministic_walk` (a
  negative control)."""
  temperature, topk, topp = sampling_args
  draft_cache, draft_tokens_to_logits = toy_setup.lookup_draft(draft, drafter, source, inputs)
  run = lambda: token_tree.speculative_tree_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      draft_cache=draft_cache, draft_tokens_to_logits=draft_tokens_to_logits, tree_rule=rule,
      lookup_branches=LOOKUP_BRANCHES, lookup_depth=LOOKUP_DEPTH, decode_rng=rng,
      temperature=temperature, topk=topk, topp=topp, **_tree_settings(branching))
  if lookup_walk is None:
    return run()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tree_rules, "deterministic_walk", lookup_walk)
    return run()


def _draw_lookup(case, seed=0, lookup_walk=None):
  drafter_kind, branching, rule, sampling_args = LOOKUP_CASES[case]
  target, near = toy_setup.make_pair(VOCAB, "near", seed=1)
  drafter = engine_lookup.NGramLookup(VOCAB, max_ngram=3, min_ngram=1)
  decodes, _, stats = _lookup_tree(
      target, near if drafter_kind == "lookup+near" else None,
      jnp.asarray(test_exactness.lookup_sources(NUM_SAMPLES)),
      jnp.zeros((NUM_SAMPLES, LENGTH), jnp.int32), jax.random.PRNGKey(seed), drafter,
      branching, rule, sampling_args, lookup_walk)
  return np.asarray(decodes[:, 0]), test_exactness.exact_law(target, sampling_args), stats


@pytest.mark.slow
@pytest.mark.parametrize("case", tiers.newest_among(LOOKUP_CASES, ["lookup+near_deterministic"]))
def test_lookup_branches_follow_the_target_law(case):
  decodes, law, stats = _draw_lookup(case)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value > P_VALUE_FLOOR, f"{case}: p = {p_value:.2e}"
  lookup_accepted = np.asarray(stats.lookup_accepted_tokens)[:, 0]
  accepted = np.asarray(stats.accepted_tokens)[:, 0]
  assert lookup_accepted.sum() > 0.04 * NUM_SAMPLES  # the branches were weighed and kept
  assert np.all(lookup_accepted <= accepted)
  if LOOKUP_CASES[case][0] == "lookup":
    np.testing.assert_array_equal(lookup_accepted, accepted)
    np.testing.assert_array_equal(stats.draft_calls, 0)  # no model: no draft call
  else:
    assert np.sum(accepted - lookup_accepted) > 0.05 * NUM_SAMPLES  # the model's tree too
  # Rows copying from a source keep more lookup nodes than rows matching their output only.
  assert lookup_accepted[::2].mean() > lookup_accepted[1::2].mean()


_EXACT_LOOKUP_WALK = tree_rules.deterministic_walk  # what the wrong walks below are made from


def _walk_resampling_from_the_target(target_probs, children, present):
  """A listed child accepted with p(x), but a rejection leaves the law as it was: the next
  token comes from p again, which a rejected child still has mass in."""
  accept, _ = _EXACT_LOOKUP_WALK(target_probs, children, present)
  return accept, target_probs


def _walk_taking_absent_children(target_probs, children, present):
  """Absent branches taken for proposals (of id 2, a word, in place of their filler 0)."""
  del present
  return _EXACT_LOOKUP_WALK(target_probs, jnp.maximum(children, 2),
                            jnp.ones(children.shape, bool))


@pytest.mark.slow
@pytest.mark.parametrize("lookup_walk", [_walk_resampling_from_the_target,
                                         _walk_taking_absent_children])
def test_negative_controls_of_the_lookup_branches_fail(lookup_walk):
  """The exact-law test catches a walk of the lookup's branches that keeps a rejected
  child's mass, and one that takes absent branches for proposals."""
  decodes, law, _ = _draw_lookup("lookup_temperature_1", lookup_walk=lookup_walk)
  p_value = test_exactness.chi_square_p_value(decodes, law)
  assert p_value < P_VALUE_FLOOR, f"{lookup_walk.__name__} was not caught: p = {p_value:.2e}"


def test_a_node_of_deterministic_children_emits_the_target_law():
  """Children x0, x1 (distinct, listed), x1 repeated and one absent: x0 is accepted with p(x0),
  x1 with p(x1) / (1 - p(x0)), the repeat and the absent never, and the residual is p without
  x0 and x1, renormalized: the emitted token is distributed as p."""
  p = jnp.asarray([0.0, 0.1, 0.2, 0.3, 0.4])
  accept, residual = tree_rules.deterministic_walk(
      p, jnp.asarray([3, 4, 4, 2]), jnp.asarray([True, True, True, False]))
  np.testing.assert_allclose(accept, [0.3, 0.4 / 0.7, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(residual, [0.0, 1 / 3, 2 / 3, 0.0, 0.0], rtol=1e-6)
  reject = np.cumprod(1 - np.asarray(accept))
  emitted = np.asarray(residual) * reject[-1]
  emitted[3] += accept[0]
  emitted[4] += reject[0] * accept[1]
  np.testing.assert_allclose(emitted, p, atol=1e-6)


def test_lookup_branches_are_every_earlier_match_one_per_first_token():
  """Hand-made rows: matches in the source (stopped by its padding) and in the output (copied
  on past the row's end, the repeat's period), one branch per distinct first token, the
  longest match first, absent branches where a row has fewer matches."""
  source = jnp.asarray([[5, 6, 7, 5, 6, 9, 0, 0],   # "5 6" continues with 7 and 9
                        [8, 8, 8, 8, 8, 8, 8, 8],   # no match
                        [3, 4, 0, 0, 0, 0, 0, 0]])  # "4" ends the source: nothing follows
  sequences = jnp.asarray([[0, 6, 3, 5, 6, 0],      # suffix "5 6" at index 4, "6" at 1
                           [0, 2, 3, 0, 0, 0],      # suffix "3": nothing earlier
                           [0, 4, 2, 4, 0, 0]])     # "4" at 1, then "2 4": period 2
  tokens, present = engine_lookup.branches(
      source, sequences, jnp.asarray([4, 2, 3]), num_branches=3, depth=4, max_ngram=3,
      min_ngram=1)
  np.testing.assert_array_equal(present, [
      [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]],
      [[0, 0, 0, 0]] * 3,
      [[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]])
  # Two source matches of "5 6" (the input's first, longest, first), then the output's "6".
  np.testing.assert_array_equal(tokens[0], [[7, 5, 6, 9], [9, 0, 0, 0], [3, 5, 6, 3]])
  np.testing.assert_array_equal(tokens[2], [[2, 4, 2, 4], [0] * 4, [0] * 4])


@pytest.mark.parametrize("drafter_kind,branching,rule", [
    ("lookup", (), "most_likely"), ("lookup+near", (2, 1), "most_likely"),
    ("lookup+near", (2, 1), "deterministic"), ("lookup+near", Chosen((2, 2)), "most_likely")])
def test_greedy_lookup_trees_decode_the_targets(drafter_kind, branching, rule):
  """Rows copying the target's own greedy output (the lookup's branches accepted whole), a
  shuffled copy, random words and nothing, with forced prompts: `temperature_sample`'s
  decodes and scores."""
  target, near = toy_setup.make_pair(TOY_VOCAB, "near", seed=2, eos_shift=-2.0)
  rng = np.random.default_rng(1)
  inputs = jnp.asarray(toy_setup.random_prompts(rng, 8, TOY_LENGTH, TOY_VOCAB, 2))
  want = jax.jit(lambda inputs: decoding.temperature_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      temperature=0.0))(inputs)
  source = np.array(want[0][:, 0])
  source[2::4] = rng.permuted(source[2::4], axis=1)
  source[1::4] = rng.integers(2, TOY_VOCAB, source[1::4].shape)
  source[3::4] = 0
  drafter = engine_lookup.NGramLookup(TOY_VOCAB, max_ngram=3, min_ngram=1)
  got = _lookup_tree(target, near if drafter_kind == "lookup+near" else None,
                     jnp.asarray(source), inputs, jax.random.PRNGKey(0), drafter, branching,
                     rule, GREEDY)
  _check_greedy(got, want, lengths_differ=False)
  lookup_accepted = np.asarray(got[2].lookup_accepted_tokens)[:, 0]
  assert lookup_accepted[::4].sum() > lookup_accepted[3::4].sum()  # copies are taken


def test_greedy_lookup_trees_through_the_decoder_on_t5():
  """`core.Decoder` with draft_source 'lookup' and 'lookup+model' (a smaller T5) on a tiny T5
  target at batch 4: the target's greedy decodes."""
  target_config, target_params = _tiny_t5(32, 32, 2, 0)
  draft_config, draft_params = _tiny_t5(32, 16, 1, 1)
  encoder_tokens = np.random.default_rng(0).integers(2, 32, (4, 7)).astype(np.int32)
  encoder_tokens[3, 4:] = 0
  batch = {"encoder_input_tokens": encoder_tokens,
           "decoder_input_tokens": np.zeros((4, 12), np.int32)}
  target = network.Transformer(target_config)
  want, _ = core.Decoder.create("temperature_sample", target, temperature=0.0).predict(
      target_params, None, batch, eos_id=EOS)
  for source, model, weights, branching in (
      ("lookup", None, None, ()),
      ("lookup+model", network.Transformer(draft_config), draft_params, (2, 1))):
    decoder = core.Decoder.create(
        "speculative_tree_sample", target, core.make_draft(source, model), temperature=0.0,
        tree_branching=branching, tree_rule="most_likely", lookup_branches=3, lookup_depth=3)
    got, aux = decoder.predict(target_params, weights, batch, eos_id=EOS)
    np.testing.assert_array_equal(got, want)
    assert np.sum(aux["lookup_accepted_tokens"]) > 0, source
