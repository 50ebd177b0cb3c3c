"""Toy models that honor the engine's model contract with a real cache.

`PrefixHashModel` keeps, per row and position t, a 32-bit hash of the tokens at positions 0..t.
Its logits for the token after position t are a table row chosen by that hash, so they depend
on the whole prefix — but the model only reads the cache entry of position t-1. A decoder that
rolls a cache back wrongly, reads a stale entry, or feeds tokens at the wrong position gets
different logits, which is what makes these models good engine tests without a transformer.

It takes tree calls (the contract's token_positions and token_mask; each fed token's parent
is the fed token it attends to with the highest position, fed before it), so a loop that
scores a tree is tested against decoding each path alone.

Shapes: cache {'prefix_hash': [B, max_len] uint32}; logits [B, k, V] float32.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import contract


def _mix(prefix_hash: jax.Array, token: jax.Array) -> jax.Array:
  """A 32-bit hash step (xorshift-multiply), wrapping uint32 arithmetic."""
  h = (prefix_hash ^ token.astype(jnp.uint32)) * jnp.uint32(0x9E3779B1)
  h = h ^ (h >> 15)
  h = h * jnp.uint32(0x85EBCA77)
  return h ^ (h >> 13)


@flax.struct.dataclass
class PrefixHashModel:
  table: jax.Array  # [num_buckets, V] logits; column 0 (PAD) is never sampled

  @classmethod
  def random(cls, rng: jax.Array, vocab_size: int, num_buckets: int = 64, scale: float = 1.5,
             eos_id: int = 1, eos_shift: float = 0.0) -> "PrefixHashModel":
    """Random logits; `eos_shift` is added to EOS's logit (negative: longer outputs)."""
    table = scale * jax.random.normal(rng, (num_buckets, vocab_size))
    return cls(table.at[:, eos_id].add(eos_shift).at[:, 0].set(-1e9))

  def perturbed(self, rng: jax.Array, noise: float) -> "PrefixHashModel":
    """A draft that approximates this model: same hashing, noisy logits."""
    table = self.table + noise * jax.random.normal(rng, self.table.shape)
    return PrefixHashModel(table.at[:, 0].set(-1e9))

  @property
  def vocab_size(self) -> int:
    return self.table.shape[1]

  def init_cache(self, batch_size: int, max_len: int) -> dict:
    return {"prefix_hash": jnp.zeros((batch_size, max_len), jnp.uint32)}

  def tokens_to_logits(self, state: contract.DecodingState):
    hashes = state.cache["prefix_hash"]
    max_len = hashes.shape[1]
    rows = jnp.arange(hashes.shape[0])
    cached = jnp.where(state.cur_index > 0,
                       hashes[rows, jnp.clip(state.cur_index - 1, 0, max_len - 1)],
                       jnp.uint32(0x12345678))
    num_fed = state.cur_token.shape[1]
    tree = state.token_positions is not None
    positions = (state.token_positions if tree
                 else state.cur_index[:, None] + jnp.arange(num_fed))
    chunk, previous = [], cached
    for j in range(num_fed):
      if tree and j:  # continue the parent's hash: the attended fed token with the highest position
        parents = state.token_mask[:, j, :j]
        parent = jnp.argmax(jnp.where(parents, positions[:, :j], -1), axis=1)
        previous = jnp.where(jnp.any(parents, axis=1), jnp.stack(chunk, axis=1)[rows, parent],
                             cached)
      previous = _mix(previous, state.cur_token[:, j])
      chunk.append(previous)
    chunk = jnp.stack(chunk, axis=1)  # [B, k]
    hashes = hashes.at[rows[:, None], positions].set(chunk, mode="drop")
    logits = self.table[(contract.requested(state, chunk) % jnp.uint32(self.table.shape[0])
                         ).astype(jnp.int32)]
    return logits, {"prefix_hash": hashes}

  def next_token_logits(self, prefixes: np.ndarray) -> jax.Array:
    """Logits after each prefix [N, t] (starting with BOS), from a fresh cache: [N, V]."""
    prefixes = jnp.asarray(prefixes, jnp.int32)
    state = contract.DecodingState(
        cur_index=jnp.zeros((prefixes.shape[0],), jnp.int32), cur_token=prefixes,
        sequences=prefixes, cache=self.init_cache(prefixes.shape[0], prefixes.shape[1]))
    return self.tokens_to_logits(state)[0][:, -1]
