"""The verify_cost suite: v(k) = seconds of a k-token cached decoder call / seconds of a 1-token
call (batch 1), for k in `VerifyCostConfig.num_tokens` and each model of `model_gins` (random
weights), beside this machine's roofline for it.

Speculative decoding pays when the target's (gamma+1)-token verification call costs about what
a 1-token call costs (the paper's v ~ 1): a batch-1 decode step is bound by reading the weights,
and k rows of activations instead of one add FLOPs, not bytes. Per model:

  * measured: each k's call timed in one jitted loop (`call_costs`), all k interleaved
    (k=1, 2, ..., 8, k=1, 2, ... so load drift hits all alike), compiled as our decoders are
    (the default platform's compiler options and products: `platforms.Platform`); with
    `compare_xla_defaults` the same calls as XLA alone compiles them too (its default options,
    its own dots), interleaved with ours ('xla_v').
  * roofline: weight_s = weight bytes a step reads / the measured read bandwidth; flop_s(k) =
    2 k (weights a step multiplies) / the measured matmul FLOP/s. 'roofline_v' =
    max(weight_s, flop_s(k)) / max(weight_s, flop_s(1)) (reading and computing overlapped,
    the hardware's limit) and 'serial_v' = (weight_s + flop_s(k)) / (weight_s + flop_s(1))
    (nothing overlapped). Attention over the cache, norms and the softmax are left out of both.
  * 'read_bandwidth_fraction': weight bytes / the 1-token call's seconds / read bandwidth.

Weights a step reads: the decoder's kernels except the cross-attention key/value projections
(those run once per input, in `init_decode_cache`), the relative-position table, the norms, and
the logits layer (or the tied embedding).
"""

from __future__ import annotations

import gc
import os
from typing import Any

import jax

from spec_decode.runtime import call_costs
from spec_decode.bench.config import VerifyCostConfig
from spec_decode.bench.pairs import Model, random_model
from spec_decode.bench.timing import matmul_throughput, read_bandwidth
from spec_decode.bench.workspace import Workspace
from spec_decode.t5 import network


def step_weights(model: Model) -> dict[str, int]:
  """{'bytes': parameter bytes one cached decoder call reads, 'matmul_params': the kernel
  values it multiplies each fed token by} (see the module docstring)."""
  leaves = jax.tree_util.tree_leaves_with_path(model.decode_step_trees())
  read = matmul = 0
  for path, leaf in leaves:
    keys = [getattr(entry, "key", None) for entry in path]
    if "encoder_decoder_attention" in keys and keys[-2] in ("key", "value"):
      continue
    read += leaf.size * leaf.dtype.itemsize
    if keys[-1] in ("kernel", "embedding"):
      matmul += leaf.size
  return {"bytes": int(read), "matmul_params": int(matmul)}


def _model_costs(model: Model, config: VerifyCostConfig, read_bytes_per_s: float,
                 flops_per_s: float, compiler_options: Any) -> dict[str, Any]:
  ks = list(config.num_tokens)
  sequences = {f"ours k={k}": [(model.module, model.params, k)] for k in ks}
  xla_defaults = {}
  if config.compare_xla_defaults:
    for k in ks:
      sequences[f"xla k={k}"] = [(model.module, model.params, k)]
      xla_defaults[f"xla k={k}"] = True
  timed = call_costs.interleaved_call_seconds(
      sequences, batch_size=1, input_length=config.input_length,
      cache_length=network.decode_length(model.config, config.input_length,
                                         config.cache_length),
      loops=config.calls, repetitions=config.repetitions,
      compiler_options=compiler_options, xla_defaults=xla_defaults)
  weights = step_weights(model)
  weight_s = weights["bytes"] / read_bytes_per_s

  def flop_s(k: int) -> float:
    return 2.0 * k * weights["matmul_params"] / flops_per_s

  one = timed["ours k=1"]["median_s"] if 1 in ks else None
  rows = []
  for k in ks:
    row = {"k": k, "step_s": timed[f"ours k={k}"]["median_s"],
           "step_s_all": timed[f"ours k={k}"]["all_s"],
           "roofline_v": max(weight_s, flop_s(k)) / max(weight_s, flop_s(1)),
           "serial_v": (weight_s + flop_s(k)) / (weight_s + flop_s(1))}
    if one:
      row["v"] = row["step_s"] / one
    if config.compare_xla_defaults:
      row["xla_step_s"] = timed[f"xla k={k}"]["median_s"]
      row["xla_step_s_all"] = timed[f"xla k={k}"]["all_s"]
      row["ours_over_xla"] = row["step_s"] / row["xla_step_s"]
      if 1 in ks:
        row["xla_v"] = row["xla_step_s"] / timed["xla k=1"]["median_s"]
    rows.append(row)
  result = {"model": model.name, "num_params": model.num_params,
            "weight_bytes_per_step": weights["bytes"],
            "matmul_params_per_token": weights["matmul_params"],
            "roofline_weight_s": weight_s, "roofline_flop_s_per_token": flop_s(1), "rows": rows}
  if one:
    result["read_bandwidth_fraction"] = weights["bytes"] / one / read_bytes_per_s
  return result


def verify_cost_suite(workspace: Workspace, config: VerifyCostConfig) -> dict[str, Any]:
  """Per model: v(k) measured (ours and XLA's defaults) beside the roofline."""
  if not config.num_tokens or min(config.num_tokens) < 1:
    raise ValueError(f"VerifyCostConfig.num_tokens must be positive, got {config.num_tokens}")
  options = workspace.compiler_options
  read = read_bandwidth(config.read_mib, config.bandwidth_repetitions, options)
  matmul = matmul_throughput(config.matmul_rows, config.matmul_size,
                             config.bandwidth_repetitions, options)
  models = []
  for i, gin_file in enumerate(config.model_gins):
    name = "/".join(os.path.splitext(gin_file)[0].split("/")[-2:])  # e.g. t5_1_1/large
    model = random_model(f"{name} (random)", gin_file, config.overrides, config.seed + i)
    models.append(_model_costs(model, config, read["bytes_per_s"], matmul["flops_per_s"],
                               options))
    del model  # one model's weights in memory at a time
    gc.collect()
  return {"read_bandwidth": read, "matmul": matmul, "batch_size": 1,
          "input_length": config.input_length, "cache_length": config.cache_length,
          "calls_per_loop": config.calls, "repetitions": config.repetitions,
          "models": models}


def largest(suite: dict[str, Any]) -> dict[str, Any] | None:
  """The suite's model with the most parameters (the thresholds' subject)."""
  return max(suite["models"], key=lambda m: m["num_params"], default=None)

