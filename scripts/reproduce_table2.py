"""Table 2 of Leviathan et al. (2023) at small scale: the shipped demo pair on held-out text.

For each temperature and gamma, on the same held-out sentences decoded one at a time (batch 1,
the paper's setting) in the same process, with the baseline and every gamma interleaved
sentence by sentence, it reports:
  alpha            the paper's acceptance estimate, mean of sum_x min(p, q) over verified positions;
  tokens/call      tokens committed per target call;
  speedup          measured: speculative tokens/s over baseline tokens/s (wall clock, whole
                   decode including both encoders);
  loop speedup     the same for the decoding loops alone (what the formula models);
  predicted (v=1)  the paper's Theorem 3.8, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)),
                   from the measured alpha and c (draft step / target step);
  predicted (v)    the same with the measured cost v of the target's (gamma+1)-token call in
                   target steps (the paper's TPU has v ~ 1; a CPU does not);
  realized         the formula's cost model with the realized tokens per target call instead
                   of alpha (`bench.realized_speedup`);
  BLEU             of the baseline's and of the speculative decoder's translations.
It writes `table2.md`, `table2.json` and `table2.png` (speedups vs gamma) to --output_dir.

  python scripts/reproduce_table2.py                       # Multi30k test, 100 sentences
  python scripts/reproduce_table2.py --num_sentences 20 --gammas 1,2 --temperatures 0
Sentences come from `<corpus>.{en,de}` under the data root (--data_root or $SPEC_DECODE_DATA_ROOT).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from spec_decode.data import corpora
from spec_decode import bench
from spec_decode.training import bleu
from spec_decode.checkpoints import demo_pair
from spec_decode.t5 import vocab

# The paper's Table 2 rows of the same task and draft size, by temperature.
PAPER_ROWS = {0.0: bench.paper.TABLE2["ende_small_t0"], 1.0: bench.paper.TABLE2["ende_small_t1"]}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus", default="multi30k/test", help="held-out corpus prefix")
  parser.add_argument("--data_root", default=None, help="default: $SPEC_DECODE_DATA_ROOT")
  parser.add_argument("--num_sentences", type=int, default=100)
  parser.add_argument("--gammas", default="1,2,3,4,5,6,7,8")
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--input_length", type=int, default=64)
  parser.add_argument("--max_decode_len", type=int, default=64)
  parser.add_argument("--step_calls", type=int, default=32, help="calls per timed step loop")
  parser.add_argument("--output_dir", default="docs/table2")
  args = parser.parse_args(argv)
  args.gammas = [int(g) for g in args.gammas.split(",")]
  args.temperatures = [float(t) for t in args.temperatures.split(",")]
  if args.num_sentences < 1 or min(args.gammas) < 1:
    parser.error("--num_sentences and every gamma must be >= 1")
  return args


def translations(decodes: Sequence[np.ndarray], vocabulary: vocab.SentencePieceVocabulary
                 ) -> list[str]:
  """Text of each decode [1, L] (`vocabulary.decode` stops at its first EOS)."""
  return [vocabulary.decode(np.asarray(row)[0]) for row in decodes]


def measure(args: argparse.Namespace) -> dict[str, Any]:
  sources, references = corpora.read_parallel([args.corpus], data_root=args.data_root)
  sources, references = sources[:args.num_sentences], references[:args.num_sentences]
  pair = bench.shipped_pair(sources, corpora.TRANSLATE_PREFIX, args.input_length, args.max_decode_len,
                            f"the shipped demo pair on the first {len(sources)} of {args.corpus}")
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  decoders = bench.PairDecoders(pair, {})

  def step(model: bench.Model, num_tokens: int) -> float:
    return bench.step_seconds(model, 1, num_tokens, args.input_length, args.max_decode_len,
                              args.step_calls, 5, {})

  target_step, draft_step = step(pair.target, 1), step(pair.draft, 1)
  verify_steps = {gamma: step(pair.target, gamma + 1) for gamma in args.gammas}
  c = draft_step / target_step
  rows = []
  for temperature in args.temperatures:
    variants = {"baseline": bench.Variant(temperature)}
    variants.update({gamma: bench.Variant(temperature, gamma) for gamma in args.gammas})
    outputs = bench.interleave(
        {key: (lambda r, v=variant: decoders.run(v, r, 1)) for key, variant in variants.items()},
        repetitions=len(sources))
    baseline = outputs.pop("baseline")
    baseline_summary = bench.summarize(baseline)
    baseline_rate = baseline_summary["tokens"] / baseline_summary["seconds"]
    baseline_text = translations([o.decodes for o in baseline], vocabulary)
    for gamma, runs in outputs.items():
      summary = bench.summarize(runs)
      alpha = summary["alpha"]
      v = verify_steps[gamma] / target_step
      rate = summary["tokens"] / summary["seconds"]
      text = translations([o.decodes for o in runs], vocabulary)
      rows.append({
          "temperature": temperature, "gamma": gamma, "alpha": alpha,
          "tokens_per_target_call": summary["tokens_per_target_call"], "c": c, "v": v,
          "baseline_tokens_per_s": baseline_rate, "speculative_tokens_per_s": rate,
          "speedup": rate / baseline_rate,
          "loop_speedup": (summary["decode_tokens_per_s"]
                           / baseline_summary["decode_tokens_per_s"]),
          "predicted_paper": bench.predicted_speedup(alpha, gamma, c, 1.0),
          "predicted_measured_v": bench.predicted_speedup(alpha, gamma, c, v),
          "predicted_realized": bench.realized_speedup(summary, {"c": c, "v": v}),
          "bleu_baseline": bleu.corpus_bleu(baseline_text, references),
          "bleu_speculative": bleu.corpus_bleu(text, references),
          "identical_to_baseline": text == baseline_text,
      })
      print(f"T={temperature:g} gamma={gamma}: alpha {alpha:.3f} speedup "
            f"{rows[-1]['speedup']:.2f}x, loop {rows[-1]['loop_speedup']:.2f}x (predicted "
            f"{rows[-1]['predicted_paper']:.2f}x with v=1, {rows[-1]['predicted_measured_v']:.2f}x "
            f"with v={v:.2f}, {rows[-1]['predicted_realized']:.2f}x realized)", flush=True)
  return {"corpus": args.corpus, "num_sentences": len(sources), "machine": bench.describe_machine(),
          "target_step_s": target_step, "draft_step_s": draft_step, "c": c,
          "command": "python scripts/reproduce_table2.py " + " ".join(sys.argv[1:]), "rows": rows}


def to_markdown(report: dict[str, Any]) -> str:
  lines = [
      f"Shipped demo pair, first {report['num_sentences']} sentences of {report['corpus']}, "
      f"batch 1; c = {report['c']:.3f} (draft step {report['draft_step_s'] * 1e3:.2f} ms, target "
      f"step {report['target_step_s'] * 1e3:.2f} ms). Command: `{report['command'].strip()}`.",
      "",
      "| T | gamma | alpha | tokens / target call | v | speedup, whole call | speedup, loop | "
      "predicted, v = 1 (paper) | predicted, measured v | predicted, realized tokens/call | "
      "BLEU baseline | BLEU speculative |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in report["rows"]:
    lines.append(
        f"| {row['temperature']:g} | {row['gamma']} | {row['alpha']:.3f} | "
        f"{row['tokens_per_target_call']:.2f} | {row['v']:.2f} | {row['speedup']:.2f}x | "
        f"{row['loop_speedup']:.2f}x | {row['predicted_paper']:.2f}x | "
        f"{row['predicted_measured_v']:.2f}x | {row['predicted_realized']:.2f}x | "
        f"{row['bleu_baseline']:.2f} | {row['bleu_speculative']:.2f} |")
  lines.append("")
  draft = PAPER_ROWS[0.0].draft
  lines.append(f"Paper ({bench.paper.TARGET} target, {draft} draft, {bench.paper.HARDWARE}): "
               + "; ".join(f"T={t:g}: {row.summary()}" for t, row in PAPER_ROWS.items()) + ".")
  return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  temperatures = sorted({row["temperature"] for row in report["rows"]})
  figure, axes = pyplot.subplots(1, len(temperatures), figsize=(5 * len(temperatures), 3.8),
                                 squeeze=False, sharey=True)
  for axis, temperature in zip(axes[0], temperatures):
    rows = [row for row in report["rows"] if row["temperature"] == temperature]
    gammas = [row["gamma"] for row in rows]
    for key, label, style in (("speedup", "measured, whole call", "o-"),
                              ("loop_speedup", "measured, decoding loop", "D-"),
                              ("predicted_paper", "Theorem 3.8, v = 1 (paper)", "s--"),
                              ("predicted_measured_v", "Theorem 3.8, measured v", "^:")):
      axis.plot(gammas, [row[key] for row in rows], style, label=label)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_title(f"T = {temperature:g}, alpha ~ {np.mean([r['alpha'] for r in rows]):.2f}")
    axis.set_xlabel("gamma")
    axis.set_xticks(gammas)
  axes[0][0].set_ylabel("speedup over the baseline")
  axes[0][0].legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  corpus = corpora.resolve(args.corpus, args.data_root)
  for suffix in ("en", "de"):
    if not corpus.parent.joinpath(f"{corpus.name}.{suffix}").exists():
      print(f"error: {corpus}.{suffix} does not exist (--corpus, --data_root)", file=sys.stderr)
      return 2
  report = measure(args)
  output_dir = pathlib.Path(args.output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  (output_dir / "table2.json").write_text(json.dumps(report, indent=1))
  (output_dir / "table2.md").write_text(to_markdown(report))
  plot(report, output_dir / "table2.png")
  print(f"wrote {output_dir}/table2.{{md,json,png}}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
