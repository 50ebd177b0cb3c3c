"""Drafting policies: how many tokens the draft proposes in each iteration, per row.

A policy is a pure function

    policy(offset, draft_probs [N, V], stats: decoding.SpeculativeStats) -> keep_drafting [N] bool

called after the draft proposed its token at block offset `offset` (0-based) from
`draft_probs`; rows for which it returns False stop drafting for this iteration. The engine
bounds the block by the static `gamma` (one compilation), so a policy can only shorten it; the
draft loop stops as soon as no row wants more, which saves real draft calls at batch 1.

Every policy is exact by construction: what it reads (this iteration's drafts, the row's stats
from earlier iterations) is history, fixed before the verification it shortens, and the verifier
is told how many drafts each row proposed and emits the bonus token from the target right after
them (see `verify` and `speculative_sampling`). The exactness suite
runs on every policy registered in `POLICIES`.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp

Policy = Callable[[int, jax.Array, Any], jax.Array]


def fixed(offset: jax.Array, draft_probs: jax.Array, stats: Any) -> jax.Array:
  """Always draft the full gamma (the paper's setting)."""
  del offset, stats
  return jnp.ones(draft_probs.shape[:1], bool)


def expected_tokens_per_cost(alpha: jax.Array, gamma: jax.Array, cost_ratio: float,
                             verify_cost: float) -> jax.Array:
  """The paper's Theorem 3.8 speedup (1 - alpha^(g+1)) / ((1 - alpha)(g c + v)).

  `verify_cost` v is the cost of one target call on g+1 tokens relative to one on 1 token (the
  paper assumes v = 1 on TPUs). alpha is clipped below 1 where the limit (g+1)/(g c + v) holds.
  """
  alpha = jnp.clip(alpha, 0.0, 1.0 - 1e-6)
  return (1.0 - alpha ** (gamma + 1)) / ((1.0 - alpha) * (gamma * cost_ratio + verify_cost))


def expected_speedup(offset: jax.Array, draft_probs: jax.Array, stats: Any,
                     max_gamma: int = 8, cost_ratio: float = 0.1, verify_cost: float = 1.0,
                     prior_alpha: float = 0.7, prior_weight: float = 4.0) -> jax.Array:
  """Drafts, per row, the gamma that maximizes the expected speedup for its running alpha.

  alpha is each row's running estimate (its verified positions so far, shrunk towards
  `prior_alpha` with the weight of `prior_weight` positions); c and v are measured by
  `spec_decode.bench` and bound in gin.
  """
  del draft_probs
  alpha = ((stats.acceptance_sum + prior_alpha * prior_weight)
           / (stats.verified_positions + prior_weight))
  candidates = jnp.arange(1, max_gamma + 1)
  value = expected_tokens_per_cost(alpha[:, None], candidates[None], cost_ratio, verify_cost)
  best_gamma = candidates[jnp.argmax(value, axis=1)]
  return offset + 1 < best_gamma


def confidence(offset: jax.Array, draft_probs: jax.Array, stats: Any,
               threshold: float = 0.5) -> jax.Array:
  """Stops a row's block once the draft's own top probability falls below `threshold`."""
  del offset, stats
  return jnp.max(draft_probs, axis=-1) >= threshold


POLICIES: dict[str, Policy] = {"fixed": fixed, "expected_speedup": expected_speedup,
                               "confidence": confidence}


def register_policy(name: str, policy: Policy) -> None:
  """Makes `policy` available as `speculative_sample(..., draft_policy=name)`."""
  if name in POLICIES:
    raise ValueError(f"a drafting policy named {name!r} is already registered")
  POLICIES[name] = policy


def get_policy(name: str) -> Policy:
  if name not in POLICIES:
    raise ValueError(f"draft_policy must be one of {sorted(POLICIES)}, got {name!r}")
  return POLICIES[name]
