"""Predicted tokens per target call of drawn trees chosen per row (`tree_widths` with a rule
that draws its children), next to the measured, on the demo pair.

On the first --sentences sentences of Multi30k's test split (as scripts/tree_vs_chain.py
encodes them): the target's translation sampled at --temperature, then both models' logits
after each prefix of it (one teacher-forced call each). At every output position, --draws sets
of --max_rank children drawn by --rule from the draft's law there and verified against the
target's (`tree_choice.drawn_acceptance`) give the chance that the walk accepts a node's drawn
child of rank k, given that it reached the node; their mean over the positions is the
positional acceptance of drawn children, the same at every depth (the sampled trees' model of
Sequoia, Chen et al. 2024). With the outputs' lengths, each --widths tree's prediction
(`tree_choice.drawn_tokens_per_call`: every call whole; of decodes of those lengths), then its
decodes (`speculative_tree_sample`, batch 1, PRNGKey(row) as tree_vs_chain.py's) of the same
sentences and of the --heldout after them, measured tokens per target call beside.

  python scripts/drawn_tree_prediction.py --data_dir DATA [--sentences 100] [--heldout 100] \
      [--widths 16,8,4,4 4,4,4,4,4,4,4,4] [--rule without_replacement] [--temperature 1]
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.checkpoints import demo_pair
from spec_decode.engine import sampling
from spec_decode.engine import token_tree
from spec_decode.engine import tree_choice
from spec_decode.engine import tree_rules
import choose_tree
import tree_vs_chain

_BATCH = 10  # sentences per sampled decode
_CHUNK = 64  # positions per draw of children: their laws are [_CHUNK, draws, K, V] floats


def _acceptance(target, draft, encoder_tokens: np.ndarray, temperature: float, rule: str,
                draws: int, max_rank: int, rng: jax.Array) -> tuple[np.ndarray, list[int]]:
  """(positional acceptance [1, max_rank] of drawn children, the outputs' lengths), from the
  target's samples of `encoder_tokens`' translations (a multiple of _BATCH sentences)."""

  @jax.jit
  def laws(encoder_tokens, rng):
    outputs, logits = choose_tree.decoded_and_forced(target, [target, draft], encoder_tokens,
                                                     temperature, rng)
    return outputs, *(sampling.logits_to_probs(found, temperature) for found in logits)

  sample_rng, draw_rng = jax.random.split(rng)
  target_probs, draft_probs, lengths = [], [], []
  for start in range(0, len(encoder_tokens), _BATCH):
    outputs, target_laws, draft_laws = (np.asarray(x) for x in laws(
        jnp.asarray(encoder_tokens[start:start + _BATCH]), jax.random.fold_in(sample_rng, start)))
    real = outputs > 0  # output positions, EOS included
    target_probs.append(target_laws[real])
    draft_probs.append(draft_laws[real])
    lengths += [int(n) for n in real.sum(axis=1)]
  return mean_acceptance(np.concatenate(target_probs), np.concatenate(draft_probs), rule, draws,
                         max_rank, draw_rng), lengths


def mean_acceptance(target_probs: np.ndarray, draft_probs: np.ndarray, rule: str, draws: int,
                    max_rank: int, rng: jax.Array) -> np.ndarray:
  """[1, max_rank]: the positional acceptance of drawn children, `tree_choice.drawn_acceptance`
  at the P positions of `target_probs`, `draft_probs [P, V]` (`draws` sets of children each),
  averaged over the positions."""
  accepted = jax.jit(functools.partial(tree_choice.drawn_acceptance, rule=rule))
  total = np.zeros(max_rank)
  for start in range(0, len(target_probs), _CHUNK):
    chunk = slice(start, start + _CHUNK)
    size = len(target_probs[chunk])
    pad = lambda x: jnp.asarray(np.pad(x[chunk], ((0, _CHUNK - size), (0, 0)),
                                       constant_values=1.0 / x.shape[-1]))  # one shape
    uniforms = jax.random.uniform(jax.random.fold_in(rng, start), (_CHUNK, draws, max_rank))
    found = accepted(pad(target_probs), pad(draft_probs), uniforms=uniforms)
    total += np.asarray(found)[:size].sum(axis=0)
  return (total / len(target_probs))[None]


def add_acceptance_arguments(parser: argparse.ArgumentParser) -> None:
  """--rule, --temperature and --draws: how `mean_acceptance` is estimated."""
  parser.add_argument("--rule", default="without_replacement",
                      help="a tree rule that draws its children")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--draws", type=int, default=8,
                      help="sets of children drawn at each position")


def check_acceptance_arguments(parser: argparse.ArgumentParser,
                               args: argparse.Namespace) -> None:
  """The parser's one-line error for a setting of `add_acceptance_arguments` it cannot take."""
  if args.temperature <= 0 or args.draws < 1:
    parser.error("--temperature must be > 0 (a sampled decode) and --draws >= 1")
  try:
    if tree_rules.get_rule(args.rule).verify_among is None:
      parser.error(f"--rule {args.rule!r} does not draw its children")
  except ValueError as e:
    parser.error(str(e))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  choose_tree.add_sentence_arguments(parser, 100)
  parser.add_argument("--widths", nargs="+", default=["16,8,4,4"],
                      help="trees chosen per row: nodes at each depth, comma-separated")
  add_acceptance_arguments(parser)
  args = parser.parse_args()
  widths = [tuple(int(w) for w in text.split(",")) for text in args.widths]
  max_rank = max(max(shape) for shape in widths)
  check_acceptance_arguments(parser, args)
  if min(min(shape) for shape in widths) < 1:
    parser.error(f"--widths must be nodes per depth, each >= 1, got {' '.join(args.widths)}")
  if args.sentences % _BATCH or args.heldout % _BATCH or args.sentences < _BATCH:
    parser.error(f"--sentences (at least {_BATCH}) and --heldout must be multiples of {_BATCH}")
  encoder_tokens = choose_tree.encoded_sentences(parser, args)
  target, draft = demo_pair.load_model("target"), demo_pair.load_model("draft")

  # Samples of their own, from a key none of the decodes below (PRNGKey(row)) takes.
  acceptance, lengths = _acceptance(target, draft, encoder_tokens[:args.sentences],
                                    args.temperature, args.rule, args.draws, max_rank,
                                    jax.random.PRNGKey(1 << 30))
  print(f"{args.sentences} sentences, {np.mean(lengths):.2f} output tokens each on average, "
        f"rule '{args.rule}' at temperature {args.temperature:g}, {args.draws} draws of "
        f"{max_rank} children per position; acceptance of a node's drawn child by rank: "
        + " ".join(f"{p:.3f}" for p in acceptance[0]))
  sets = {"measured": range(args.sentences),
          "held out": range(args.sentences, args.sentences + args.heldout)}
  for shape in widths:
    decode = tree_vs_chain.decoder(token_tree.speculative_tree_sample, target, draft,
                                   tree_branching=None, tree_widths=shape, tree_rule=args.rule,
                                   temperature=args.temperature)
    whole = tree_choice.drawn_tokens_per_call(shape, acceptance)
    predicted = tree_choice.drawn_tokens_per_call(shape, acceptance, lengths)
    measured = []
    for name, rows in sets.items():
      generated = calls = 0
      for row in rows:
        _, row_generated, row_calls = decode(jnp.asarray(encoder_tokens[row:row + 1]),
                                             jax.random.PRNGKey(row))
        generated, calls = generated + int(row_generated), calls + int(row_calls)
      if calls:
        tokens = generated / calls
        measured.append(f"{name} {tokens:.3f} ({predicted / tokens - 1:+.1%})")
    print(f"  widths {str(shape):24s} predicted {whole:.3f} whole / {predicted:.3f} of the "
          f"lengths; measured: {'  '.join(measured)}")


if __name__ == "__main__":
  main()
