"""Peak host memory (RSS) of restoring a T5X TensorStore checkpoint into 8 simulated devices.

Run: `python scripts/restore_rss.py [--directory DIR] [--num_partitions P]`. It writes a random
T5X checkpoint (T5.1.1-small-sized, float32, about 320 MB; kept in DIR when given),
then restores it in a fresh process with 8 CPU devices, once per method:
  * sharded: `decode_layout.decode_layout(...).restore` (what `spec_decode.infer` does): every
    TensorStore array read slice by slice into its shards;
  * whole: `formats.load_params` (the whole target in host memory) then `jax.device_put` onto
    one device and to the shardings (what `spec_decode.infer` did before).
For each it prints the process's RSS before the restore, its peak (ru_maxrss) after, and the
bytes the devices hold. On CPU the devices' buffers ARE host memory, so the peak always
includes them: what a restore adds on top (peak - before - device bytes) is its host overhead,
which for the sharded restore must stay far below the checkpoint's size.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# T5.1.1 small's shapes but 8 heads (so 8 partitions divide them): about 80M parameters,
# about 320 MB in float32.
CONFIG = dict(vocab_size=32128, emb_dim=512, num_heads=8, head_dim=64, num_encoder_layers=8,
              num_decoder_layers=8, mlp_dim=1024, mlp_activations=("gelu", "linear"),
              dropout_rate=0.0, logits_via_embedding=False, dtype="float32")
MIB = 2**20


def _config():
  from spec_decode.t5 import network  # pylint: disable=g-import-not-at-top
  return network.T5Config(**CONFIG)


def write_checkpoint(directory: pathlib.Path) -> str:
  """A random T5X checkpoint (gzip zarr arrays) of CONFIG; returns its path."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import t5x_format  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda leaf: rng.standard_normal(leaf.shape, np.float32),
      t5x_format.expected_param_shapes(_config()))
  return t5x_format.save_t5x(params, str(directory), step=1)


def _rss_mib() -> float:
  with open("/proc/self/status", encoding="ascii") as f:
    fields = dict(line.split(":", 1) for line in f)
  return int(fields["VmRSS"].split()[0]) / 1024


def restore_in_this_process(path: str, method: str, num_partitions: int) -> dict:
  """Restores `path` by `method` and returns the memory figures (MiB)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spec_decode.checkpoints import formats  # pylint: disable=g-import-not-at-top
  from spec_decode.runtime import decode_layout  # pylint: disable=g-import-not-at-top
  from spec_decode.runtime import partitioning  # pylint: disable=g-import-not-at-top
  from spec_decode.t5 import network  # pylint: disable=g-import-not-at-top
  module = network.Transformer(_config())
  layout = decode_layout.decode_layout(
      partitioning.PjitPartitioner(num_partitions=num_partitions), module.config)
  jax.block_until_ready(jax.numpy.zeros(8))  # the runtime's own memory before measuring
  before = _rss_mib()
  if method == "sharded":
    params = layout.restore("target", module, path)
  else:
    params = jax.device_put(jax.device_put(formats.load_params(module, path)),
                            layout.params_shardings)
  jax.block_until_ready(params)
  device_bytes = sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(params)
                     for shard in leaf.addressable_shards)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
  return {"method": method, "devices": jax.device_count(), "mesh": dict(layout.mesh.shape),
          "rss_before_mib": before, "peak_rss_mib": peak,
          "device_mib": device_bytes / MIB, "overhead_mib": peak - before - device_bytes / MIB}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--directory", default=None, help="where the checkpoint goes (default: "
                      "a temporary directory, removed afterwards)")
  parser.add_argument("--num_partitions", type=int, default=8)
  parser.add_argument("--child", nargs=2, metavar=("PATH", "METHOD"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(restore_in_this_process(*args.child, args.num_partitions)))
    return 0
  with tempfile.TemporaryDirectory() as scratch:
    directory = pathlib.Path(args.directory or scratch) / "rss_checkpoint"
    path = (str(directory / "checkpoint_1") if (directory / "checkpoint_1").exists()
            else write_checkpoint(directory))
    on_disk = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / MIB
    from spec_decode.runtime import partitioning  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    shapes, _ = partitioning.abstract_params(_config())
    param_mib = sum(leaf.size * leaf.dtype.itemsize
                    for leaf in jax.tree_util.tree_leaves(shapes)) / MIB
    print(f"checkpoint: {param_mib:.0f} MiB of float32 parameters, {on_disk:.0f} MiB on disk "
          f"(gzip zarr)")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    for method in ("sharded", "whole"):
      child = subprocess.run(
          [sys.executable, __file__, "--child", path, method,
           f"--num_partitions={args.num_partitions}"],
          env=env, capture_output=True, text=True, check=True)
      result = json.loads(child.stdout.strip().splitlines()[-1])
      print(f"{method:>7}: mesh {result['mesh']}, RSS before {result['rss_before_mib']:.0f} MiB,"
            f" peak {result['peak_rss_mib']:.0f} MiB, devices hold "
            f"{result['device_mib']:.0f} MiB, host overhead {result['overhead_mib']:.0f} MiB "
            f"({result['overhead_mib'] / param_mib:.2f} x the parameters)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
