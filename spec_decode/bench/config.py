"""The benchmark's settings: one frozen dataclass per suite, plus the pair and the run.

Nothing here registers with gin. The configs in configs/bench/*.gin register and bind
these classes themselves (`from spec_decode import bench`, then `bench.PairConfig.gamma = 2`;
the package re-exports them), and the CLI reads a bound instance with
`gin_utils.configured(PairConfig)()`. Defaults are the documented values of default.gin.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

# The suites in the order they run; `BenchConfig.suites` selects among them.
SUITES = ("own_baseline", "engine_cost", "peer", "simulated_table2", "physical_limit",
          "verify_cost")


@dataclasses.dataclass(frozen=True)
class PairConfig:
  """The target/draft pair of own_baseline and peer, and how it decodes.

  `source`: 'demo' (the shipped pair of `checkpoints.demo_pair`, with its bundled English inputs),
  'random' (random weights with the configs of `target_gin`/`draft_gin` plus the overrides, and
  random inputs: encoder inputs, or with decoder-only model files a language model's prompts,
  each continued to the end of its `input_length + max_decode_len` positions), 'near_bigram'
  (`pairs.near_bigram_pair`: a random `target_gin` target with its residual branches scaled by
  `residual_scale` and a draft of one layer per stack made of the target's own arrays;
  `draft_gin` unused), or 'auto' (demo when its files exist, else random; the shipped pair takes
  no model bindings). Random and near-bigram pairs decode with no EOS (every row runs to the end
  of its decode), so their timings do not depend on where a random model happens to stop.
  `gamma` is the speculative decoders' (own_baseline's main one and the peer comparison's).
  `step_calls` decoder calls (or iterations' worth of calls) make one timed loop of
  `timing.call_sequence_seconds` (c, v, the interleaved iteration, physical_limit); the median
  of `step_repetitions` loops counts.
  """
  source: str = "auto"
  target_gin: str = "configs/demo/target.gin"
  draft_gin: str = "configs/demo/draft.gin"
  target_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  draft_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  input_prefix: str = "translate English to German: "
  input_length: int = 64
  max_decode_len: int = 64
  gamma: int = 5
  num_random_inputs: int = 32
  step_calls: int = 32
  step_repetitions: int = 5
  seed: int = 0
  residual_scale: float = 0.01


@dataclasses.dataclass(frozen=True)
class OwnBaselineConfig:
  """`sweep_gammas`, the block verifier and the adaptive policies (drafting up to the largest
  swept gamma) are timed at `comparison_batch_sizes` only."""
  temperatures: Sequence[float] = (0.0, 1.0)
  batch_sizes: Sequence[int] = (1, 8)
  comparison_batch_sizes: Sequence[int] = (1,)
  sweep_gammas: Sequence[int] = (3, 5, 7)
  repetitions: int = 5


@dataclasses.dataclass(frozen=True)
class PeerConfig:
  """`num_threads` for PyTorch: None = the cores this process may use (as JAX uses). The
  assistant drafts `PairConfig.gamma` tokens per iteration with `assistant_schedule`
  (Hugging Face's 'constant', or its own 'heuristic'). `torch_device`: where Hugging Face's
  models run: 'cpu', 'cuda', or 'auto' (CUDA when torch sees it, else the CPU)."""
  temperatures: Sequence[float] = (0.0, 1.0)
  repetitions: int = 5
  num_threads: int | None = None
  assistant_schedule: str = "constant"
  torch_device: str = "cpu"


@dataclasses.dataclass(frozen=True)
class SimulatedTable2Config:
  """Random-weight models with the paper's dimensions; `rows` are keys of `paper.TABLE2`.

  Every row uses the same `draft_gin` (the paper's rows differ in their draft; here only alpha,
  gamma and the temperature change), decodes `max_decode_len` tokens with no EOS. `step_calls`
  and `step_repetitions` as in `PairConfig`.
  """
  target_gin: str = "configs/models/t5_1_1/large.gin"
  draft_gin: str = "configs/models/t5_1_1/small.gin"
  target_overrides: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: {"dtype": "float32"})
  draft_overrides: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: {"dtype": "float32"})
  rows: Sequence[str] = ("ende_small_t0", "ende_small_t1")
  input_length: int = 32
  max_decode_len: int = 32
  batch_size: int = 1
  repetitions: int = 2
  step_calls: int = 8
  step_repetitions: int = 3
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class EngineCostConfig:
  """`targets`: 'pair' and/or 'simulated' (simulated_table2's pair); per temperature and gamma,
  the speculative loop's and the baseline's kernels and seconds per iteration at batch 1,
  `repetitions` interleaved rounds."""
  targets: Sequence[str] = ("pair", "simulated")
  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int] = (2, 3, 5, 7)
  repetitions: int = 5


@dataclasses.dataclass(frozen=True)
class PhysicalLimitConfig:
  """`targets`: 'pair' (the pair's target) and/or 'simulated' (simulated_table2's target)."""
  targets: Sequence[str] = ("pair", "simulated")
  copy_mib: int = 512
  copy_repetitions: int = 5


@dataclasses.dataclass(frozen=True)
class VerifyCostConfig:
  """v(k) for k in `num_tokens` of random-weight models with each of `model_gins` (plus
  `overrides`; T5's or decoder-only LMs'), batch 1, `input_length` encoded tokens (a language
  model's prompt), a self-attention cache of `cache_length` positions (after the prompt);
  `calls` calls per timed loop, the median of `repetitions` interleaved loops counts; with
  `compare_xla_defaults` the calls compiled with XLA's defaults are timed too. The roofline's
  read bandwidth sums a `read_mib` MiB array and its FLOP/s time a [matmul_rows, matmul_size] x
  [matmul_size, matmul_size] matmul, each the median of `bandwidth_repetitions`."""
  model_gins: Sequence[str] = ("configs/models/t5_1_1/base.gin",
                               "configs/models/t5_1_1/large.gin")
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"dtype": "float32"})
  num_tokens: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8)
  input_length: int = 64
  cache_length: int = 64
  calls: int = 4
  repetitions: int = 7
  compare_xla_defaults: bool = True
  read_mib: int = 512
  matmul_rows: int = 512
  matmul_size: int = 1024
  bandwidth_repetitions: int = 5
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """`compiler_options`: XLA options for every compiled decoder and timing loop. Empty for a
  measurement; the smoke config lowers optimization to halve compile times, which makes its
  timings unrepresentative (the report says so). `num_partitions`: our decoders run on the
  mesh (data 1, model num_partitions), as `spec_decode.infer` with that `num_partitions` on that many
  devices: the target split over them, the draft replicated, any batch size. The calls' c and
  v (`call_costs`) are measured on one device whatever the mesh."""
  suites: Sequence[str] = SUITES
  output_dir: str = "out/bench"
  compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  num_partitions: int = 1
