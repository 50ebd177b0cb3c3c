"""`python -m spec_decode.data.ngrams`: a unigram or bigram draft estimated from text.

Reads UTF-8 text files (one text per non-blank line: e.g. the target side of a translation
corpus, what the drafts will have to guess), tokenizes each line with a SentencePiece
vocabulary and appends EOS (the draft learns where outputs end), estimates the model of
`--order` (`engine.ngram.estimate`: add-one unigram, Dirichlet-smoothed bigram over each
token's `--max_successors` most frequent successors) and writes it as one .npz file
(`checkpoints.ngram_format`), the `draft_checkpoint_path` of a run with DRAFT_SOURCE = 'ngram'.

  python -m spec_decode.data.ngrams --order=2 --output=/tmp/bigram.npz \\
      --text_file=train.de

`--vocab_size` is the target network's (its config's `vocab_size`, which a T5 checkpoint pads
past the SentencePiece model's: 32128 against 32100); the default is the vocabulary's own.
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterator, Sequence

import numpy as np

from spec_decode import gin_utils
from spec_decode import paths
from spec_decode.checkpoints import ngram_format
from spec_decode.data import corpora
from spec_decode.engine import ngram
from spec_decode.t5 import vocab

DEMO_VOCABULARY = paths.DEMO_ASSETS / "spm_ende_8k.model"


def token_sequences(texts: Sequence[str], vocabulary: vocab.SentencePieceVocabulary
                    ) -> Iterator[np.ndarray]:
  """Each text's ids followed by EOS."""
  for text in texts:
    yield np.asarray(vocabulary.encode(text) + [vocabulary.eos_id], np.int64)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m spec_decode.data.ngrams",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--text_file", action="append", required=True,
                      help="a UTF-8 text file, one text per line (repeatable)")
  parser.add_argument("--output", required=True, help="the .npz file to write")
  parser.add_argument("--order", type=int, default=2, choices=ngram.ORDERS)
  parser.add_argument("--vocabulary", default=str(DEMO_VOCABULARY),
                      help="SentencePiece model (default: the demo pair's)")
  parser.add_argument("--vocab_size", type=int, default=None,
                      help="the target network's vocab_size (default: the vocabulary's)")
  parser.add_argument("--max_successors", type=int, default=64)
  parser.add_argument("--smoothing", type=float, default=1.0)
  parser.add_argument("--max_texts", type=int, default=None,
                      help="read at most this many texts (all by default)")
  return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> None:
  if not ngram_format.is_ngram_file(args.output):
    raise gin_utils.UsageError(f"--output must name a {ngram_format.SUFFIX} file: {args.output}")
  texts = []
  for text_file in args.text_file:
    try:
      texts += corpora.read_input_lines(text_file)
    except ValueError as e:
      raise gin_utils.UsageError(str(e)) from None
  texts = texts[:args.max_texts]
  vocabulary = vocab.SentencePieceVocabulary(args.vocabulary)
  vocab_size = args.vocab_size or vocabulary.vocab_size
  if vocab_size < vocabulary.vocab_size:
    raise gin_utils.UsageError(f"--vocab_size={vocab_size} is below the vocabulary's "
                               f"{vocabulary.vocab_size} ids")
  try:
    model = ngram.estimate(token_sequences(texts, vocabulary), vocab_size, order=args.order,
                           max_successors=args.max_successors, smoothing=args.smoothing)
  except ValueError as e:
    raise gin_utils.UsageError(str(e)) from None
  ngram_format.save(args.output, model)
  print(f"order-{args.order} model of {len(texts)} texts, {vocab_size} ids: {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.data.ngrams", lambda: _run(args))


if __name__ == "__main__":
  sys.exit(main())
