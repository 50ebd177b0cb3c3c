"""The SIMULATED acceptance rule: benchmark only, never a verifier a config can select.

`simulated_acceptance_rule(alpha)` is a `verify.Rule` that accepts each draft by an i.i.d. coin,
so a random-weight pair can be timed at the paper's alpha (the simulated_table2 suite). It is
deliberately absent from `verify.EXACT_RULES` and `verify.LOSSY_RULES`. Everything it produces
is labelled with `SIMULATED`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spec_decode.engine import verify

# The label of every result the coin produced.
SIMULATED = "SIMULATED"


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
