"""`python -m spec_decode.training.export_demo`: a trainer checkpoint as a shipped demo model.

Run: `python -m spec_decode.training.export_demo --checkpoint out/target/checkpoint_N.msgpack
--gin_file configs/demo/target.gin --output spec_decode/assets/demo/target.safetensors`.
The checkpoint is the trainer's own format (`train.save_checkpoint`); the model gin file gives
the `network.T5Config` stored beside the weights (`spec_decode.checkpoints.demo_pair`'s format).
"""

from __future__ import annotations

import argparse
import os
import pathlib
from typing import Any, Sequence

import flax.serialization

from spec_decode import gin_utils
from spec_decode.checkpoints import demo_pair


def params_from_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
  """The params of a trainer checkpoint (`checkpoint_<step>.msgpack`), as numpy arrays."""
  state = flax.serialization.msgpack_restore(pathlib.Path(path).read_bytes())
  return state["params"]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m spec_decode.training.export_demo",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--checkpoint", required=True, help="checkpoint_<step>.msgpack")
  parser.add_argument("--gin_file", required=True, help="model gin file binding network.T5Config")
  parser.add_argument("--output", required=True, help="output .safetensors path")
  args = parser.parse_args(argv)
  demo_pair.save_model(params_from_checkpoint(args.checkpoint),
                       gin_utils.read_model_config(args.gin_file), args.output)
  print(f"wrote {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB)")


if __name__ == "__main__":
  main()
