"""The real decode loop with n-gram lookup drafts on a benchmark pair: greedy identity with the
target alone, tokens per target call and speedup against the baseline, for the model draft, the
lookup alone and the combination (`bench.decoders.Variant.draft_source`), batch 1.

Each input is decoded by every variant in turn (interleaved, so load drifts hit all alike),
after one untimed compile-and-warm-up run per variant; the speedup is the baseline's summed
seconds over the variant's (whole decode, encoders included; and the loop alone).

  python scripts/lookup_loop_bench.py --pair demo --gamma 3 --inputs 8
  python scripts/lookup_loop_bench.py --pair near_bigram_base --gamma 3 --inputs 4
  python scripts/lookup_loop_bench.py --pair near_bigram_large --gamma 3 --inputs 2
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from spec_decode.bench import pairs
from spec_decode.bench.config import PairConfig
from spec_decode.bench.decoders import PairDecoders, Variant

PAIRS = {
    "demo": dict(source="demo"),
    # configs/bench/peer_t5_1_1.gin's and peer_t5_1_1_large.gin's pairs.
    "near_bigram_base": dict(source="near_bigram", target_gin="configs/models/t5_1_1/base.gin",
                             target_overrides={"dtype": "float32"}, residual_scale=5e-5),
    "near_bigram_large": dict(source="near_bigram",
                              target_gin="configs/models/t5_1_1/large.gin",
                              target_overrides={"dtype": "float32"}, residual_scale=5e-5),
}


def variants(gamma: int, temperature: float, min_ngram: int) -> dict[str, Variant]:
  return {"baseline": Variant(temperature),
          "model": Variant(temperature, gamma),
          "lookup": Variant(temperature, gamma, draft_source="lookup"),
          "lookup+model": Variant(temperature, gamma, draft_source="lookup+model",
                                  lookup_min_ngram=min_ngram)}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pair", choices=sorted(PAIRS), default="demo")
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--inputs", type=int, default=8)
  parser.add_argument("--max_decode_len", type=int, default=64)
  parser.add_argument("--min_ngram", type=int, default=2, help="the combination's")
  args = parser.parse_args(argv)
  pair = pairs.build_pair(PairConfig(**PAIRS[args.pair], input_length=64,
                                     max_decode_len=args.max_decode_len,
                                     num_random_inputs=args.inputs, gamma=args.gamma))
  decoders = PairDecoders(pair, compiler_options={})
  chosen = variants(args.gamma, 0.0, args.min_ngram)
  for variant in chosen.values():  # compile and warm up, untimed
    decoders.run(variant, 0, 1)
  totals = {name: {"seconds": 0.0, "loop_seconds": 0.0, "tokens": 0, "identical": 0,
                   "stats": {}} for name in chosen}
  for repetition in range(args.inputs):
    outputs = {name: decoders.run(variant, repetition, 1) for name, variant in chosen.items()}
    for name, output in outputs.items():
      total = totals[name]
      total["seconds"] += output.seconds
      total["loop_seconds"] += output.decode_seconds
      total["tokens"] += output.tokens
      total["identical"] += int(np.array_equal(output.decodes, outputs["baseline"].decodes))
      for counter, value in (output.stats or {}).items():
        total["stats"][counter] = total["stats"].get(counter, 0.0) + value
  base = totals["baseline"]
  report = {}
  for name, total in totals.items():
    stats = total["stats"]
    row = {"identical": f"{total['identical']}/{args.inputs}", "tokens": total["tokens"],
           "speedup": base["seconds"] / total["seconds"],
           "loop_speedup": base["loop_seconds"] / total["loop_seconds"]}
    if stats:
      row.update(tokens_per_target_call=stats["generated_tokens"] / stats["target_calls"],
                 drafted=stats["drafted_tokens"], accepted=stats["accepted_tokens"],
                 lookup_drafted=stats["lookup_drafted_tokens"],
                 lookup_accepted=stats["lookup_accepted_tokens"])
    report[name] = row
    print(f"{name:>13}: " + ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
          flush=True)
  print(json.dumps({"pair": args.pair, "gamma": args.gamma, "inputs": args.inputs,
                    "results": report}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
