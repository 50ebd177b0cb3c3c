"""The physical_limit suite: decoder weight bytes read per batch-1 baseline step / step time,
as a fraction of the machine's copy bandwidth measured in the same run (also with the key/value
cache bytes counted), for the pair's and/or the simulated pair's target."""

from __future__ import annotations

from typing import Any

import numpy as np

from spec_decode.bench.config import PhysicalLimitConfig
from spec_decode.bench.pairs import Model
from spec_decode.bench.timing import copy_bandwidth
from spec_decode.bench.workspace import Workspace
from spec_decode.t5 import network


def kv_cache_bytes_per_step(model: Model, input_length: int, cache_length: int) -> int:
  """Key/value bytes one batch-1 decoder call reads: self-attention over the whole cache
  (masked, not skipped) in every layer, and an encoder-decoder's cross-attention over the
  encoded input (a language model's prompt is in its cache)."""
  config = model.config
  per_position = 2 * config.num_heads * config.head_dim * np.dtype(config.dtype).itemsize
  if network.is_decoder_only(config):
    return int(config.num_layers * per_position * cache_length)
  return int(config.num_decoder_layers * per_position * (cache_length + input_length))


def physical_limit_suite(workspace: Workspace, config: PhysicalLimitConfig) -> dict[str, Any]:
  """Per target: decoder weight bytes per batch-1 step / step time, as a fraction of the copy
  bandwidth (also with the key/value cache bytes counted)."""
  unknown = [which for which in config.targets if which not in workspace.configs]
  if unknown:
    raise ValueError(f"PhysicalLimitConfig.targets must name {sorted(workspace.configs)}, "
                     f"got {unknown}")
  copy = copy_bandwidth(config.copy_mib, config.copy_repetitions,
                        workspace.compiler_options)
  targets = []
  for which in config.targets:
    pair = workspace.pair(which)
    seconds = workspace.step(which, "target", 1, 1)
    weight_bytes = pair.target.decode_step_weight_bytes
    cache_bytes = kv_cache_bytes_per_step(pair.target, pair.inputs.shape[1], pair.decode_length)
    targets.append({
        "model": pair.target.name, "num_params": pair.target.num_params, "batch_size": 1,
        "step_s": seconds, "weight_bytes_per_step": weight_bytes,
        "weight_bytes_per_s": weight_bytes / seconds,
        "fraction_of_copy_bandwidth": weight_bytes / seconds / copy["bytes_per_s"],
        "kv_cache_bytes_per_step": cache_bytes,
        "fraction_with_kv_cache": (weight_bytes + cache_bytes) / seconds / copy["bytes_per_s"]})
  return {"copy": copy, "targets": targets}
