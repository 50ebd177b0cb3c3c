"""N-gram lookup drafts: proposals copied from a row's input and its own output, no draft model.

`NGramLookup` honours the engine's model contract (`contract`), so every verifier, drafting
policy and decode loop takes it as a draft unchanged. For the token after position t it looks,
per row, for the longest suffix of the row's tokens 1..t (up to `max_ngram` tokens) that also
occurs in the row's encoder input tokens or earlier in its own output (ending before t), and
proposes the token that followed that occurrence. Its logits are the one-hot of that token
(0 there, -inf elsewhere): a deterministic proposal, whose q is the point mass at the token
after any temperature, top-k or top-p, so the verifier weighs it like any draft and stays exact.

Where no suffix of at least `min_ngram` tokens matches, every logit is -inf: the engine's
"no proposal" (see `decoding`), which stops the row's drafting for the iteration instead of
proposing a made-up token. `with_model` combines a lookup with a draft model: the lookup's
proposal where it has one, the model's logits elsewhere, per row and per draft position.

`branches` gives a token tree (`token_tree`) every earlier match at once: one branch of copied
tokens per distinct continuation, absent where a row has fewer matches.

Everything is fixed-shape JAX inside the caller's jit: the source is the concatenation
[encoder tokens | output tokens] (Le + S entries), and each of the k fed positions compares its
last max_ngram tokens with every window of the source ([B, k, max_ngram, Le + S] booleans).
Ties between equally long matches go to the output's latest occurrence, else the input's first.

Cache: `LookupCache(source [B, Le])`, the encoder tokens (0 = padding, never matched); combined
with a model, `{'lookup': LookupCache, 'model': the model's cache}`.
"""

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.engine import contract

TokensToLogits = Callable[[contract.DecodingState], tuple[jax.Array, Any]]


@flax.struct.dataclass
class LookupCache:
  source: jax.Array  # [B, Le] int32: the row's encoder input tokens, 0 = padding


def check_ngram_settings(max_ngram: Any, min_ngram: Any) -> None:
  """ValueError naming the setting when the n-gram lengths cannot be used."""
  for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"lookup {name} must be an integer >= 1, got {value!r}")
  if min_ngram > max_ngram:
    raise ValueError(f"lookup min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")


def point_logits(token: jax.Array, proposes: jax.Array, vocab_size: int,
                 dtype: Any = jnp.float32) -> jax.Array:
  """Logits [..., V] of a deterministic proposal: 0 at `token`, -inf elsewhere; all -inf (no
  proposal) where `proposes` is False."""
  hit = (jnp.arange(vocab_size) == token[..., None]) & proposes[..., None]
  return jnp.where(hit, 0.0, -jnp.inf).astype(dtype)


def _match_lengths(source: jax.Array, sequences: jax.Array, positions: jax.Array,
                   max_ngram: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(length [B, k, M], following [B, M], rank [M]) over the text [source | sequences] of M
  entries: the length of the suffix ending at each of `positions [B, k]` that also ends at text
  entry e (0 where e may not be used: see `longest_match`), the token after entry e, and e's
  rank among equally long matches (the output's latest, else the input's first)."""
  num_rows, source_len = source.shape
  text = jnp.concatenate([source, sequences], axis=1)  # [B, M]
  text_len = text.shape[1]
  ends = jnp.arange(text_len)
  shifts = jnp.arange(max_ngram)
  # windows[b, i, e] = text[b, e - i] (-1 before the start: matches no token).
  windows = jnp.where((ends[None, :] >= shifts[:, None])[None],
                      text[:, jnp.clip(ends[None, :] - shifts[:, None], 0, text_len - 1)], -1)
  # suffix[b, j, i] = sequences[b, t_j - i], valid while t_j - i >= 1.
  suffix_positions = positions[..., None] - shifts
  suffix = jnp.take_along_axis(sequences[:, None, :].repeat(positions.shape[1], axis=1),
                               jnp.clip(suffix_positions, 0, sequences.shape[1] - 1), axis=2)
  suffix = jnp.where(suffix_positions >= 1, suffix, -2)  # -2: matches nothing
  equal = windows[:, None] == suffix[..., None]  # [B, k, N, M]
  length = jnp.sum(jnp.cumprod(equal, axis=2), axis=2)  # consecutive matches from the end
  following = jnp.concatenate([text[:, 1:], jnp.zeros((num_rows, 1), text.dtype)], axis=1)
  in_source = (ends < source_len - 1)[None] & (following != 0)  # [B, M]
  output_end = ends[None, None, :] - source_len  # position of the match's end in the output
  in_output = (output_end >= 1) & (output_end < positions[..., None])
  usable = in_source[:, None] | in_output
  # Among equally long matches the output's latest, else the input's first (a summary copies
  # its article mostly in order, from the top: the lead).
  rank = jnp.where(ends >= source_len, ends, source_len - 1 - ends)
  return jnp.where(usable, length, 0), following, rank


def longest_match(source: jax.Array, sequences: jax.Array, positions: jax.Array,
                  max_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(continuation [B, k], match length [B, k]) for the token after each of `positions [B, k]`.

  The suffix is sequences[t-n+1 .. t] with n <= min(max_ngram, t) (position 0, BOS, is never
  part of it); it may match `source [B, Le]` where a non-padding token follows, or
  sequences[1 .. t-1] (so the continuation is already known). Length 0: nothing matched.
  """
  length, following, rank = _match_lengths(source, sequences, positions, max_ngram)
  best = jnp.argmax(length * following.shape[1] + rank, axis=-1)
  best_length = jnp.take_along_axis(length, best[..., None], axis=-1)[..., 0]
  token = jnp.take_along_axis(following, best, axis=1)
  return token.astype(jnp.int32), best_length.astype(jnp.int32)


def branches(source: jax.Array, sequences: jax.Array, index: jax.Array, *, num_branches: int,
             depth: int, max_ngram: int, min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(tokens [B, num_branches, depth], present [B, num_branches, depth]): the continuations
  of up to `num_branches` earlier matches of the suffix ending at `index [B]` (at least
  `min_ngram` tokens, in `longest_match`'s order: its proposal is branch 0's first token), one
  per distinct first token, `depth` tokens each.

  A match in the source continues with the source's tokens, present up to its padding or its
  end; a match ending at output position e < t (t = index) with the output's tokens e + 1 ..
  t and, past t, with the branch's own tokens again (the suffix repeats every t - e tokens: an
  overlapping copy), all present. A row with fewer matches has its last branches absent.
  """
  length, following, rank = _match_lengths(source, sequences, index[:, None], max_ngram)
  length, text_len = length[:, 0], following.shape[1]
  score = jnp.where(length >= min_ngram, length * text_len + rank, -1)  # [B, M]
  ends = []
  for _ in range(num_branches):
    best = jnp.argmax(score, axis=-1)
    found = jnp.take_along_axis(score, best[:, None], axis=1)[:, 0] >= 0
    ends.append(jnp.where(found, best, -1))
    first = jnp.take_along_axis(following, best[:, None], axis=1)
    score = jnp.where(found[:, None] & (following == first), -1, score)
  ends = jnp.stack(ends, axis=1)  # [B, n]: the text entry each match ends at, -1: none
  source_len = source.shape[1]
  offsets = jnp.arange(depth)
  # In the output: entry e + 1 + (j mod (t - e)), e the match's end as an output position.
  output_end = ends - source_len
  period = jnp.maximum(index[:, None] - output_end, 1)
  from_output = source_len + output_end[..., None] + 1 + offsets % period[..., None]
  from_source = ends[..., None] + 1 + offsets
  in_output = (output_end >= 1)[..., None]
  entries = jnp.where(in_output, from_output, from_source)
  text = jnp.concatenate([source, sequences], axis=1)
  tokens = jnp.take_along_axis(text[:, None, :], jnp.clip(entries, 0, text_len - 1), axis=2)
  in_text = in_output | ((entries < source_len) & (tokens != 0))
  present = (ends >= 0)[..., None] & (jnp.cumprod(in_text, axis=-1) > 0)
  return jnp.where(present, tokens, 0).astype(jnp.int32), present


def _with_fed_tokens(state: contract.DecodingState) -> jax.Array:
  """The token buffer with the fed tokens written at their positions (the contract says they
  are there; writing them keeps the lookup right for a caller that has not)."""
  positions = state.cur_index[:, None] + jnp.arange(state.cur_token.shape[1])
  limit = state.sequences.shape[1]
  return jax.vmap(lambda row, where, new: row.at[where].set(new, mode="drop"))(
      state.sequences, jnp.where(positions < limit, positions, limit), state.cur_token)


@dataclasses.dataclass(frozen=True)
class NGramLookup:
  """A draft without a model (see the module docstring). `min_ngram`: the shortest match it
  proposes from (alone, 1; combined with a model, where the model takes over)."""
  vocab_size: int
  max_ngram: int = 4
  min_ngram: int = 1

  def __post_init__(self):
    check_ngram_settings(self.max_ngram, self.min_ngram)

  def init_cache(self, encoder_input_tokens: jax.Array) -> LookupCache:
    return LookupCache(jnp.asarray(encoder_input_tokens, jnp.int32))

  def proposals(self, cache: LookupCache, state: contract.DecodingState
                ) -> tuple[jax.Array, jax.Array]:
    """(token [B, k], proposes [B, k]) for each fed position (for the one fed token the
    call asks for: [B, 1])."""
    positions = state.cur_index[:, None] + jnp.arange(state.cur_token.shape[1])
    token, length = longest_match(cache.source, _with_fed_tokens(state), positions,
                                  self.max_ngram)
    return contract.requested(state, token), contract.requested(state, length >= self.min_ngram)

  def tokens_to_logits(self, state: contract.DecodingState) -> tuple[jax.Array, LookupCache]:
    token, proposes = self.proposals(state.cache, state)
    return point_logits(token, proposes, self.vocab_size), state.cache


def init_combined_cache(lookup: NGramLookup, encoder_input_tokens: jax.Array,
                        model_cache: Any) -> dict[str, Any]:
  """The cache of `with_model`: the lookup's and the model's."""
  return {"lookup": lookup.init_cache(encoder_input_tokens), "model": model_cache}


@dataclasses.dataclass(frozen=True)
class WithModel:
  """A draft that proposes the lookup's token where a match of at least `lookup.min_ngram`
  tokens exists and the model's logits elsewhere, per row and per position (`with_model`).
  The model is called on every fed token, so its cache never misses a position the lookup
  drafted."""
  lookup: NGramLookup
  model_tokens_to_logits: TokensToLogits

  def __call__(self, state: contract.DecodingState) -> tuple[jax.Array, dict[str, Any]]:
    logits, model_cache = self.model_tokens_to_logits(
        dataclasses.replace(state, cache=state.cache["model"]))
    token, proposes = self.lookup.proposals(state.cache["lookup"], state)
    logits = jnp.where(proposes[..., None],
                       point_logits(token, proposes, logits.shape[-1], logits.dtype), logits)
    return logits, {"lookup": state.cache["lookup"], "model": model_cache}


def with_model(lookup: NGramLookup, model_tokens_to_logits: TokensToLogits) -> WithModel:
  """The lookup combined with a draft model (`WithModel`); its cache is
  `init_combined_cache`'s."""
  return WithModel(lookup, model_tokens_to_logits)


def parts(draft_tokens_to_logits: TokensToLogits, draft_cache: Any
          ) -> tuple[NGramLookup, LookupCache, TokensToLogits | None, Any] | None:
  """(lookup, its cache, the model's tokens_to_logits, the model's cache) of a lookup draft:
  `NGramLookup.tokens_to_logits` (no model: None, None) or `with_model`'s; None for any other
  draft."""
  if isinstance(draft_tokens_to_logits, WithModel):
    return (draft_tokens_to_logits.lookup, draft_cache["lookup"],
            draft_tokens_to_logits.model_tokens_to_logits, draft_cache["model"])
  if isinstance(getattr(draft_tokens_to_logits, "__self__", None), NGramLookup):
    return draft_tokens_to_logits.__self__, draft_cache, None, None
  return None
