"""A long `spec_decode.infer` run of the demo pair: compiles and host memory (RSS), batch by batch.

Run: `python scripts/long_run_steadiness.py [--num_examples N] [--output FILE.json]` (N >= 2,000
by default 2,014). It decodes the first N English captions of Multi30k's validation and test
splits (../shared/data/multi30k, or $SPEC_DECODE_DATA_ROOT/multi30k) with the demo config
(`configs/demo/infer.gin`: batch 1, speculative then the target alone, chunks committed every
CHECKPOINT_PERIOD batches), through `infer.main` in this process, and records
  * every XLA compilation by function name (`steadiness.CompileCounter`), and how many
    happened between each decoder's first and last batch;
  * the RSS after every batch of each decoder (`steadiness.rss_bytes`): at the end of warm-up
    (batch 50), at each quarter of the run and at its maximum.
It prints them and writes them as JSON to --output.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spec_decode import infer  # pylint: disable=g-import-not-at-top,wrong-import-position
from spec_decode.infer import outputs as infer_outputs  # pylint: disable=wrong-import-position
from spec_decode import paths  # pylint: disable=wrong-import-position
from spec_decode.bench import steadiness  # pylint: disable=wrong-import-position

WARM_UP_BATCHES = 50
MIB = 2**20


def _captions(num_examples: int) -> list[str]:
  root = pathlib.Path(os.environ.get(paths.DATA_ROOT_VARIABLE, REPO_ROOT.parent / "shared" /
                                     "data")) / "multi30k"
  lines = []
  for split in ("val", "test"):
    with open(root / f"{split}.en", encoding="utf-8") as f:
      lines += [line.strip() for line in f if line.strip()]
  if len(lines) < num_examples:
    raise SystemExit(f"{root} has {len(lines)} captions, fewer than {num_examples}")
  return lines[:num_examples]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_examples", type=int, default=2014)
  parser.add_argument("--output", default=None)
  args = parser.parse_args()
  records: dict[str, dict] = {}
  original_progress = infer_outputs.progress

  def progress(name):
    report = original_progress(name)
    record = records.setdefault(name, {"rss": [], "compiles_at_first_batch": None})

    def observe(stage, done, total):
      report(stage, done, total)
      if stage == "decoding":
        record["rss"].append(steadiness.rss_bytes())
        if record["compiles_at_first_batch"] is None:
          record["compiles_at_first_batch"] = compiles.total
        record["compiles_at_last_batch"] = compiles.total
    return observe

  with tempfile.TemporaryDirectory() as directory, steadiness.CompileCounter() as compiles:
    input_file = pathlib.Path(directory) / "inputs.en"
    input_file.write_text("\n".join(_captions(args.num_examples)) + "\n", encoding="utf-8")
    infer_outputs.progress = progress
    status = infer.main([f"--input_file={input_file}",
                         f"--gin.INFER_OUTPUT_DIR='{pathlib.Path(directory) / 'out'}'"])
    if status:
      return status
  result = {"num_examples": args.num_examples, "compiles": dict(compiles.by_name),
            "decoders": {}}
  for name, record in records.items():
    rss = record["rss"]
    warm = rss[WARM_UP_BATCHES - 1]
    quarters = {f"{q}/4": rss[len(rss) * q // 4 - 1] / MIB for q in (1, 2, 3, 4)}
    result["decoders"][name] = {
        "batches": len(rss),
        "compiles_after_first_batch": (record["compiles_at_last_batch"]
                                       - record["compiles_at_first_batch"]),
        "rss_mib_after_warm_up": warm / MIB, "rss_mib_at": quarters,
        "rss_mib_max": max(rss) / MIB,
        "growth_mib_after_warm_up": (rss[-1] - warm) / MIB}
  print(json.dumps(result, indent=2))
  if args.output:
    pathlib.Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
