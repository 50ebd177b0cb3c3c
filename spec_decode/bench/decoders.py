"""Our decoders of a pair, compiled and timed: `PairDecoders(pair, compiler_options,
partitioner).run(variant, repetition, batch_size) -> RunOutput`.

A `Variant` names one decoder setting (the baseline, or a speculative decoder with its gamma,
verifier and drafting policy). Each decode runs as two compiled calls timed apart, the prefill
(encoders, decode caches) and the decoding loop, and ends at `jax.block_until_ready`. Both are
compiled and their arrays placed by `decode_layout.DecodeLayout`, the path `spec_decode.infer`
decodes through, on the partitioner's mesh (by default one device); decodes and
statistics are fetched by `decode_layout.gather`. Tokens count up to and including a row's
first EOS, else to the length limit (`generated_lengths`), for every decoder, ours and Hugging
Face's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import core
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode.bench.pairs import Pair
from spec_decode.bench.simulated import SIMULATED, simulated_acceptance_rule
from spec_decode.engine import drafting
from spec_decode.engine import loops
from spec_decode.t5 import network


@dataclasses.dataclass(frozen=True)
class Variant:
  """One decoder setting: the baseline (gamma None) or a speculative decoder.

  `policy_bindings` are keyword arguments bound into the drafting policy; `simulated_alpha`
  replaces the verifier by `simulated_acceptance_rule(simulated_alpha)`. `draft_source` and the
  lookup's n-gram lengths choose the drafts (`core.make_draft`: 'model', 'lookup' or
  'lookup+model').
  """
  temperature: float
  gamma: int | None = None
  verifier: str = "token"
  draft_policy: str = "fixed"
  policy_bindings: tuple[tuple[str, float], ...] = ()
  simulated_alpha: float | None = None
  # Any loop of spec_decode.engine.loops with a draft; another than speculative_sample gets
  # gamma, temperature (where it samples: a loop without that setting, e.g.
  # 'speculative_beam_search', takes temperature 0) and its own `loop_settings`. A baseline
  # (gamma None) runs the loop's baseline with the `loop_settings` it takes.
  decode_loop: str = "speculative_sample"
  loop_settings: tuple[tuple[str, Any], ...] = ()
  draft_source: str = "model"
  lookup_max_ngram: int = 4
  lookup_min_ngram: int | None = None
  num_decodes: int = 1  # decodes per input (beams for beam search), the best one kept

  def __post_init__(self):
    if ("temperature" not in loops.get(self.decode_loop).setting_names
        and self.temperature != 0.0):
      raise ValueError(f"decode loop {self.decode_loop!r} samples nothing: give temperature 0, "
                       f"not {self.temperature!r}")

  @property
  def is_baseline(self) -> bool:
    return self.gamma is None

  @property
  def is_paper_setting(self) -> bool:
    """The paper's verifier and a fixed gamma: the setting its speedup formula describes."""
    return self.verifier == "token" and self.draft_policy == "fixed"

  @property
  def uses_draft_params(self) -> bool:
    return not self.is_baseline and self.draft_source != "lookup"

  @property
  def _beams(self) -> str:
    return f" beams={self.num_decodes}" if self.num_decodes > 1 else ""

  @property
  def label(self) -> str:
    if self.is_baseline:
      if self.decode_loop == "speculative_sample":
        return "baseline" + self._beams
      return f"baseline {loops.get(self.decode_loop).baseline}{self._beams}"
    if self.draft_source != "model":
      return f"{self.draft_source} n<={self.lookup_max_ngram} {self._model_label()}"
    return self._model_label()

  def _model_label(self) -> str:
    if self.simulated_alpha is not None:
      return f"{SIMULATED} coin alpha={self.simulated_alpha:g} gamma={self.gamma}"
    if self.decode_loop != "speculative_sample":
      return f"{self.decode_loop} gamma={self.gamma}{self._beams}"
    if self.draft_policy == "fixed":
      return f"{self.verifier} fixed gamma={self.gamma}"
    return f"{self.verifier} {self.draft_policy} gamma<={self.gamma}"

  def decoder(self, pair: Pair) -> core.Decoder:
    """This setting's decoder over the pair (the baseline: the target alone)."""
    if self.is_baseline:
      baseline = loops.get(loops.get(self.decode_loop).baseline)
      settings = {"temperature": self.temperature, **dict(self.loop_settings)}
      return core.Decoder.create(baseline.name, pair.target.module, **{
          name: value for name, value in settings.items() if name in baseline.setting_names})
    verifier = (simulated_acceptance_rule(self.simulated_alpha)
                if self.simulated_alpha is not None else self.verifier)
    policy = (functools.partial(drafting.get_policy(self.draft_policy),
                                **dict(self.policy_bindings))
              if self.policy_bindings else self.draft_policy)
    draft = core.make_draft(self.draft_source,
                            pair.draft.module if self.uses_draft_params else None,
                            self.lookup_max_ngram, self.lookup_min_ngram)
    if self.decode_loop != "speculative_sample":
      samples = "temperature" in loops.get(self.decode_loop).setting_names
      return core.Decoder.create(self.decode_loop, pair.target.module, draft,
                                 gamma=self.gamma,
                                 temperature=self.temperature if samples else None,
                                 **dict(self.loop_settings))
    return core.Decoder.create("speculative_sample", pair.target.module, draft,
                               gamma=self.gamma, temperature=self.temperature,
                               verifier=verifier, draft_policy=policy)


@dataclasses.dataclass
class RunOutput:
  """One timed decode: seconds of the whole call (encoders included), tokens generated,
  decodes [B, L], speculative counters summed over rows (None for the baseline) and, for our
  decoders, the seconds of the decoding loop alone (what Theorem 3.8 models)."""
  seconds: float
  tokens: int
  decodes: np.ndarray
  stats: dict[str, Any] | None = None
  decode_seconds: float | None = None
  stats_class: type | None = None  # the loop's (`engine.stats`), which `stats` are counters of


def generated_lengths(decodes: np.ndarray, eos_id: int | None,
                      limits: np.ndarray | None = None) -> np.ndarray:
  """Tokens per row of decodes [B, L]: up to and including the first EOS, else the row's limit
  (`limits` [B]: the tokens it could decode; default L). The vectorized `vocab.until_eos`
  length."""
  decodes = np.asarray(decodes)
  limits = np.full(decodes.shape[0], decodes.shape[1]) if limits is None else np.asarray(limits)
  if eos_id is None:
    return limits
  is_eos = (decodes == eos_id) & (np.arange(decodes.shape[1]) < limits[:, None])
  return np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, limits)


def _partitioned_decoder(layout: decode_layout.DecodeLayout, pair: Pair, variant: Variant
                         ) -> tuple[Callable, Callable]:
  """The two compiled halves of one decode (`core.Decoder.prefill` and `run`) on `layout`,
  timed apart:
  prefill(target_params, draft_params, tokens [B, input_length]) -> caches, each in its layout
    (an encoder-decoder's encoders run; a language model's prompt fills its cache);
  loop(target_params, draft_params, caches, tokens, rng) -> (decodes [B, L], log_probs [B],
    aux), split over 'data': the decoding loop alone (the variant's num_decodes per row, the
    best kept; a language model's rows start after their prompts, which its decodes leave out),
    computing what infer's does (the scores too: the same compiled loop, tests/sharding
    compares them)."""
  decoder = variant.decoder(pair)
  decode_length = pair.decode_length
  draft_role = "draft" if decoder.draft_network is not None else None

  def in_decode(prompts):
    """A language model's prompts in their decode [B, L], as `core.Decoder.predict` holds
    them."""
    return jnp.pad(prompts, ((0, 0), (0, decode_length - prompts.shape[1])))

  def prefill(target_params, draft_params, tokens):
    if pair.decoder_only:
      tokens = in_decode(tokens)
    return decoder.prefill(target_params, draft_params, tokens, decode_length, layout)

  def loop(target_params, draft_params, caches, tokens, rng):
    initial_index = None
    if pair.decoder_only:
      inputs = in_decode(tokens)
      initial_index = network.prompt_lengths(inputs)
    else:
      inputs = jnp.zeros((tokens.shape[0], decode_length), jnp.int32)
    # Split over 'data' as infer's decoder inputs are: each row's state stays with its caches.
    inputs = jax.lax.with_sharding_constraint(inputs, layout.partitioner.batch_sharding)
    decodes, log_probs, aux = decoder.run(target_params, draft_params, caches, inputs,
                                          pair.eos_id, num_decodes=variant.num_decodes,
                                          decoder_params={"decode_rng": rng}, calls=layout,
                                          initial_index=initial_index)
    if initial_index is not None:
      decodes = core.without_prompt(decodes, initial_index)
    # Sorted by score, ascending: the best is last.
    return decodes[:, -1], log_probs[:, -1], {name: value[:, -1] for name, value in aux.items()}

  return (layout.partition(prefill, ("target", draft_role, "batch"), outputs="pinned"),
          layout.partition(loop, ("target", draft_role, "pinned", "batch", "replicated")))


class PairDecoders:
  """Our compiled decoders of one pair on `partitioner`'s mesh (None: one device), one per
  variant (jax keeps one executable per batch shape), as timed runs: `run(variant, repetition,
  batch_size) -> RunOutput`. The repetition picks the inputs (`Pair.batch`) and the rng.
  Compiled and placed as `spec_decode.infer` decodes (`decode_layout.decode_layout`: target
  parameters split by the partitioner's rules, the draft replicated, each cache pinned to its
  layout), with `compiler_options` on top of the decoders' own. Batch sizes must be multiples
  of the mesh's 'data' axis (a ValueError before compiling)."""

  def __init__(self, pair: Pair, compiler_options: Mapping[str, Any],
               partitioner: partitioning.PjitPartitioner | None = None):
    self.pair = pair
    if partitioner is None:  # one device, the same path
      partitioner = partitioning.PjitPartitioner(mesh_shape=(1, 1))
    self.layout = decode_layout.decode_layout(partitioner, pair.target.config,
                                              pair.draft.config,
                                              compiler_options=compiler_options)
    self._params = (self.layout.put_params("target", pair.target.params),
                    self.layout.put_params("draft", pair.draft.params))
    self._decoders: dict[Variant, tuple[Callable, Callable]] = {}

  def _halves(self, variant: Variant) -> tuple[Callable, Callable]:
    if variant not in self._decoders:
      self._decoders[variant] = _partitioned_decoder(self.layout, self.pair, variant)
    return self._decoders[variant]

  def _prefill_args(self, variant: Variant, repetition: int, batch_size: int) -> tuple:
    """(target params, draft params or None, input tokens) of one run, placed."""
    draft_params = self._params[1] if variant.uses_draft_params else None
    return (self._params[0], draft_params,
            self.layout.put_batch(self.pair.batch(repetition, batch_size)))

  def run(self, variant: Variant, repetition: int, batch_size: int) -> RunOutput:
    prefill, loop = self._halves(variant)
    params_and_tokens = self._prefill_args(variant, repetition, batch_size)
    rng = self.layout.put_replicated(jax.random.PRNGKey(repetition))
    start = time.perf_counter()
    caches = jax.block_until_ready(prefill(*params_and_tokens))
    loop_start = time.perf_counter()
    outputs = jax.block_until_ready(loop(*params_and_tokens[:2], caches, params_and_tokens[2],
                                         rng))
    end = time.perf_counter()
    decodes, _, aux = decode_layout.gather(outputs)
    stats_class = variant.decoder(self.pair).loop.stats
    summed = None if stats_class is None else {
        name: np.sum(aux[name], axis=0).tolist() for name in stats_class.counter_names()}
    limits = self.pair.new_tokens(self.pair.batch(repetition, batch_size))
    return RunOutput(end - start,
                     int(generated_lengths(decodes, self.pair.eos_id, limits).sum()),
                     decodes, summed, decode_seconds=end - loop_start, stats_class=stats_class)

  def lower_loop(self, variant: Variant, repetition: int, batch_size: int
                 ) -> jax.stages.Lowered:
    """The decoding loop `run(variant, repetition, batch_size)` times, lowered (its compiled
    HLO shows what the loop communicates)."""
    prefill, loop = self._halves(variant)
    params_and_tokens = self._prefill_args(variant, repetition, batch_size)
    caches = prefill(*params_and_tokens)
    return loop.lower(*params_and_tokens[:2], caches, params_and_tokens[2],
                      self.layout.put_replicated(jax.random.PRNGKey(repetition)))
