"""Unigram and bigram language models as drafts: the paper's trivial drafts, no network.

`NGramModel` honours the engine's model contract (`contract`), so every verifier, drafting
policy and decode loop takes it as a draft unchanged, and its q is an ordinary distribution the
verifiers weigh like a network's. It is data (a `flax.struct` pytree passed into the caller's
jit, like a network's parameters), estimated from token sequences by `estimate`.

The law, for the token x after a fed token t (t = 0, the BOS/PAD id, before the first output
token):
  unigram (order 1)  q(x)     = u(x)
  bigram  (order 2)  q(x | t) = (c(t, x) + beta * u(x)) / (n(t) + beta)
where u(x) = (count(x) + 1) / (N + V - 1) over the non-PAD ids (add-one: every token stays
possible; PAD never follows anything), c(t, x) counts x right after t for the `max_successors`
most frequent successors of t (the rest of t's counts are dropped, and n(t) is the sum of those
kept), and beta (`smoothing`) is the weight of the unigram prior (Dirichlet smoothing). Both
sum to one over the vocabulary, so the model is a proper draft.

Storage: `unigram_log_probs [V]`, and for order 2 `successors [V, K]` int32 with
`successor_counts [V, K]` (0 for unused slots), `smoothing` a scalar: O(V K), not the
O(V^2) of a dense bigram table (32,000^2 floats would be 4 GB). A call's logits are
[B, k, V] (or [B, 1, V] for `logits_index`); the model keeps no cache, so a row rolls back
by construction and tree calls need nothing (a fed token's logits depend on that token alone).
"""

from typing import Iterable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import contract

ORDERS = (1, 2)
PAD_ID = 0


@flax.struct.dataclass
class NGramModel:
  unigram_log_probs: jax.Array  # [V] float32: log u(x); -inf at PAD
  successors: jax.Array  # [V, K] int32: the kept successors of each token (K = 0: a unigram)
  successor_counts: jax.Array  # [V, K] float32: c(t, x) of each kept successor, 0 where unused
  smoothing: jax.Array  # [] float32: beta

  @property
  def order(self) -> int:
    return 2 if self.successors.shape[-1] else 1

  @property
  def vocab_size(self) -> int:
    return self.unigram_log_probs.shape[-1]

  def init_cache(self, batch_size: int, max_decode_len: int) -> dict:
    """The model keeps no cache (the contract's caches are pytrees: this one is empty)."""
    del batch_size, max_decode_len
    return {}

  def next_token_log_probs(self, tokens: jax.Array) -> jax.Array:
    """log q(. | t) [..., V] for fed tokens `tokens [...]`."""
    unigram = jnp.broadcast_to(self.unigram_log_probs, tokens.shape + (self.vocab_size,))
    if self.order == 1:
      return unigram
    counts = self.successor_counts[tokens]  # [..., K]
    kept = jnp.zeros(unigram.shape, jnp.float32)
    kept = jnp.put_along_axis(kept, self.successors[tokens], counts, axis=-1, inplace=False)
    total = jnp.sum(counts, axis=-1, keepdims=True) + self.smoothing
    return jnp.log(kept + self.smoothing * jnp.exp(unigram)) - jnp.log(total)

  def tokens_to_logits(self, state: contract.DecodingState) -> tuple[jax.Array, dict]:
    """The contract's call: logits [B, k, V] of the fed tokens ([B, 1, V] for logits_index)."""
    return self.next_token_log_probs(contract.requested(state, state.cur_token)), state.cache


def estimate(sequences: Iterable[np.ndarray], vocab_size: int, *, order: int,
             max_successors: int = 64, smoothing: float = 1.0) -> NGramModel:
  """The model of `order` estimated from token sequences (each the ids of one text, no BOS; PAD
  ids are skipped), as the module docstring defines it. ValueError naming a bad setting."""
  if order not in ORDERS:
    raise ValueError(f"n-gram order must be one of {ORDERS}, got {order!r}")
  if isinstance(max_successors, bool) or not isinstance(max_successors, int) or max_successors < 1:
    raise ValueError(f"max_successors must be an integer >= 1, got {max_successors!r}")
  if not smoothing > 0:
    raise ValueError(f"smoothing must be > 0, got {smoothing!r}")
  unigram = np.zeros(vocab_size, np.float64)
  pairs = []
  for sequence in sequences:
    tokens = np.asarray(sequence, np.int64)
    tokens = tokens[tokens != PAD_ID]
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
      raise ValueError(f"a sequence holds ids outside the vocabulary of {vocab_size}")
    unigram += np.bincount(tokens, minlength=vocab_size)
    previous = np.concatenate([[PAD_ID], tokens[:-1]])
    pairs.append(previous * vocab_size + tokens)
  unigram[PAD_ID] = 0.0
  probs = (unigram + 1.0) / (unigram.sum() + vocab_size - 1)
  probs[PAD_ID] = 0.0
  with np.errstate(divide="ignore"):
    unigram_log_probs = np.log(probs).astype(np.float32)
  num_kept = max_successors if order == 2 else 0
  successors = np.zeros((vocab_size, num_kept), np.int32)
  successor_counts = np.zeros((vocab_size, num_kept), np.float32)
  if num_kept:
    keys, counts = np.unique(np.concatenate(pairs or [np.zeros(0, np.int64)]),
                             return_counts=True)
    previous, following = keys // vocab_size, keys % vocab_size
    # Within each previous token, most frequent first (ties: the smaller id).
    ranked = np.lexsort((following, -counts, previous))
    previous, following, counts = previous[ranked], following[ranked], counts[ranked]
    starts = np.searchsorted(previous, previous, side="left")
    rank = np.arange(previous.size) - starts
    keep = rank < num_kept
    successors[previous[keep], rank[keep]] = following[keep]
    successor_counts[previous[keep], rank[keep]] = counts[keep]
  return NGramModel(unigram_log_probs=jnp.asarray(unigram_log_probs),
                    successors=jnp.asarray(successors),
                    successor_counts=jnp.asarray(successor_counts),
                    smoothing=jnp.asarray(smoothing, jnp.float32))
