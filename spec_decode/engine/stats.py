"""The counters a decode loop reports per decode (T5X's aux), and what a run makes of them.

A loop's stats class is registered with the loop (`loops.register(..., stats=...)`) and
follows one contract:
  * its fields are counters, [N] per row in the loop ([B, num_decodes] when returned), or
    [N, D] for a vector of D counters;
  * `counter_names()` lists them: the one list reports and run totals are built from;
  * `ratios(totals)` -> {name: value}: what the counters mean, from counters of one decode or
    summed over a run (a ratio of sums, not a mean of per-decode ratios), among them
    'target_calls_saved' (against the loop's baseline, one target call per step);
  * `aux()` = the counters and `ratios` of this decode.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp


def _per(numerator: Any, denominator: Any) -> Any:
  return numerator / jnp.maximum(denominator, 1)


class _Counters:
  """The contract's shared half: counter names and aux from the dataclass fields."""

  @classmethod
  def counter_names(cls) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))

  @staticmethod
  def ratios(totals: Mapping[str, Any]) -> dict[str, Any]:
    raise NotImplementedError

  def aux(self) -> dict[str, jax.Array]:
    counters = {name: getattr(self, name) for name in self.counter_names()}
    return {**counters, **self.ratios(counters)}


@flax.struct.dataclass
class SpeculativeStats(_Counters):
  """Per-row counters of a speculative decode."""
  target_calls: jax.Array
  draft_calls: jax.Array
  drafted_tokens: jax.Array
  accepted_tokens: jax.Array  # drafts accepted by the verifier and kept (not past EOS/limit)
  lookup_drafted_tokens: jax.Array  # of drafted_tokens: deterministic (n-gram lookup) ones
  lookup_accepted_tokens: jax.Array  # of accepted_tokens: deterministic (n-gram lookup) ones
  generated_tokens: jax.Array  # tokens committed (accepted + corrections/bonus, cut at EOS)
  acceptance_sum: jax.Array  # sum over verified positions of sum_x min(p(x), q(x))
  verified_positions: jax.Array

  @property
  def alpha(self) -> jax.Array:
    return self.aux()["alpha"]

  @staticmethod
  def ratios(totals: Mapping[str, Any]) -> dict[str, Any]:
    """'alpha' (the paper's acceptance estimate: mean over verified positions of
    sum_x min(p, q)), tokens per target call and the target calls saved."""
    return {"alpha": _per(totals["acceptance_sum"], totals["verified_positions"]),
            "tokens_per_target_call": _per(totals["generated_tokens"], totals["target_calls"]),
            "target_calls_saved": 1 - _per(totals["target_calls"], totals["generated_tokens"])}

  @classmethod
  def zeros(cls, num_rows: int) -> "SpeculativeStats":
    zero_int = jnp.zeros((num_rows,), jnp.int32)
    zero_float = jnp.zeros((num_rows,), jnp.float32)
    return cls(**{name: zero_float if name == "acceptance_sum" else zero_int
                  for name in cls.counter_names()})


@flax.struct.dataclass
class BeamSearchStats(_Counters):
  """Per-row counters of a speculative beam search."""
  target_calls: jax.Array
  draft_calls: jax.Array
  beam_steps: jax.Array
  tree_nodes: jax.Array  # tree slots of each target call per beam, summed over its calls
  # [N, gamma]: entry d - 1 counts the target calls whose replay took more than d steps: every
  # beam that beam search selected at step d was a node the call scored (a call whose row
  # finished at step d counts as not covered there).
  covered_past_depth: jax.Array

  @staticmethod
  def ratios(totals: Mapping[str, Any]) -> dict[str, Any]:
    """Beam steps per target call, the target calls saved (the baseline calls once per beam
    step), and per depth d the share of target calls that covered every selected beam there
    (the step after it could be replayed)."""
    return {"beam_steps_per_target_call": _per(totals["beam_steps"], totals["target_calls"]),
            "target_calls_saved": 1 - _per(totals["target_calls"], totals["beam_steps"]),
            "coverage_by_depth": _per(jnp.asarray(totals["covered_past_depth"]),
                                      jnp.asarray(totals["target_calls"])[..., None])}

  @classmethod
  def zeros(cls, num_rows: int, gamma: int) -> "BeamSearchStats":
    zero = jnp.zeros((num_rows,), jnp.int32)
    return cls(zero, zero, zero, zero, jnp.zeros((num_rows, gamma), jnp.int32))


@flax.struct.dataclass
class TreeStats(_Counters):
  """Per-row counters of a token-tree speculative decode."""
  target_calls: jax.Array
  draft_calls: jax.Array
  tree_nodes: jax.Array  # nodes the target scored, summed over its iterations
  accepted_tokens: jax.Array  # drafted nodes accepted and kept (not past EOS/limit)
  lookup_accepted_tokens: jax.Array  # of accepted_tokens: nodes of n-gram lookup branches
  generated_tokens: jax.Array  # tokens committed (accepted + the next token, cut at EOS)
  accepted_depths: jax.Array  # [N, D + 1]: entry a counts the iterations that accepted a nodes

  @staticmethod
  def ratios(totals: Mapping[str, Any]) -> dict[str, Any]:
    """Tokens per target call, the target calls saved (the baseline calls once per token),
    accepted nodes per iteration and the share of iterations by accepted depth."""
    depths = jnp.asarray(totals["accepted_depths"])
    iterations = jnp.sum(depths, axis=-1)
    return {"tokens_per_target_call": _per(totals["generated_tokens"], totals["target_calls"]),
            "target_calls_saved": 1 - _per(totals["target_calls"], totals["generated_tokens"]),
            "accepted_per_iteration": _per(totals["accepted_tokens"], iterations),
            "accepted_depth_share": _per(depths, iterations[..., None])}

  @classmethod
  def zeros(cls, num_rows: int, max_depth: int) -> "TreeStats":
    zero = jnp.zeros((num_rows,), jnp.int32)
    return cls(zero, zero, zero, zero, zero, zero,
               jnp.zeros((num_rows, max_depth + 1), jnp.int32))
