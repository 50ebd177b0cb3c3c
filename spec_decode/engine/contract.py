"""The model contract: how a decode loop calls a model, the one interface models enter the
engine through (`spec_decode.engine.decoding`'s loops, `beam_search`, `speculative_beam_search`,
`lookup`'s drafts; `network.Transformer`, `network.DecoderOnlyTransformer` and
`toy.PrefixHashModel` honour it).

A model is `tokens_to_logits(state: DecodingState) -> (logits, new_cache)` where
  state.cur_index  [B] int32     decoder position of state.cur_token[:, 0], per row;
  state.cur_token  [B, k] int32  k >= 1 tokens to feed (positions cur_index .. cur_index+k-1);
  state.sequences  [B, S] int32  the engine's token buffer (position 0 is BOS = 0);
  state.cache      the model's pytree: every leaf has the batch as its leading axis, except
                   the leaves T5X's cache convention names batch-free (below).
`logits [B, k, V]` (a JAX array, or a NumPy one, which a loop hands a logit callback
unconverted: see `decoding`'s conventions): row j predicts the token at position
cur_index + j + 1 and attends to every position <= cur_index + j and to nothing beyond. The cache is written by overwriting positions
[cur_index, cur_index + k); the engine rolls a row back simply by passing a smaller cur_index
next time, so entries at positions >= cur_index are stale and must never be read. Writes at
positions >= the cache length are dropped; a cache of length L = max_decode_len is enough.

The cache's batch-free leaves (T5X's convention): a leaf whose name (its dict key, or its
attribute) is in `BATCH_FREE_LEAVES`, T5X's `cache_map` exclusion list (the relative-position
bias T5X's decoders cache, [1, ...], and an absolute position embedder's index), has no batch
axis. Every loop hands the model such a leaf as the model gave it: never expanded to
num_decodes rows or beams, gathered per row or beam, nor rolled back (`map_rows` is how a loop
touches a cache's rows).

A tree call gives two more fields, both or neither (`speculative_beam_search` gives them to
its target; `network.Transformer` and `toy.PrefixHashModel` take them):
  state.token_positions [B, k] int32  the decoder position of each fed token;
  state.token_mask      [B, k, k] bool which fed tokens each fed token attends to;
fed token j is written to the cache at token_positions[:, j] (dropped past its length) and
attends to the cache positions < cur_index and to the fed tokens i with token_mask[:, j, i]
(itself included), with relative positions taken from token_positions, never to cache
entries at positions >= cur_index. So one call scores several continuations of a row (a tree
of tokens: each attends to its ancestors) while entries >= cur_index stay stale as above. A
chain call is the tree call with token_positions cur_index + j and a causal token_mask.

A call may ask for the logits of one fed token per row:
  state.logits_index [B] int32        which fed token's logits to return;
the call then returns logits [B, 1, V], those of fed token logits_index[b] (every fed token is
still written to the cache). The draft's catch-up call feeds two tokens and reads one: on
CPU the output projection is the largest product of a small draft's call. A model may ignore
the field and return every fed token's logits [B, k, V]: the engine then selects the row
itself (`logits_of_one`), so taking it only saves work.

The contract's history: every field after the first four is optional, and a model written
to any earlier form still decodes through every loop.
  1. cur_index, cur_token [B, k], sequences, cache: chain calls (k fed tokens at consecutive
     positions), all that `temperature_sample`, `speculative_sample` and `beam_search` need.
  2. token_positions, token_mask: tree calls, for `speculative_beam_search`'s target. A model
     that never reads them (`reads_fields`, from its traced call) is given chain calls instead,
     one per path of the tree (`speculative_beam_search._path_calls`): the same beams, in more
     target calls.
  3. logits_index: one fed token's logits, for the draft's catch-up call; a model ignoring it
     returns them all (above).
"""

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp


# T5X's `cache_map` exclusion list: the cache leaves that have no batch axis.
BATCH_FREE_LEAVES = ("cached_bias", "position_embedder_index")


def _leaf_name(path: tuple) -> Any:
  last = path[-1] if path else None
  return getattr(last, "key", getattr(last, "name", None))


def map_rows(fn: Callable[[jax.Array], jax.Array], cache: Any) -> Any:
  """`fn` over the leaves of `cache` that have the batch leading, its batch-free leaves
  (`BATCH_FREE_LEAVES`) passed through as they are: how a loop expands or gathers a cache's
  rows."""
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: leaf if _leaf_name(path) in BATCH_FREE_LEAVES else fn(leaf), cache)


@flax.struct.dataclass
class DecodingState:
  """What a model sees on each call (see the model contract above)."""
  cur_index: jax.Array  # [B] int32
  cur_token: jax.Array  # [B, k] int32
  sequences: jax.Array  # [B, S] int32
  cache: Any
  token_positions: jax.Array | None = None  # [B, k] int32: a tree call (see the contract)
  token_mask: jax.Array | None = None  # [B, k, k] bool
  logits_index: jax.Array | None = None  # [B] int32: return only that fed token's logits


TokensToLogits = Callable[[DecodingState], tuple[jax.Array, Any]]


def requested(state: DecodingState, per_fed_token: jax.Array) -> jax.Array:
  """`per_fed_token [B, k, ...]` as a call returns it: [B, 1, ...] at `state.logits_index`
  where the call asks for one fed token's logits, else unchanged."""
  if state.logits_index is None:
    return per_fed_token
  index = state.logits_index.reshape((-1, 1) + (1,) * (per_fed_token.ndim - 2))
  return jnp.take_along_axis(per_fed_token, index, axis=1)


def logits_of_one(tokens_to_logits: TokensToLogits, state: DecodingState,
                  index: jax.Array) -> tuple[jax.Array, Any]:
  """(logits [B, V] of fed token index[b], new cache): a call of `state` that asks for them
  (`logits_index`). A model that does not take the field returns every fed token's logits,
  and the row is selected here; ValueError at trace time for any other count."""
  logits, cache = tokens_to_logits(dataclasses.replace(state, logits_index=index))
  num_fed = state.cur_token.shape[1]
  if logits.shape[1] == 1:
    return logits[:, 0], cache
  if logits.shape[1] == num_fed:
    return jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0], cache
  raise ValueError(f"a model fed {num_fed} tokens returned the logits of {logits.shape[1]}: "
                   "see the model contract in spec_decode.engine.contract")


def reads_fields(tokens_to_logits: TokensToLogits, state: DecodingState,
                 names: tuple[str, ...]) -> bool:
  """Whether a call of `state` reads any of its fields `names` (arrays): traced, never
  compiled or run. A model written before an optional field existed never reads it."""

  def call(*values):
    return tokens_to_logits(dataclasses.replace(state, **dict(zip(names, values))))

  jaxpr = jax.make_jaxpr(call)(*(getattr(state, name) for name in names)).jaxpr
  used = {id(var) for eqn in jaxpr.eqns for var in eqn.invars}
  used |= {id(var) for var in jaxpr.outvars}
  return any(id(var) in used for var in jaxpr.invars)
