"""Our decoders of a pair, compiled and timed: `PairDecoders(pair).run(variant, repetition,
batch_size) -> RunOutput`.

A `Variant` names one decoder setting (the baseline, or a speculative decoder with its gamma,
verifier and drafting policy). Each decode runs as two compiled calls timed apart, the prefill
(encoders, decode caches) and the decoding loop, and ends at `jax.block_until_ready`. Tokens
count up to and including a row's first EOS, else to the length limit (`generated_lengths`),
for every decoder, ours and Hugging Face's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import compile_options
from spec_decode.bench.pairs import Pair
from spec_decode.bench.simulated import SIMULATED, simulated_acceptance_rule
from spec_decode.engine import decoding
from spec_decode.engine import drafting
from spec_decode.engine import verify
from spec_decode.t5 import network


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
  def is_paper_setting(self) -> bool:
    """The paper's verifier and a fixed gamma: the setting its speedup formula describes."""
    return self.verifier == "token" and self.draft_policy == "fixed"

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
  """Tokens per row of decodes [B, L]: up to and including the first EOS, else L (the
  vectorized `vocab.until_eos` length)."""
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

  options = compile_options.merged(compiler_options)
  return (jax.jit(prefill, compiler_options=options),
          jax.jit(decode, compiler_options=options))


class PairDecoders:
  """Our compiled decoders of one pair, one per variant (jax keeps one executable per batch
  shape), as timed runs: `run(variant, repetition, batch_size) -> RunOutput`. The repetition
  picks the inputs (`Pair.batch`) and the rng."""

  def __init__(self, pair: Pair, compiler_options: Mapping[str, Any]):
    self.pair = pair
    self.compiler_options = compiler_options
    self._decoders: dict[Variant, tuple[Callable, Callable]] = {}

  def run(self, variant: Variant, repetition: int, batch_size: int) -> RunOutput:
    if variant not in self._decoders:
      self._decoders[variant] = _jitted_decoder(self.pair, variant, self.compiler_options)
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
    summed = None
    if stats is not None:
      summed = {name: float(np.sum(getattr(stats, name)))
                for name in decoding.SpeculativeStats.counter_names()}
    return RunOutput(end - start, int(generated_lengths(decodes, self.pair.eos_id).sum()),
                     decodes, summed, decode_seconds=end - loop_start)
