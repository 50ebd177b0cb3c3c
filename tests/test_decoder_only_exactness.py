"""Exactness for decoder-only language models: a speculative decode of a `DecoderOnlyTransformer`
target, from prefilled prompts of different lengths (causal and prefix LM), samples each
prompt's continuation law as the target gives it. The law is enumerated from the target's own
teacher-forced logits (`__call__`, never the cache the decode uses), so a prefill or a cached
call that differed from teacher forcing fails here as a wrong verifier does (the negative
controls plant each), and so does a token written after EOS. Draws go through
`core.Decoder.predict` with T5X's decoder-only batch, as every runner's do."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import core
from spec_decode.engine import drafting, ngram, sampling, verify
from spec_decode.t5 import network

import test_exactness
import tiers

pytestmark = pytest.mark.slow

VOCAB = 5  # every id a token, 0 included: a language model can emit it
EOS = 1
PROMPTS = ((3,), (2, 4, 3))
LENGTH = 5  # the decode buffer: a prompt of n tokens is continued by LENGTH - n tokens
NUM_SAMPLES = test_exactness.NUM_SAMPLES
P_VALUE_FLOOR = test_exactness.P_VALUE_FLOOR
CONFIG = dict(vocab_size=VOCAB, emb_dim=8, num_heads=2, num_layers=2, head_dim=4, mlp_dim=16,
              mlp_activations=("gelu", "linear"), dropout_rate=0.0)


def make_network(prefix_lm: bool, seed: int,
                 module_class: type[network.DecoderOnlyTransformer] = (
                     network.DecoderOnlyTransformer),
                 **config) -> tuple[network.DecoderOnlyTransformer, dict]:
  module = module_class(network.DecoderOnlyConfig(**{**CONFIG, **config}),
                        inputs_bidirectional_attention=prefix_lm)
  tokens = jnp.ones((1, LENGTH), jnp.int32)
  params = module.init(jax.random.PRNGKey(seed), tokens, tokens)["params"]
  return module, params


def near(params: dict, seed: int, scale: float = 0.3) -> dict:
  """The target's parameters, each perturbed by `scale` of its own spread."""
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree_util.tree_unflatten(tree, [
      leaf + scale * jnp.std(leaf) * jax.random.normal(key, leaf.shape)
      for leaf, key in zip(leaves, keys)])


def decoder_batch(prompt: tuple[int, ...], num_rows: int) -> dict[str, np.ndarray]:
  """seqio.DecoderFeatureConverter's features of `prompt` with no targets: BOS then the
  prompt, `decoder_causal_attention` over both."""
  inputs = np.zeros((num_rows, LENGTH), np.int32)
  inputs[:, 1:len(prompt) + 1] = prompt
  causal = np.zeros_like(inputs)
  causal[:, :len(prompt) + 1] = 1
  return {"decoder_input_tokens": inputs, "decoder_target_tokens": np.ones_like(inputs),
          "decoder_causal_attention": causal}


def continuation_law(module, params, prompt, sampling_args) -> dict[tuple, float]:
  """P(continuation) of every complete continuation of `prompt` (ends at the first EOS or
  after LENGTH - len(prompt) tokens), from teacher-forced logits."""
  steps = LENGTH - len(prompt)
  logits_fn = jax.jit(lambda tokens, causal: module.apply(
      {"params": params}, tokens, jnp.ones_like(tokens), decoder_causal_attention=causal))
  law, frontier = {}, {(): 1.0}
  for depth in range(steps):
    prefixes = list(frontier)
    if not prefixes:
      break
    tokens = np.zeros((len(prefixes), LENGTH), np.int32)
    for row, prefix in enumerate(prefixes):
      sequence = (0,) + prompt + prefix
      tokens[row, :len(sequence)] = sequence
    causal = np.zeros_like(tokens)
    causal[:, :len(prompt) + 1] = 1
    logits = logits_fn(jnp.asarray(tokens), jnp.asarray(causal))[:, len(prompt) + depth]
    probs = np.asarray(sampling.logits_to_probs(logits, *sampling_args), np.float64)
    next_frontier = {}
    for prefix, row in zip(prefixes, probs):
      for token in range(VOCAB):
        mass = frontier[prefix] * row[token]
        sequence = prefix + (token,)
        if token == EOS or depth == steps - 1:
          law[sequence] = mass
        else:
          next_frontier[sequence] = mass
    frontier = next_frontier
  return law


def p_value(continuations: np.ndarray, law: dict[tuple, float]) -> float:
  """Chi-square p-value of the rows' continuations (each cut after its first EOS; token 0 is a
  token here, so only what follows EOS is padding) against `law`; 0 where a row holds a token
  after its EOS (the whole row is then an outcome the law cannot produce)."""
  observed = {}
  for row in continuations.tolist():
    end = row.index(EOS) + 1 if EOS in row else len(row)
    outcome = tuple(row[:end]) if not any(row[end:]) else tuple(row)
    observed[outcome] = observed.get(outcome, 0) + 1
  return test_exactness.counts_p_value(observed, law)


def draw(decoder: core.Decoder, params, draft_params, prompts, seed: int = 0
         ) -> list[np.ndarray]:
  """NUM_SAMPLES continuations of each prompt, their first LENGTH - len(prompt) tokens: one
  compiled decode (the parameters its arguments) for every prompt."""
  predict = jax.jit(lambda params, draft_params, batch, rng: decoder.predict(
      params, draft_params, batch, EOS, rng))
  draws = []
  for prompt in prompts:
    decodes, _ = predict(params, draft_params, decoder_batch(prompt, NUM_SAMPLES),
                         jax.random.PRNGKey(seed))
    draws.append(np.asarray(decodes)[:, :LENGTH - len(prompt)])
  return draws


CASES = {  # name: (prefix LM, draft source, temperature)
    "causal": (False, "model", 1.0),
    "prefix_lm": (True, "model", 1.0),
    "temperature_0.5": (False, "model", 0.5),
    "lookup": (False, "lookup", 1.0),
    "bigram": (False, "ngram", 1.0),
}
DECODERS = ([(case, rule, "fixed") for case in CASES for rule in sorted(verify.EXACT_RULES)]
            + [("causal", "token", policy) for policy in sorted(drafting.POLICIES)
               if policy != "fixed"])


def pair(case: str, verifier, draft_policy: str = "fixed",
         module_class: type[network.DecoderOnlyTransformer] = network.DecoderOnlyTransformer):
  """(decoder, target params, draft params, target module) of a case; `module_class` the
  network both models run as."""
  prefix_lm, source, temperature = CASES[case]
  target, params = make_network(prefix_lm, seed=1, module_class=module_class)
  draft_model, draft_params = None, None
  if source == "model":
    draft_model, draft_params = target, near(params, seed=2)
  elif source == "ngram":
    corpus = [list(prompt) + list(rest)
              for prompt in PROMPTS for rest in itertools.product(range(VOCAB), repeat=2)]
    draft_params = ngram.estimate(corpus, VOCAB, order=2, max_successors=2)
  draft = core.make_draft(source, draft_model, ngram_draft=(
      core.NGramDraft.of(draft_params) if source == "ngram" else None))
  decoder = core.Decoder.create("speculative_sample", target, draft, gamma=3, verifier=verifier,
                                draft_policy=draft_policy, temperature=temperature)
  return decoder, params, draft_params, target


@pytest.mark.parametrize("case,verifier,draft_policy", tiers.newest_among(
    DECODERS, {("causal", "token", "fixed"), ("prefix_lm", "block", "fixed")}))
def test_continuations_follow_the_target_law(case, verifier, draft_policy):
  decoder, params, draft_params, target = pair(case, verifier, draft_policy)
  sampling_args = (CASES[case][2], 0, 0.0)
  for prompt, continuations in zip(PROMPTS, draw(decoder, params, draft_params, PROMPTS)):
    law = continuation_law(target, params, prompt, sampling_args)
    p = p_value(continuations, law)
    assert p > P_VALUE_FLOOR, f"prompt {prompt}: p = {p:.2e}"


@pytest.mark.parametrize("case", tiers.newest_among(["causal", "prefix_lm"], {"causal"}))
def test_negative_control_fails(case):
  """The test above has the power to catch a wrong verifier here."""
  decoder, params, draft_params, target = pair(case, test_exactness.accept_everything)
  prompt = PROMPTS[1]
  law = continuation_law(target, params, prompt, (1.0, 0, 0.0))
  p = p_value(draw(decoder, params, draft_params, [prompt])[0], law)
  assert p < P_VALUE_FLOOR, f"accept_everything was not caught: p = {p:.2e}"


def test_negative_control_a_causal_law_for_a_prefix_lm_fails():
  """The prompt's attention is seen: a prefix LM's samples against its causal twin's law."""
  decoder, params, draft_params, _ = pair("prefix_lm", "token")
  causal_target, _ = make_network(False, seed=1)
  prompt = PROMPTS[1]
  law = continuation_law(causal_target, params, prompt, (1.0, 0, 0.0))
  p = p_value(draw(decoder, params, draft_params, [prompt])[0], law)
  assert p < P_VALUE_FLOOR, f"a causal law passed for a prefix LM: p = {p:.2e}"


class PrefilledFromTargets(network.DecoderOnlyTransformer):
  """A wrong prefill: the prompt's keys and values computed from T5X's decoder_target_tokens
  (the input tokens shifted left by one, a feature converter's two arrays confused); the cache
  index is the right one."""

  def init_cache(self, prompt: jax.Array, max_decode_len: int) -> network.DecodeCache:
    cache = super().init_cache(jnp.pad(prompt[:, 1:], ((0, 0), (0, 1))), max_decode_len)
    return {**cache, "cache_index": network.prompt_lengths(prompt)}


class OffByOneCache(network.DecoderOnlyTransformer):
  """An off-by-one cache: every cached call writes and attends one position later than its
  tokens' (the prefill's entries are where they belong)."""

  def decode_chunk(self, cache: network.DecodeCache, cur_index: jax.Array, tokens: jax.Array,
                   *args, **kwargs) -> tuple[jax.Array, network.DecodeCache]:
    return super().decode_chunk(cache, cur_index + 1, tokens, *args, **kwargs)


@pytest.mark.parametrize("module_class,case", [(PrefilledFromTargets, "prefix_lm"),
                                               (OffByOneCache, "causal")])
def test_negative_control_a_cache_unlike_teacher_forcing_fails(module_class, case):
  """A decode whose prefill or cached calls differ from teacher forcing (planted in the network
  target and draft run as) is caught against the teacher-forced law, with an exact verifier."""
  decoder, params, draft_params, target = pair(case, "token", module_class=module_class)
  prompt = PROMPTS[1]
  law = continuation_law(target, params, prompt, (1.0, 0, 0.0))
  p = p_value(draw(decoder, params, draft_params, [prompt])[0], law)
  assert p < P_VALUE_FLOOR, f"{module_class.__name__} was not caught: p = {p:.2e}"


def test_negative_control_tokens_after_eos_fail():
  """Continuations drawn from the law itself pass; the same with a token written after EOS in
  one row of a thousand fail."""
  _, params, _, target = pair("causal", "token")
  prompt = PROMPTS[1]
  law = continuation_law(target, params, prompt, (1.0, 0, 0.0))
  outcomes = list(law)
  rng = np.random.default_rng(0)
  masses = np.array([law[o] for o in outcomes])
  drawn = rng.choice(len(outcomes), NUM_SAMPLES, p=masses / masses.sum())
  width = LENGTH - len(prompt)
  continuations = np.zeros((NUM_SAMPLES, width), np.int32)
  for row, outcome in enumerate(drawn):
    continuations[row, :len(outcomes[outcome])] = outcomes[outcome]
  assert p_value(continuations, law) > P_VALUE_FLOOR
  ended_early = np.flatnonzero(continuations[:, 0] == EOS)[::1000]
  assert len(ended_early) > 0
  continuations[ended_early, 1] = 2
  p = p_value(continuations, law)
  assert p < P_VALUE_FLOOR, f"tokens after EOS were not caught: p = {p:.2e}"
