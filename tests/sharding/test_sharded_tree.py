"""The token-tree loop (`speculative_tree_sample`) sharded on 8 simulated CPU devices.

On test_sharded_decoding's problem (a small random T5 pair, a batch with padded inputs and
forced prompts), the tree loop partitioned by `decode_layout` (target and draft, the lookup's
cache pinned with them) gives exactly the tokens and counters (scores to float rounding) of
the same decode on one device, greedy and sampled with the same rng: a model's tree on two
meshes, n-gram lookup branches beside it ('lookup+model') on a third (greedy: the random
target repeats itself, which the lookup's branches copy), and trees chosen per row (sampled, the
likeliest paths and children drawn at them; their rows' parents data the mesh splits like the
rest).
"""

import functools

import jax
import numpy as np
import pytest

from spec_decode.engine import lookup
from spec_decode.engine import token_tree
from spec_decode.runtime import partitioning
from spec_decode.t5 import network
from test_sharded_decoding import DRAFT, EOS, MODES, RNG, TARGET
from test_sharded_decoding import _partition_decoders, _problem

TREES = {  # name: (draft_source, settings per mode)
    "model": ("model", {"greedy": dict(tree_branching=(2, 2), tree_rule="most_likely"),
                        "sampled": dict(tree_branching=(2, 2), tree_rule="without_replacement")}),
    "lookup+model": ("lookup+model", {
        mode: dict(tree_branching=(2, 1), tree_rule=rule, lookup_branches=2, lookup_depth=2)
        for mode, rule in (("greedy", "most_likely"), ("sampled", "deterministic"))}),
    "chosen": ("model", {"sampled": dict(tree_widths=(3, 3), tree_rule="deterministic")}),
    "chosen_drawn": ("model", {"sampled": dict(tree_widths=(3, 3),
                                               tree_rule="without_replacement")}),
}
CASES = [("model", (1, 8), "sampled"), ("model", (2, 4), "greedy"),
         ("lookup+model", (4, 2), "greedy"), ("chosen", (2, 4), "sampled"),
         ("chosen_drawn", (4, 2), "sampled")]
LOOKUP_MIN_NGRAM = 1
LOOKUP = lookup.NGramLookup(TARGET.vocab_size, max_ngram=4, min_ngram=LOOKUP_MIN_NGRAM)


@functools.partial(jax.jit, static_argnames=("tree", "mode"))
def _single_device(params, draft_params, encoder_input_tokens, decoder_inputs, rng, tree, mode):
  """The reference: the engine and the network on one device, without the partitioning module."""
  length = decoder_inputs.shape[1]
  draft_cache = network.init_decode_cache(DRAFT, draft_params, encoder_input_tokens, length)
  draft_tokens_to_logits = network.make_tokens_to_logits(DRAFT, draft_params)
  if tree == "lookup+model":
    draft_cache = lookup.init_combined_cache(LOOKUP, encoder_input_tokens, draft_cache)
    draft_tokens_to_logits = lookup.with_model(LOOKUP, draft_tokens_to_logits)
  return token_tree.speculative_tree_sample(
      decoder_inputs, network.init_decode_cache(TARGET, params, encoder_input_tokens, length),
      network.make_tokens_to_logits(TARGET, params), EOS, draft_cache=draft_cache,
      draft_tokens_to_logits=draft_tokens_to_logits, decode_rng=rng, **MODES[mode],
      **TREES[tree][1][mode])


@pytest.mark.parametrize("tree,mesh_shape,mode", CASES, ids=str)
def test_the_tree_loop_matches_one_device(tree, mesh_shape, mode):
  params, draft_params, encoder_input_tokens, decoder_inputs = _problem()
  draft_source, settings = TREES[tree]
  decoders = _partition_decoders(partitioning.PjitPartitioner(mesh_shape=mesh_shape),
                                 loop="speculative_tree_sample", draft_source=draft_source,
                                 lookup_min_ngram=LOOKUP_MIN_NGRAM, **MODES[mode],
                                 **settings[mode])
  placed = jax.device_put(params, decoders.params_shardings)
  placed_draft = jax.device_put(draft_params, decoders.draft_params_shardings)
  got = jax.device_get(decoders.speculative(placed, placed_draft, encoder_input_tokens,
                                            decoder_inputs, RNG))
  want = jax.device_get(_single_device(params, draft_params, encoder_input_tokens,
                                       decoder_inputs, RNG, tree, mode))
  np.testing.assert_array_equal(got[0], want[0])  # tokens
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)  # log-probabilities
  for name in want[2].counter_names():
    np.testing.assert_array_equal(got[2][name], getattr(want[2], name), err_msg=name)
  # Not trivial: nodes were accepted (the lookup's too) and some rejected.
  accepted, generated = want[2].accepted_tokens, want[2].generated_tokens
  assert 0 < accepted.sum() < generated.sum()
  if tree == "lookup+model":
    assert want[2].lookup_accepted_tokens.sum() > 0
