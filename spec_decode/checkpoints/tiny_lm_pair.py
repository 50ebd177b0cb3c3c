"""A tiny random decoder-only target/draft pair on disk: what the tests and the README's
language-model command run (random weights continue prompts with noise, but every path a real
pair takes is taken, and speculative decoding must still reproduce the target's own decodes).

`python -m spec_decode.checkpoints.tiny_lm_pair DIR [--vocabulary FILE]` writes to DIR (and
`write_pair` returns the paths): `target.gin` (a model gin file binding
`network.DecoderOnlyConfig`, like configs/models/decoder_only/), T5X checkpoints `target_t5x/`
and `draft_t5x/` of random parameters (`t5x_format.random_params`, T5X's decoder-only tree:
the draft's config is read back from its shapes), and `infer.gin`, a `spec_decode.infer` run
of the pair (greedy, compared with the target alone, outputs in DIR/infer) that takes its
prompts from --text or --input_file. The vocabulary (default: the shipped demo's) sets both
models' vocab_size. The target ties its logits to the embedding (as T5X's decoder-only configs
do), the draft has its own logits layer, so both layouts are exercised.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Sequence

from spec_decode import paths
from spec_decode.checkpoints import t5x_format
from spec_decode.t5 import network
from spec_decode.t5 import vocab

DEFAULT_VOCABULARY = paths.DEMO_ASSETS / "spm_ende_8k.model"
TARGET_SHAPE = dict(emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=32,
                    logits_via_embedding=True)
DRAFT_SHAPE = dict(emb_dim=8, num_heads=2, head_dim=4, num_layers=1, mlp_dim=16,
                   logits_via_embedding=False)
# The run `infer.gin` describes: prompts of up to 32 tokens continued by 16.
TASK_FEATURE_LENGTHS = {"inputs": 32, "targets": 16}


@dataclasses.dataclass(frozen=True)
class TinyLMPair:
  target: network.DecoderOnlyConfig
  draft: network.DecoderOnlyConfig
  target_gin: str
  target_checkpoint: str
  draft_checkpoint: str
  infer_gin: str
  vocabulary: str


def tiny_config(vocab_size: int, shape: dict) -> network.DecoderOnlyConfig:
  """A float32 decoder-only config of `shape` (TARGET_SHAPE or DRAFT_SHAPE), gated gelu."""
  return network.DecoderOnlyConfig(vocab_size=vocab_size, dtype="float32",
                                   mlp_activations=("gelu", "linear"), dropout_rate=0.0,
                                   **shape)


def model_gin(config: network.DecoderOnlyConfig) -> str:
  """A model gin file's text binding `config`, as configs/models/decoder_only/ files do."""
  lines = ["from __gin__ import dynamic_registration", "from spec_decode.t5 import network",
           "network.DecoderOnlyTransformer.config = @network.DecoderOnlyConfig()"]
  lines += [f"network.DecoderOnlyConfig.{field.name} = {getattr(config, field.name)!r}"
            for field in dataclasses.fields(config)]
  return "\n".join(lines) + "\n"


def write_pair(directory: str | pathlib.Path, vocabulary: str | pathlib.Path = DEFAULT_VOCABULARY,
               seed: int = 0) -> TinyLMPair:
  """Writes the pair's files to `directory` (see the module docstring)."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  vocabulary = str(paths.resolve(str(vocabulary)))
  vocab_size = vocab.SentencePieceVocabulary(vocabulary, 0).vocab_size
  target, draft = tiny_config(vocab_size, TARGET_SHAPE), tiny_config(vocab_size, DRAFT_SHAPE)
  target_gin = directory / "target.gin"
  target_gin.write_text(model_gin(target))
  checkpoints = [t5x_format.save_t5x(t5x_format.random_params(config, seed + i),
                                     str(directory / f"{name}_t5x"), step=1)
                 for i, (name, config) in enumerate((("target", target), ("draft", draft)))]
  infer_gin = directory / "infer.gin"
  infer_gin.write_text(f"""\
# A spec_decode.infer run of the tiny random decoder-only pair: prompts from --text or
# --input_file, continued greedily, speculatively and by the target alone.
include 'configs/runs/infer.gin'
include '{target_gin}'
include 'configs/decoding/speculative_decoder_only.gin'
from __gin__ import dynamic_registration
from spec_decode import models

VOCABULARY = @models.sentencepiece_vocabulary()
models.sentencepiece_vocabulary.sentencepiece_model_file = '{vocabulary}'
CHECKPOINT_PATH = '{checkpoints[0]}'
DRAFT_CHECKPOINT_PATH = '{checkpoints[1]}'
MIXTURE_OR_TASK_NAME = None
TASK_FEATURE_LENGTHS = {TASK_FEATURE_LENGTHS!r}
BATCH_SIZE = 2
GAMMA = 3
TEMPERATURE = 0.0
COMPARE_WITH_BASELINE = True
INFER_OUTPUT_DIR = '{directory / "infer"}'
""")
  return TinyLMPair(target, draft, str(target_gin), checkpoints[0], checkpoints[1],
                    str(infer_gin), vocabulary)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m spec_decode.checkpoints.tiny_lm_pair",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("directory", help="where the pair's files are written")
  parser.add_argument("--vocabulary", default=str(DEFAULT_VOCABULARY),
                      help="SentencePiece model both models use (its size is their vocab_size)")
  args = parser.parse_args(argv)
  pair = write_pair(args.directory, args.vocabulary)
  print(f"wrote {pair.target_checkpoint}, {pair.draft_checkpoint}; run:\n"
        f"python -m spec_decode.infer --gin_file={pair.infer_gin} --text 'The station is'")


if __name__ == "__main__":
  main()
