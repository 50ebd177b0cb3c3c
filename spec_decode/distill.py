"""Sequence-level distillation data (Kim & Rush, 2016) for training a draft on its target.

A draft trained on the target's own greedy translations imitates the target rather than the
references, which raises alpha; speculative sampling stays exact whatever the draft is.

Contract: `python -m spec_decode.distill --model target --corpus multi30k/train
--output out/distill/train` translates `<corpus>.en` (corpora resolved under the data root,
see `spec_decode.data`) with a shipped demo model (or a `.safetensors` path) and writes the
parallel corpus `<output>.en` (the sources) and `<output>.de` (the model's translations),
line-aligned, without the pairs whose translation is empty, ready for
`train.train_corpora = ['/abs/path/out/distill/train']`.
"""
from __future__ import annotations

import argparse
import pathlib
import time
from typing import Sequence

import sentencepiece as spm

from spec_decode import data
from spec_decode import demo_pair
from spec_decode import greedy


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="target", help='"target", "draft" or a .safetensors path')
  parser.add_argument("--corpus", action="append", required=True, help="e.g. multi30k/train")
  parser.add_argument("--output", required=True, help="prefix of the .en/.de files to write")
  parser.add_argument("--data_root", default=None)
  parser.add_argument("--max_input_len", type=int, default=64)
  parser.add_argument("--max_decode_len", type=int, default=64)
  parser.add_argument("--batch_size", type=int, default=128)
  args = parser.parse_args(argv)
  config, params = demo_pair.load_model(args.model)
  sp = spm.SentencePieceProcessor(model_file=str(demo_pair.VOCAB_PATH))
  sources, _ = data.read_parallel(args.corpus, data_root=args.data_root)
  start = time.time()
  translations = greedy.translate(config, params, sp, sources, args.max_input_len,
                                  args.max_decode_len, args.batch_size)
  # Whitespace is normalized (a stray line separator would misalign the corpus) and pairs
  # whose translation is empty are dropped (nothing to imitate; an empty last line would not
  # survive `data.read_parallel`).
  pairs = [(s, " ".join(t.split())) for s, t in zip(sources, translations) if t.strip()]
  sources, translations = [s for s, _ in pairs], [t for _, t in pairs]
  output = pathlib.Path(args.output)
  output.parent.mkdir(parents=True, exist_ok=True)
  output.with_name(output.name + ".en").write_text("\n".join(sources) + "\n", encoding="utf-8")
  output.with_name(output.name + ".de").write_text("\n".join(translations) + "\n",
                                                   encoding="utf-8")
  print(f"wrote {len(sources)} pairs to {output}.{{en,de}} in {time.time() - start:.0f}s",
        flush=True)


if __name__ == "__main__":
  main()
