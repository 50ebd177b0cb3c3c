"""Token trees against one chain of drafts: tokens per target call and wall time on the demo pair.

The shipped demo pair (spec_decode/assets/demo/) translates the first --sentences sentences of
Multi30k's test split (multi30k/test.en under --data_dir, see spec_decode.paths) one at a time
(batch 1, the paper's setting), with T5's task prefix, inputs and outputs of 64 tokens. At each
temperature (0: greedy, 1: sampled) it runs the target alone (`temperature_sample`), the chain
(`speculative_sample`, each of --gammas drafts per target call, the token rule), each tree of
--trees (`speculative_tree_sample`: --tree_rule when sampling, 'most_likely' when greedy) and
each tree chosen per row of --tree_widths (--widths_rule when sampling: 'deterministic', the
likeliest paths, or a rule that draws children at the likeliest paths' nodes).
Each decoder is compiled once and run once untimed, then every sentence is decoded by each
decoder in turn (interleaved, so load changes hit all alike). Printed per decoder: tokens per
target call (over all sentences: generated tokens / target calls, both printed), total wall
seconds, and the speedup over the target alone; greedy decodes are checked identical to the
target's.

--pair_gin takes the pair of a benchmark config instead (its `bench.PairConfig`, e.g. the
near-bigram T5.1.1-large pair of configs/bench/peer_t5_1_1_large.gin: random inputs, no EOS,
every output 64 tokens), --sentences of its random inputs.

--draft_source 'lookup' drafts by n-gram lookup alone (`core.make_draft`'s n-gram lengths): the
chain is the lookup's chain and each tree is --lookup_branches branches of --lookup_depth tokens
(--trees unused); 'lookup+model' adds the branches to each tree of the draft model and the
chain is the chain loop's combination (the lookup's token where it matches, else the model's).

  python scripts/tree_vs_chain.py --data_dir DATA [--sentences 50] [--gammas 4] \
      [--trees 4,2,1 2,2,1,1] [--tree_rule without_replacement] [--tree_widths 4,4,4,4] \
      [--widths_rule deterministic] \
      [--temperatures 0 1] \
      [--draft_source lookup --lookup_branches 2 4 8 --lookup_depth 4] \
      [--pair_gin configs/bench/peer_t5_1_1_large.gin]
"""

from __future__ import annotations

import argparse
import functools
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import bench
from spec_decode import core
from spec_decode import gin_utils
from spec_decode.bench import pairs
from spec_decode.checkpoints import demo_pair
from spec_decode.data import corpora
from spec_decode.engine import decoding
from spec_decode.engine import lookup
from spec_decode.engine import token_tree
from spec_decode.t5 import network
from spec_decode.t5 import vocab

LENGTH = 64


def encoded(sentences: list[str]) -> np.ndarray:
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  tokens = np.zeros((len(sentences), LENGTH), np.int32)
  for row, sentence in enumerate(sentences):
    ids = vocab.trim_with_eos(vocabulary.encode(corpora.TRANSLATE_PREFIX + sentence), LENGTH,
                              vocabulary.eos_id)
    tokens[row, :len(ids)] = ids
  return tokens


def decoder(loop, target, draft, draft_source="model", eos_id=vocab.EOS_ID, **settings):
  """decode(encoder tokens [1, L], rng) -> (decodes [1, L], generated tokens, target calls)."""
  (target_config, target_params), (draft_config, draft_params) = target, draft
  drafts = core.make_draft(draft_source, None if draft_source == "lookup"
                           else network.Transformer(draft_config))

  def draft_calls(draft_params, encoder_tokens):
    """(the draft's cache, its tokens_to_logits) for `drafts`."""
    if draft_source == "lookup":
      drafter = drafts.drafter(target_config.vocab_size)
      return drafter.init_cache(encoder_tokens), drafter.tokens_to_logits
    model_calls = (network.init_decode_cache(draft_config, draft_params, encoder_tokens, LENGTH),
                   network.make_tokens_to_logits(draft_config, draft_params))
    if draft_source == "model":
      return model_calls
    drafter = drafts.drafter(target_config.vocab_size)
    return (lookup.init_combined_cache(drafter, encoder_tokens, model_calls[0]),
            lookup.with_model(drafter, model_calls[1]))

  def decode(target_params, draft_params, encoder_tokens, rng):
    inputs = jnp.zeros((encoder_tokens.shape[0], LENGTH), jnp.int32)
    cache = network.init_decode_cache(target_config, target_params, encoder_tokens, LENGTH)
    tokens_to_logits = network.make_tokens_to_logits(target_config, target_params)
    if loop is decoding.temperature_sample:
      decodes, _ = loop(inputs, cache, tokens_to_logits, eos_id, decode_rng=rng,
                        **settings)
      generated = jnp.sum(decodes[:, 0] > 0)
      return decodes[:, 0], generated, generated
    draft_cache, draft_tokens_to_logits = draft_calls(draft_params, encoder_tokens)
    decodes, _, stats = loop(
        inputs, cache, tokens_to_logits, eos_id, decode_rng=rng, draft_cache=draft_cache,
        draft_tokens_to_logits=draft_tokens_to_logits, **settings)
    return decodes[:, 0], jnp.sum(stats.generated_tokens), jnp.sum(stats.target_calls)

  # The parameters are arguments, not constants folded into the program (GBs at real sizes).
  return functools.partial(jax.jit(decode), target_params, draft_params)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None,
                      help="the data root holding multi30k/ (default: $SPEC_DECODE_DATA_ROOT)")
  parser.add_argument("--sentences", type=int, default=50)
  parser.add_argument("--gammas", type=int, nargs="+", default=[4],
                      help="the chains: drafts per target call")
  parser.add_argument("--trees", nargs="+", default=["4,2,1"],
                      help="tree shapes: children per node at each depth, comma-separated")
  parser.add_argument("--tree_rule", default="without_replacement")
  parser.add_argument("--tree_widths", nargs="+", default=[],
                      help="trees chosen per row: nodes at each depth, comma-separated (rule "
                           "--widths_rule when sampling, 'most_likely' when greedy)")
  parser.add_argument("--widths_rule", default="deterministic",
                      help="the sampled rule of the trees chosen per row")
  parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
  parser.add_argument("--draft_source", choices=("model", "lookup", "lookup+model"),
                      default="model")
  parser.add_argument("--lookup_branches", type=int, nargs="+", default=[4],
                      help="lookup branches of each tree (draft_source lookup, lookup+model)")
  parser.add_argument("--lookup_depth", type=int, default=4)
  parser.add_argument("--pair_gin", default=None,
                      help="a benchmark config whose bench.PairConfig gives the pair instead")
  args = parser.parse_args()
  if args.pair_gin is None:
    sources, _ = corpora.read_parallel(["multi30k/test"], data_root=args.data_dir)
    encoder_tokens = encoded(sources[:args.sentences])
    target, draft = demo_pair.load_model("target"), demo_pair.load_model("draft")
    eos_id = vocab.EOS_ID
  else:
    gin_utils.parse_config([args.pair_gin], [])
    pair = pairs.build_pair(gin.get_configurable(bench.PairConfig)(
        num_random_inputs=args.sentences))
    if pair.decoder_only or pair.max_decode_len != LENGTH:
      raise ValueError(f"{args.pair_gin}: an encoder-decoder pair decoding {LENGTH} tokens is "
                       f"needed, got {pair.description}")
    encoder_tokens, eos_id = pair.inputs, pair.eos_id
    target, draft = ((model.config, model.params) for model in (pair.target, pair.draft))
  make = lambda loop, draft_source="model", **settings: decoder(
      loop, target, draft, draft_source, eos_id, **settings)
  for temperature in args.temperatures:
    greedy = temperature == 0.0
    decoders = {"target alone": make(decoding.temperature_sample, temperature=temperature)}
    for gamma in args.gammas:
      decoders[f"chain gamma {gamma}"] = make(decoding.speculative_sample, args.draft_source,
                                              gamma=gamma, temperature=temperature)
    rule = "most_likely" if greedy else args.tree_rule
    trees = [()] if args.draft_source == "lookup" else [
        tuple(int(b) for b in tree.split(",")) for tree in args.trees]
    for branching in trees:
      name = f"tree {','.join(map(str, branching))} {rule}"
      if args.draft_source != "lookup":
        decoders[name] = make(token_tree.speculative_tree_sample, tree_branching=branching,
                              tree_rule=rule, temperature=temperature)
      if args.draft_source == "model":
        continue
      for branches in args.lookup_branches:
        label = f"lookup {branches}x{args.lookup_depth}"
        decoders[f"{name} + {label}" if branching else f"tree {label}"] = (
            make(token_tree.speculative_tree_sample, args.draft_source, tree_branching=branching,
                 tree_rule=rule, lookup_branches=branches, lookup_depth=args.lookup_depth,
                 temperature=temperature))
    for widths in args.tree_widths:
      chosen_rule = "most_likely" if greedy else args.widths_rule
      decoders[f"tree widths {widths} {chosen_rule}"] = make(
          token_tree.speculative_tree_sample, args.draft_source, tree_branching=None,
          tree_widths=tuple(int(w) for w in widths.split(",")), tree_rule=chosen_rule,
          temperature=temperature)
    totals = {name: [0, 0, 0.0] for name in decoders}  # generated, target calls, seconds
    first = jnp.asarray(encoder_tokens[:1])
    for decode in decoders.values():
      jax.block_until_ready(decode(first, jax.random.PRNGKey(0)))  # compiled, run once
    for row in range(len(encoder_tokens)):
      tokens, rng = jnp.asarray(encoder_tokens[row:row + 1]), jax.random.PRNGKey(row)
      outputs = {}
      for name, decode in decoders.items():
        start = time.perf_counter()
        decodes, generated, calls = jax.block_until_ready(decode(tokens, rng))
        totals[name][2] += time.perf_counter() - start
        totals[name][0] += int(generated)
        totals[name][1] += int(calls)
        outputs[name] = np.asarray(decodes)
      if greedy:
        for name, decodes in outputs.items():
          assert np.array_equal(decodes, outputs["target alone"]), (name, row)
    baseline_seconds = totals["target alone"][2]
    print(f"temperature {temperature}, {len(encoder_tokens)} sentences, batch 1"
          + (" (greedy decodes identical to the target's)" if greedy else ""))
    for name, (generated, calls, seconds) in totals.items():
      print(f"  {name:44s} {generated / calls:6.3f} tokens/target call ({generated} / {calls})"
            f"  {seconds:7.2f} s  {baseline_seconds / seconds:5.2f}x")


if __name__ == "__main__":
  main()
