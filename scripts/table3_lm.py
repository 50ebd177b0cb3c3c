"""Table 3's decoder-only (GPT-like) row at small scale: alpha of a draft language model, a bigram
and a unigram draft against a decoder-only target, at temperatures 0 and 1, gamma 1.

The prompts are the first `--prompt_tokens` tokens of held-out sentences (those with more
tokens than that); each decode continues for `--new_tokens` tokens or to EOS. alpha is the
paper's estimate, the mean over verified positions of sum_x min(p, q): summed counters of all
rows (`SpeculativeStats.ratios` of the totals), not a mean of per-row ratios.

  python scripts/table3_lm.py --target=/work/table3_out/lm_target/t5x/checkpoint_643 \
    --draft=/work/table3_out/lm_draft/t5x/checkpoint_1400 \
    --bigram=/work/table3_out/bigram.npz --unigram=/work/table3_out/unigram.npz \
    --prompts=../shared/data/wmt_ende/test.en
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from spec_decode import core
from spec_decode import paths
from spec_decode.checkpoints import ngram_format
from spec_decode.checkpoints import t5x_format
from spec_decode.engine import stats
from spec_decode.t5 import network

REPO = pathlib.Path(__file__).resolve().parents[1]
EOS_ID = 1


def config_of(gin_file: str) -> network.DecoderOnlyConfig:
  """The `DecoderOnlyConfig` a training config (`configs/train/lm_*.gin`) binds."""
  gin.clear_config()
  gin.add_config_file_search_path(str(REPO))
  gin.parse_config_file(gin_file)
  config = gin.get_configurable(network.DecoderOnlyConfig)()
  gin.clear_config()
  return config


def prompt_batch(sp: spm.SentencePieceProcessor, lines: Sequence[str], num_prompts: int,
                 prompt_tokens: int, new_tokens: int) -> dict[str, np.ndarray]:
  """T5X decoder-only features of the first `num_prompts` lines longer than `prompt_tokens`
  tokens: BOS, the prompt, then room for `new_tokens`."""
  prompts = [ids[:prompt_tokens] for ids in sp.encode(list(lines)) if len(ids) > prompt_tokens]
  if len(prompts) < num_prompts:
    raise ValueError(f"only {len(prompts)} sentences have more than {prompt_tokens} tokens")
  prompts = np.asarray(prompts[:num_prompts], np.int32)
  tokens = np.zeros((num_prompts, 1 + prompt_tokens + new_tokens), np.int32)
  tokens[:, 1:1 + prompt_tokens] = prompts
  causal = np.zeros_like(tokens)
  causal[:, :1 + prompt_tokens] = 1
  return {"decoder_input_tokens": tokens, "decoder_causal_attention": causal}


def measure(target: network.DecoderOnlyTransformer, params: Any, draft: core.Draft,
            draft_params: Any, batch: dict[str, np.ndarray], temperature: float,
            batch_size: int, seed: int) -> dict[str, float]:
  """Summed speculative counters over `batch` in chunks of `batch_size`, and their ratios."""
  decoder = core.Decoder.create("speculative_sample", target, draft, gamma=1,
                                temperature=temperature)
  # Parameters are arguments, not constants folded into the compiled decode.
  predict = jax.jit(lambda p, dp, b, rng: decoder.predict(p, dp, b, EOS_ID, rng)[1])
  totals = {name: 0.0 for name in stats.SpeculativeStats.counter_names()}
  num_rows = len(batch["decoder_input_tokens"])
  for start in range(0, num_rows, batch_size):
    chunk = {k: jnp.asarray(v[start:start + batch_size]) for k, v in batch.items()}
    aux = predict(params, draft_params, chunk, jax.random.PRNGKey(seed + start))
    for name in totals:
      totals[name] += float(np.sum(aux[name]))
  return {**totals, **{k: float(v) for k, v in stats.SpeculativeStats.ratios(totals).items()}}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--target", required=True, help="the target's T5X checkpoint")
  parser.add_argument("--draft", required=True, help="the draft LM's T5X checkpoint")
  parser.add_argument("--target_gin", default="configs/train/lm_target.gin")
  parser.add_argument("--draft_gin", default="configs/train/lm_draft.gin")
  parser.add_argument("--bigram", required=True, help="`python -m spec_decode.data.ngrams` .npz")
  parser.add_argument("--unigram", required=True)
  parser.add_argument("--prompts", required=True, help="held-out text, one sentence a line")
  parser.add_argument("--vocabulary", default=str(paths.DEMO_ASSETS / "spm_ende_8k.model"))
  parser.add_argument("--num_prompts", type=int, default=1000)
  parser.add_argument("--prompt_tokens", type=int, default=8)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=100)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)

  target = network.DecoderOnlyTransformer(config_of(args.target_gin))
  draft_network = network.DecoderOnlyTransformer(config_of(args.draft_gin))
  params = t5x_format.load_t5x(args.target)
  sp = spm.SentencePieceProcessor(model_file=args.vocabulary)
  lines = pathlib.Path(args.prompts).read_text(encoding="utf-8").split("\n")
  batch = prompt_batch(sp, lines, args.num_prompts, args.prompt_tokens, args.new_tokens)
  drafts = {}
  for name, path in (("unigram", args.unigram), ("bigram", args.bigram)):
    model = ngram_format.load(path)
    drafts[name] = (core.make_draft("ngram", None, ngram_draft=core.NGramDraft.of(model)), model)
  drafts["draft LM"] = (draft_network, t5x_format.load_t5x(args.draft))

  print(f"{len(batch['decoder_input_tokens'])} prompts of {args.prompt_tokens} tokens from "
        f"{args.prompts}, up to {args.new_tokens} new tokens, gamma 1", flush=True)
  rows = []
  for name, (draft, draft_params) in drafts.items():
    alphas = []
    for temperature in (0.0, 1.0):
      start = time.time()
      result = measure(target, params, draft, draft_params, batch, temperature,
                       args.batch_size, args.seed)
      alphas.append(result["alpha"])
      print(f"{name} T={temperature:g}: alpha {result['alpha']:.3f} over "
            f"{result['verified_positions']:.0f} verified positions, "
            f"{result['generated_tokens']:.0f} tokens ({time.time() - start:.0f}s)", flush=True)
    rows.append(f"| {name} | {alphas[0]:.3f} | {alphas[1]:.3f} |")
  print("\n| draft | alpha, T = 0 | alpha, T = 1 |\n|---|---|---|\n" + "\n".join(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
