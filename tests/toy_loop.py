"""A decode loop and a drafting policy as a user would add them: registered once, by name, in
their own module.

`toy_speculative` is speculative sampling with a verification rule of its own setting `rule`
(the engine's 'token' or 'block'); `TRACES` counts how often a runner traced it, so a test can
tell that this loop, not the default one, ran. `one_draft` is a drafting policy that drafts one
token per iteration; `TRACES["one_draft"]` counts its traces likewise."""

import collections
from typing import Any

import jax
import jax.numpy as jnp

from spec_decode.engine import decoding
from spec_decode.engine import drafting
from spec_decode.engine import loops
from spec_decode.engine import stats

TRACES = collections.Counter()


def one_draft(offset: jax.Array, draft_probs: jax.Array, stats_so_far: Any) -> jax.Array:
  """Stops every row after its first draft."""
  del offset, stats_so_far
  TRACES["one_draft"] += 1
  return jnp.zeros(draft_probs.shape[:1], bool)


drafting.register_policy("one_draft", one_draft)


def _check(rule: str, **_) -> None:
  if rule not in ("token", "block"):
    raise ValueError(f"rule must be 'token' or 'block', got {rule!r}")


@loops.register("toy_speculative", uses_draft=True, check_settings=_check,
                stats=stats.SpeculativeStats)
def toy_speculative(inputs, cache, tokens_to_logits, eos_id, *, draft_cache,
                    draft_tokens_to_logits, gamma, rule="block", decode_rng=None,
                    num_decodes=1, temperature=1.0, topk=0, topp=0.0, max_decode_steps=None,
                    initial_index=None):
  TRACES[rule] += 1
  return decoding.speculative_sample(
      inputs, cache, tokens_to_logits, eos_id, draft_cache=draft_cache,
      draft_tokens_to_logits=draft_tokens_to_logits, gamma=gamma, decode_rng=decode_rng,
      num_decodes=num_decodes, temperature=temperature, topk=topk, topp=topp,
      max_decode_steps=max_decode_steps, initial_index=initial_index, verifier=rule)
