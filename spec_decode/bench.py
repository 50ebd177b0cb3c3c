"""`python -m spec_decode.bench`: how fast speculative decoding is, and against what.

Run: `python -m spec_decode.bench [--gin_file=FILE ...] [--gin_bindings=B ...] [--smoke]
[--suites=own_baseline,peer,simulated_table2,physical_limit] [--output_dir=DIR]`.
Without --gin_file it reads `spec_decode/configs/bench/default.gin`; `--smoke` adds `spec_decode/configs/bench/smoke.gin`
(tiny random models, one repetition). It writes `DIR/bench.json` (every number, the machine and
the operative gin config) and `DIR/bench.md` (the same as markdown tables), and prints the tables.

Suites (each `<suite>_suite(workspace, config, ...) -> dict` of plain JSON data; the configs
are the gin-configurable dataclasses below, bound in spec_decode/configs/bench/*.gin):
  own_baseline     the pair of `PairConfig` (the shipped demo pair when its files exist, else
                   random weights): `decoding.temperature_sample` vs `decoding.speculative_sample`
                   per temperature and batch size, timed in interleaved repetitions on the same
                   inputs; alpha; c and v from single cached decoder calls; the decoding loops'
                   speedup against the paper's prediction (`drafting.expected_tokens_per_cost`)
                   and two refinements of it (`compare_with_theory`). At the comparison batch
                   sizes it also times a fixed-gamma sweep, the block verifier and the adaptive
                   drafting policies ('expected_speedup' with the measured c and v bound,
                   'confidence').
  peer             the same weights exported with `checkpoints.save_hf`, decoded by Hugging
                   Face `T5ForConditionalGeneration.generate` (PyTorch, CPU) without and with
                   `assistant_model`, interleaved with ours, batch 1; greedy agreement token for
                   token.
  simulated_table2 Leviathan et al. (2023), Table 2, SIMULATED: random-weight T5.1.1 target and
                   draft, acceptance forced to the paper's alpha by an i.i.d. coin
                   (`simulated_acceptance_rule`), measured speedup vs the formula.
  physical_limit   decoder weight bytes read per baseline step / step time, against the
                   machine's copy bandwidth measured in the same run.

Goals are recorded in the output with how far each is from its target; nothing is asserted.

Timing: every decoder and every timed step is compiled (and run once) before it is timed; a
timed call ends at `jax.block_until_ready`. Decoders take the parameters as jit arguments and
run as two compiled calls, the prefill (encoders, caches) and the decoding loop, timed apart:
tokens/s count both, the comparisons with Theorem 3.8 the loop alone.
Token counts follow one rule for every decoder, ours and Hugging Face's: a row's tokens run up to
and including its first EOS, else to the length limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import paths
from spec_decode.t5 import checkpoints
from spec_decode.engine import decoding
from spec_decode.engine import drafting
from spec_decode import models
from spec_decode.t5 import network
from spec_decode.engine import verify

if __name__ == "__main__":
  # `python -m` runs this file as __main__; configs bind `bench.*` configurables of the importable
  # module, and defining them twice would register them twice. Run the importable module instead.
  from spec_decode import bench as _bench  # pylint: disable=g-import-not-at-top
  sys.exit(_bench.main())

DEFAULT_GIN_FILE = "spec_decode/configs/bench/default.gin"
SMOKE_GIN_FILE = "spec_decode/configs/bench/smoke.gin"
JSON_FILE = "bench.json"
MARKDOWN_FILE = "bench.md"
SUITES = ("own_baseline", "peer", "simulated_table2", "physical_limit")
SIMULATED = "SIMULATED"

# Goals (recorded, never asserted).
GOAL_MEASURED_OVER_PREDICTED = 0.9
GOAL_OURS_OVER_HF_ASSISTED = 2.0
GOAL_BANDWIDTH_FRACTION = 0.5
GOAL_BANDWIDTH_MIN_PARAMS = 200_000_000

# Leviathan, Kalman & Matias (ICML 2023), Table 2: target T5-XXL (11B), batch 1, TPU-v4.
# name -> (task, draft M_q, temperature, gamma, alpha, walltime speedup).
PAPER_TABLE2 = {
    "ende_small_t0": ("EnDe", "T5-small", 0.0, 7, 0.75, 3.4),
    "ende_base_t0": ("EnDe", "T5-base", 0.0, 7, 0.80, 2.8),
    "ende_large_t0": ("EnDe", "T5-large", 0.0, 7, 0.82, 1.7),
    "ende_small_t1": ("EnDe", "T5-small", 1.0, 7, 0.62, 2.6),
    "ende_base_t1": ("EnDe", "T5-base", 1.0, 5, 0.68, 2.4),
    "ende_large_t1": ("EnDe", "T5-large", 1.0, 3, 0.71, 1.4),
    "cnndm_small_t0": ("CNNDM", "T5-small", 0.0, 5, 0.65, 3.1),
    "cnndm_base_t0": ("CNNDM", "T5-base", 0.0, 5, 0.73, 3.0),
    "cnndm_large_t0": ("CNNDM", "T5-large", 0.0, 3, 0.74, 2.2),
    "cnndm_small_t1": ("CNNDM", "T5-small", 1.0, 5, 0.53, 2.3),
    "cnndm_base_t1": ("CNNDM", "T5-base", 1.0, 3, 0.55, 2.2),
    "cnndm_large_t1": ("CNNDM", "T5-large", 1.0, 3, 0.56, 1.7),
}


# --------------------------------------------------------------------------- configuration


@dataclasses.dataclass(frozen=True)
class PairConfig:
  """The target/draft pair of own_baseline and peer, and how it decodes.

  `source`: 'demo' (the shipped pair of `spec_decode.t5.demo_pair`, with its bundled English inputs),
  'random' (random weights with the configs of `target_gin`/`draft_gin` plus the overrides, and
  random inputs), or 'auto' (demo when its files exist, else random). A random pair decodes
  with no EOS (every row runs to `max_decode_len`), so its timings do not depend on where a
  random model happens to stop. `gamma` is the speculative decoders' (own_baseline's main one and
  the peer comparison's). `step_calls` decoder calls (or iterations' worth of calls) make one
  timed loop of `call_sequence_seconds` (c, v, the interleaved iteration, physical_limit); the
  median of `step_repetitions` loops counts.
  """
  source: str = "auto"
  target_gin: str = "spec_decode/configs/demo/target.gin"
  draft_gin: str = "spec_decode/configs/demo/draft.gin"
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
  (Hugging Face's 'constant', or its own 'heuristic')."""
  temperatures: Sequence[float] = (0.0, 1.0)
  repetitions: int = 5
  num_threads: int | None = None
  assistant_schedule: str = "constant"


@dataclasses.dataclass(frozen=True)
class SimulatedTable2Config:
  """Random-weight models with the paper's dimensions; `rows` are keys of `PAPER_TABLE2`.

  Every row uses the same `draft_gin` (the paper's rows differ in their draft; here only alpha,
  gamma and the temperature change), decodes `max_decode_len` tokens with no EOS. `step_calls`
  and `step_repetitions` as in `PairConfig`.
  """
  target_gin: str = "spec_decode/configs/models/t5_1_1/large.gin"
  draft_gin: str = "spec_decode/configs/models/t5_1_1/small.gin"
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
class PhysicalLimitConfig:
  """`targets`: 'pair' (the pair's target) and/or 'simulated' (simulated_table2's target)."""
  targets: Sequence[str] = ("pair", "simulated")
  copy_mib: int = 512
  copy_repetitions: int = 5


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """`compiler_options`: XLA options for every compiled decoder and timing loop. Empty for a
  measurement; the smoke config lowers optimization to halve compile times, which makes its
  timings unrepresentative (the report says so)."""
  suites: Sequence[str] = SUITES
  output_dir: str = "out/bench"
  compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- the coin rule


def simulated_acceptance_rule(alpha: float) -> verify.Rule:
  """SIMULATED, benchmark only: accepts each draft by an i.i.d. coin of probability `alpha`.

  The returned rule ignores p and q when deciding: after n accepted drafts of the m a row
  proposed, the next is accepted with probability alpha, so P(n) = alpha^n (1 - alpha) for
  n < m and alpha^m for n = m; the token emitted after them comes from the target's p at that
  position. It is NOT exact and is deliberately not registered in `verify.EXACT_RULES` or
  `verify.LOSSY_RULES`: no config selects it by name as its verifier.
  """
  if not 0.0 <= alpha < 1.0:
    raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")

  def rule(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array,
           num_drafted: jax.Array) -> verify.Verdict:
    del draft_probs
    num_accepted = jnp.arange(draft_tokens.shape[1] + 1)[None]
    num_drafted = num_drafted[:, None]
    stop_early = alpha ** num_accepted * (1.0 - alpha)
    accept_all = alpha ** num_accepted
    law = jnp.where(num_accepted < num_drafted, stop_early,
                    jnp.where(num_accepted == num_drafted, accept_all, 0.0))
    return verify.Verdict(num_accepted_probs=law, next_token_probs=target_probs)

  return rule


# --------------------------------------------------------------------------- machine


def _usable_cores() -> int:
  """The cores this process may run on (what JAX's CPU backend uses)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def describe_machine() -> dict[str, Any]:
  """CPU model, cores, memory, load and the software stack the numbers were measured with
  (the load matters: on a shared machine every timing is only as good as it)."""
  cpu_model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu_model = names[0] if names else cpu_model
  except OSError:
    pass
  try:
    memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    memory_bytes = None
  return {
      "cpu_model": cpu_model,
      "cpu_count": os.cpu_count(),
      "usable_cores": _usable_cores(),
      "memory_bytes": memory_bytes,
      "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
      "platform": platform.platform(),
      "python": platform.python_version(),
      "jax_version": jax.__version__,
      "jax_backend": jax.default_backend(),
      "jax_devices": [str(device) for device in jax.devices()],
  }


# --------------------------------------------------------------------------- models and pairs


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A named `network.Transformer` with its parameters (on the default device)."""
  name: str
  module: network.Transformer
  params: Any

  @property
  def config(self) -> network.T5Config:
    return self.module.config

  @property
  def num_params(self) -> int:
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(self.params)))

  @property
  def decode_step_weight_bytes(self) -> int:
    """Parameter bytes one cached decoder call reads: the decoder stack and its logits layer
    (the shared embedding too when the logits go through it; otherwise the token lookup reads
    only a few rows, neglected)."""
    trees = [self.params["decoder"]]
    if self.config.logits_via_embedding:
      trees.append(self.params["token_embedder"])
    return int(sum(leaf.size * leaf.dtype.itemsize
                   for leaf in jax.tree_util.tree_leaves(trees)))

  def describe(self) -> dict[str, Any]:
    config = dataclasses.asdict(self.config)
    config["dtype"] = np.dtype(self.config.dtype).name
    return {"name": self.name, "num_params": self.num_params, "config": config}


def random_params(module: network.Transformer, seed: int) -> Any:
  """Random float32 parameters with the module's shapes, drawn by numpy.

  Nothing is compiled (T5.1.1-large's 780M values take seconds, not a compiled `init`): shapes
  come from an abstract `init`; layer-norm scales are 1, embeddings N(0, 1), every other
  leaf N(0, 1/fan_in) with fan_in its first axis, so activations stay of order 1. Only the
  shapes matter for speed.
  """
  tokens = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), tokens, tokens, tokens)["params"]
  rng = np.random.default_rng(seed)

  def draw(path: tuple, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, np.float32)
    values = rng.standard_normal(leaf.shape, np.float32)
    if name != "embedding":
      values *= np.float32(1.0 / np.sqrt(leaf.shape[0]))
    return values

  return jax.device_put(jax.tree_util.tree_map_with_path(draw, shapes))


def random_model(name: str, gin_file: str, overrides: Mapping[str, Any], seed: int) -> Model:
  """A model with the config of a model gin file (plus overrides) and random weights."""
  module = models.transformer_from_gin_file(gin_file, dict(overrides))
  return Model(name, module, random_params(module, seed))


@dataclasses.dataclass(frozen=True, eq=False)
class Pair:
  """A target, its draft, the encoder inputs they decode ([N, input_length], 0-padded), the EOS
  id (`target.config.vocab_size` = none: every row runs to its length limit) and the decode
  length."""
  name: str
  target: Model
  draft: Model
  inputs: np.ndarray
  eos_id: int
  max_decode_len: int
  description: str

  @property
  def has_eos(self) -> bool:
    return self.eos_id < self.target.config.vocab_size

  def batch(self, index: int, batch_size: int) -> np.ndarray:
    """The index-th batch of inputs, cycling through them (each repetition sees new ones)."""
    rows = [(index * batch_size + i) % len(self.inputs) for i in range(batch_size)]
    return self.inputs[rows]


def random_inputs(vocab_size: int, input_length: int, count: int, seed: int) -> np.ndarray:
  """`count` rows of random tokens (ids >= 3, past T5's pad/eos/unk) of random length, each
  ending in EOS (1), 0-padded to input_length."""
  rng = np.random.default_rng(seed)
  inputs = np.zeros((count, input_length), np.int32)
  for row in inputs:
    length = int(rng.integers(input_length // 2, input_length))
    row[:length - 1] = rng.integers(3, vocab_size, length - 1)
    row[length - 1] = 1
  return inputs


def _demo_files_exist() -> bool:
  from spec_decode.t5 import demo_pair  # pylint: disable=g-import-not-at-top
  return all((demo_pair.ASSET_DIR / f"{name}.safetensors").exists()
             for name in ("target", "draft"))


def shipped_pair(texts: Sequence[str], input_prefix: str, input_length: int,
                 max_decode_len: int, description: str) -> Pair:
  """The shipped demo pair decoding `texts` (English; prefixed, encoded and 0-padded to
  input_length with room kept for EOS, as seqio's append_eos_after_trim and `spec_decode.infer`
  do)."""
  from spec_decode.t5 import demo_pair  # pylint: disable=g-import-not-at-top
  from spec_decode.t5 import vocab  # pylint: disable=g-import-not-at-top
  if not _demo_files_exist():
    raise FileNotFoundError(f"{demo_pair.ASSET_DIR} lacks target.safetensors or draft.safetensors")
  loaded = {}
  for name in ("target", "draft"):
    model_config, params = demo_pair.load_model(name)
    loaded[name] = Model(f"demo {name}", network.Transformer(model_config),
                         jax.device_put(params))
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  inputs = np.zeros((len(texts), input_length), np.int32)
  for row, text in zip(inputs, texts):
    ids = vocabulary.encode(input_prefix + text)[:input_length - 1]
    row[:len(ids) + 1] = ids + [vocabulary.eos_id]
  return Pair("demo", loaded["target"], loaded["draft"], inputs, vocabulary.eos_id,
              max_decode_len, description)


def _demo_pair(config: PairConfig) -> Pair:
  from spec_decode.t5 import demo_pair  # pylint: disable=g-import-not-at-top
  texts = (demo_pair.ASSET_DIR / "examples.en").read_text().splitlines()
  return shipped_pair(texts, config.input_prefix, config.input_length, config.max_decode_len,
                   "the shipped demo pair (spec_decode/assets/demo), bundled English sentences")


def random_pair(name: str, config: PairConfig | SimulatedTable2Config, num_inputs: int
                ) -> Pair:
  """Random weights with the configs' model gin files, random inputs, no EOS."""
  target = random_model(f"{name} target", config.target_gin, config.target_overrides,
                        config.seed)
  draft = random_model(f"{name} draft", config.draft_gin, config.draft_overrides,
                       config.seed + 1)
  vocab_size = target.config.vocab_size
  inputs = random_inputs(vocab_size, config.input_length, num_inputs, config.seed)
  return Pair(name, target, draft, inputs, vocab_size, config.max_decode_len,
              f"random weights ({config.target_gin}, {config.draft_gin}), random inputs, no EOS")


def build_pair(config: PairConfig) -> Pair:
  if config.source not in ("auto", "demo", "random"):
    raise ValueError(f"PairConfig.source must be 'auto', 'demo' or 'random', got "
                     f"{config.source!r}")
  if config.source == "demo" or (config.source == "auto" and _demo_files_exist()):
    return _demo_pair(config)
  return random_pair("random", config, config.num_random_inputs)


# --------------------------------------------------------------------------- decoders


@dataclasses.dataclass(frozen=True)
class Variant:
  """One decoder setting: the baseline (gamma None) or a speculative decoder.

  `policy_bindings` are keyword arguments bound into the drafting policy; `simulated_alpha`
  replaces the verifier by `simulated_acceptance_rule(simulated_alpha)`.
  """
  temperature: float
  gamma: int | None = None
  verifier: str = "token"
  draft_policy: str = "fixed"
  policy_bindings: tuple[tuple[str, float], ...] = ()
  simulated_alpha: float | None = None

  @property
  def is_baseline(self) -> bool:
    return self.gamma is None

  @property
  def label(self) -> str:
    if self.is_baseline:
      return "baseline"
    if self.simulated_alpha is not None:
      return f"{SIMULATED} coin alpha={self.simulated_alpha:g} gamma={self.gamma}"
    if self.draft_policy == "fixed":
      return f"{self.verifier} fixed gamma={self.gamma}"
    return f"{self.verifier} {self.draft_policy} gamma<={self.gamma}"

  def verifier_rule(self) -> str | verify.Rule:
    if self.simulated_alpha is not None:
      return simulated_acceptance_rule(self.simulated_alpha)
    return self.verifier

  def policy(self) -> str | drafting.Policy:
    if not self.policy_bindings:
      return self.draft_policy
    return functools.partial(drafting.get_policy(self.draft_policy), **dict(self.policy_bindings))


@dataclasses.dataclass
class RunOutput:
  """One timed decode: seconds of the whole call (encoders included), tokens generated,
  decodes [B, L], speculative counters summed over rows (None for the baseline) and, for our
  decoders, the seconds of the decoding loop alone (what Theorem 3.8 models)."""
  seconds: float
  tokens: int
  decodes: np.ndarray
  stats: dict[str, float] | None = None
  decode_seconds: float | None = None


def generated_lengths(decodes: np.ndarray, eos_id: int | None) -> np.ndarray:
  """Tokens per row of decodes [B, L]: up to and including the first EOS, else L."""
  decodes = np.asarray(decodes)
  if eos_id is None:
    return np.full(decodes.shape[0], decodes.shape[1])
  is_eos = decodes == eos_id
  return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, decodes.shape[1])


def _jitted_decoder(pair: Pair, variant: Variant, compiler_options: Mapping[str, Any]
                    ) -> tuple[Callable, Callable]:
  """The two compiled halves of one decode, timed apart:
  prefill(target_params, draft_params, encoder_tokens [B, Le]) -> caches: the encoders and the
    decode caches (the draft's only for a speculative variant);
  decode(target_params, draft_params, caches, rng) -> (decodes [B, L], stats or None): the
    decoding loop alone."""
  target, draft, max_decode_len = pair.target, pair.draft, pair.max_decode_len

  def prefill(target_params, draft_params, encoder_tokens):
    caches = [network.init_decode_cache(target.module, target_params, encoder_tokens,
                                        max_decode_len)]
    if not variant.is_baseline:
      caches.append(network.init_decode_cache(draft.module, draft_params, encoder_tokens,
                                              max_decode_len))
    return caches

  def decode(target_params, draft_params, caches, rng):
    inputs = jnp.zeros((caches[0]["encoder_mask"].shape[0], max_decode_len), jnp.int32)
    tokens_to_logits = network.make_tokens_to_logits(target.module, target_params)
    if variant.is_baseline:
      decodes, _ = decoding.temperature_sample(
          inputs, caches[0], tokens_to_logits, pair.eos_id, decode_rng=rng,
          temperature=variant.temperature)
      return decodes[:, 0], None
    decodes, _, stats = decoding.speculative_sample(
        inputs, caches[0], tokens_to_logits, pair.eos_id, draft_cache=caches[1],
        draft_tokens_to_logits=network.make_tokens_to_logits(draft.module, draft_params),
        gamma=variant.gamma, decode_rng=rng, temperature=variant.temperature,
        verifier=variant.verifier_rule(), draft_policy=variant.policy())
    return decodes[:, 0], stats

  options = dict(compiler_options)
  return (jax.jit(prefill, compiler_options=options),
          jax.jit(decode, compiler_options=options))


_STAT_FIELDS = ("target_calls", "draft_calls", "drafted_tokens", "accepted_tokens",
                "generated_tokens", "acceptance_sum", "verified_positions")


class PairDecoders:
  """Our compiled decoders of one pair, one per variant (jax keeps one executable per batch
  shape), as timed runs: `run(variant, repetition, batch_size) -> RunOutput`."""

  def __init__(self, pair: Pair, compiler_options: Mapping[str, Any]):
    self.pair = pair
    self.compiler_options = compiler_options
    self._decoders: dict[Variant, Callable] = {}

  def run(self, variant: Variant, repetition: int, batch_size: int) -> RunOutput:
    if variant not in self._decoders:
      self._decoders[variant] = _jitted_decoder(self.pair, variant,
                                                  self.compiler_options)
    prefill, decode = self._decoders[variant]
    params = (self.pair.target.params, self.pair.draft.params)
    encoder_tokens = jnp.asarray(self.pair.batch(repetition, batch_size))
    rng = jax.random.PRNGKey(repetition)
    start = time.perf_counter()
    caches = jax.block_until_ready(prefill(*params, encoder_tokens))
    loop_start = time.perf_counter()
    decodes, stats = jax.block_until_ready(decode(*params, caches, rng))
    end = time.perf_counter()
    decodes = np.asarray(decodes)
    eos = self.pair.eos_id if self.pair.has_eos else None
    summed = None
    if stats is not None:
      summed = {name: float(np.sum(getattr(stats, name))) for name in _STAT_FIELDS}
    return RunOutput(end - start, int(generated_lengths(decodes, eos).sum()), decodes, summed,
                     decode_seconds=end - loop_start)


def interleave(runs: Mapping[str, Callable[[int], RunOutput]], repetitions: int
               ) -> dict[str, list[RunOutput]]:
  """Runs each callable once untimed (compilation, warm-up), then `repetitions` rounds of
  A B C ... A B C ...; each callable gets the round index (its inputs and rng)."""
  for run in runs.values():
    run(0)
  outputs: dict[str, list[RunOutput]] = {label: [] for label in runs}
  for repetition in range(repetitions):
    for label, run in runs.items():
      outputs[label].append(run(repetition))
  return outputs


def summarize(outputs: Sequence[RunOutput]) -> dict[str, Any]:
  """tokens/s of whole calls (median, min, max, relative spread), total tokens and seconds; for
  our decoders also the total seconds of the decoding loops alone and total tokens / those; for
  a speculative decoder also alpha, accepted and generated tokens per target call."""
  rates = [out.tokens / out.seconds for out in outputs]
  median = statistics.median(rates)
  summary: dict[str, Any] = {
      "tokens_per_s": median,
      "tokens_per_s_min": min(rates),
      "tokens_per_s_max": max(rates),
      "relative_spread": (max(rates) - min(rates)) / median,
      "tokens_per_s_all": rates,
      "tokens": sum(out.tokens for out in outputs),
      "seconds": sum(out.seconds for out in outputs),
  }
  if all(out.decode_seconds is not None for out in outputs):
    # Totals, not a median: the counters the predictions use are totals too.
    summary["decode_seconds"] = sum(out.decode_seconds for out in outputs)
    summary["decode_tokens_per_s"] = summary["tokens"] / summary["decode_seconds"]
  if outputs[0].stats is not None:
    total = {name: sum(out.stats[name] for out in outputs) for name in _STAT_FIELDS}
    calls = max(total["target_calls"], 1.0)
    summary.update(
        alpha=total["acceptance_sum"] / max(total["verified_positions"], 1.0),
        accepted_per_target_call=total["accepted_tokens"] / calls,
        tokens_per_target_call=total["generated_tokens"] / calls,
        draft_calls_per_target_call=total["draft_calls"] / calls,
        accepted_over_drafted=total["accepted_tokens"] / max(total["drafted_tokens"], 1.0),
        counters=total)
  return summary


def predicted_speedup(alpha: float, gamma: int, cost_ratio: float, verify_cost: float) -> float:
  """The paper's Theorem 3.8 walltime improvement (via `drafting.expected_tokens_per_cost`)."""
  return float(drafting.expected_tokens_per_cost(alpha, gamma, cost_ratio, verify_cost))


def realized_speedup(summary: Mapping[str, Any], costs: Mapping[str, float]) -> float:
  """Theorem 3.8's cost model fed with what the run realized instead of an i.i.d. alpha:
  tokens per target call / (draft calls per target call * c + v).

  The formula's alpha assumes independent acceptances and unbounded outputs; an output ending
  (EOS or the length limit cuts the last block) and positions harder than others give fewer
  tokens per call than (1 - alpha^(gamma+1)) / (1 - alpha). Measured / this isolates the
  implementation's own cost from the formula's assumptions.
  """
  return summary["tokens_per_target_call"] / (
      summary["draft_calls_per_target_call"] * costs["c"] + costs["v"])


def compare_with_theory(speculative: Mapping[str, Any], baseline: Mapping[str, Any],
                        costs: Mapping[str, float], alpha: float, gamma: int,
                        batch_size: int) -> dict[str, Any]:
  """The decoding-loop speedup of `speculative` (a fixed-gamma decoder) over `baseline`
  (summaries) beside three predictions, each dropping one more assumption of Theorem 3.8:
  from alpha (`predicted_speedup`); from the realized tokens and draft calls per target call
  (`realized_speedup`); and from the realized tokens per call priced with an iteration's model
  calls timed together (`costs['iteration_calls_s']`). What separates the measured speedup from
  the last is the engine's own work outside the networks."""
  decode_speedup = speculative["decode_tokens_per_s"] / baseline["decode_tokens_per_s"]
  predicted = predicted_speedup(alpha, gamma, costs["c"], costs["v"])
  realized = realized_speedup(speculative, costs)
  # The realized counts priced with one iteration's model calls timed together (fixed gamma).
  interleaved = (speculative["tokens_per_target_call"] * costs["target_step_s"]
                 / costs["iteration_calls_s"])
  return {**costs, "decode_speedup": decode_speedup, "predicted_speedup": predicted,
          "measured_over_predicted": decode_speedup / predicted,
          "predicted_speedup_realized": realized,
          "measured_over_realized": decode_speedup / realized,
          "predicted_speedup_interleaved": interleaved,
          "measured_over_interleaved": decode_speedup / interleaved,
          "model_call_share": model_call_share(speculative, costs, batch_size)}


def model_call_share(summary: Mapping[str, Any], costs: Mapping[str, float],
                     batch_size: int) -> float:
  """The share of a decoder's decoding-loop time that its model calls alone take, priced with
  the measured step times: 1 means no time outside the networks, lower values show what the
  formula (which counts only model calls) leaves out. Rows' mean call counts stand for the
  loop's iterations (exact at batch 1, approximate when rows stop at different lengths)."""
  if "counters" in summary:
    counters = summary["counters"]
    seconds = (counters["target_calls"] * costs["verify_step_s"]
               + counters["draft_calls"] * costs["draft_step_s"])
  else:
    seconds = summary["tokens"] * costs["target_step_s"]
  return seconds / batch_size / summary["decode_seconds"]


# --------------------------------------------------------------------------- step timing


def call_sequence_seconds(calls: Sequence[tuple[Model, int]], batch_size: int,
                          input_length: int, cache_length: int, loops: int, repetitions: int,
                          compiler_options: Mapping[str, Any]) -> float:
  """Median seconds of one pass through `calls`: cached decoder calls, each (model, number of
  tokens fed per row), made in that order.

  Timed as one jitted `fori_loop` of `loops` passes, divided by `loops`: the engine makes its
  calls inside a `while_loop` too, so no per-call dispatch is counted. Every call's logits feed
  a running max, so none is optimized away. Each model's cache has `init_decode_cache`'s shapes
  but zero keys and values (every input position unmasked): the cost of a call does not depend
  on them, and running the encoder would cost one more compilation per timing.
  """
  encoder_tokens = jnp.ones((batch_size, input_length), jnp.int32)
  models = list({id(model): model for model, _ in calls}.values())
  caches = []
  for model in models:
    shapes = jax.eval_shape(
        functools.partial(network.init_decode_cache, model.module, max_decode_len=cache_length),
        model.params, encoder_tokens)
    cache = jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)
    cache["encoder_mask"] = jnp.ones_like(cache["encoder_mask"])
    caches.append(cache)
  slot = {id(model): i for i, model in enumerate(models)}
  sequences = jnp.zeros((batch_size, cache_length), jnp.int32)
  num_starts = max(cache_length - max(num_tokens for _, num_tokens in calls), 1)

  @functools.partial(jax.jit, compiler_options=dict(compiler_options))
  def run_calls(params, caches):
    tokens_to_logits = [network.make_tokens_to_logits(model.module, model_params)
                        for model, model_params in zip(models, params)]

    def one_pass(i, carry):
      caches, running_max = list(carry[0]), carry[1]
      for model, num_tokens in calls:
        state = decoding.DecodingState(
            cur_index=jnp.full((batch_size,), i % num_starts, jnp.int32),
            cur_token=jnp.full((batch_size, num_tokens), 3 + i % 5, jnp.int32),
            sequences=sequences, cache=caches[slot[id(model)]])
        logits, caches[slot[id(model)]] = tokens_to_logits[slot[id(model)]](state)
        running_max = jnp.maximum(running_max, jnp.max(logits))
      return caches, running_max

    return jax.lax.fori_loop(0, loops, one_pass, (caches, jnp.float32(-jnp.inf)))[1]

  params = [model.params for model in models]
  jax.block_until_ready(run_calls(params, caches))
  timings = []
  for _ in range(repetitions):
    start = time.perf_counter()
    jax.block_until_ready(run_calls(params, caches))
    timings.append((time.perf_counter() - start) / loops)
  return statistics.median(timings)


def step_seconds(model: Model, batch_size: int, num_tokens: int, input_length: int,
                 cache_length: int, calls: int, repetitions: int,
                 compiler_options: Mapping[str, Any]) -> float:
  """Median seconds of one cached decoder call feeding `num_tokens` tokens per row, alone
  (`call_sequence_seconds` of `calls` repeated calls)."""
  return call_sequence_seconds([(model, num_tokens)], batch_size, input_length, cache_length,
                               calls, repetitions, compiler_options)


def copy_bandwidth(mib: int, repetitions: int, compiler_options: Mapping[str, Any]
                   ) -> dict[str, float]:
  """The machine's copy bandwidth: bytes moved per second (read + write, as STREAM counts a
  copy) over a `mib` MiB float32 array, median of `repetitions`, measured two ways — a jitted
  elementwise pass writing into its donated input, and numpy's `copyto` into a preallocated
  array — the higher one being the reference. Both write into memory already touched: a fresh
  output buffer would time the kernel's page faults instead (several times slower)."""
  size = mib * 2**20 // 4

  def median_seconds(run: Callable[[], Any]) -> float:
    run()
    timings = []
    for _ in range(repetitions):
      start = time.perf_counter()
      run()
      timings.append(time.perf_counter() - start)
    return statistics.median(timings)

  scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0,
                  compiler_options=dict(compiler_options))
  buffer = [jnp.ones((size,), jnp.float32)]

  def xla_pass():
    buffer[0] = jax.block_until_ready(scale(buffer[0]))

  source = np.ones((size,), np.float32)
  destination = np.empty_like(source)
  moved = 2 * size * 4
  result = {"array_bytes": size * 4,
            "xla_bytes_per_s": moved / median_seconds(xla_pass),
            "numpy_bytes_per_s": moved / median_seconds(lambda: np.copyto(destination, source))}
  result["bytes_per_s"] = max(result["xla_bytes_per_s"], result["numpy_bytes_per_s"])
  return result


# --------------------------------------------------------------------------- workspace


class Workspace:
  """What the suites share, built on first use: the two pairs ('pair': PairConfig's,
  'simulated': SimulatedTable2Config's), their compiled decoders and their step timings."""

  def __init__(self, pair_config: PairConfig, simulated_config: SimulatedTable2Config,
               compiler_options: Mapping[str, Any]):
    self.compiler_options = compiler_options
    self.configs: dict[str, PairConfig | SimulatedTable2Config] = {
        "pair": pair_config, "simulated": simulated_config}
    self._pairs: dict[str, Pair] = {}
    self._decoders: dict[str, PairDecoders] = {}
    self._steps: dict[tuple, float] = {}

  def pair(self, which: str) -> Pair:
    if which not in self._pairs:
      if which == "pair":
        self._pairs[which] = build_pair(self.configs[which])
      else:
        self._pairs[which] = random_pair(f"{SIMULATED} T5.1.1", self.configs[which], 8)
    return self._pairs[which]

  def decoders(self, which: str) -> PairDecoders:
    if which not in self._decoders:
      self._decoders[which] = PairDecoders(self.pair(which), self.compiler_options)
    return self._decoders[which]

  def calls(self, which: str, batch_size: int, calls: tuple[tuple[str, int], ...]) -> float:
    """`call_sequence_seconds` of the pair's ('target' | 'draft', tokens fed) calls at its
    decode shapes, measured once."""
    key = (which, batch_size, calls)
    if key not in self._steps:
      pair, config = self.pair(which), self.configs[which]
      self._steps[key] = call_sequence_seconds(
          [(getattr(pair, model), num_tokens) for model, num_tokens in calls], batch_size,
          pair.inputs.shape[1], pair.max_decode_len, config.step_calls,
          config.step_repetitions, self.compiler_options)
    return self._steps[key]

  def step(self, which: str, model: str, batch_size: int, num_tokens: int) -> float:
    """Seconds of one call of the pair's 'target' or 'draft' alone."""
    return self.calls(which, batch_size, ((model, num_tokens),))

  def costs(self, which: str, batch_size: int, gamma: int) -> dict[str, float]:
    """c = draft 1-token call / target 1-token call, v = target (gamma+1)-token call / target
    1-token call (each model timed alone), the step times they come from, and the seconds of
    one fixed-gamma iteration's model calls made in the engine's order (draft: the 2-token
    catch-up and gamma - 1 one-token calls; target: the (gamma+1)-token call) in one loop —
    on a CPU whose cache holds the target alone but not both models, more than the sum."""
    target_step = self.step(which, "target", batch_size, 1)
    draft_step = self.step(which, "draft", batch_size, 1)
    verify_step = self.step(which, "target", batch_size, gamma + 1)
    iteration = self.calls(which, batch_size,
                           (("draft", 2),) + (("draft", 1),) * (gamma - 1)
                           + (("target", gamma + 1),))
    return {"c": draft_step / target_step, "v": verify_step / target_step,
            "target_step_s": target_step, "draft_step_s": draft_step,
            "verify_step_s": verify_step, "iteration_calls_s": iteration,
            "interleaved_over_isolated": iteration / (verify_step + gamma * draft_step)}


def _describe_pair(pair: Pair) -> dict[str, Any]:
  return {"name": pair.name, "description": pair.description, "eos_id": pair.eos_id,
          "has_eos": pair.has_eos, "input_length": int(pair.inputs.shape[1]),
          "num_inputs": int(pair.inputs.shape[0]), "max_decode_len": pair.max_decode_len,
          "target": pair.target.describe(), "draft": pair.draft.describe()}


# --------------------------------------------------------------------------- own_baseline


def _group_variants(config: OwnBaselineConfig, gamma: int, temperature: float, compared: bool,
                    max_costs: dict[str, float] | None) -> list[Variant]:
  """Baseline first, then the pair's speculative decoder, then (when compared) the rest of the
  fixed-gamma sweep, the block verifier at gamma and the adaptive policies up to the largest
  swept gamma ('expected_speedup' with that gamma's measured c and v bound)."""
  variants = [Variant(temperature), Variant(temperature, gamma)]
  if compared:
    max_gamma = max(config.sweep_gammas)
    variants += [Variant(temperature, g) for g in config.sweep_gammas if g != gamma]
    variants += [
        Variant(temperature, gamma, verifier="block"),
        Variant(temperature, max_gamma, draft_policy="expected_speedup", policy_bindings=(
            ("max_gamma", max_gamma), ("cost_ratio", max_costs["c"]),
            ("verify_cost", max_costs["v"]))),
        Variant(temperature, max_gamma, draft_policy="confidence")]
  return variants


def _is_paper_setting(variant: Variant) -> bool:
  """The paper's verifier and a fixed gamma: the setting its speedup formula describes."""
  return variant.verifier == "token" and variant.draft_policy == "fixed"


def own_baseline_suite(workspace: Workspace, config: OwnBaselineConfig) -> dict[str, Any]:
  """Per (temperature, batch size) group: the baseline and the speculative decoders, timed
  interleaved on the same inputs; for the paper's setting also c, v, the predicted speedup and
  measured / predicted; at comparison batch sizes the best fixed gamma and every decoder's
  tokens/s relative to it."""
  pair, decoders = workspace.pair("pair"), workspace.decoders("pair")
  gamma = workspace.configs["pair"].gamma
  groups = []
  for temperature in config.temperatures:
    for batch_size in config.batch_sizes:
      compared = batch_size in config.comparison_batch_sizes
      max_costs = (workspace.costs("pair", batch_size, max(config.sweep_gammas))
                   if compared else None)
      variants = _group_variants(config, gamma, temperature, compared, max_costs)
      outputs = interleave({v.label: functools.partial(decoders.run, v, batch_size=batch_size)
                            for v in variants}, config.repetitions)
      baseline = summarize(outputs["baseline"])
      rows = {}
      for variant in variants[1:]:
        row = summarize(outputs[variant.label])
        row["variant"] = dataclasses.asdict(variant)
        row["speedup"] = row["tokens_per_s"] / baseline["tokens_per_s"]
        if _is_paper_setting(variant):
          row.update(compare_with_theory(
              row, baseline, workspace.costs("pair", batch_size, variant.gamma), row["alpha"],
              variant.gamma, batch_size))
        rows[variant.label] = row
      baseline["model_call_share"] = model_call_share(
          baseline, workspace.costs("pair", batch_size, gamma), batch_size)
      group = {"temperature": temperature, "batch_size": batch_size, "gamma": gamma,
               "baseline": baseline, "speculative": rows[variants[1].label], "variants": rows}
      if compared:
        fixed = [v.label for v in variants[1:] if _is_paper_setting(v)]
        best = max(fixed, key=lambda label: rows[label]["tokens_per_s"])
        group["best_fixed"] = best
        group["tokens_per_s_over_best_fixed"] = {
            label: row["tokens_per_s"] / rows[best]["tokens_per_s"] for label, row in rows.items()}
      groups.append(group)
  return {"pair": _describe_pair(pair), "repetitions": config.repetitions, "groups": groups}


# --------------------------------------------------------------------------- peer


class HuggingFacePair:
  """The pair's weights as Hugging Face `T5ForConditionalGeneration` models (PyTorch, CPU),
  exported with `checkpoints.save_hf`; `run(temperature, assisted, repetition)` decodes the
  pair's batch-1 input of that repetition with `generate` and returns a RunOutput."""

  def __init__(self, pair: Pair, directory: str, gamma: int, num_threads: int,
               assistant_schedule: str):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self._torch, self._transformers = torch, transformers
    torch.set_num_threads(num_threads)
    # generate() warns about its own assistant's internal arguments on every assisted call,
    # and loading draws progress bars: neither belongs in the benchmark's output.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    loaded = {}
    for name in ("target", "draft"):
      model = getattr(pair, name)
      path = os.path.join(directory, name)
      checkpoints.save_hf(model.config, jax.device_get(model.params), path)
      loaded[name] = transformers.T5ForConditionalGeneration.from_pretrained(
          path, dtype=torch.float32).eval()
    self.target, self.draft = loaded["target"], loaded["draft"]
    self.pair = pair
    self.eos_id = pair.eos_id if pair.has_eos else None
    for model in (self.target, self.draft):
      # generate() fills every unset (None) option from the model's own generation config, so
      # a pair without EOS must clear it there: save_hf writes eos_token_id 1.
      model.generation_config.eos_token_id = self.eos_id
    self.draft.generation_config.num_assistant_tokens = gamma
    self.draft.generation_config.num_assistant_tokens_schedule = assistant_schedule
    # 0 disables the assistant's own confidence stop: it drafts gamma tokens, as ours does.
    self.draft.generation_config.assistant_confidence_threshold = 0.0

  def run(self, temperature: float, assisted: bool, repetition: int) -> RunOutput:
    torch = self._torch
    max_decode_len = self.pair.max_decode_len
    tokens = self.pair.batch(repetition, 1)[0]
    input_ids = torch.tensor(tokens[tokens > 0][None].astype(np.int64))
    # top_k=0: the full distribution, as ours (Hugging Face's default is 50).
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0 else {"do_sample": False})
    generation_config = self._transformers.GenerationConfig(
        max_new_tokens=max_decode_len, num_beams=1, use_cache=True,
        decoder_start_token_id=0, eos_token_id=self.eos_id, pad_token_id=0, **sampling)
    torch.manual_seed(repetition)
    with torch.inference_mode():
      start = time.perf_counter()
      output = self.target.generate(input_ids, generation_config=generation_config,
                                    assistant_model=self.draft if assisted else None)
      seconds = time.perf_counter() - start
    new_tokens = output[:, 1:].numpy()  # after the decoder start token
    decodes = np.zeros((1, max_decode_len), np.int32)
    decodes[:, :new_tokens.shape[1]] = new_tokens
    return RunOutput(seconds, int(generated_lengths(new_tokens, self.eos_id).sum()), decodes)


def greedy_agreement(reference: Sequence[RunOutput], other: Sequence[RunOutput],
                     eos_id: int | None) -> dict[str, Any]:
  """Token-for-token agreement of two decoders' batch-1 outputs on the same inputs."""
  identical, first_differences = 0, []
  for ref, out in zip(reference, other):
    ref_tokens = ref.decodes[0, :generated_lengths(ref.decodes, eos_id)[0]]
    out_tokens = out.decodes[0, :generated_lengths(out.decodes, eos_id)[0]]
    if np.array_equal(ref_tokens, out_tokens):
      identical += 1
      continue
    common = min(len(ref_tokens), len(out_tokens))
    differs = np.nonzero(ref_tokens[:common] != out_tokens[:common])[0]
    first_differences.append(int(differs[0]) if len(differs) else common)
  return {"identical": identical, "compared": len(reference),
          "all_identical": identical == len(reference),
          "first_difference_positions": first_differences}


def peer_suite(workspace: Workspace, config: PeerConfig, scratch_dir: str) -> dict[str, Any]:
  """Per temperature, batch 1: ours (baseline, speculative) and Hugging Face's (generate,
  assisted generate) interleaved on the same inputs; at temperature 0, whether each output is
  ours baseline's token for token. The exported models live in a temporary folder of
  `scratch_dir`."""
  pair, decoders = workspace.pair("pair"), workspace.decoders("pair")
  gamma = workspace.configs["pair"].gamma
  num_threads = config.num_threads or _usable_cores()
  result: dict[str, Any] = {"pair": pair.name, "batch_size": 1, "gamma": gamma,
                            "torch_num_threads": num_threads, "jax_usable_cores": _usable_cores(),
                            "assistant_schedule": config.assistant_schedule,
                            "max_decode_len": pair.max_decode_len, "temperatures": []}
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    result["error"] = f"Hugging Face peer unavailable: {e}"
    return result
  result.update(torch_version=torch.__version__, transformers_version=transformers.__version__)
  eos = pair.eos_id if pair.has_eos else None
  with tempfile.TemporaryDirectory(dir=scratch_dir) as directory:
    hf = HuggingFacePair(pair, directory, gamma, num_threads, config.assistant_schedule)
    for temperature in config.temperatures:
      runs = {
          "ours baseline": functools.partial(decoders.run, Variant(temperature), batch_size=1),
          "ours speculative": functools.partial(decoders.run, Variant(temperature, gamma),
                                                batch_size=1),
          "hf generate": functools.partial(hf.run, temperature, False),
          "hf assisted": functools.partial(hf.run, temperature, True),
      }
      entry: dict[str, Any] = {"temperature": temperature}
      try:
        outputs = interleave(runs, config.repetitions)
      except Exception as e:  # pylint: disable=broad-except
        # Recorded, not raised: e.g. a transformers cache that rejects unequal encoder and
        # decoder depths must not hide every other result.
        entry["error"] = f"{type(e).__name__}: {e}"
        result["temperatures"].append(entry)
        continue
      summaries = {label: summarize(out) for label, out in outputs.items()}
      rate = {label: summary["tokens_per_s"] for label, summary in summaries.items()}
      entry.update(summaries)
      entry["ours_speedup"] = rate["ours speculative"] / rate["ours baseline"]
      entry["hf_speedup"] = rate["hf assisted"] / rate["hf generate"]
      entry["ours_speculative_over_hf_assisted"] = rate["ours speculative"] / rate["hf assisted"]
      entry["ours_baseline_over_hf_generate"] = rate["ours baseline"] / rate["hf generate"]
      if temperature == 0:
        entry["greedy_agreement_with_ours_baseline"] = {
            label: greedy_agreement(outputs["ours baseline"], outputs[label], eos)
            for label in ("ours speculative", "hf generate", "hf assisted")}
      result["temperatures"].append(entry)
  return result


# --------------------------------------------------------------------------- simulated Table 2


def simulated_table2_suite(workspace: Workspace, config: SimulatedTable2Config
                           ) -> dict[str, Any]:
  """Per Table 2 row: the baseline and the SIMULATED coin decoder at the row's alpha, gamma and
  temperature, measured speedup against the formula with the measured c and v."""
  unknown = [row for row in config.rows if row not in PAPER_TABLE2]
  if unknown:
    raise ValueError(f"unknown Table 2 rows {unknown}; choose from {sorted(PAPER_TABLE2)}")
  pair, decoders = workspace.pair("simulated"), workspace.decoders("simulated")
  rows = []
  for name in config.rows:
    task, paper_draft, temperature, gamma, alpha, paper_speedup = PAPER_TABLE2[name]
    costs = workspace.costs("simulated", config.batch_size, gamma)
    baseline, coin = Variant(temperature), Variant(temperature, gamma, simulated_alpha=alpha)
    outputs = interleave(
        {label: functools.partial(decoders.run, variant, batch_size=config.batch_size)
         for label, variant in (("baseline", baseline), ("coin", coin))}, config.repetitions)
    base, spec = summarize(outputs["baseline"]), summarize(outputs["coin"])
    base["model_call_share"] = model_call_share(base, costs, config.batch_size)
    theory = compare_with_theory(spec, base, costs, alpha, gamma, config.batch_size)
    spec["model_call_share"] = theory.pop("model_call_share")
    rows.append({
        "row": name, "label": f"{SIMULATED} {task} M_q={paper_draft} T={temperature:g}",
        "simulated": True, "task": task, "paper_draft": paper_draft,
        "temperature": temperature, "gamma": gamma, "forced_alpha": alpha,
        "paper_speedup": paper_speedup, "batch_size": config.batch_size,
        "baseline": base, "speculative": spec, **theory,
        "expected_tokens_per_target_call": (1 - alpha ** (gamma + 1)) / (1 - alpha),
        "speedup": spec["tokens_per_s"] / base["tokens_per_s"]})
  return {"simulated": True,
          "note": (f"{SIMULATED}: random weights; every draft is accepted by an i.i.d. coin of "
                   "probability alpha (bench.simulated_acceptance_rule), not by p and q; the "
                   "draft model is the same for every row"),
          "pair": _describe_pair(pair), "repetitions": config.repetitions, "rows": rows}


# --------------------------------------------------------------------------- physical limit


def kv_cache_bytes_per_step(model: Model, input_length: int, cache_length: int) -> int:
  """Key/value bytes one batch-1 decoder call reads: self-attention over the whole cache
  (masked, not skipped) and cross-attention over the encoded input, in every layer."""
  config = model.config
  per_position = 2 * config.num_heads * config.head_dim * np.dtype(config.dtype).itemsize
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
    cache_bytes = kv_cache_bytes_per_step(pair.target, pair.inputs.shape[1], pair.max_decode_len)
    targets.append({
        "model": pair.target.name, "num_params": pair.target.num_params, "batch_size": 1,
        "step_s": seconds, "weight_bytes_per_step": weight_bytes,
        "weight_bytes_per_s": weight_bytes / seconds,
        "fraction_of_copy_bandwidth": weight_bytes / seconds / copy["bytes_per_s"],
        "kv_cache_bytes_per_step": cache_bytes,
        "fraction_with_kv_cache": (weight_bytes + cache_bytes) / seconds / copy["bytes_per_s"]})
  return {"copy": copy, "targets": targets}


# --------------------------------------------------------------------------- goals


def _goal(name: str, measured: float | None, target: float, note: str = "",
          strict: bool = False) -> dict[str, Any]:
  """A goal `measured >= target` (`>` when strict); `measured` None = not measured here."""
  goal = {"goal": name, "measured": measured, "target": target, "note": note}
  if measured is None:
    goal.update(met=None, status=f"not measured ({note})" if note else "not measured")
  elif measured > target or (measured == target and not strict):
    goal.update(met=True, status="met")
  else:
    goal.update(met=False, status=f"missed by {target - measured:.3g} "
                f"({measured / target:.0%} of the target)")
  return goal


def _theory_goals(where: str, row: Mapping[str, Any]) -> list[dict[str, Any]]:
  """Decoding-loop speedup >= 0.9x each prediction of `compare_with_theory`: from alpha (the
  issue's goal), from the realized counts, and from those priced with interleaved calls."""
  predictions = (("Theorem 3.8 with alpha", "measured_over_predicted"),
                 ("the realized tokens per target call", "measured_over_realized"),
                 ("the realized tokens per call and interleaved model calls",
                  "measured_over_interleaved"))
  return [_goal(f"{where}: measured decoding-loop speedup >= {GOAL_MEASURED_OVER_PREDICTED}x "
                f"predicted from {name}", row[key], GOAL_MEASURED_OVER_PREDICTED)
          for name, key in predictions]


def goals(suites: Mapping[str, Any]) -> list[dict[str, Any]]:
  """The issue's speed goals, each with its measured value and how far it is from the target."""
  result = []
  own = suites.get("own_baseline")
  if own:
    for group in own["groups"]:
      where = f"T={group['temperature']:g} batch {group['batch_size']}"
      if group["batch_size"] == 1:
        result += _theory_goals(f"own pair ({own['pair']['name']}) {where}",
                                group["speculative"])
      else:
        result.append(_goal(f"own pair {where}: speculative tokens/s > baseline tokens/s "
                            "(speedup > 1)", group["speculative"]["speedup"], 1.0,
                            strict=True))
  table2 = suites.get("simulated_table2")
  if table2:
    for row in table2["rows"]:
      result += _theory_goals(f"{row['label']} gamma={row['gamma']}", row)
  peer = suites.get("peer")
  if peer:
    for entry in peer["temperatures"]:
      mode = "greedy" if entry["temperature"] == 0 else f"sampling T={entry['temperature']:g}"
      result.append(_goal(f"batch 1 {mode}: ours speculative tokens/s >= "
                          f"{GOAL_OURS_OVER_HF_ASSISTED}x HF assisted generation",
                          entry.get("ours_speculative_over_hf_assisted"),
                          GOAL_OURS_OVER_HF_ASSISTED, entry.get("error", "")))
  limit = suites.get("physical_limit")
  if limit:
    large = [t for t in limit["targets"] if t["num_params"] >= GOAL_BANDWIDTH_MIN_PARAMS]
    name = (f"baseline decode step weight traffic >= {GOAL_BANDWIDTH_FRACTION:.0%} of copy "
            f"bandwidth (target >= {GOAL_BANDWIDTH_MIN_PARAMS / 1e6:.0f}M params)")
    for target in large:
      result.append(_goal(f"{name}: {target['model']}", target["fraction_of_copy_bandwidth"],
                          GOAL_BANDWIDTH_FRACTION))
    if not large:
      result.append(_goal(name, None, GOAL_BANDWIDTH_FRACTION,
                          "no target of that size was measured in this run"))
  return result


# --------------------------------------------------------------------------- markdown


def _number(value: Any, digits: int = 3) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}"
  return str(value)


def _rate(summary: Mapping[str, Any]) -> str:
  """tokens/s as 'median [min-max]'."""
  return (f"{summary['tokens_per_s']:.1f} [{summary['tokens_per_s_min']:.1f}-"
          f"{summary['tokens_per_s_max']:.1f}]")


def _predictions(row: Mapping[str, Any]) -> str:
  return (f"{row['predicted_speedup']:.2f} / {row['predicted_speedup_realized']:.2f} / "
          f"{row['predicted_speedup_interleaved']:.2f}")


def _over_predictions(row: Mapping[str, Any]) -> str:
  return (f"{row['measured_over_predicted']:.2f} / {row['measured_over_realized']:.2f} / "
          f"{row['measured_over_interleaved']:.2f}")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_number(cell) for cell in row) + " |" for row in rows]
  return lines + [""]


_THEORY_NOTE = (
    "tok/s and speedup: whole calls (encoders included). Loop speedup: the decoding loops "
    "alone, which Theorem 3.8 predicts. Predictions (`bench.compare_with_theory`), each "
    "dropping one assumption: from alpha (the paper's formula, i.i.d. acceptance, endless "
    "output); from the realized tokens per target call; and the same priced with one "
    "iteration's model calls timed together (interleaved) rather than each model alone. Loop "
    "speedup / the last = the engine's own overhead.")


def to_markdown(report: Mapping[str, Any]) -> str:
  """The report's tables: one section per suite that ran, then the goals."""
  machine = report["machine"]
  load = machine["load_average_at_start"]
  load = "unknown" if load is None else " ".join(f"{value:.1f}" for value in load)
  lines = ["# spec_decode benchmark", "",
           f"{machine['cpu_model']}, {machine['usable_cores']} usable cores, load average at "
           f"start {load}; jax {machine['jax_version']} "
           f"({machine['jax_backend']}). tokens/s are medians [min-max] over interleaved "
           "repetitions.", ""]
  if report["compiler_options"]:
    lines += [f"**XLA compiler options {report['compiler_options']}: compiled for a quick "
              "check, so these timings are not representative.**", ""]
  suites = report["suites"]
  own = suites.get("own_baseline")
  if own:
    lines += [f"## own_baseline: {own['pair']['description']}", ""]
    rows = []
    for group in own["groups"]:
      spec = group["speculative"]
      rows.append([group["temperature"], group["batch_size"], group["gamma"],
                   _rate(group["baseline"]), _rate(spec), spec["speedup"],
                   spec["decode_speedup"], spec["alpha"], spec["tokens_per_target_call"],
                   spec["c"], spec["v"], spec["interleaved_over_isolated"], _predictions(spec),
                   _over_predictions(spec),
                   f"{group['baseline']['model_call_share']:.2f} / "
                   f"{spec['model_call_share']:.2f}"])
    lines += [_THEORY_NOTE, ""]
    lines += _table(["T", "batch", "gamma", "baseline tok/s", "speculative tok/s", "speedup",
                     "loop speedup", "alpha", "tokens/target call", "c", "v",
                     "interleaved / isolated calls", "predicted: alpha / realized / interleaved",
                     "loop speedup / each prediction", "model-call share base / spec"], rows)
    rows = []
    for group in own["groups"]:
      if "best_fixed" not in group:
        continue
      for label, row in group["variants"].items():
        rows.append([group["temperature"], group["batch_size"],
                     label + (" (best fixed)" if label == group["best_fixed"] else ""),
                     _rate(row), row["speedup"], group["tokens_per_s_over_best_fixed"][label],
                     row["accepted_per_target_call"], row["tokens_per_target_call"],
                     row["alpha"]])
    if rows:
      lines += ["### Verifiers and drafting policies", ""]
      lines += _table(["T", "batch", "decoder", "tok/s", "speedup", "vs best fixed",
                       "accepted/target call", "tokens/target call", "alpha"], rows)
  peer = suites.get("peer")
  if peer:
    lines += [f"## peer: Hugging Face generate (torch {peer.get('torch_version')}, "
              f"transformers {peer.get('transformers_version')}, {peer['torch_num_threads']} "
              f"threads), batch 1, gamma {peer['gamma']}", ""]
    if "error" in peer:
      lines += [f"Not run: {peer['error']}", ""]
    rows = []
    for entry in peer["temperatures"]:
      if "error" in entry:
        rows.append([entry["temperature"], f"error: {entry['error']}"] + [""] * 7)
        continue
      agreement = entry.get("greedy_agreement_with_ours_baseline")
      agree = "-" if agreement is None else ", ".join(
          f"{label} {a['identical']}/{a['compared']}" for label, a in agreement.items())
      rows.append([entry["temperature"], _rate(entry["ours baseline"]),
                   _rate(entry["ours speculative"]), entry["ours_speedup"],
                   _rate(entry["hf generate"]), _rate(entry["hf assisted"]),
                   entry["hf_speedup"], entry["ours_speculative_over_hf_assisted"], agree])
    lines += _table(["T", "ours baseline", "ours speculative", "ours speedup", "HF generate",
                     "HF assisted", "HF speedup", "ours spec / HF assisted",
                     "greedy identical to ours baseline"], rows)
  table2 = suites.get("simulated_table2")
  if table2:
    lines += [f"## simulated_table2 ({SIMULATED})", "", table2["note"] + "; target "
              f"{table2['pair']['target']['num_params'] / 1e6:.3g}M params, draft "
              f"{table2['pair']['draft']['num_params'] / 1e6:.3g}M params.", "", _THEORY_NOTE, ""]
    rows = [[row["label"], row["gamma"], row["forced_alpha"], row["paper_speedup"],
             f"{row['speculative']['tokens_per_target_call']:.2f} / "
             f"{row['expected_tokens_per_target_call']:.2f}", row["c"], row["v"],
             row["interleaved_over_isolated"], _predictions(row), row["decode_speedup"],
             _over_predictions(row),
             f"{row['baseline']['model_call_share']:.2f} / "
             f"{row['speculative']['model_call_share']:.2f}"]
            for row in table2["rows"]]
    lines += _table(["row", "gamma", "alpha (forced)", "paper speedup (T5-XXL, TPU)",
                     "tokens/call realized / expected", "c", "v", "interleaved / isolated calls",
                     "predicted: alpha / realized / interleaved", "measured loop speedup",
                     "loop speedup / each prediction", "model-call share base / spec"], rows)
  limit = suites.get("physical_limit")
  if limit:
    copy = limit["copy"]
    lines += ["## physical_limit", "", f"Copy bandwidth: {copy['bytes_per_s'] / 1e9:.2f} GB/s "
              f"(read + write of a {copy['array_bytes'] / 2**20:.0f} MiB array; XLA "
              f"{copy['xla_bytes_per_s'] / 1e9:.2f}, numpy {copy['numpy_bytes_per_s'] / 1e9:.2f})."
              " Weights that fit in the CPU caches can exceed it.", ""]
    rows = [[t["model"], f"{t['num_params'] / 1e6:.3g}M", t["weight_bytes_per_step"] / 1e6,
             t["step_s"] * 1e3, t["weight_bytes_per_s"] / 1e9, t["fraction_of_copy_bandwidth"],
             t["fraction_with_kv_cache"]] for t in limit["targets"]]
    lines += _table(["target", "params", "weight MB/step", "step ms", "weights GB/s",
                     "fraction of copy", "fraction incl. KV cache"], rows)
  lines += ["## Goals (recorded, not asserted)", ""]
  lines += _table(["goal", "measured", "target", "status"],
                  [[g["goal"], g["measured"], g["target"], g["status"]]
                   for g in report["goals"]])
  return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def _plain(value: Any) -> Any:
  """JSON-ready copy of a result: numpy scalars and arrays become Python numbers and lists."""
  if isinstance(value, Mapping):
    return {str(key): _plain(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(item) for item in value]
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  return value


def run_suites(bench_config: BenchConfig) -> dict[str, Any]:
  """Runs the selected suites with the gin-bound configs and returns the report."""
  unknown = [suite for suite in bench_config.suites if suite not in SUITES]
  if unknown:
    raise ValueError(f"unknown suites {unknown}; choose from {list(SUITES)}")
  os.makedirs(bench_config.output_dir, exist_ok=True)
  simulated_config = _configured(SimulatedTable2Config)
  workspace = Workspace(_configured(PairConfig), simulated_config, bench_config.compiler_options)
  report: dict[str, Any] = {"machine": describe_machine(),
                            "compiler_options": dict(bench_config.compiler_options),
                            "suites": {}, "timings_s": {}}
  runners = {
      "own_baseline": lambda: own_baseline_suite(workspace, _configured(OwnBaselineConfig)),
      "peer": lambda: peer_suite(workspace, _configured(PeerConfig), bench_config.output_dir),
      "simulated_table2": lambda: simulated_table2_suite(workspace, simulated_config),
      "physical_limit": lambda: physical_limit_suite(workspace, _configured(PhysicalLimitConfig)),
  }
  for suite in SUITES:
    if suite in bench_config.suites:
      start = time.perf_counter()
      report["suites"][suite] = _plain(runners[suite]())
      report["timings_s"][suite] = time.perf_counter() - start
  report["goals"] = goals(report["suites"])
  report["gin_config"] = gin.config_str()
  return report


def _configured(config_class: type) -> Any:
  """An instance of a config dataclass with the gin bindings in force (bench/*.gin)."""
  return gin.get_configurable(config_class)()


def write_report(report: Mapping[str, Any], output_dir: str) -> str:
  """Writes bench.json and bench.md to output_dir; returns the markdown."""
  markdown = to_markdown(report)
  with open(os.path.join(output_dir, JSON_FILE), "w") as f:
    json.dump(_plain(report), f, indent=2)
  with open(os.path.join(output_dir, MARKDOWN_FILE), "w") as f:
    f.write(markdown + "\n")
  return markdown


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m spec_decode.bench",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("--gin_file", action="append", default=None,
                      help=f"gin config file (repeatable; default {DEFAULT_GIN_FILE})")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="gin binding, e.g. \"bench.PairConfig.gamma = 4\" (repeatable)")
  parser.add_argument("--smoke", action="store_true",
                      help=f"add {SMOKE_GIN_FILE}: tiny models, one repetition")
  parser.add_argument("--suites", help=f"comma-separated subset of {','.join(SUITES)}")
  parser.add_argument("--output_dir", help="where bench.json and bench.md go")
  args = parser.parse_args(argv)
  gin_files = [paths.resolve(path) for path in (args.gin_file or [DEFAULT_GIN_FILE])]
  if args.smoke:
    gin_files.append(paths.resolve(SMOKE_GIN_FILE))
  bindings = list(args.gin_bindings)
  if args.suites:
    bindings.append(f"bench.BenchConfig.suites = {args.suites.split(',')!r}")
  if args.output_dir:
    bindings.append(f"bench.BenchConfig.output_dir = {args.output_dir!r}")
  gin.clear_config()
  gin.parse_config_files_and_bindings(gin_files, bindings)
  bench_config = _configured(BenchConfig)
  report = run_suites(bench_config)
  print(write_report(report, bench_config.output_dir))
  print(f"\nwrote {os.path.join(bench_config.output_dir, JSON_FILE)} and {MARKDOWN_FILE}")
  return 0
