"""`spec_decode.bench`: how fast speculative decoding is, and against what.

Run it with `python -m spec_decode.bench` (`bench.cli`). The configs in
configs/bench/*.gin bind the config classes as this package exports them
(`from spec_decode import bench`, then `bench.PairConfig.gamma = 2`).

Modules, one job each:
  config      the gin-bound settings: PairConfig, OwnBaselineConfig, PeerConfig,
              SimulatedTable2Config, PhysicalLimitConfig, VerifyCostConfig, BenchConfig;
              SUITES.
  paper       the paper's Table 2 (Leviathan et al. 2023), the project's one copy: TABLE2.
  simulated   the benchmark-only coin acceptance rule (SIMULATED), never a selectable verifier.
  machine     the machine a run measured.
  pairs       Model and Pair: the shipped demo pair, random-weight pairs, the training-free
              near-bigram pair (a draft that agrees with its target most of the time); T5
              encoder-decoders or decoder-only language models, as the model gin files say.
  hf_worker   Hugging Face generate in its own process, for the peer suite.
  decoders    Variant (one decoder setting), PairDecoders (compiled, timed runs), RunOutput.
  timing      interleave, summarize, call and step timers, copy and read bandwidth, matmul
              FLOP/s.
  theory      Theorem 3.8's predictions beside a measured speedup.
  workspace   the pairs, decoders and step timings a run's suites share.
  kernels     the kernels a compiled decoding loop executes per iteration, engine and models
              apart.
  suites/     own_baseline, engine_cost, peer (Hugging Face), simulated_table2,
              physical_limit, verify_cost (v(k) for k = 1..8 beside the roofline).
  thresholds  the levels measured ratios are compared with, recorded and never asserted.
  report      bench.json and the markdown tables.
  cli         the command line and `run_suites`.

The public API (what scripts/reproduce_table2.py and the tests use), re-exported here:
  configs         PairConfig, OwnBaselineConfig, EngineCostConfig, PeerConfig,
                  SimulatedTable2Config, PhysicalLimitConfig, VerifyCostConfig, BenchConfig,
                  SUITES
  the paper       paper.TABLE2, paper.Table2Row
  models          Model, Pair, random_model, random_pair, near_bigram_pair, build_pair,
                  shipped_pair, demo_files_exist
  decoding        Variant, PairDecoders, RunOutput, generated_lengths
  timing          interleave, summarize, step_seconds, call_sequence_seconds, copy_bandwidth,
                  read_bandwidth, matmul_throughput
  theory          predicted_speedup, realized_speedup, compare_with_theory, model_call_share
  SIMULATED       simulated_acceptance_rule, SIMULATED
  the run         describe_machine, thresholds, run_suites, main, to_markdown, write_report,
                  JSON_FILE, MARKDOWN_FILE
"""

from spec_decode.bench import paper
from spec_decode.bench.cli import main, run_suites
from spec_decode.bench.config import (SUITES, BenchConfig, EngineCostConfig,
                                      OwnBaselineConfig, PairConfig, PeerConfig,
                                      PhysicalLimitConfig, SimulatedTable2Config,
                                      VerifyCostConfig)
from spec_decode.bench.decoders import PairDecoders, RunOutput, Variant, generated_lengths
from spec_decode.bench.thresholds import thresholds
from spec_decode.bench.machine import describe_machine
from spec_decode.bench.pairs import (Model, Pair, build_pair, demo_files_exist,
                                     near_bigram_pair, random_model, random_pair, shipped_pair)
from spec_decode.bench.report import JSON_FILE, MARKDOWN_FILE, to_markdown, write_report
from spec_decode.bench.simulated import SIMULATED, simulated_acceptance_rule
from spec_decode.bench.theory import (compare_with_theory, model_call_share, predicted_speedup,
                                      realized_speedup)
from spec_decode.bench.timing import (call_sequence_seconds, copy_bandwidth, interleave,
                                      matmul_throughput, read_bandwidth, step_seconds,
                                      summarize)

__all__ = [
    "SUITES", "BenchConfig", "EngineCostConfig", "OwnBaselineConfig", "PairConfig", "PeerConfig",
    "PhysicalLimitConfig", "SimulatedTable2Config", "VerifyCostConfig", "paper", "Model",
    "Pair", "random_model",
    "random_pair", "near_bigram_pair", "build_pair", "shipped_pair", "demo_files_exist", "Variant", "PairDecoders",
    "RunOutput", "generated_lengths", "interleave", "summarize", "step_seconds",
    "call_sequence_seconds", "copy_bandwidth", "read_bandwidth", "matmul_throughput",
    "predicted_speedup", "realized_speedup",
    "compare_with_theory", "model_call_share", "simulated_acceptance_rule", "SIMULATED",
    "describe_machine", "thresholds", "run_suites", "main", "to_markdown", "write_report",
    "JSON_FILE", "MARKDOWN_FILE",
]
