"""Token trees against one chain of drafts: tokens per target call and wall time on the demo pair.

The shipped demo pair (spec_decode/assets/demo/) translates the first --sentences sentences of
Multi30k's test split (multi30k/test.en under --data_dir, see spec_decode.paths) one at a time (batch 1, the
paper's setting), with T5's task prefix, inputs and outputs of 64 tokens. At each temperature
(0: greedy, 1: sampled) it runs the target alone (`temperature_sample`), the chain
(`speculative_sample`, --gamma drafts per target call, the token rule) and each tree of
--trees (`speculative_tree_sample`: --tree_rule when sampling, 'most_likely' when greedy).
Each decoder is compiled once and run once untimed, then every sentence is decoded by each
decoder in turn (interleaved, so load changes hit all alike). Printed per decoder: tokens per
target call (over all sentences: generated tokens / target calls), total wall seconds, and the
speedup over the target alone; greedy decodes are checked identical to the target's.

  python scripts/tree_vs_chain.py --data_dir DATA [--sentences 50] [--gamma 4] \
      [--trees 4,2,1 2,2,1,1] [--tree_rule without_replacement] [--temperatures 0 1]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.checkpoints import demo_pair
from spec_decode.data import corpora
from spec_decode.engine import decoding
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


def decoder(loop, target, draft, **settings):
  """decode(encoder tokens [1, L], rng) -> (decodes [1, L], generated tokens, target calls)."""
  (target_config, target_params), (draft_config, draft_params) = target, draft

  def decode(encoder_tokens, rng):
    inputs = jnp.zeros((encoder_tokens.shape[0], LENGTH), jnp.int32)
    cache = network.init_decode_cache(target_config, target_params, encoder_tokens, LENGTH)
    tokens_to_logits = network.make_tokens_to_logits(target_config, target_params)
    if loop is decoding.temperature_sample:
      decodes, _ = loop(inputs, cache, tokens_to_logits, vocab.EOS_ID, decode_rng=rng,
                        **settings)
      generated = jnp.sum(decodes[:, 0] > 0)
      return decodes[:, 0], generated, generated
    decodes, _, stats = loop(
        inputs, cache, tokens_to_logits, vocab.EOS_ID, decode_rng=rng,
        draft_cache=network.init_decode_cache(draft_config, draft_params, encoder_tokens,
                                              LENGTH),
        draft_tokens_to_logits=network.make_tokens_to_logits(draft_config, draft_params),
        **settings)
    return decodes[:, 0], jnp.sum(stats.generated_tokens), jnp.sum(stats.target_calls)

  return jax.jit(decode)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=None,
                      help="the data root holding multi30k/ (default: $SPEC_DECODE_DATA_ROOT)")
  parser.add_argument("--sentences", type=int, default=50)
  parser.add_argument("--gamma", type=int, default=4)
  parser.add_argument("--trees", nargs="+", default=["4,2,1"],
                      help="tree shapes: children per node at each depth, comma-separated")
  parser.add_argument("--tree_rule", default="without_replacement")
  parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
  args = parser.parse_args()
  sources, _ = corpora.read_parallel(["multi30k/test"], data_root=args.data_dir)
  encoder_tokens = encoded(sources[:args.sentences])
  target, draft = demo_pair.load_model("target"), demo_pair.load_model("draft")
  for temperature in args.temperatures:
    greedy = temperature == 0.0
    decoders = {"target alone": decoder(decoding.temperature_sample, target, draft,
                                         temperature=temperature),
                f"chain gamma {args.gamma}": decoder(decoding.speculative_sample, target,
                                                      draft, gamma=args.gamma,
                                                      temperature=temperature)}
    for tree in args.trees:
      branching = tuple(int(b) for b in tree.split(","))
      rule = "most_likely" if greedy else args.tree_rule
      decoders[f"tree {tree} {rule}"] = decoder(
          token_tree.speculative_tree_sample, target, draft, tree_branching=branching,
          tree_rule=rule, temperature=temperature)
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
      print(f"  {name:36s} {generated / calls:5.2f} tokens/target call  {seconds:7.2f} s  "
            f"{baseline_seconds / seconds:5.2f}x")


if __name__ == "__main__":
  main()
