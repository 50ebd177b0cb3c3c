"""Predicted tokens per target call of drawn trees and chains on the Table 3 decoder-only pair,
and the most any static tree of drawn children of a node budget gets under the same model.

Reads a sampled `spec_decode.infer` run of the pair (--predictions: its predictions.jsonl,
each example's prompt, sampled continuation and stats; any exact decoder's run is a sample of
the target's law), tokenizes each prompt and continuation (EOS after it), and takes both
models' laws after every prefix of the continuation (one teacher-forced call each, at
--temperature). As `scripts/drawn_tree_prediction.py` does for the demo pair, the positional
acceptance of drawn children comes from --draws sets of children drawn by --rule at every
position (`tree_choice.drawn_acceptance`), and with the run's generated tokens per example as
the decodes' lengths it predicts each --widths tree (`tree_choice.drawn_tokens_per_call`),
each --gammas chain (a static tree of one child per node) and `tree_choice.best_static_tree`
of each --nodes budget: every call whole, and of those lengths.

  python scripts/table3_drawn_prediction.py --predictions RUN/predictions.jsonl \
      --target_checkpoint T --draft_checkpoint D [--widths 4,4,4,4,4,4,4,4] [--gammas 16] \
      [--nodes 32 64]
"""

from __future__ import annotations

import argparse
import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from spec_decode.checkpoints import formats
from spec_decode.engine import sampling
from spec_decode.engine import tree_choice
from spec_decode.t5 import network
from spec_decode.training import data
import drawn_tree_prediction

_TARGET_GIN = "configs/models/decoder_only/table3_target.gin"
_DRAFT_GIN = "configs/models/decoder_only/table3_draft.gin"
_VOCAB = "spec_decode/assets/demo/spm_ende_8k.model"
_BATCH = 50  # sequences per teacher-forced call


def _model(gin_file: str, checkpoint: str) -> tuple[network.NetworkConfig, object]:
  """The decoder-only model of `gin_file` restored from `checkpoint`."""
  gin.clear_config()
  gin.parse_config_file(gin_file)
  return formats.load_model(checkpoint, like=gin.get_configurable(network.DecoderOnlyConfig)())


def _examples(path: str, sp: spm.SentencePieceProcessor, prompt_length: int
              ) -> tuple[list[list[int]], list[int], list[int]]:
  """(each example's tokens: prompt then continuation then EOS; where its continuation
  starts; its generated tokens as the run counted them)."""
  sequences, starts, lengths = [], [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      example = json.loads(line)
      prompt = sp.encode(example["inputs"])[:prompt_length]
      sequences.append(prompt + sp.encode(example["prediction"]) + [data.EOS_ID])
      starts.append(len(prompt))
      lengths.append(int(example["stats"]["generated_tokens"]))
  return sequences, starts, lengths


def _laws(models, sequences: list[list[int]], starts: list[int], temperature: float
          ) -> list[np.ndarray]:
  """Each model's laws [P, V] at every continuation position (P over all examples)."""
  length = max(map(len, sequences))
  tokens = np.zeros((len(sequences), length), np.int32)
  for row, sequence in enumerate(sequences):
    tokens[row, :len(sequence)] = sequence
  scored = np.zeros_like(tokens, bool)
  for row, (sequence, start) in enumerate(zip(sequences, starts)):
    scored[row, start:len(sequence)] = True
  fed = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # BOS (0), then the sequence

  def probs(config, params):
    call = jax.jit(lambda fed, targets: sampling.logits_to_probs(
        network.module_of(config).apply({"params": params}, fed, targets), temperature))
    found = [np.asarray(call(jnp.asarray(fed[i:i + _BATCH]), jnp.asarray(tokens[i:i + _BATCH])))
             for i in range(0, len(tokens), _BATCH)]
    return np.concatenate(found)[scored]

  return [probs(config, params) for config, params in models]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--predictions", required=True,
                      help="predictions.jsonl of a sampled spec_decode.infer run of the pair")
  parser.add_argument("--target_checkpoint", required=True)
  parser.add_argument("--draft_checkpoint", required=True)
  parser.add_argument("--prompt_length", type=int, default=8,
                      help="the run's input tokens (TASK_FEATURE_LENGTHS['inputs'])")
  parser.add_argument("--widths", nargs="*", default=["4,4,4,4,4,4,4,4"],
                      help="drawn trees: nodes at each depth, comma-separated")
  parser.add_argument("--gammas", nargs="*", type=int, default=[16])
  parser.add_argument("--nodes", nargs="*", type=int, default=[32],
                      help="node budgets of the best static trees")
  parser.add_argument("--max_rank", type=int, default=16, help="children drawn per set")
  drawn_tree_prediction.add_acceptance_arguments(parser)
  args = parser.parse_args()
  widths = [tuple(int(w) for w in text.split(",")) for text in args.widths]
  drawn_tree_prediction.check_acceptance_arguments(parser, args)
  if args.max_rank < 1 or any(n < 1 for n in args.nodes) or any(g < 1 for g in args.gammas):
    parser.error("--max_rank, --nodes and --gammas must be >= 1")
  if any(min(shape) < 1 or max(shape) > args.max_rank for shape in widths):
    parser.error("--widths must be nodes per depth, each 1 to --max_rank")

  sp = spm.SentencePieceProcessor(model_file=_VOCAB)
  sequences, starts, lengths = _examples(args.predictions, sp, args.prompt_length)
  target_probs, draft_probs = _laws([_model(_TARGET_GIN, args.target_checkpoint),
                                     _model(_DRAFT_GIN, args.draft_checkpoint)],
                                    sequences, starts, args.temperature)
  acceptance = drawn_tree_prediction.mean_acceptance(
      target_probs, draft_probs, args.rule, args.draws, args.max_rank, jax.random.PRNGKey(0))
  print(f"{len(sequences)} examples, {np.mean(lengths):.2f} generated tokens each on average "
        f"({len(target_probs)} positions), rule '{args.rule}' at temperature "
        f"{args.temperature:g}, {args.draws} draws of {args.max_rank} children per position; "
        f"acceptance of a node's drawn child by rank: "
        + " ".join(f"{p:.3f}" for p in acceptance[0]))

  def show(name: str, law: np.ndarray) -> None:
    print(f"  {name:44s} predicted {tree_choice.law_tokens_per_call(law):.3f} whole / "
          f"{tree_choice.law_tokens_per_call(law, lengths):.3f} of the lengths")

  for gamma in args.gammas:
    show(f"chain, gamma {gamma}", tree_choice.static_depth_law(((1,),) * gamma, acceptance))
  for shape in widths:
    show(f"drawn, widths {shape}", tree_choice.drawn_depth_law(shape, acceptance))
  for nodes in args.nodes:
    best = tree_choice.best_static_tree(acceptance, nodes)
    show(f"best static tree of {nodes} nodes", tree_choice.static_depth_law(best, acceptance))
    print(f"    its nodes per depth: {tuple(sum(counts) for counts in best)}")


if __name__ == "__main__":
  main()
