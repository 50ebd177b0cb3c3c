"""BLEU of greedy translations (sacrebleu, default 13a tokenization, detokenized text).

Contract: `corpus_bleu(hypotheses, references) -> float` is sacrebleu's corpus BLEU score.
CLI: `python -m spec_decode.bleu --model target --corpus multi30k/test [--limit 500]` decodes the
English side of `<corpus>.en` greedily with a shipped demo model (or a `.safetensors` path; see
`spec_decode.demo_pair`) and scores it against `<corpus>.de`; corpora are resolved under the
data root (`../shared/data` from the repository root, or `--data_root`).
"""
from __future__ import annotations

import argparse
import time
from typing import Sequence

import sacrebleu
import sentencepiece as spm

from spec_decode import data
from spec_decode import demo_pair
from spec_decode import greedy


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description="Greedy BLEU of a demo model on a corpus.")
  parser.add_argument("--model", default="target", help='"target", "draft" or a .safetensors path')
  parser.add_argument("--corpus", action="append", required=True, help="e.g. multi30k/test")
  parser.add_argument("--limit", type=int, default=None, help="first N segments only")
  parser.add_argument("--data_root", default=None)
  parser.add_argument("--max_input_len", type=int, default=128)
  parser.add_argument("--max_decode_len", type=int, default=128)
  parser.add_argument("--batch_size", type=int, default=64)
  args = parser.parse_args(argv)
  config, params = demo_pair.load_model(args.model)
  sp = spm.SentencePieceProcessor(model_file=str(demo_pair.VOCAB_PATH))
  for corpus in args.corpus:
    sources, references = data.read_parallel([corpus], data_root=args.data_root)
    sources, references = sources[:args.limit], references[:args.limit]
    start = time.time()
    hypotheses = greedy.translate(config, params, sp, sources, args.max_input_len,
                                  args.max_decode_len, args.batch_size)
    print(f"{args.model} {corpus} n={len(sources)} BLEU {corpus_bleu(hypotheses, references):.2f} "
          f"({time.time() - start:.0f}s)", flush=True)


if __name__ == "__main__":
  main()
