"""Choosing a token tree for the demo pair: acceptance measured per depth and child rank, the best
tree for a node budget and this machine's v(k), and its predicted tokens per target call next to
the measured ones, on the sentences measured and on held-out ones.

On the first --sentences sentences of Multi30k's test split (as scripts/tree_vs_chain.py
encodes them): the target's decode (greedy, or sampled at --temperature), then the draft's
logits after each prefix of it in one call. The rank of each output token among them gives the
acceptance by depth and rank (`tree_choice.greedy_acceptance`, --max_depth x --max_rank) and the
ranks' chain (`tree_choice.greedy_rank_chain`, --max_rank) of the rule 'most_likely' (greedy)
or 'deterministic' (sampled: the walk emits a sample of the target's, and a node is accepted
when that token ranks among its children; `tree_choice`'s module docstring); with the decodes'
lengths, three predictions of tokens per target call: every call counted whole (positional
acceptance, 1 + E(0)), of decodes of those lengths (the last call cut; positional acceptance),
and of those lengths with the ranks' chain, which ranks the trees. The next --heldout sentences
are held out: measured, never used to predict.

v(k), the time of a target call feeding k tokens per row relative to one token, is
--target_costs ("k:v,..."), or a platform's compiled v(k) (--call_costs, a file of
`tree_choice.load_call_costs`'s format such as docs/token_trees/tpu_call_costs.json, at
--platform, batch 1: the T5.1.1-XXL target's tree calls as XLA:TPU compiles them), or, without
either, measured here (`spec_decode.runtime.call_costs`, batch 1, widths 1, 2, 4, ... up to the
widest tree's call, interleaved; linear between them); --draft_cost is the draft's c. Every
shape within --node_budget nodes is ranked by predicted tokens per unit of time
(`tree_choice.rank_trees`); the --top best, and the chain (1,) * max_depth, are then decoded by
`speculative_tree_sample` on the --sentences and on the --heldout sentences: predicted and
measured tokens per target call side by side (measured: generated tokens / target calls over a
set's sentences, the last call of each sentence cut at EOS) and wall seconds (both sets). Last,
every shape's walk is replayed over the ranks of both sets (`tree_choice.replayed_tokens_per_call`:
a greedy decode's calls exactly, a sampled decode's in law) and each prediction's error range
printed.

  python scripts/choose_tree.py --data_dir DATA [--sentences 20] [--heldout 0] \
      [--temperature 0] [--node_budget 16] [--max_depth 5] [--max_rank 4] \
      [--target_costs 1:1,8:1.1,32:1.6] [--draft_cost 0.1] \
      [--call_costs docs/token_trees/tpu_call_costs.json --platform v4:1x1x1]
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
from spec_decode.engine import tree_choice
from spec_decode.runtime import call_costs
from spec_decode.t5 import network
from spec_decode.t5 import vocab
import tree_vs_chain

LENGTH = tree_vs_chain.LENGTH
_RANKS_BATCH = 25


def decoded_and_forced(target, models, encoder_tokens: jax.Array, temperature: float,
                       rng: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
  """The target's decodes of `encoder_tokens [B, L]` at `temperature` (outputs [B, LENGTH], EOS
  included, 0 after), and each of `models`' ((config, params) pairs) logits after every prefix
  of them, teacher-forced in one call ([B, LENGTH, V] each). Traceable: callers jit it."""
  target_config, target_params = target
  inputs = jnp.zeros((encoder_tokens.shape[0], LENGTH), jnp.int32)
  decodes, _ = decoding.temperature_sample(
      inputs, network.init_decode_cache(target_config, target_params, encoder_tokens, LENGTH),
      network.make_tokens_to_logits(target_config, target_params), vocab.EOS_ID,
      decode_rng=rng, temperature=temperature)
  outputs = decodes[:, 0]
  fed = jnp.pad(outputs[:, :-1], ((0, 0), (1, 0)))  # BOS (0), then the output
  logits = [network.make_tokens_to_logits(config, params)(decoding.DecodingState(
      cur_index=jnp.zeros((fed.shape[0],), jnp.int32), cur_token=fed, sequences=fed,
      cache=network.init_decode_cache(config, params, encoder_tokens, LENGTH)))[0]
            for config, params in models]
  return outputs, logits


def _ranks(target, draft, encoder_tokens: np.ndarray, temperature: float,
           rng: jax.Array) -> list[np.ndarray]:
  """Per sentence, each output token's rank among the draft's logits after the output before it
  (EOS included), the target decoding at `temperature`, in batches of `_RANKS_BATCH` sentences
  (the draft's logits of a batch are [batch, LENGTH, vocabulary] floats)."""

  @jax.jit
  def ranks(encoder_tokens, rng):
    outputs, (logits,) = decoded_and_forced(target, [draft], encoder_tokens, temperature, rng)
    chosen = jnp.take_along_axis(logits, outputs[:, :, None], axis=2)
    return outputs, jnp.sum(logits > chosen, axis=2)

  found = []
  for start in range(0, len(encoder_tokens), _RANKS_BATCH):
    batch = encoder_tokens[start:start + _RANKS_BATCH]
    padded = np.pad(batch, ((0, _RANKS_BATCH - len(batch)), (0, 0)))  # one compiled shape
    outputs, batch_ranks = (np.asarray(x)[:len(batch)] for x in ranks(
        jnp.asarray(padded), jax.random.fold_in(rng, start)))
    found += [row_ranks[:np.sum(row > 0)] for row, row_ranks in zip(outputs, batch_ranks)]
  return found


def _print_outputs(name: str, ranks: list[np.ndarray]) -> None:
  """The outputs' lengths, and those that reach the length limit (no EOS): outputs that loop,
  whose ranks differ from the others'."""
  tokens = np.concatenate(ranks)
  limited = [row for row in ranks if len(row) == LENGTH]
  line = (f"{name}: {len(ranks)} outputs, {len(tokens) / len(ranks):.2f} tokens each, "
          f"{np.mean(tokens == 0):.1%} of them the draft's likeliest; {len(limited)} reach the "
          f"{LENGTH}-token limit")
  if limited:
    line += (f" ({sum(map(len, limited)) / len(tokens):.1%} of the tokens, "
             f"{np.mean(np.concatenate(limited) == 0):.1%} of theirs the draft's likeliest)")
  print(line)


def _measured_costs(target, widths: list[int]) -> dict[int, float]:
  config, params = target
  module = network.Transformer(config)
  seconds = call_costs.interleaved_call_seconds(
      {k: [call_costs.Call(module, params, k)] for k in widths}, batch_size=1,
      input_length=LENGTH, cache_length=LENGTH, loops=20, repetitions=5)
  return {k: seconds[k]["median_s"] / seconds[1]["median_s"] for k in widths}


def add_sentence_arguments(parser: argparse.ArgumentParser, sentences: int) -> None:
  """--data_dir, --sentences (default `sentences`) and --heldout: Multi30k test's sentences
  that predict and that are held out (`encoded_sentences`)."""
  parser.add_argument("--data_dir", default=None,
                      help="the data root holding multi30k/ (default: $SPEC_DECODE_DATA_ROOT)")
  parser.add_argument("--sentences", type=int, default=sentences,
                      help="sentences whose acceptance and lengths predict, decoded too")
  parser.add_argument("--heldout", type=int, default=0,
                      help="the sentences after --sentences, decoded only (held out)")


def encoded_sentences(parser: argparse.ArgumentParser, args: argparse.Namespace) -> np.ndarray:
  """The first --sentences + --heldout sentences of Multi30k's test split as the decodes'
  encoder tokens; a parser error where the split has fewer."""
  sources, _ = corpora.read_parallel(["multi30k/test"], data_root=args.data_dir)
  if len(sources) < args.sentences + args.heldout:
    parser.error(f"--sentences and --heldout ask for {args.sentences + args.heldout} "
                 f"sentences; Multi30k's test split has {len(sources)}")
  return tree_vs_chain.encoded(sources[:args.sentences + args.heldout])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_sentence_arguments(parser, 20)
  parser.add_argument("--temperature", type=float, default=0.0,
                      help="0: greedy, rule 'most_likely'; else sampled, rule 'deterministic'")
  parser.add_argument("--node_budget", type=int, default=16)
  parser.add_argument("--max_depth", type=int, default=5)
  parser.add_argument("--max_rank", type=int, default=4)
  parser.add_argument("--target_costs", default=None,
                      help="v(k) as 'k:v,...' (default: measured on this machine)")
  parser.add_argument("--call_costs", default=None,
                      help="a platform's compiled call costs (JSON), whose target v(k) to use")
  parser.add_argument("--platform", default="v4:1x1x1", help="the platform of --call_costs")
  parser.add_argument("--draft_cost", type=float, default=0.0)
  parser.add_argument("--top", type=int, default=3)
  args = parser.parse_args()
  if args.call_costs and args.target_costs:
    parser.error("give --target_costs or --call_costs, not both")
  compiled_costs = None
  if args.call_costs:  # read first: a wrong file or platform is an error before any decode
    compiled_costs = tree_choice.relative_costs(tree_choice.load_call_costs(args.call_costs),
                                                args.platform, "target", 1)
  if args.sentences < 1 or args.heldout < 0 or args.temperature < 0:
    parser.error("--sentences must be >= 1, --heldout and --temperature >= 0")
  rule = "most_likely" if args.temperature == 0 else "deterministic"
  encoder_tokens = encoded_sentences(parser, args)
  target, draft = demo_pair.load_model("target"), demo_pair.load_model("draft")

  # Sampled: samples of their own, from keys none of the decodes below (PRNGKey(row)) takes.
  ranks = _ranks(target, draft, encoder_tokens[:args.sentences], args.temperature,
                 jax.random.PRNGKey(1 << 30))
  heldout_ranks = _ranks(target, draft, encoder_tokens[args.sentences:], args.temperature,
                         jax.random.PRNGKey((1 << 30) + 1)) if args.heldout else []
  lengths = [len(row) for row in ranks]
  acceptance = tree_choice.greedy_acceptance(ranks, args.max_depth, args.max_rank)
  chain_of_ranks = tree_choice.greedy_rank_chain(ranks, args.max_rank)
  for name, outputs in (("measured", ranks), ("held out", heldout_ranks)):
    if outputs:
      _print_outputs(name, outputs)
  print(f"acceptance by depth (rows) and child rank (columns), {args.sentences} sentences, "
        f"{np.mean(lengths):.2f} output tokens each on average:")
  for depth, row in enumerate(acceptance):
    print(f"  depth {depth}: " + " ".join(f"{p:.3f}" for p in row))
  print("rank class after the previous token's (rows: rank 0.., then none) (columns: rank "
        f"0..{args.max_rank - 1}, then {args.max_rank} or more):")
  for previous, row in enumerate(chain_of_ranks.transitions):
    name = "none" if previous == args.max_rank + 1 else str(previous)
    print(f"  after {name:4s}: " + " ".join(f"{p:.3f}" for p in row))
  if compiled_costs:
    costs = compiled_costs
  elif args.target_costs:
    costs = {int(k): float(v) for k, v in (item.split(":") for item in
                                           args.target_costs.split(","))}
  else:
    widest = args.max_depth + 1 + args.node_budget
    widths = sorted({1, widest} | {2 ** i for i in range(1, widest.bit_length())})
    costs = _measured_costs(target, widths)
  print("v(k): " + ", ".join(f"{k}: {v:.2f}" for k, v in sorted(costs.items())))

  ranked = tree_choice.rank_trees(chain_of_ranks, args.node_budget, args.max_depth, costs,
                                  args.draft_cost, output_lengths=lengths)
  chain = (1,) * args.max_depth
  chosen = list(ranked[:args.top])
  chosen += [choice for choice in ranked if choice.branching == chain and choice not in chosen]
  decoders = {choice.branching: tree_vs_chain.decoder(
      token_tree.speculative_tree_sample, target, draft, tree_branching=choice.branching,
      tree_rule=rule, temperature=args.temperature) for choice in chosen}
  sets = {"measured": range(args.sentences),
          "held out": range(args.sentences, args.sentences + args.heldout)}
  set_ranks = {"measured": ranks, "held out": heldout_ranks}
  # per set and tree: generated tokens, target calls, seconds
  totals = {name: {branching: [0, 0, 0.0] for branching in decoders} for name in sets}
  first = jnp.asarray(encoder_tokens[:1])
  for decode in decoders.values():
    jax.block_until_ready(decode(first, jax.random.PRNGKey(0)))  # compiled, run once
  for name, rows in sets.items():
    for row in rows:
      tokens = jnp.asarray(encoder_tokens[row:row + 1])
      for branching, decode in decoders.items():
        start = time.perf_counter()
        _, generated, calls = jax.block_until_ready(decode(tokens, jax.random.PRNGKey(row)))
        totals[name][branching][2] += time.perf_counter() - start
        totals[name][branching][0] += int(generated)
        totals[name][branching][1] += int(calls)
  print(f"{len(ranked)} shapes within {args.node_budget} nodes and depth {args.max_depth}; "
        f"the best {args.top} and the chain, temperature {args.temperature:g} ('{rule}'), "
        f"batch 1.\nTokens per target call predicted from the {args.sentences} sentences "
        f"(every call whole / of their lengths / of their lengths with the ranks' chain),\n"
        f"measured on them and on the {args.heldout} held out (the last prediction's error; "
        f"the walk replayed over the set's ranks):")
  for choice in chosen:
    branching = choice.branching
    measured = []
    for name in sets:
      generated, calls, _ = totals[name][branching]
      if calls:
        replayed = tree_choice.replayed_tokens_per_call(set_ranks[name], branching)
        measured.append(f"{name} {generated / calls:.2f} "
                        f"({choice.tokens_per_call / (generated / calls) - 1:+.1%}; "
                        f"replayed {replayed:.2f})")
    seconds = sum(totals[name][branching][2] for name in sets)
    print(f"  tree {str(branching):18s} {token_tree.TreeShape(branching).num_nodes:3d} nodes  "
          f"predicted {tree_choice.expected_tokens(branching, acceptance):.2f} / "
          f"{tree_choice.tokens_per_call(branching, acceptance, lengths):.2f} / "
          f"{choice.tokens_per_call:.2f} ({choice.tokens_per_time:.2f} per unit time)  "
          f"{'  '.join(measured)}  {seconds:6.2f} s")

  by_chain = {choice.branching: choice.tokens_per_call for choice in ranked}
  models = {"every call whole": lambda b: tree_choice.expected_tokens(b, acceptance),
            "of their lengths": lambda b: tree_choice.tokens_per_call(b, acceptance, lengths),
            "with the chain": by_chain.get}
  print(f"Every one of the {len(ranked)} shapes, its walk replayed over the ranks (the decodes "
        f"that gave the acceptance; the held-out sentences' own): each prediction's error")
  for name in sets:
    if not set_ranks[name]:
      continue
    replayed = {branching: tree_choice.replayed_tokens_per_call(set_ranks[name], branching)
                for branching in by_chain}
    for model, predicted in models.items():
      errors = {branching: predicted(branching) / tokens - 1
                for branching, tokens in replayed.items()}
      low, high = min(errors, key=errors.get), max(errors, key=errors.get)
      within = sum(abs(error) <= 0.1 for error in errors.values())
      print(f"  {name:8s} {model:16s}: {errors[low]:+6.1%} {str(low):17s} to {errors[high]:+6.1%} "
            f"{str(high):17s} {within} of {len(errors)} within 10%")


if __name__ == "__main__":
  main()
