"""Speculative beam search against the engine's beam search on the same weights, interleaved.

The pair is the benchmark's near-bigram pair (`bench.near_bigram_pair`: a random T5.1.1 target
whose residual branches are scaled down, and a 1+1-layer draft made of its own arrays), float32,
no EOS (every row runs to the length limit). Each repetition decodes the same batch with
`beam_search` and with `speculative_beam_search` (compiled once each, one untimed call first),
alternately, and checks that every beam and score agree. Printed per run: tokens/s of the best
beams (tokens = batch * max_decode_len), target calls per beam-search step, draft calls, and
per tree depth the share of target calls whose tree held every beam selected there; then
medians and the speedup. With --t5x, T5X's own `t5x.decoding.beam_search` over T5X's network
(`spec_decode.t5x.sampler.beam_search_model`, the same weights) is timed in the same rounds and
its beams compared with ours. One JSON line per repetition goes to --output.

  python scripts/beam_search_bench.py --target_gin configs/models/t5_1_1/base.gin \
      [--batch_size 1] [--beams 4] [--alpha 0.6] [--gamma 3] [--nodes_per_beam N] \
      [--draft_beams W] [--t5x] \
      [--repetitions 3] [--output records.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import bench
from spec_decode import core


def _compiled(decoder: core.Decoder, pair, batch_size: int, beams: int):
  """decode(target params, draft params, encoder tokens) -> (decodes [B, n, L], aux)."""
  zeros = jnp.zeros((batch_size, pair.max_decode_len), jnp.int32)

  def decode(params, draft_params, encoder_tokens):
    batch = {"encoder_input_tokens": encoder_tokens, "decoder_input_tokens": zeros}
    return decoder.predict(params, draft_params, batch, pair.eos_id or 1,
                           return_all_decodes=True, num_decodes=beams)

  return jax.jit(decode)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target_gin", default="configs/models/t5_1_1/base.gin")
  parser.add_argument("--batch_size", type=int, default=1)
  parser.add_argument("--beams", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--gamma", type=int, default=3)
  parser.add_argument("--nodes_per_beam", type=int, default=None,
                      help="tree nodes each beam's target call scores (default: the whole tree)")
  parser.add_argument("--draft_beams", type=int, default=None,
                      help="beams of the draft's own search (default: --beams)")
  parser.add_argument("--repetitions", type=int, default=3)
  parser.add_argument("--max_decode_len", type=int, default=64)
  parser.add_argument("--residual_scale", type=float, default=5e-5)
  parser.add_argument("--t5x", action="store_true",
                      help="also time T5X's own beam_search on the same weights")
  parser.add_argument("--output", default=None)
  args = parser.parse_args()
  pair = bench.build_pair(bench.PairConfig(
      source="near_bigram", target_gin=args.target_gin, target_overrides={"dtype": "float32"},
      residual_scale=args.residual_scale, input_length=64, max_decode_len=args.max_decode_len,
      gamma=args.gamma, num_random_inputs=8))
  baseline = core.Decoder.create("beam_search", pair.target.module, alpha=args.alpha)
  speculative = core.Decoder.create("speculative_beam_search", pair.target.module,
                                    pair.draft.module, gamma=args.gamma, alpha=args.alpha,
                                    nodes_per_beam=args.nodes_per_beam,
                                    draft_beams=args.draft_beams)
  runs = {"beam_search": (_compiled(baseline, pair, args.batch_size, args.beams), None),
          "speculative_beam_search": (_compiled(speculative, pair, args.batch_size, args.beams),
                                      pair.draft.params)}
  if args.t5x:
    from spec_decode.t5x import sampler  # pylint: disable=import-outside-toplevel
    t5x_model = sampler.beam_search_model(pair.target.config, pair.eos_id or 1, args.alpha)
    zeros = jnp.zeros((args.batch_size, pair.max_decode_len), jnp.int32)
    predict = jax.jit(lambda params, draft_params, tokens: t5x_model.predict_batch_with_aux(
        params, {"encoder_input_tokens": tokens, "decoder_input_tokens": zeros},
        num_decodes=args.beams, return_all_decodes=True))
    runs["t5x_beam_search"] = (predict, None)
  rates = {name: [] for name in runs}
  records = []
  for repetition in range(args.repetitions + 1):  # the first is untimed (compiles, warms up)
    tokens = jnp.asarray(pair.batch(repetition, args.batch_size))
    outputs = {}
    for name, (decode, draft_params) in runs.items():
      start = time.perf_counter()
      outputs[name] = jax.block_until_ready(decode(pair.target.params, draft_params, tokens))
      seconds = time.perf_counter() - start
      if repetition:
        rates[name].append(args.batch_size * args.max_decode_len / seconds)
    (want, want_aux), (got, aux) = outputs["beam_search"], outputs["speculative_beam_search"]
    identical = bool(np.array_equal(np.asarray(want), np.asarray(got)))
    scores_close = bool(np.allclose(want_aux["scores"], aux["scores"], rtol=1e-5, atol=1e-5))
    if args.t5x:
      t5x_decodes, t5x_aux = outputs["t5x_beam_search"]
      identical &= bool(np.array_equal(np.asarray(want), np.asarray(t5x_decodes)))
      scores_close &= bool(np.allclose(want_aux["scores"], t5x_aux["scores"], rtol=1e-5,
                                       atol=1e-5))
    record = {"repetition": repetition, "identical_decodes": identical,
              "scores_close": scores_close,
              **{name: float(np.sum(np.asarray(aux[name])[:, 0]))
                 for name in ("target_calls", "draft_calls", "beam_steps")}}
    record["target_calls_per_step"] = record["target_calls"] / max(record["beam_steps"], 1)
    # Per tree depth d: the share of target calls whose tree held every beam selected at d.
    covered = np.asarray(aux["covered_past_depth"])[:, 0].sum(axis=0)
    record["coverage_by_depth"] = (covered / max(record["target_calls"], 1)).tolist()
    if repetition:
      record.update({f"{name}_tokens_per_second": rates[name][-1] for name in runs})
      records.append(record)
    print(json.dumps(record), flush=True)
  medians = {name: statistics.median(values) for name, values in rates.items()}
  print(json.dumps({"median_tokens_per_second": medians,
                    "speedup": medians["speculative_beam_search"] / medians["beam_search"],
                    "all_identical": all(r["identical_decodes"] for r in records)}))
  if args.output:
    with open(args.output, "w") as f:
      for record in records:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  main()
