"""The sampling transform: logits -> the distribution that is actually sampled.

Every decoder draws from `logits_to_probs(logits, temperature, topk, topp)`, and the
speculative decoders apply the very same transform to the target's logits (p) and the
draft's logits (q), so that verification compares the distributions really sampled.

Shapes: `logits [..., V]` -> `probs [..., V]` float32, rows summing to 1.

Conventions (T5X's, except the topk default, see `decoding.temperature_sample`):
- temperature <= `GREEDY_TEMPERATURE` means argmax: a one-hot distribution (ties go to the
  lowest token id, like `jnp.argmax`).
- topk > 0 keeps the k largest logits (every logit equal to the k-th is kept as well).
- 0 < topp < 1 keeps the smallest set of most likely tokens whose total probability is
  >= topp (ties at the boundary are kept); topp in {0, 1} keeps everything.
- topk and topp both non-zero are refused (`validate_sampling_args`) as T5X's
  temperature_sample refuses them, where both are known; where either is traced T5X checks
  nothing and masks top-k, then top-p within what top-k kept, and so does `logits_to_probs`.

The settings are data, as in T5X: Python numbers (the transform is then specialized to them
when traced: a greedy temperature reads the argmax, no truncation costs nothing) or arrays,
traced ones included, so one compiled decoder serves every setting: `temperature` a scalar or
one per row ([N] for logits [N, ..., V]: T5X's per-example temperatures), `topk` and `topp`
scalars (T5X's are: one k and one p for the whole batch).
"""

import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

GREEDY_TEMPERATURE = 1e-4


def known_value(value: Any) -> np.ndarray | None:
  """A setting's value, or None where it is traced (known only when the decoder runs)."""
  try:
    return np.asarray(value)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def validate_sampling_args(temperature: Any, topk: Any, topp: Any) -> None:
  """Raises ValueError naming the offending argument (called before anything is traced; a
  traced value is checked for its shape alone)."""
  if np.ndim(temperature) > 1:
    raise ValueError(f"temperature must be a number or one per example, got shape "
                     f"{np.shape(temperature)}")
  for name, value in (("topk", topk), ("topp", topp)):
    if np.ndim(value) != 0:
      raise ValueError(f"{name} must be a number, got shape {np.shape(value)}")
  known = known_value(temperature)
  if known is not None and not np.all(known >= 0):
    raise ValueError(f"temperature must be >= 0, got {temperature!r}")
  known_topk = known_value(topk)
  if known_topk is not None and (isinstance(topk, bool) or known_topk.dtype == bool
                                 or int(known_topk) != known_topk or known_topk < 0):
    raise ValueError(f"topk must be an integer >= 0, got {topk!r}")
  known_topp = known_value(topp)
  if known_topp is not None and not 0.0 <= known_topp <= 1.0:
    raise ValueError(f"topp must be in [0, 1], got {topp!r}")
  if known_topk is not None and known_topp is not None and known_topk and known_topp:
    raise ValueError(f"at most one of topk ({topk!r}) and topp ({topp!r}) may be non-zero, as "
                     f"in T5X's temperature_sample")


def check_settings(temperature: Any = 1.0, topk: Any = 0, topp: Any = 0.0,
                   max_decode_steps: Any = None, max_decode_steps_hard_limit: int | None = None,
                   rescale_log_probs: bool = True, logit_callback_fn: Any = None,
                   **_: Any) -> None:
  """ValueError for settings of T5X's temperature_sample no decoder can use: the transform's
  (`validate_sampling_args`), the decode's length (`max_decode_steps` a number, or one per
  example [B], traced or not, as T5X takes it), its scores (traced ones: their shapes) and the
  logit callback."""
  validate_sampling_args(temperature, topk, topp)
  if logit_callback_fn is not None and not callable(logit_callback_fn):
    raise ValueError(f"logit_callback_fn must be a function (logits, state) -> logits or None, "
                     f"got {logit_callback_fn!r}")
  if not isinstance(rescale_log_probs, bool):
    raise ValueError(f"rescale_log_probs must be True or False, got {rescale_log_probs!r}")
  limit = max_decode_steps_hard_limit
  if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
    raise ValueError(f"max_decode_steps_hard_limit must be a Python integer >= 0 (0: none) or "
                     f"None, got {limit!r}")
  if max_decode_steps is None:
    return
  known = known_value(max_decode_steps)
  if np.ndim(max_decode_steps) > 1 or isinstance(max_decode_steps, bool) or (
      known is not None and (known.dtype == bool or np.any(known.astype(int) != known)
                             or np.any(known < 1))):
    raise ValueError(f"max_decode_steps must be an integer >= 1, one per example, or None, "
                     f"got {max_decode_steps!r}")


def first_argmax(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32 (ties to the lowest index) for rows without NaN, as a
  max and a min: XLA:CPU's variadic argmax reduction is about twice as slow (measured at
  [3, 8000] and [8, 32128], float32). A row holding NaN gives its last index."""
  size = x.shape[-1]
  is_max = x == jnp.max(x, axis=-1, keepdims=True)
  first = jnp.min(jnp.where(is_max, jnp.arange(size, dtype=jnp.int32), size), axis=-1)
  return jnp.minimum(first, size - 1)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Number)


def _divisor(temperature: Any, logits: jax.Array) -> Any:
  """What `logits [N, ..., V]` are divided by: a number as it is, an array broadcast per row
  and kept from 0 (its greedy rows are replaced by their point mass)."""
  if _is_number(temperature):
    return temperature
  temperature = jnp.asarray(temperature, jnp.float32)
  temperature = temperature.reshape(temperature.shape + (1,) * (logits.ndim - temperature.ndim))
  return jnp.maximum(temperature, GREEDY_TEMPERATURE)


def logits_to_probs(logits: jax.Array, temperature: Any = 1.0, topk: Any = 0,
                    topp: Any = 0.0) -> jax.Array:
  """The sampled distribution for `logits [..., V]` (settings: see the module docstring)."""
  logits = logits.astype(jnp.float32)
  one_hot = lambda: jax.nn.one_hot(first_argmax(logits), logits.shape[-1], dtype=jnp.float32)
  if is_greedy(temperature):
    return one_hot()
  divisor = _divisor(temperature, logits)
  logits = logits / divisor
  if not _is_number(topk):  # a traced k: the k-th largest of the sorted logits
    descending = -jnp.sort(-logits, axis=-1)
    kth_largest = jnp.take(descending, jnp.clip(topk - 1, 0, logits.shape[-1] - 1), axis=-1)
    logits = jnp.where((topk > 0) & (logits < kth_largest[..., None]), -jnp.inf, logits)
  elif 0 < topk < logits.shape[-1]:
    kth_largest = jax.lax.top_k(logits, topk)[0][..., -1:]
    logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
  probs = jax.nn.softmax(logits, axis=-1)
  if not _is_number(topp) or 0.0 < topp < 1.0:
    sorted_probs = -jnp.sort(-probs, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    # The smallest kept probability: the last sorted token whose preceding mass is < topp.
    threshold = jnp.min(jnp.where(mass_before < topp, sorted_probs, jnp.inf), axis=-1,
                        keepdims=True)
    truncated = jnp.where(probs >= threshold, probs, 0.0)
    truncated = truncated / jnp.sum(truncated, axis=-1, keepdims=True)
    probs = jnp.where((0.0 < topp) & (topp < 1.0), truncated, probs)
  if not _is_number(temperature):  # rows at a greedy temperature: their point mass
    probs = jnp.where(divisor <= GREEDY_TEMPERATURE, one_hot(), probs)
  return probs


def is_greedy(temperature: Any) -> bool:
  """Whether `logits_to_probs` turns every row into a point mass, known before anything runs:
  a number at most `GREEDY_TEMPERATURE`. An array temperature never is (its rows may differ,
  or it is traced); its greedy rows are point masses drawn from like any law."""
  return _is_number(temperature) and temperature <= GREEDY_TEMPERATURE


def sample(rng: jax.Array, probs: jax.Array, point_masses: bool = False) -> jax.Array:
  """Draws one id per row of `probs [..., V]` -> [...] int32 (rows may be unnormalized).

  `point_masses=True` (static) promises that every row puts all its mass on one id, as at a
  greedy temperature; that id is then read by argmax instead of searched for, which is the same
  draw without the search's ~40 small kernels, and without drawing a uniform.
  Otherwise `sample_from_uniform` with one uniform per row from `rng`.
  """
  if point_masses:
    return first_argmax(probs)
  return sample_from_uniform(jax.random.uniform(rng, probs.shape[:-1]), probs)


def _block_width(vocab_size: int) -> int:
  """The width of the blocks `sample_from_uniform` walks first: the divisor of the vocabulary
  size nearest its square root from below when it is at least half that root, else the root
  plus one (the vocabulary is then padded with ids of probability 0 to whole blocks), so that
  neither level holds more than about 2 sqrt(V) entries."""
  root = math.isqrt(vocab_size)
  divisor = max(d for d in range(1, root + 1) if vocab_size % d == 0)
  return divisor if 2 * divisor >= root else root + 1


def _prefix_sums(x: jax.Array) -> jax.Array:
  """Inclusive prefix sums along the last axis of `x [..., n]`, as masked sums ([n, n])."""
  n = x.shape[-1]
  upto = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]  # [i, j]: j <= i
  return jnp.sum(jnp.where(upto, x[..., None, :], 0.0), axis=-1)


def sample_from_uniform(uniform: jax.Array, probs: jax.Array) -> jax.Array:
  """The id of each row of `probs [..., V]` at which the row's cumulative mass passes
  `uniform [...]` (in [0, 1)) times the row's total: one draw per row -> [...] int32.

  Inverse CDF with one uniform per row: drawing V Gumbels per row (`jax.random.categorical`)
  costs more than a small model's whole decoder call on a CPU, and a decoder draws all of an
  iteration's uniforms at once (one random-bits call instead of one per draw). The id is found
  in two levels, a few kernels whatever V: the vocabulary as blocks of about sqrt(V) ids, the
  block where the cumulative mass passes the threshold, then the id within it. Every sum is a
  masked sum, prefix sums included (`_prefix_sums`, sqrt(V) x sqrt(V) per level): on a
  vocabulary-sharded array each is an all-reduce, where a scan (`jnp.cumsum`) would pass
  partial sums from device to device. An id with probability 0 is never drawn, whatever the
  rounding.
  """
  # Clipped: rounding can leave entries slightly below zero.
  probs = jnp.maximum(probs.astype(jnp.float32), 0.0)
  vocab_size = probs.shape[-1]
  width = _block_width(vocab_size)
  num_blocks = -(-vocab_size // width)
  padding = [(0, 0)] * (probs.ndim - 1) + [(0, num_blocks * width - vocab_size)]
  blocks = jnp.pad(probs, padding).reshape(probs.shape[:-1] + (num_blocks, width))
  block_mass = jnp.sum(blocks, axis=-1)
  block_end = _prefix_sums(block_mass)  # the mass up to each block's end
  threshold = uniform * jnp.sum(block_mass, axis=-1)
  count_at_most = lambda ends: jnp.sum((ends <= threshold[..., None]).astype(jnp.int32), -1)
  block = jnp.minimum(count_at_most(block_end), num_blocks - 1)
  chosen = jnp.arange(num_blocks) == block[..., None]
  before = jnp.sum(jnp.where(chosen, block_end - block_mass, 0.0), axis=-1)
  in_block = jnp.sum(jnp.where(chosen[..., None], blocks, 0.0), axis=-2)  # [..., width]
  offset = jnp.minimum(count_at_most(before[..., None] + _prefix_sums(in_block)),
                       width - 1)
  token = block * width + offset
  # A rounding tie can land on an id of probability 0, or past the vocabulary in the padding;
  # the likeliest id stands in for it.
  in_vocab = jnp.minimum(token, vocab_size - 1)
  drawn = (token < vocab_size) & (
      jnp.take_along_axis(probs, in_vocab[..., None], axis=-1)[..., 0] > 0)
  return jnp.where(drawn, token, first_argmax(probs)).astype(jnp.int32)


def log_softmax_of(logits: jax.Array, tokens: jax.Array) -> jax.Array:
  """The model's own log-probability (temperature 1, untruncated) of `tokens [...]` under
  `logits [..., V]`: what T5X's samplers report with `rescale_log_probs=False`."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]


def law_log_prob_of(logits: jax.Array, tokens: jax.Array, temperature: Any = 1.0,
                    topk: Any = 0, topp: Any = 0.0) -> jax.Array:
  """The log-probability of `tokens [...]` under the law `logits_to_probs` samples from
  `logits [..., V]`: T5X's `rescale_log_probs=True` score (the tempered log-softmax renormalized
  over the ids top-k/top-p keep; 0 for the argmax at a greedy temperature, -inf for an id the
  law excludes). Computed in log space, as T5X does: the log of a float32 probability loses
  an unlikely id's precision."""
  if is_greedy(temperature):
    return jnp.where(first_argmax(logits) == tokens, 0.0, -jnp.inf)
  kept = logits_to_probs(logits, temperature, topk, topp) > 0  # one id in a greedy row
  scaled = jnp.where(kept, logits.astype(jnp.float32) / _divisor(temperature, logits), -jnp.inf)
  return jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), tokens[..., None],
                             axis=-1)[..., 0]


def decode_uniforms(decode_rng: jax.Array | None, num_rows: int, max_iterations: int,
                    draws_per_iteration: int) -> jax.Array:
  """Every uniform a decode loop can draw, [max_iterations, N, draws_per_iteration], from one
  random-bits call before the loop (None: PRNGKey(0)); iteration t draws with row t
  (`iteration_uniforms`). A loop whose every iteration commits a token of each unfinished row
  has at most as many iterations as its buffer has positions. Why not a key split per draw: on
  XLA:CPU a random-bits call is a loop of its own (threefry's rolled rounds, ~90 kernels)."""
  rng = jax.random.PRNGKey(0) if decode_rng is None else decode_rng
  return jax.random.uniform(rng, (max_iterations, num_rows, draws_per_iteration))


def iteration_uniforms(uniforms: jax.Array | None, iteration: jax.Array) -> jax.Array | None:
  """Row `iteration` of `decode_uniforms` [N, draws_per_iteration] (None stays None)."""
  if uniforms is None:
    return None
  return jax.lax.dynamic_index_in_dim(uniforms, jnp.minimum(iteration, uniforms.shape[0] - 1),
                                      keepdims=False)
