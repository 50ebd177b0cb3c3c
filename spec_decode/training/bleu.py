"""BLEU of greedy translations (sacrebleu, default 13a tokenization, detokenized text).

Contract: `corpus_bleu(hypotheses, references) -> float` is sacrebleu's corpus BLEU score.
CLI: `python -m spec_decode.training.bleu --model target --corpus multi30k/test [--limit 500]` decodes the
English side of `<corpus>.en` greedily with a shipped demo model (or a `.safetensors` path; see
`spec_decode.checkpoints.demo_pair`) and scores it against `<corpus>.de`; corpora are resolved
under the data root ($SPEC_DECODE_DATA_ROOT, or `--data_root`).
"""
from __future__ import annotations

import argparse
import time
from typing import Sequence

import sacrebleu

from spec_decode.training import greedy


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description="Greedy BLEU of a demo model on a corpus.")
  greedy.add_corpus_arguments(parser, max_len=128, batch_size=64)
  parser.add_argument("--limit", type=int, default=None, help="first N segments only")
  args = parser.parse_args(argv)
  start = time.time()
  for corpus, sources, references, hypotheses in greedy.translate_corpora(args, args.limit):
    print(f"{args.model} {corpus} n={len(sources)} BLEU {corpus_bleu(hypotheses, references):.2f} "
          f"({time.time() - start:.0f}s)", flush=True)
    start = time.time()


if __name__ == "__main__":
  main()
