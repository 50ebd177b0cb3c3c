"""Sequence-level distillation data (Kim & Rush, 2016) for training a draft on its target.

A draft trained on the target's own greedy translations imitates the target rather than the
references, which raises alpha; speculative sampling stays exact whatever the draft is.

Contract: `python -m spec_decode.training.distill --model target --corpus multi30k/train
--output out/distill/train` translates `<corpus>.en` (corpora resolved under the data root,
see `spec_decode.training.data`) with a shipped demo model (or a `.safetensors` path) and writes the
parallel corpus `<output>.en` (the sources) and `<output>.de` (the model's translations),
line-aligned, without the pairs whose translation is empty, ready for
`train.train_corpora = ['/abs/path/out/distill/train']`.
"""
from __future__ import annotations

import argparse
import pathlib
import time
from typing import Sequence

from spec_decode.training import greedy


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  greedy.add_corpus_arguments(parser, max_len=64, batch_size=128)
  parser.add_argument("--output", required=True, help="prefix of the .en/.de files to write")
  args = parser.parse_args(argv)
  start = time.time()
  pairs = []
  for _, sources, _, translations in greedy.translate_corpora(args):
    # Whitespace is normalized (a stray line separator would misalign the corpus) and pairs
    # whose translation is empty are dropped (nothing to imitate; an empty last line would not
    # survive `corpora.read_parallel`).
    pairs += [(s, " ".join(t.split())) for s, t in zip(sources, translations) if t.strip()]
  output = pathlib.Path(args.output)
  output.parent.mkdir(parents=True, exist_ok=True)
  for index, suffix in enumerate(("en", "de")):
    output.with_name(f"{output.name}.{suffix}").write_text(
        "".join(pair[index] + "\n" for pair in pairs), encoding="utf-8")
  print(f"wrote {len(pairs)} pairs to {output}.{{en,de}} in {time.time() - start:.0f}s",
        flush=True)


if __name__ == "__main__":
  main()
