"""T5X's model protocol for T5 encoder-decoders and decoder-only language models, decoding with
exact speculative sampling.

`EncoderDecoderModel` mirrors `t5x.models.EncoderDecoderModel` (constructor,
`FEATURE_CONVERTER_CLS`, `input_vocabulary`/`output_vocabulary`, `module`,
`get_initial_variables`, `loss_fn`, `eval_fn`, `score_batch`, `predict_batch`,
`predict_batch_with_aux`), so T5X-style code (and `spec_decode.infer`) drives it unchanged;
`DecoderOnlyModel` mirrors `t5x.models.DecoderOnlyModel` the same way over
`network.DecoderOnlyTransformer` (one `vocabulary`, `inputs_bidirectional_attention`). Both
share `BaseTransformerModel`. `SpeculativeEncoderDecoderModel` and
`SpeculativeDecoderOnlyModel` add a draft: a second network of the same family with its own
checkpoint, loaded once (on first use) and kept by the model. `params` are always the target's,
as in any T5X run. `loss_fn`'s token loss is `cross_entropy_with_logits` (T5X's, which the
trainer uses too); the vocabulary configs bind is `sentencepiece_vocabulary`.

Batches use seqio's encoder-decoder features (B batch, Le input length, L target length):
  encoder_input_tokens [B, Le] int32 (0 = padding), decoder_input_tokens [B, L] (targets
  shifted right, BOS = 0), decoder_target_tokens [B, L], decoder_loss_weights [B, L] (optional
  for scoring: defaults to target != 0); a decoder-only model's are seqio's decoder features
  (`seqio.DecoderFeatureConverter`: L = prompt + continuation), the same decoder_* features
  plus decoder_causal_attention [B, L] (1 over BOS and the prompt: what decoding prefills, its
  decodes being the continuations, the prompt cut off) and, when packed,
  decoder_segment_ids and decoder_positions.
Shapes returned:
  predict_batch_with_aux -> (decodes [B, L], aux) or, with return_all_decodes,
  (decodes [B, num_decodes, L], aux) with the num_decodes axis sorted by score, best last.
  aux['scores'] is the decode's log-probability or beam score ([B] or [B, num_decodes]; T5X's:
  the log-probability under the law sampled, so 0 for a greedy decode, or with
  `loop_settings={'rescale_log_probs': False}` under the target's own log-softmax); a
  loop with stats adds their `aux()` (`spec_decode.engine.stats`: e.g. the counters, 'alpha',
  'tokens_per_target_call'), with the same leading shape and sorted alike. `num_decodes`
  (constructor; T5X's DecoderParams.num_decodes) is the default number of decodes per input:
  samples (the best returned) or beams.
  score_batch -> [B] float32: sum over target tokens of log p(target) * decoder_loss_weights.
  get_initial_variables -> {'params': ..., 'params_axes': ...}.

Decoding is `core.Decoder`'s (the one core every entry point shares): the model builds it from
`decode_loop` (a loop name of `spec_decode.engine.loops`) and its settings, passed as
constructor arguments (gamma, verifier, draft_policy, temperature, topk, topp,
max_decode_steps; `loop_settings` for a loop's own), and `predict_batch_with_aux` is
`Decoder.predict`.

Under `jax.jit`, pass the draft's parameters as an argument (`draft_params=`) as
`spec_decode.infer` does: otherwise the loaded ones are closed over and compiled in as
constants.

Bad configurations (target and draft vocabularies differ, a draft of the other family, no
draft for a loop that needs one, no gamma, a setting the loop does not take, a vocabulary
larger than the embedding) raise ValueError at construction, a missing local draft checkpoint
FileNotFoundError, before anything is loaded or compiled.
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax.core import unfreeze

from spec_decode import core
from spec_decode import paths
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import ngram_format
from spec_decode.engine import loops
from spec_decode.t5 import network
from spec_decode.engine import sampling
from spec_decode.t5 import vocab

Params = Any
Batch = Mapping[str, jax.Array]


def sentencepiece_vocabulary(sentencepiece_model_file: str,
                             extra_ids: int = 0) -> vocab.SentencePieceVocabulary:
  """`vocab.SentencePieceVocabulary` with its file found by `resolve_path` (T5: extra_ids=100)."""
  return vocab.SentencePieceVocabulary(paths.resolve(sentencepiece_model_file), extra_ids)


def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array, z_loss: float,
                              label_smoothing: float) -> tuple[jax.Array, jax.Array]:
  """T5X's per-token cross-entropy (`t5x/losses.py`), of `EncoderDecoderModel.loss_fn` and the
  trainer: (loss including the z-loss term, the z-loss term alone), both [B, L], for logits
  [B, L, V] and targets [B, L]; the caller weights and sums them.

  With label smoothing the constant entropy of the smoothed target is subtracted (as T5X
  does) so that a perfect model scores 0.
  """
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low_confidence = label_smoothing / (vocab_size - 1)
  normalizer = -(confidence * jnp.log(confidence) +
                 (vocab_size - 1) * low_confidence * jnp.log(low_confidence + 1e-20))
  soft_targets = jax.nn.one_hot(targets, vocab_size) * (confidence - low_confidence) + low_confidence
  log_z = jax.nn.logsumexp(logits, axis=-1)
  log_probs = logits - log_z[..., None]
  z_term = z_loss * jnp.square(log_z)
  loss = -jnp.sum(soft_targets * log_probs, axis=-1) - normalizer + z_term
  return loss, z_term


# --------------------------------------------------------------------------- models


class _LazySeqioClass:
  """Class attribute that is seqio's class `name` (a feature converter), imported on first use:
  seqio imports TensorFlow, which nothing else here needs.

  Read on an instance (as T5X does: `model.FEATURE_CONVERTER_CLS(pack=False)`) it imports seqio.
  Read on the class before seqio is imported it stays this descriptor: gin, registering the
  class for a config, reads every class attribute, and must not pull in TensorFlow.
  """

  def __init__(self, name: str):
    self.name = name

  def __get__(self, instance: Any, owner: type) -> Any:
    if instance is None and "seqio" not in sys.modules:
      return self
    import seqio  # pylint: disable=g-import-not-at-top
    return getattr(seqio, self.name)


def _initial_variables(module: network.Network, rng: jax.Array,
                       arguments: tuple[jax.Array, ...]) -> dict[str, Any]:
  # Jitted: run op by op, initializing even a tiny T5 takes many seconds.
  init = jax.jit(functools.partial(module.init, enable_dropout=False))
  return unfreeze(init(rng, *arguments))


def _tokens(input_shapes: Mapping[str, tuple[int, ...]], input_types: Mapping[str, Any] | None,
            name: str) -> jax.Array:
  return jnp.ones(input_shapes[name], (input_types or {}).get(name, jnp.int32))


class BaseTransformerModel:
  """What both families share (T5X's `BaseTransformerModel`): the vocabularies, the decoder
  (`core.Decoder`) built from `decode_loop` and its settings, the loss, scoring and decoding
  over the teacher-forced logits and initial variables a family's model computes
  (`_compute_logits`, `_init_arguments`)."""

  NETWORK_CLS: type = network.Transformer

  def __init__(self, module: network.Network, input_vocabulary: Any,
               output_vocabulary: Any, optimizer_def: Any = None,
               decode_loop: str = "temperature_sample",
               feature_converter_cls: Callable[..., Any] | None = None,
               label_smoothing: float = 0.0, z_loss: float = 0.0,
               loss_normalizing_factor: float | None = None, *, num_decodes: int = 1,
               gamma: int | None = None,
               verifier: str | None = None, draft_policy: str | None = None,
               temperature: float | None = None, topk: int | None = None,
               topp: float | None = None, max_decode_steps: int | None = None,
               loop_settings: Mapping[str, Any] | None = None):
    if not isinstance(module, self.NETWORK_CLS):
      raise ValueError(f"module must be a network.{self.NETWORK_CLS.__name__}, got "
                       f"{type(module).__name__}")
    for name, vocabulary in (("input", input_vocabulary), ("output", output_vocabulary)):
      if vocabulary.vocab_size > module.config.vocab_size:
        raise ValueError(f"the {name} vocabulary has {vocabulary.vocab_size} ids but the "
                         f"model's embedding only {module.config.vocab_size}")
    if isinstance(num_decodes, bool) or not isinstance(num_decodes, int) or num_decodes < 1:
      raise ValueError(f"num_decodes must be an integer >= 1, got {num_decodes!r}")
    self.num_decodes = num_decodes
    if feature_converter_cls is not None:
      self.FEATURE_CONVERTER_CLS = feature_converter_cls  # pylint: disable=invalid-name
    self.module = module
    self._input_vocabulary = input_vocabulary
    self._output_vocabulary = output_vocabulary
    self.optimizer_def = optimizer_def
    self._label_smoothing = label_smoothing
    self._z_loss = z_loss
    self._loss_normalizing_factor = loss_normalizing_factor
    self.decoder = core.Decoder.create(
        decode_loop, module, self._draft_for(decode_loop), gamma=gamma,
        verifier=verifier, draft_policy=draft_policy, temperature=temperature, topk=topk,
        topp=topp, max_decode_steps=max_decode_steps, **dict(loop_settings or {}))

  def _draft_for(self, decode_loop: str) -> core.Draft | None:
    del decode_loop  # the target alone
    return None

  def _network_of(self, config: network.NetworkConfig) -> network.Network:
    """The network of a draft's config, as this model builds its networks."""
    return network.module_of(config)

  @property
  def input_vocabulary(self) -> Any:
    return self._input_vocabulary

  @property
  def output_vocabulary(self) -> Any:
    return self._output_vocabulary

  @property
  def is_speculative(self) -> bool:
    return self.decoder.uses_draft

  @property
  def decode_settings(self) -> dict[str, Any]:
    """Every setting of the decode loop as it runs (for reports)."""
    return self.decoder.resolved_settings()

  # ----------------------------------------------------------------- training protocol

  def _init_arguments(self, input_shapes: Mapping[str, tuple[int, ...]],
                      input_types: Mapping[str, Any] | None) -> tuple[jax.Array, ...]:
    """The token arguments of the network's `init` for inputs of these shapes."""
    raise NotImplementedError

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{'params': ..., 'params_axes': ...} for inputs of these shapes (token dtype int32)."""
    return _initial_variables(self.module, rng, self._init_arguments(input_shapes, input_types))

  def _compute_logits(self, params: Params, batch: Batch,
                      dropout_rng: jax.Array | None = None) -> jax.Array:
    """Teacher-forced logits [B, L, V] float32."""
    raise NotImplementedError

  def loss_fn(self, params: Params, batch: Batch, dropout_rng: jax.Array | None
              ) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    """T5X's cross-entropy: (loss, (weight_sum, metrics)); the token losses (with label
    smoothing and z-loss) are summed with decoder_loss_weights, then divided by
    loss_normalizing_factor when it is set."""
    logits = self._compute_logits(params, batch, dropout_rng)
    token_loss, z_term = cross_entropy_with_logits(
        logits, batch["decoder_target_tokens"], self._z_loss, self._label_smoothing)
    weights = self._loss_weights(batch).astype(jnp.float32)
    loss, z_loss = jnp.sum(token_loss * weights), jnp.sum(z_term * weights)
    if self._loss_normalizing_factor is not None:
      loss, z_loss = loss / self._loss_normalizing_factor, z_loss / self._loss_normalizing_factor
    weight_sum = jnp.sum(weights)
    correct = jnp.argmax(logits, axis=-1) == batch["decoder_target_tokens"]
    metrics = {"loss": loss, "z_loss": z_loss, "weight_sum": weight_sum,
               "accuracy": jnp.sum(correct * weights) / jnp.maximum(weight_sum, 1.0)}
    return loss, (weight_sum, metrics)

  def eval_fn(self, params: Params, batch: Batch
              ) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    return self.loss_fn(params, batch, dropout_rng=None)

  @staticmethod
  def _loss_weights(batch: Batch) -> jax.Array:
    if "decoder_loss_weights" in batch:
      return batch["decoder_loss_weights"]
    return batch["decoder_target_tokens"] > 0

  def score_batch(self, params: Params, batch: Batch, return_intermediates: bool = False
                  ) -> jax.Array | tuple[jax.Array, dict[str, Any]]:
    """Log-likelihood [B] of decoder_target_tokens (z-loss and label smoothing never apply)."""
    logits = self._compute_logits(params, batch)
    targets = batch["decoder_target_tokens"]
    weights = self._loss_weights(batch)
    scores = jnp.sum(sampling.log_softmax_of(logits, targets) * weights, axis=-1)
    if return_intermediates:
      # T5X's extra entries; this network sows no intermediates of its own.
      return scores, {"decoder": {"target_tokens": (targets,), "loss_weights": (weights,)}}
    return scores

  # ----------------------------------------------------------------- inference protocol

  def predict_batch(self, params: Params, batch: Batch, rng: jax.Array | None = None
                    ) -> jax.Array:
    return self.predict_batch_with_aux(params, batch, rng=rng)[0]

  def predict_batch_with_aux(self, params: Params, batch: Batch, rng: jax.Array | None = None,
                             decoder_params: Mapping[str, Any] | None = None,
                             return_all_decodes: bool = False,
                             num_decodes: int | None = None, prompt_with_targets: bool = False
                             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Decodes a batch (`core.Decoder.predict`: shapes, aux and T5X's conventions there);
    `num_decodes` None: the model's."""
    return self._predict(params, None, batch, rng, decoder_params=decoder_params,
                         return_all_decodes=return_all_decodes, num_decodes=num_decodes,
                         prompt_with_targets=prompt_with_targets)

  def _predict(self, params: Params, draft_params: Params | None, batch: Batch,
               rng: jax.Array | None, *, decoder_params: Mapping[str, Any] | None,
               return_all_decodes: bool, num_decodes: int | None, prompt_with_targets: bool
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    return self.decoder.predict(
        params, draft_params, batch, self.output_vocabulary.eos_id, rng=rng,
        decoder_params=decoder_params, return_all_decodes=return_all_decodes,
        num_decodes=self.num_decodes if num_decodes is None else num_decodes,
        prompt_with_targets=prompt_with_targets)


class EncoderDecoderModel(BaseTransformerModel):
  """T5X's EncoderDecoderModel protocol over `network.Transformer` (see the module docstring):
  the target alone, decoding with `decode_loop` (a loop of `spec_decode.engine.loops` that uses
  no draft; 'temperature_sample' by default) and its settings."""

  FEATURE_CONVERTER_CLS = _LazySeqioClass("EncDecFeatureConverter")
  NETWORK_CLS = network.Transformer

  def _init_arguments(self, input_shapes: Mapping[str, tuple[int, ...]],
                      input_types: Mapping[str, Any] | None) -> tuple[jax.Array, ...]:
    decoder_tokens = _tokens(input_shapes, input_types, "decoder_input_tokens")
    return (_tokens(input_shapes, input_types, "encoder_input_tokens"), decoder_tokens,
            decoder_tokens)

  def _compute_logits(self, params: Params, batch: Batch,
                      dropout_rng: jax.Array | None = None) -> jax.Array:
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else {}
    return self.module.apply({"params": params}, batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                             enable_dropout=dropout_rng is not None, rngs=rngs)


class DecoderOnlyModel(BaseTransformerModel):
  """T5X's DecoderOnlyModel protocol over `network.DecoderOnlyTransformer`: a language model
  continuing prompts (see the module docstring), the target alone.

  `vocabulary` is both the input and the output vocabulary. `inputs_bidirectional_attention`
  (T5X's argument: a prefix LM, its prompt attending both ways) is the module's attribute;
  given here, the module is rebuilt with it, None keeps the module's. Other arguments as
  EncoderDecoderModel's (the decode settings keyword-only).
  """

  FEATURE_CONVERTER_CLS = _LazySeqioClass("DecoderFeatureConverter")
  NETWORK_CLS = network.DecoderOnlyTransformer

  def __init__(self, module: network.DecoderOnlyTransformer, vocabulary: Any,
               optimizer_def: Any = None, decode_loop: str = "temperature_sample",
               inputs_bidirectional_attention: bool | None = None,
               feature_converter_cls: Callable[..., Any] | None = None,
               label_smoothing: float = 0.0, z_loss: float = 0.0,
               loss_normalizing_factor: float | None = None, **decode_settings: Any):
    if (inputs_bidirectional_attention is not None
        and isinstance(module, network.DecoderOnlyTransformer)):
      module = module.clone(inputs_bidirectional_attention=inputs_bidirectional_attention)
    super().__init__(module, vocabulary, vocabulary, optimizer_def, decode_loop,
                     feature_converter_cls=feature_converter_cls,
                     label_smoothing=label_smoothing, z_loss=z_loss,
                     loss_normalizing_factor=loss_normalizing_factor, **decode_settings)

  @property
  def inputs_bidirectional_attention(self) -> bool:
    return self.module.inputs_bidirectional_attention

  def _network_of(self, config: network.NetworkConfig) -> network.Network:
    draft = network.module_of(config)
    if network.is_decoder_only(draft):  # one of the other family is core.Decoder's error
      draft = draft.clone(inputs_bidirectional_attention=self.inputs_bidirectional_attention)
    return draft

  def _init_arguments(self, input_shapes: Mapping[str, tuple[int, ...]],
                      input_types: Mapping[str, Any] | None) -> tuple[jax.Array, ...]:
    return (_tokens(input_shapes, input_types, "decoder_input_tokens"),) * 2

  def _compute_logits(self, params: Params, batch: Batch,
                      dropout_rng: jax.Array | None = None) -> jax.Array:
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else {}
    return self.module.apply(
        {"params": params}, batch["decoder_input_tokens"], batch["decoder_target_tokens"],
        batch.get("decoder_segment_ids"), batch.get("decoder_positions"),
        batch.get("decoder_causal_attention"), enable_dropout=dropout_rng is not None,
        rngs=rngs)


class _Speculative:
  """The draft of a speculative model (mixed into either family's model): decoding with
  `decode_loop` ('speculative_sample' by default; any loop of `spec_decode.engine.loops`).

  `draft_checkpoint_path`: the draft's checkpoint (any format of `formats.load_params`), read
  on first use; `draft_module`: the draft network, by default the config read from that
  checkpoint (`formats.checkpoint_config`: no weight is read) in the target's dtype. A draft
  built or trained in memory needs no checkpoint: give `draft_module` alone and pass its
  parameters to `predict_batch_with_aux(draft_params=...)`. The decode settings (gamma,
  verifier, draft_policy, temperature, ...) are constructor arguments, as in the T5X hook
  (configs bind them from GAMMA, VERIFIER, DRAFT_POLICY, TEMPERATURE). With a loop that uses no
  draft (the baseline) the target runs alone and the draft is never read.
  `draft_source` (`core.make_draft`): 'model' (the checkpoint's draft), 'lookup' (n-gram
  lookup from the input, or a language model's prompt, and the output so far: no draft
  checkpoint, and giving one is an error since it would be ignored), 'lookup+model', or 'ngram'
  (a unigram or bigram draft: draft_checkpoint_path names its .npz file, `python -m
  spec_decode.data.ngrams`, read at construction: it is small); `lookup_max_ngram`,
  `lookup_min_ngram` are the lookup's n-gram lengths.
  """

  module: network.Network
  decoder: core.Decoder

  def _set_draft(self, draft_checkpoint_path: str | None,
                 draft_module: network.Network | None, draft_source: str,
                 lookup_max_ngram: int, lookup_min_ngram: int | None) -> None:
    """Keeps the draft's settings; called before the model's own __init__ builds the
    decoder."""
    self.draft_checkpoint_path = draft_checkpoint_path
    # The draft's checkpoint located once (`formats.locate`), for every read of it after.
    self.draft_checkpoint: formats.Checkpoint | None = None
    self._given_draft_module = draft_module
    self._draft_settings = (draft_source, lookup_max_ngram, lookup_min_ngram)
    self._draft_params: Params | None = None

  def _draft_for(self, decode_loop: str) -> core.Draft | None:
    if not loops.get(decode_loop).uses_draft:
      return None
    draft_source, max_ngram, min_ngram = self._draft_settings
    if draft_source == "lookup":
      if self.draft_checkpoint_path is not None or self._given_draft_module is not None:
        raise ValueError("draft_source 'lookup' uses no draft model: unset "
                         "draft_checkpoint_path (the draft would be ignored)")
      return core.make_draft("lookup", None, max_ngram, min_ngram)
    if draft_source == "ngram":
      return self._ngram_draft()
    return core.make_draft(draft_source, self._draft_network(decode_loop), max_ngram, min_ngram)

  def _ngram_draft(self) -> core.NGramDraft:
    if self._given_draft_module is not None:
      raise ValueError("draft_source 'ngram' uses no draft model: unset draft_module")
    if self.draft_checkpoint_path is None or not ngram_format.is_ngram_file(
        self.draft_checkpoint_path):
      raise ValueError(f"draft_source 'ngram' reads an n-gram draft file (.npz, written by "
                       f"`python -m spec_decode.data.ngrams`) from draft_checkpoint_path, got "
                       f"{self.draft_checkpoint_path!r}")
    self._draft_params = ngram_format.load(self.draft_checkpoint_path)
    return core.make_draft("ngram", None, ngram_draft=core.NGramDraft.of(self._draft_params))

  def _draft_network(self, decode_loop: str) -> network.Network:
    if self.draft_checkpoint_path is not None:  # FileNotFoundError when missing
      self.draft_checkpoint = formats.locate(self.draft_checkpoint_path)
    if self._given_draft_module is not None:  # built in memory: its params are given to decode
      return self._given_draft_module
    if self.draft_checkpoint_path is None:
      raise ValueError(f"decode loop {decode_loop!r} needs a draft: set draft_checkpoint_path "
                       "(or give draft_module)")
    return self._network_of(formats.checkpoint_config(self.draft_checkpoint,
                                                      like=self.module.config))

  @property
  def draft_module(self) -> network.Network | None:
    """The draft network (None without one, as for a lookup alone)."""
    return self.decoder.draft_network

  @property
  def draft_params(self) -> Params:
    """The draft's parameters, read from draft_checkpoint_path on first use."""
    if self._draft_params is None:
      if self.draft_module is None or self.draft_checkpoint_path is None:
        raise ValueError("no draft parameters: set draft_checkpoint_path, or pass draft_params")
      self._draft_params = jax.device_put(
          formats.load_params(self.draft_module, self.draft_checkpoint))
    return self._draft_params

  def baseline(self) -> BaseTransformerModel:
    """The target alone, with this model's sampling settings (the same distribution): the
    model speculative decoding is compared with."""
    model = copy.copy(self)
    model.decoder = self.decoder.baseline()
    return model

  def get_draft_initial_variables(self, rng: jax.Array,
                                  input_shapes: Mapping[str, tuple[int, ...]],
                                  input_types: Mapping[str, Any] | None = None
                                  ) -> dict[str, Any]:
    """`get_initial_variables` for the draft module (e.g. for its parameter axes)."""
    return _initial_variables(self.draft_module, rng,
                              self._init_arguments(input_shapes, input_types))

  def predict_batch_with_aux(self, params: Params, batch: Batch, rng: jax.Array | None = None,
                             decoder_params: Mapping[str, Any] | None = None,
                             return_all_decodes: bool = False,
                             num_decodes: int | None = None, prompt_with_targets: bool = False,
                             draft_params: Params | None = None
                             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """As the target's model's; `draft_params` default to the loaded `draft_params`."""
    if self.draft_module is not None and draft_params is None:
      draft_params = self.draft_params
    return self._predict(params, draft_params, batch, rng, decoder_params=decoder_params,
                         return_all_decodes=return_all_decodes, num_decodes=num_decodes,
                         prompt_with_targets=prompt_with_targets)


class SpeculativeEncoderDecoderModel(_Speculative, EncoderDecoderModel):
  """An EncoderDecoderModel with a draft `network.Transformer` (or a lookup or n-gram draft);
  see `_Speculative`."""

  def __init__(self, module: network.Transformer, input_vocabulary: Any,
               output_vocabulary: Any, optimizer_def: Any = None,
               decode_loop: str = "speculative_sample", *,
               draft_checkpoint_path: str | None = None,
               draft_module: network.Transformer | None = None, draft_source: str = "model",
               lookup_max_ngram: int = 4, lookup_min_ngram: int | None = None, **kwargs: Any):
    self._set_draft(draft_checkpoint_path, draft_module, draft_source, lookup_max_ngram,
                    lookup_min_ngram)
    super().__init__(module, input_vocabulary, output_vocabulary, optimizer_def, decode_loop,
                     **kwargs)


class SpeculativeDecoderOnlyModel(_Speculative, DecoderOnlyModel):
  """A DecoderOnlyModel with a draft `network.DecoderOnlyTransformer` (or a lookup over the
  prompt and the output, or an n-gram draft); see `_Speculative`. A draft read from its
  checkpoint attends to the prompt as the target does (`inputs_bidirectional_attention`)."""

  def __init__(self, module: network.DecoderOnlyTransformer, vocabulary: Any,
               optimizer_def: Any = None, decode_loop: str = "speculative_sample",
               inputs_bidirectional_attention: bool | None = None, *,
               draft_checkpoint_path: str | None = None,
               draft_module: network.DecoderOnlyTransformer | None = None,
               draft_source: str = "model", lookup_max_ngram: int = 4,
               lookup_min_ngram: int | None = None, **kwargs: Any):
    self._set_draft(draft_checkpoint_path, draft_module, draft_source, lookup_max_ngram,
                    lookup_min_ngram)
    super().__init__(module, vocabulary, optimizer_def, decode_loop,
                     inputs_bidirectional_attention, **kwargs)
