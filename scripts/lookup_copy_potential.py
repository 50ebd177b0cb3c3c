"""What n-gram lookup drafts would give a target that writes the reference: accepted tokens per
target call, teacher-forced, on real text (CNN/DailyMail highlights, WMT En-De references).

No trained summarizer or translator exists here, so the target is taken to write exactly the
reference (then EOS), greedily. A greedy target accepts a draft exactly when it equals its own
next token, so while drafts are accepted the history IS the reference prefix: the lookup's
proposal after reference position t (the engine's own `lookup.longest_match`, on the row's
tokenized input and the reference so far) is right or not, independently of the iteration it
falls in. An iteration at position i then accepts the run of right proposals at i, i+1, ...
(at most gamma; a missing proposal ends it like a wrong one) and commits one more token from
the target. Reported: tokens per target call = (reference tokens + EOS) / target calls, summed
over examples, for each gamma and max n (min n 1), and the share of positions with a proposal.

  python scripts/lookup_copy_potential.py [--examples 1000] [--gammas 3 5 7] [--ngrams 1 2 3 4]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import paths
from spec_decode.engine import lookup
from spec_decode.t5 import vocab

INPUT_LENGTH, TARGET_LENGTH = 512, 128  # Table 2's task feature lengths
EOS = 1


def read_task(name: str, data_root: pathlib.Path, num_examples: int) -> list[tuple[str, str]]:
  """(input text with the T5 task prefix, reference) pairs of Table 2's task `name`."""
  if name == "cnndm":
    with open(data_root / "cnn_dailymail" / "validation_1000.jsonl", encoding="utf-8") as f:
      rows = [json.loads(line) for line in f if line.strip()][:num_examples]
    return [("summarize: " + row["article"], row["highlights"]) for row in rows]
  prefix = data_root / "wmt_ende" / "test"
  with open(f"{prefix}.en", encoding="utf-8") as en, open(f"{prefix}.de", encoding="utf-8") as de:
    pairs = [(e.rstrip("\n"), d.rstrip("\n")) for e, d in zip(en, de)][:num_examples]
  return [("translate English to German: " + e, d) for e, d in pairs]


def encode(vocabulary: vocab.SentencePieceVocabulary, pairs: list[tuple[str, str]]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(sources [N, Le] with EOS, then 0 padding; sequences [N, 1 + Lt] = BOS, reference, EOS;
  lengths [N] = reference tokens + EOS)."""
  sources = np.zeros((len(pairs), INPUT_LENGTH), np.int32)
  sequences = np.zeros((len(pairs), TARGET_LENGTH + 1), np.int32)
  lengths = np.zeros((len(pairs),), np.int32)
  for row, (inputs, target) in enumerate(pairs):
    ids = list(vocabulary.encode(inputs))[:INPUT_LENGTH - 1] + [EOS]
    sources[row, :len(ids)] = ids
    ids = list(vocabulary.encode(target))[:TARGET_LENGTH - 1] + [EOS]
    sequences[row, 1:1 + len(ids)] = ids
    lengths[row] = len(ids)
  return sources, sequences, lengths


_longest_match = jax.jit(lookup.longest_match, static_argnums=3)


def right_proposals(sources: np.ndarray, sequences: np.ndarray, max_ngram: int,
                    chunk: int = 16) -> tuple[np.ndarray, np.ndarray]:
  """(right [N, Lt], proposed [N, Lt]) for the lookup with this max n (min n 1)."""
  right, proposed = [], []
  for start in range(0, len(sources), chunk):
    src, seq = jnp.asarray(sources[start:start + chunk]), jnp.asarray(sequences[start:start + chunk])
    positions = jnp.broadcast_to(jnp.arange(seq.shape[1] - 1), seq[:, 1:].shape)
    token, length = _longest_match(src, seq, positions, max_ngram)
    proposed.append(np.asarray(length >= 1))
    right.append(np.asarray((length >= 1) & (token == seq[:, 1:])))
  return np.concatenate(right), np.concatenate(proposed)


def tokens_per_call(right: np.ndarray, lengths: np.ndarray, gamma: int) -> float:
  """Greedy speculative iterations over each reference: (tokens, target calls) summed."""
  tokens = calls = 0
  for row, length in enumerate(lengths):
    position = 0  # tokens committed so far
    while position < length:
      accepted = 0
      # A draft may be the EOS itself; the commit is then cut there (no bonus after EOS).
      while accepted < gamma and position + accepted < length and right[row, position + accepted]:
        accepted += 1
      position = min(position + accepted + 1, length)
      calls += 1
    tokens += length
  return tokens / calls


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--examples", type=int, default=1000)
  parser.add_argument("--gammas", type=int, nargs="+", default=[3, 5, 7])
  parser.add_argument("--ngrams", type=int, nargs="+", default=[1, 2, 3, 4])
  parser.add_argument("--tasks", nargs="+", default=["cnndm", "ende"])
  parser.add_argument("--data_root", default=None, help="default: SPEC_DECODE_DATA_ROOT")
  parser.add_argument("--vocabulary", default=None, help="default: SPEC_DECODE_T5_VOCABULARY")
  args = parser.parse_args(argv)
  data_root = pathlib.Path(args.data_root or os.environ["SPEC_DECODE_DATA_ROOT"])
  vocabulary = vocab.SentencePieceVocabulary(
      paths.resolve(args.vocabulary or os.environ["SPEC_DECODE_T5_VOCABULARY"]), extra_ids=100)
  results = {}
  for task in args.tasks:
    pairs = read_task(task, data_root, args.examples)
    sources, sequences, lengths = encode(vocabulary, pairs)
    print(f"{task}: {len(pairs)} examples, {lengths.sum()} reference tokens (with EOS)",
          flush=True)
    for max_ngram in args.ngrams:
      right, proposed = right_proposals(sources, sequences, max_ngram)
      valid = np.arange(right.shape[1])[None] < lengths[:, None]
      row = {"proposed": float(proposed[valid].mean()), "right": float(right[valid].mean())}
      for gamma in args.gammas:
        row[f"gamma_{gamma}"] = tokens_per_call(right, lengths, gamma)
      results[f"{task}/n{max_ngram}"] = row
      print(f"  n<={max_ngram}: proposes at {row['proposed']:.1%} of positions, right at "
            f"{row['right']:.1%}; tokens per target call "
            + ", ".join(f"gamma {g}: {row[f'gamma_{g}']:.3f}" for g in args.gammas), flush=True)
  print(json.dumps(results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
