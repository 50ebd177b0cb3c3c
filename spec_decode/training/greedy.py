"""Greedy (temperature 0) translation with the project's engine, for evaluation and BLEU.

Contract:
- `greedy_decode(config, params, encoder_input_tokens [B, Le], max_decode_len)` ->
  `decodes [B, max_decode_len]` int32: tokens of positions 1..L, EOS (1) included, PAD 0 after.
  It runs the encoder once (`network.init_decode_cache`) and the cached decoder one token per
  step through the core's `temperature_sample` loop at temperature 0.
- `translate(config, params, sp, sources, ...)` -> detokenized strings in input order
  (task prefix added, sources truncated to `max_input_len` tokens incl. EOS).
- `add_corpus_arguments(parser, ...)` / `translate_corpora(args)`: the command-line half shared
  by the programs that translate corpora with a demo model (`spec_decode.training.bleu`, `distill`).
"""
from __future__ import annotations

import argparse
import functools
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm

from spec_decode import core
from spec_decode.data import corpora
from spec_decode.training import data
from spec_decode.checkpoints import demo_pair
from spec_decode.t5 import network
from spec_decode.t5 import vocab


@functools.partial(jax.jit, static_argnames=("config", "max_decode_len"))
def greedy_decode(config: network.T5Config, params: Any, encoder_input_tokens: jax.Array,
                  max_decode_len: int) -> jax.Array:
  decoder = core.Decoder.create("temperature_sample", network.Transformer(config),
                                temperature=0.0)
  batch = {"encoder_input_tokens": encoder_input_tokens,
           "decoder_input_tokens": jnp.zeros((encoder_input_tokens.shape[0], max_decode_len),
                                             jnp.int32)}
  return decoder.predict(params, None, batch, data.EOS_ID)[0]


def translate(config: network.T5Config, params: Any, sp: spm.SentencePieceProcessor,
              sources: Sequence[str], max_input_len: int, max_decode_len: int,
              batch_size: int) -> list[str]:
  ids = [vocab.trim_with_eos(x, max_input_len)
         for x in sp.encode([corpora.TRANSLATE_PREFIX + s for s in sources])]
  # Length-sorted batches finish sooner: the loop stops when every row has emitted EOS.
  order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
  outputs = [""] * len(ids)
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    # A fixed batch shape (empty rows pad the last batch) means a single compilation.
    enc = np.zeros((batch_size, max_input_len), np.int32)
    for j, i in enumerate(rows):
      enc[j, :len(ids[i])] = ids[i]
    decodes = np.asarray(greedy_decode(config, params, enc, max_decode_len))
    for j, i in enumerate(rows):
      outputs[i] = sp.decode(vocab.until_eos(decodes[j].tolist()))  # EOS, a control piece, renders as ""
  return outputs


def add_corpus_arguments(parser: argparse.ArgumentParser, max_len: int, batch_size: int) -> None:
  """--model, --corpus (repeatable), --data_root, --max_input_len, --max_decode_len, --batch_size."""
  parser.add_argument("--model", default="target", help='"target", "draft" or a .safetensors path')
  parser.add_argument("--corpus", action="append", required=True, help="e.g. multi30k/test")
  parser.add_argument("--data_root", default=None, help="default: $SPEC_DECODE_DATA_ROOT")
  parser.add_argument("--max_input_len", type=int, default=max_len)
  parser.add_argument("--max_decode_len", type=int, default=max_len)
  parser.add_argument("--batch_size", type=int, default=batch_size)


def translate_corpora(args: argparse.Namespace, limit: int | None = None
                      ) -> Iterator[tuple[str, list[str], list[str], list[str]]]:
  """For each --corpus, once it is translated: (name, sources, references, greedy translations
  by --model). Every corpus and the model are read before anything is translated, so a missing
  file fails first."""
  parallel_texts = [(corpus, *corpora.read_parallel([corpus], data_root=args.data_root))
                    for corpus in args.corpus]
  config, params = demo_pair.load_model(args.model)
  sp = spm.SentencePieceProcessor(model_file=str(demo_pair.VOCAB_PATH))
  for corpus, sources, references in parallel_texts:
    sources, references = sources[:limit], references[:limit]
    yield (corpus, sources, references,
           translate(config, params, sp, sources, args.max_input_len, args.max_decode_len,
                     args.batch_size))
