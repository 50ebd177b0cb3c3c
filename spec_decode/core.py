"""The one speculative decode core: a registered decode loop wired to a target and a draft.

Every entry point decodes through `Decoder`: the standalone models (`spec_decode.models`), the
T5X hook (`spec_decode.t5x.speculative`), `spec_decode.infer` on a mesh
(`decode_layout.DecodeLayout.partition_predict`), the benchmark (`bench.decoders`, which times
`prefill` and `run` apart) and the tests. A `Decoder` is built once from
  * a decode loop's name (`spec_decode.engine.loops`: 'speculative_sample', 'temperature_sample'
    or any loop registered there) and the settings a config gives it (gamma, verifier,
    draft_policy, temperature, topk, topp, max_decode_steps, or a new loop's own);
  * the target's network (`network.Network`: a T5 `network.Transformer` or a decoder-only
    `network.DecoderOnlyTransformer`) and (when the loop uses one) the draft: a network of the
    same family, or a `LookupDraft` (n-gram lookup from the input and the output so
    far, `spec_decode.engine.lookup`), alone or combined with a draft `network.Transformer`,
    or an `NGramDraft` (a unigram or bigram model, `spec_decode.engine.ngram`) (`make_draft`
    builds each from a runner's settings: one place for every runner);
and checks the pair there, once, before anything is restored or compiled: the loop exists,
takes every setting and accepts its values, has a draft exactly when it needs one, and both
models share a vocabulary size (a ValueError naming the problem).

Decoding with T5X's semantics (B batch, n num_decodes, L decoder length, Le input length):
  predict(params, draft_params, batch, eos_id, rng, decoder_params, return_all_decodes,
          num_decodes, prompt_with_targets) -> (decodes [B, L], aux {name: [B]}), or with
          return_all_decodes (decodes [B, n, L], aux {name: [B, n]}), sorted by score, best last;
  aux: 'scores' (the decode's log-probability as T5X's decode functions score it: under the
  law sampled, or the target's own with the loop setting rescale_log_probs=False; or its beam
  score) and the loop's stats (`.aux()`
  of its stats, e.g. `SpeculativeStats`: the counters, 'alpha', 'tokens_per_target_call');
  `rng` becomes the loop's decode_rng;
  `decoder_params` are further loop arguments (T5X's), `eos_id` there overrides the argument;
  `prompt_with_targets` forces decoder_input_tokens, without their EOS (T5X's convention), as a
  prompt. Its halves, which the benchmark times apart:
  prefill(params, draft_params, prefill_tokens, max_decode_len) -> Caches;
  run(params, draft_params, caches, inputs [B, L], eos_id, ..., initial_index) -> (decodes
      [B, n, L], scores [B, n], aux {name: [B, n]}).
A decoder-only target decodes as T5X's `DecoderOnlyModel`: the batch is seqio's decoder
features with `decoder_causal_attention` (1 over BOS and the prompt, as
`seqio.DecoderFeatureConverter` writes it); `prefill_tokens` are the prompt (`decoder_input_tokens
* decoder_causal_attention`), each row starts at its last prompt token (`initial_index`,
`network.prompt_lengths`) and `predict`'s decodes are the continuations, the prompt cut off
(T5X's `remove_prefix`). An encoder-decoder's `prefill_tokens` are its encoder input [B, Le].
Where caches live is a `ModelCalls`' business: `NetworkCalls` (the network as it is) by default;
`decode_layout.DecodeLayout` pins each cache to its mesh layout (role 'lookup': a lookup's cache,
the rows' encoder tokens). `draft_params` are the draft network's, an n-gram draft's
`engine.ngram.NGramModel` (its tables: data, like a network's parameters), or None for a lookup
alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode.runtime import platforms
from spec_decode.engine import decoding
from spec_decode.engine import lookup
from spec_decode.engine import loops
from spec_decode.engine import ngram
from spec_decode.t5 import network

Params = Any
Batch = Mapping[str, jax.Array]
TokensToLogits = Callable[[decoding.DecodingState], tuple[jax.Array, Any]]

# The settings that fix the sampled distribution (T5X temperature_sample's arguments).
SAMPLING_SETTINGS = decoding.SAMPLING_DATA
# Where a speculative decode's drafts come from (a runner's `draft_source` setting).
DRAFT_SOURCES = ("model", "lookup", "lookup+model", "ngram")


@dataclasses.dataclass(frozen=True)
class LookupDraft:
  """An n-gram lookup draft (`engine.lookup.NGramLookup`): alone when `model` is None, else
  the lookup where a match of at least `min_ngram` tokens exists and `model` elsewhere."""
  max_ngram: int = 4
  min_ngram: int = 1
  model: network.Network | None = None

  def __post_init__(self):
    lookup.check_ngram_settings(self.max_ngram, self.min_ngram)
    if self.model is not None and not isinstance(self.model, network.NETWORKS):
      raise ValueError(f"a lookup's draft model must be a network, got {self.model!r}")

  def drafter(self, vocab_size: int) -> lookup.NGramLookup:
    return lookup.NGramLookup(vocab_size, self.max_ngram, self.min_ngram)


@dataclasses.dataclass(frozen=True)
class NGramDraft:
  """A unigram (order 1) or bigram (order 2) draft, `engine.ngram.NGramModel`: no network; the
  model itself is the decode's `draft_params`."""
  order: int
  vocab_size: int

  def __post_init__(self):
    if self.order not in ngram.ORDERS:
      raise ValueError(f"an n-gram draft's order must be one of {ngram.ORDERS}, got "
                       f"{self.order!r}")

  @classmethod
  def of(cls, model: ngram.NGramModel) -> "NGramDraft":
    return cls(model.order, model.vocab_size)


Draft = network.Network | LookupDraft | NGramDraft


def make_draft(draft_source: str, model: network.Network | None,
               lookup_max_ngram: int = 4, lookup_min_ngram: int | None = None, *,
               ngram_draft: NGramDraft | None = None) -> Draft:
  """The draft of a runner's settings: 'model' (the draft network), 'lookup' (n-gram lookup
  alone: `model` must be None), 'lookup+model' (lookup where a match of `lookup_min_ngram`
  tokens exists, default 2, the model elsewhere) or 'ngram' (`ngram_draft`, a unigram or bigram
  model: `model` must be None). ValueError naming a bad setting."""
  if draft_source not in DRAFT_SOURCES:
    raise ValueError(f"draft_source must be one of {DRAFT_SOURCES}, got {draft_source!r}")
  if draft_source == "ngram":
    if model is not None:
      raise ValueError("draft_source 'ngram' uses no draft model, but one is given")
    if ngram_draft is None:
      raise ValueError("draft_source 'ngram' needs an n-gram model file (draft_checkpoint_path "
                       "of a `python -m spec_decode.data.ngrams` output)")
    return ngram_draft
  if draft_source != "lookup" and model is None:
    raise ValueError(f"draft_source {draft_source!r} needs a draft model")
  if draft_source == "model":
    return model
  if draft_source == "lookup" and model is not None:
    raise ValueError("draft_source 'lookup' uses no draft model, but one is given")
  if lookup_min_ngram is None:
    lookup_min_ngram = 1 if model is None else min(2, lookup_max_ngram)
  return LookupDraft(lookup_max_ngram, lookup_min_ngram, model)


def draft_network(draft: Draft | None) -> network.Network | None:
  """The network a draft's parameters belong to (None: a lookup alone, an n-gram draft, or no
  draft)."""
  if isinstance(draft, LookupDraft):
    return draft.model
  return draft if isinstance(draft, network.NETWORKS) else None


class ModelCalls(Protocol):
  """How a decode gets each model's cache and step function (role 'target' or 'draft'), and
  where a lookup draft's cache lives (`pin_cache` with role 'lookup')."""

  def init_cache(self, role: str, module: network.Network, params: Params,
                 prefill_tokens: jax.Array, max_decode_len: int) -> network.DecodeCache:
    ...

  def tokens_to_logits(self, role: str, module: network.Network,
                       params: Params) -> TokensToLogits:
    ...

  def pin_cache(self, role: str, cache: network.DecodeCache) -> network.DecodeCache:
    ...


@dataclasses.dataclass(frozen=True)
class NetworkCalls:
  """`ModelCalls` of the network as it is, on `platform` (None: `Platform.default()`, the devices
  a plain jit runs on): its products chosen there (`platforms.Platform.module`), caches wherever
  the computation puts them."""
  platform: platforms.Platform | None = None

  def _module(self, module: network.Network) -> network.Network:
    return (self.platform or platforms.Platform.default()).module(module)

  def init_cache(self, role: str, module: network.Network, params: Params,
                 prefill_tokens: jax.Array, max_decode_len: int) -> network.DecodeCache:
    del role
    return network.init_decode_cache(self._module(module), params, prefill_tokens,
                                     max_decode_len)

  def tokens_to_logits(self, role: str, module: network.Network,
                       params: Params) -> TokensToLogits:
    del role
    return network.make_tokens_to_logits(self._module(module), params)

  def pin_cache(self, role: str, cache: network.DecodeCache) -> network.DecodeCache:
    del role
    return cache


NETWORK_CALLS = NetworkCalls()


@flax.struct.dataclass
class Caches:
  """The decode caches of one batch: the target's, and the draft's (None without a draft)."""
  target: network.DecodeCache
  draft: Any  # a network's DecodeCache, a lookup's cache, or both (see `Decoder.prefill`)


def _frozen(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
  return tuple(sorted((name, tuple(value) if isinstance(value, list) else value)
                      for name, value in settings.items()))


@dataclasses.dataclass(frozen=True)
class Decoder:
  """A decode loop with its settings over a target and (when the loop uses one) a draft.

  Build it with `Decoder.create(loop, target, draft, **settings)`; a setting given as None is
  left to the loop's default. See the module docstring for what is checked and computed.
  """
  loop_name: str
  target: network.Network
  draft: Draft | None
  settings: tuple[tuple[str, Any], ...]

  def __post_init__(self):
    loop = loops.get(self.loop_name)
    if not isinstance(self.target, network.NETWORKS):
      raise ValueError(f"the target must be a network (network.Transformer or "
                       f"network.DecoderOnlyTransformer), got {self.target!r}")
    if self.draft is not None and not isinstance(self.draft, network.NETWORKS + (LookupDraft,
                                                                                 NGramDraft)):
      raise ValueError(f"the draft must be a network, a LookupDraft or an NGramDraft, got "
                       f"{self.draft!r}")
    if (self.draft_network is not None and network.is_decoder_only(self.draft_network)
        != self.decoder_only):
      kinds = ("an encoder-decoder", "a decoder-only model")
      raise ValueError(f"the target is {kinds[self.decoder_only]} and the draft "
                       f"{kinds[not self.decoder_only]}: a draft network must be of its "
                       "target's family")
    if loop.uses_draft and self.draft is None:
      raise ValueError(f"decode loop {self.loop_name!r} needs a draft model")
    if not loop.uses_draft and self.draft is not None:
      raise ValueError(f"decode loop {self.loop_name!r} uses no draft model, but one is given")
    draft_vocab = (self.draft.vocab_size if isinstance(self.draft, NGramDraft) else
                   None if self.draft_network is None else self.draft_network.config.vocab_size)
    if draft_vocab is not None:
      target_vocab = self.target.config.vocab_size
      if target_vocab != draft_vocab:
        raise ValueError(f"target and draft vocabularies differ: the target has {target_vocab} "
                         f"ids, the draft {draft_vocab}")
    loop.check(dict(self.settings))

  @classmethod
  def create(cls, loop: str, target: network.Network, draft: Draft | None = None,
             **settings: Any) -> "Decoder":
    return cls(loop, target, draft,
               _frozen({name: value for name, value in settings.items() if value is not None}))

  @property
  def loop(self) -> loops.DecodeLoop:
    return loops.get(self.loop_name)

  @property
  def uses_draft(self) -> bool:
    return self.loop.uses_draft

  @property
  def decoder_only(self) -> bool:
    """Whether the target is a decoder-only language model (prefilled with a prompt)."""
    return network.is_decoder_only(self.target)

  @property
  def draft_network(self) -> network.Network | None:
    """The draft network whose parameters a decode takes (None: no draft params)."""
    return draft_network(self.draft)

  @property
  def takes_draft_params(self) -> bool:
    """Whether a decode takes draft_params: a draft network's, or an n-gram draft's model."""
    return self.draft_network is not None or isinstance(self.draft, NGramDraft)

  @property
  def draft_description(self) -> str:
    """Where the drafts come from, for reports: 'draft model', 'n-gram lookup (n 1..4)', ..."""
    if isinstance(self.draft, NGramDraft):
      return ("unigram", "bigram")[self.draft.order - 1] + " draft"
    if not isinstance(self.draft, LookupDraft):
      return "draft model"
    lookup_text = f"n-gram lookup (n {self.draft.min_ngram}..{self.draft.max_ngram})"
    return lookup_text if self.draft.model is None else lookup_text + ", else draft model"

  def _draft_cache(self, calls: ModelCalls, draft_params: Params | None,
                   prefill_tokens: jax.Array, max_decode_len: int) -> Any:
    if isinstance(self.draft, NGramDraft):
      return draft_params.init_cache(prefill_tokens.shape[0], max_decode_len)
    model_cache = None
    if self.draft_network is not None:
      model_cache = calls.init_cache("draft", self.draft_network, draft_params,
                                     prefill_tokens, max_decode_len)
    if not isinstance(self.draft, LookupDraft):
      return model_cache
    drafter = self.draft.drafter(self.target.config.vocab_size)
    # A lookup searches the encoder's input, or a language model's prompt, and the output.
    lookup_cache = calls.pin_cache("lookup", drafter.init_cache(prefill_tokens))
    if model_cache is None:
      return lookup_cache
    return {"lookup": lookup_cache, "model": model_cache}  # `lookup.with_model`'s cache

  def _draft_calls(self, calls: ModelCalls, draft_params: Params | None,
                   cache: Any) -> tuple[Any, TokensToLogits]:
    """(the draft's cache, pinned, and its tokens_to_logits)."""
    if isinstance(self.draft, NGramDraft):
      return cache, draft_params.tokens_to_logits
    if not isinstance(self.draft, LookupDraft):
      return (calls.pin_cache("draft", cache),
              calls.tokens_to_logits("draft", self.draft, draft_params))
    drafter = self.draft.drafter(self.target.config.vocab_size)
    if self.draft_network is None:
      return calls.pin_cache("lookup", cache), drafter.tokens_to_logits
    cache = {"lookup": calls.pin_cache("lookup", cache["lookup"]),
             "model": calls.pin_cache("draft", cache["model"])}
    return cache, lookup.with_model(
        drafter, calls.tokens_to_logits("draft", self.draft_network, draft_params))

  def resolved_settings(self) -> dict[str, Any]:
    """Every setting of the loop, as it will run (its defaults where the config set none)."""
    return {**self.loop.defaults(), **dict(self.settings)}

  def baseline(self) -> "Decoder":
    """The target alone, one call per step, with this decoder's settings that its loop's
    baseline takes (the same distribution, or the same beam search): what a speculative
    decoder is compared with."""
    baseline = loops.get(self.loop.baseline)
    shared = {name: value for name, value in self.settings if name in baseline.setting_names}
    return Decoder.create(baseline.name, self.target, None, **shared)

  def prefill(self, params: Params, draft_params: Params | None, prefill_tokens: jax.Array,
              max_decode_len: int, calls: ModelCalls = NETWORK_CALLS) -> Caches:
    """Both models' caches: an encoder-decoder's encoders run once on `prefill_tokens` (the
    encoder input [B, Le]; decode caches of positions < 0, empty), a language model's prompt
    `prefill_tokens` [B, L] fills its cache below each row's `initial_index`."""
    draft_cache = None
    if self.uses_draft:
      draft_cache = self._draft_cache(calls, draft_params, prefill_tokens, max_decode_len)
    return Caches(calls.init_cache("target", self.target, params, prefill_tokens,
                                   max_decode_len), draft_cache)

  def run(self, params: Params, draft_params: Params | None, caches: Caches, inputs: jax.Array,
          eos_id: int, *, num_decodes: int = 1,
          decoder_params: Mapping[str, Any] | None = None,
          calls: ModelCalls = NETWORK_CALLS, initial_index: jax.Array | None = None
          ) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
    """The decode loop from `prefill`'s caches: (decodes [B, n, L], scores [B, n], aux); rows
    start at `initial_index` [B] (a prefilled prompt; None: position 0)."""
    arguments = {**dict(self.settings), **dict(decoder_params or {})}
    arguments.setdefault("eos_id", eos_id)
    if initial_index is not None:
      arguments["initial_index"] = initial_index
    if self.uses_draft:
      draft_cache, draft_tokens_to_logits = self._draft_calls(calls, draft_params, caches.draft)
      arguments.update(draft_cache=draft_cache, draft_tokens_to_logits=draft_tokens_to_logits)
    return self.loop(inputs=inputs, cache=calls.pin_cache("target", caches.target),
                     tokens_to_logits=calls.tokens_to_logits("target", self.target, params),
                     num_decodes=num_decodes, **arguments)

  def predict(self, params: Params, draft_params: Params | None, batch: Batch, eos_id: int,
              rng: jax.Array | None = None, decoder_params: Mapping[str, Any] | None = None,
              return_all_decodes: bool = False, num_decodes: int = 1,
              prompt_with_targets: bool = False, calls: ModelCalls = NETWORK_CALLS
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """T5X's predict_batch_with_aux over this decoder (see the module docstring)."""
    decoder_params = dict(decoder_params or {})
    if rng is not None:
      if decoder_params.get("decode_rng") is not None:
        raise ValueError("give the decoding rng as rng or as decoder_params['decode_rng'], "
                         "not both")
      decoder_params["decode_rng"] = rng
    eos_id = decoder_params.get("eos_id", eos_id)
    decoder_input_tokens = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
    initial_index = None
    if self.decoder_only:
      inputs = _language_model_prompt(batch, decoder_input_tokens, prompt_with_targets)
      initial_index = network.prompt_lengths(inputs)
      prefill_tokens = inputs
    else:
      if prompt_with_targets:  # T5X's convention: the prompt is the targets without their EOS
        inputs = decoder_input_tokens * (decoder_input_tokens != eos_id)
      else:
        inputs = jnp.zeros_like(decoder_input_tokens)
      prefill_tokens = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
    caches = self.prefill(params, draft_params, prefill_tokens, inputs.shape[1], calls)
    decodes, scores, aux = self.run(params, draft_params, caches, inputs, eos_id,
                                    num_decodes=num_decodes, decoder_params=decoder_params,
                                    calls=calls, initial_index=initial_index)
    if initial_index is not None:
      decodes = without_prompt(decodes, initial_index)
    aux = {"scores": scores, **aux}
    if return_all_decodes:
      return decodes, aux
    # Decodes are sorted by score, ascending: the best is last.
    return decodes[:, -1], {name: value[:, -1] for name, value in aux.items()}


def _language_model_prompt(batch: Batch, decoder_input_tokens: jax.Array,
                           prompt_with_targets: bool) -> jax.Array:
  """A decoder-only batch's prompt [B, L]: BOS then the prompt tokens then 0s (T5X's
  `decoder_input_tokens * decoder_causal_attention`)."""
  if prompt_with_targets:
    raise ValueError("prompt_with_targets is an encoder-decoder's: a language model's prompt is "
                     "the batch's decoder_causal_attention region")
  if "decoder_causal_attention" not in batch:
    raise ValueError("a decoder-only batch needs decoder_causal_attention (1 over BOS and the "
                     "prompt: seqio.DecoderFeatureConverter with 'inputs' and 'targets')")
  return decoder_input_tokens * jnp.asarray(batch["decoder_causal_attention"], jnp.int32)


def without_prompt(decodes: jax.Array, initial_index: jax.Array) -> jax.Array:
  """decodes [B, n, L] (position t + 1 at t) with each row's first initial_index[b] tokens, its
  prompt, cut off and the rest moved to the front, 0s after (T5X's `remove_prefix`)."""
  length = decodes.shape[-1]
  positions = jnp.arange(length)[None, None] + initial_index[:, None, None]
  shifted = jnp.take_along_axis(decodes, jnp.minimum(positions, length - 1), axis=-1)
  return jnp.where(positions < length, shifted, 0)
