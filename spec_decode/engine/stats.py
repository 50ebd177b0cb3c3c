"""The counters a speculative decode reports per decode (T5X's aux): `SpeculativeStats`."""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class SpeculativeStats:
  """Per-row counters of a speculative decode ([B, num_decodes] when returned)."""
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
    """The paper's acceptance estimate: mean over verified positions of sum_x min(p, q)."""
    return self.acceptance_sum / jnp.maximum(self.verified_positions, 1)

  def aux(self) -> dict[str, jax.Array]:
    """What a decode reports per decode (T5X's aux): the counters, alpha and tokens per
    target call."""
    return {**{name: getattr(self, name) for name in self.counter_names()}, "alpha": self.alpha,
            "tokens_per_target_call":
                self.generated_tokens / jnp.maximum(self.target_calls, 1)}

  @classmethod
  def counter_names(cls) -> tuple[str, ...]:
    """The counters' names: the one list reports and stats totals are built from."""
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def zeros(cls, num_rows: int) -> "SpeculativeStats":
    zero_int = jnp.zeros((num_rows,), jnp.int32)
    zero_float = jnp.zeros((num_rows,), jnp.float32)
    return cls(**{name: zero_float if name == "acceptance_sum" else zero_int
                  for name in cls.counter_names()})
