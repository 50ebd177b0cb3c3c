"""How well a draft agrees with its target (the demo's by default): alpha and tokens per target
call of speculative sampling on held-out sentences, at each temperature.

  alpha            the paper's acceptance estimate, mean of sum_x min(p, q) over verified
                   positions (`engine.stats.SpeculativeStats`);
  tokens/call      tokens committed per target call (at most gamma + 1);
  accepted/drafted the fraction of drafted tokens accepted.
Sentences are decoded one at a time (batch 1, the paper's setting) with the target and the draft
given (the shipped ones by default, or `.safetensors` files of the demo format, e.g. a distilled
draft exported by `spec_decode.training.export_demo`). Timing is not measured here
(reproduce_table2.py does), so the figures do not depend on the machine's load.

  python scripts/draft_alpha.py                                   # shipped draft, 100 sentences
  python scripts/draft_alpha.py --draft /tmp/distilled.safetensors --num_sentences 100
Sentences come from `<corpus>.{en,de}` under the data root (--data_root or $SPEC_DECODE_DATA_ROOT).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from spec_decode import bench
from spec_decode.data import corpora


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--draft", default="draft",
                      help='"draft" (the shipped one) or a demo-format .safetensors path')
  parser.add_argument("--target", default="target",
                      help='"target" (the shipped one) or a demo-format .safetensors path')
  parser.add_argument("--corpus", default="multi30k/test", help="held-out corpus prefix")
  parser.add_argument("--data_root", default=None, help="default: $SPEC_DECODE_DATA_ROOT")
  parser.add_argument("--num_sentences", type=int, default=100)
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--input_length", type=int, default=64)
  parser.add_argument("--max_decode_len", type=int, default=64)
  parser.add_argument("--output", default=None, help="also write the results as JSON here")
  args = parser.parse_args(argv)
  args.temperatures = [float(t) for t in args.temperatures.split(",")]
  if args.num_sentences < 1 or args.gamma < 1:
    parser.error("--num_sentences and --gamma must be >= 1")
  return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
  sources, _ = corpora.read_parallel([args.corpus], data_root=args.data_root)
  sources = sources[:args.num_sentences]
  pair = bench.shipped_pair(sources, corpora.TRANSLATE_PREFIX, args.input_length,
                            args.max_decode_len, f"the first {len(sources)} of {args.corpus}",
                            draft=args.draft, target=args.target)
  decoders = bench.PairDecoders(pair, {})
  rows = []
  for temperature in args.temperatures:
    variant = bench.Variant(temperature, args.gamma)
    decoders.run(variant, 0, 1)  # compilation
    summary = bench.summarize([decoders.run(variant, i, 1) for i in range(len(sources))])
    rows.append({"temperature": temperature, "gamma": args.gamma, "alpha": summary["alpha"],
                 "tokens_per_target_call": summary["tokens_per_target_call"],
                 "accepted_over_drafted": summary["accepted_over_drafted"],
                 "tokens": summary["tokens"]})
    print(f"target {args.target} draft {args.draft} T={temperature:g} gamma={args.gamma}: alpha "
          f"{summary['alpha']:.3f}, tokens/target call {summary['tokens_per_target_call']:.2f}, "
          f"accepted/drafted {summary['accepted_over_drafted']:.3f} ({summary['tokens']} "
          f"tokens)", flush=True)
  return {"target": args.target, "draft": args.draft, "corpus": args.corpus,
          "num_sentences": len(sources), "machine": bench.describe_machine(),
          "command": "python scripts/draft_alpha.py " + " ".join(sys.argv[1:]), "rows": rows}


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  report = measure(args)
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
