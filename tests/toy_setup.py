"""Shared construction of toy target/draft pairs and jitted decoders for engine tests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.engine import decoding, toy
from spec_decode.engine import lookup as engine_lookup

EOS = 1


def make_pair(vocab_size: int, draft: str, seed: int = 0, eos_shift: float = 0.0,
              num_buckets: int = 64):
  """A target and a draft that is 'near' (noisy copy), 'far' (independent) or 'same'."""
  target_rng, draft_rng = jax.random.split(jax.random.PRNGKey(seed))
  target = toy.PrefixHashModel.random(target_rng, vocab_size, num_buckets, eos_shift=eos_shift)
  if draft == "same":
    return target, target
  if draft == "near":
    return target, target.perturbed(draft_rng, 0.7)
  return target, toy.PrefixHashModel.random(draft_rng, vocab_size, num_buckets,
                                            eos_shift=eos_shift)


@functools.partial(jax.jit, static_argnames=("num_decodes", "sampling_args",
                                             "max_decode_steps", "logit_callback_fn"))
def baseline(target, inputs, rng, num_decodes=1, sampling_args=(1.0, 0, 0.0),
             max_decode_steps=None, logit_callback_fn=None):
  temperature, topk, topp = sampling_args
  return decoding.temperature_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS, decode_rng=rng,
      num_decodes=num_decodes, temperature=temperature, topk=topk, topp=topp,
      max_decode_steps=max_decode_steps, logit_callback_fn=logit_callback_fn)


@functools.partial(jax.jit, static_argnames=("gamma", "num_decodes", "sampling_args",
                                             "verifier", "draft_policy", "max_decode_steps",
                                             "logit_callback_fn"))
def speculative(target, draft, inputs, rng, gamma, num_decodes=1, sampling_args=(1.0, 0, 0.0),
                verifier="token", draft_policy="fixed", max_decode_steps=None,
                logit_callback_fn=None):
  temperature, topk, topp = sampling_args
  return decoding.speculative_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      draft_cache=draft.init_cache(*inputs.shape), draft_tokens_to_logits=draft.tokens_to_logits,
      gamma=gamma, decode_rng=rng, num_decodes=num_decodes, temperature=temperature, topk=topk,
      topp=topp, verifier=verifier, draft_policy=draft_policy, max_decode_steps=max_decode_steps,
      logit_callback_fn=logit_callback_fn)


def prefilled(model, inputs: np.ndarray) -> tuple[dict, jax.Array]:
  """(the cache holding each row's prompt but its last token, each row's initial_index: the
  prompt's last position), as a prefill leaves them."""
  initial_index = np.max(np.where(inputs > 0, np.arange(inputs.shape[1]), 0), axis=1)
  cache = model.init_cache(*inputs.shape)
  fed = int(initial_index.max())
  if fed:
    _, cache = model.tokens_to_logits(decoding.DecodingState(
        cur_index=jnp.zeros((len(inputs),), jnp.int32), cur_token=jnp.asarray(inputs[:, :fed]),
        sequences=jnp.asarray(inputs), cache=cache))
  return cache, jnp.asarray(initial_index, jnp.int32)


def random_prompts(rng: np.random.Generator, batch_size: int, max_decode_len: int,
                   vocab_size: int, max_prompt_len: int) -> np.ndarray:
  """Decoder inputs [B, L]: BOS, then a forced prefix of random length in 0..max_prompt_len."""
  inputs = np.zeros((batch_size, max_decode_len), np.int32)
  for row in range(batch_size):
    prompt_len = rng.integers(0, max_prompt_len + 1)
    inputs[row, 1:1 + prompt_len] = rng.integers(2, vocab_size, prompt_len)
  return inputs


def lookup_draft(draft, lookup, source, inputs) -> tuple[dict, object]:
  """(cache, tokens_to_logits) of the n-gram `lookup` over `source [B, Le]` as the draft: alone
  when `draft` is None, else combined with that model (its cache for `inputs`' shape)."""
  if draft is None:
    return lookup.init_cache(source), lookup.tokens_to_logits
  return (engine_lookup.init_combined_cache(lookup, source, draft.init_cache(*inputs.shape)),
          engine_lookup.with_model(lookup, draft.tokens_to_logits))


@functools.partial(jax.jit, static_argnames=("lookup", "gamma", "num_decodes", "sampling_args",
                                             "verifier", "draft_policy"))
def speculative_lookup(target, draft, lookup, source, inputs, rng, gamma, num_decodes=1,
                       sampling_args=(1.0, 0, 0.0), verifier="token", draft_policy="fixed"):
  """Speculative sampling with an n-gram lookup draft over `source [B, Le]` (the rows'
  encoder tokens): the lookup alone when `draft` is None, else combined with that model."""
  temperature, topk, topp = sampling_args
  draft_cache, draft_tokens_to_logits = lookup_draft(draft, lookup, source, inputs)
  return decoding.speculative_sample(
      inputs, target.init_cache(*inputs.shape), target.tokens_to_logits, EOS,
      draft_cache=draft_cache, draft_tokens_to_logits=draft_tokens_to_logits, gamma=gamma,
      decode_rng=rng, num_decodes=num_decodes, temperature=temperature, topk=topk, topp=topp,
      verifier=verifier, draft_policy=draft_policy)
