"""T5X's model protocol for T5 encoder-decoders, decoding with exact speculative sampling.

`EncoderDecoderModel` mirrors `t5x.models.EncoderDecoderModel` (constructor,
`FEATURE_CONVERTER_CLS`, `input_vocabulary`/`output_vocabulary`, `decode_fn`, `module`,
`get_initial_variables`, `loss_fn`, `eval_fn`, `score_batch`, `predict_batch`,
`predict_batch_with_aux`), so T5X-style
code (and `spec_decode.infer`) drives it unchanged. `SpeculativeEncoderDecoderModel` adds a
draft: a second `network.Transformer` with its own checkpoint, loaded once (on first use) and
kept by the model. `params` are always the target's, as in any T5X run.

Batches use seqio's encoder-decoder features (B batch, Le input length, L target length):
  encoder_input_tokens [B, Le] int32 (0 = padding), decoder_input_tokens [B, L] (targets
  shifted right, BOS = 0), decoder_target_tokens [B, L], decoder_loss_weights [B, L] (optional
  for scoring: defaults to target != 0).
Shapes returned:
  predict_batch_with_aux -> (decodes [B, L], aux) or, with return_all_decodes,
  (decodes [B, num_decodes, L], aux) with the num_decodes axis sorted by score, best last.
  aux['scores'] is the decode's log-probability ([B] or [B, num_decodes]); a speculative decode
  adds per-example counters of `decoding.SpeculativeStats` (its `counter_names()`) and
  'alpha', with the same shape and sorted alike.
  score_batch -> [B] float32: sum over target tokens of log p(target) * decoder_loss_weights.
  get_initial_variables -> {'params': ..., 'params_axes': ...}.

`decode_fn` is any function of the engine's protocol (`spec_decode.engine.decoding`), typically
`@decoding.temperature_sample` (the baseline: target alone) or `@decoding.speculative_sample`
(a function is speculative when it takes `draft_tokens_to_logits`). The caches of both models
come from `network.init_decode_cache` (each encoder runs once per input), the step functions
from `network.make_tokens_to_logits`.

Under `jax.jit`, pass the draft's parameters as an argument (`draft_params=`) as
`spec_decode.infer` does: otherwise the loaded ones are closed over and compiled in as
constants. `with_model_calls` returns a copy whose caches and step functions come from another
`ModelCalls` (`decode_layout.DecodeLayout.model_calls` pins each cache to its mesh layout).

Bad configurations (target and draft vocabularies differ, no draft for a speculative
decode_fn, no gamma, a vocabulary larger than the embedding) raise ValueError at construction,
a missing local draft checkpoint FileNotFoundError, before anything is loaded or compiled.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import os
import sys
from typing import Any, Callable, Mapping

import gin
import jax
import jax.numpy as jnp
from flax.core import unfreeze

from spec_decode import gin_utils
from spec_decode import losses
from spec_decode import paths
from spec_decode.t5 import checkpoints
from spec_decode.t5 import cpu_kernels
from spec_decode.t5 import hf_checkpoints
from spec_decode.t5 import demo_pair
from spec_decode.engine import decoding
from spec_decode.t5 import network
from spec_decode.engine import sampling
from spec_decode.t5 import vocab

Params = Any
Batch = Mapping[str, jax.Array]

# Arguments that fix the sampled distribution; the baseline of a speculative model shares them.
SAMPLING_ARGUMENTS = ("temperature", "topk", "topp", "max_decode_steps")
# Further settings of a speculative decode_fn worth reporting (those it has).
SPECULATIVE_ARGUMENTS = ("gamma", "verifier", "draft_policy")
# T5Config fields that do not change what a checkpoint computes (precision, training only).
_NON_ARCHITECTURE_FIELDS = ("dtype", "float32_attention_logits", "dropout_rate")


def sentencepiece_vocabulary(sentencepiece_model_file: str,
                             extra_ids: int = 0) -> vocab.SentencePieceVocabulary:
  """`vocab.SentencePieceVocabulary` with its file found by `resolve_path` (T5: extra_ids=100)."""
  return vocab.SentencePieceVocabulary(paths.resolve(sentencepiece_model_file), extra_ids)


# (role 'target' or 'draft', module, params, encoder_input_tokens [B, Le], max_decode_len)
#   -> (initial decode cache, the engine's tokens_to_logits)
ModelCalls = Callable[[str, network.Transformer, Params, jax.Array, int],
                      tuple[network.DecodeCache, Callable[[Any], tuple[jax.Array, Any]]]]


def network_model_calls(role: str, module: network.Transformer, params: Params,
                        encoder_input_tokens: jax.Array, max_decode_len: int
                        ) -> tuple[network.DecodeCache, Callable[[Any], tuple[jax.Array, Any]]]:
  """The default `ModelCalls`: the network's cache and step function, whatever the role."""
  del role  # both models are called alike
  module = cpu_kernels.with_backend_ops(module)
  return (network.init_decode_cache(module, params, encoder_input_tokens, max_decode_len),
          network.make_tokens_to_logits(module, params))


# --------------------------------------------------------------------------- configs


def transformer_from_gin_file(gin_file: str,
                              overrides: Mapping[str, Any] | None = None) -> network.Transformer:
  """A `network.Transformer` whose config is the `network.T5Config` bound in a model gin file.

  The file is read without touching the global gin config, so the draft can come from its own
  model file (e.g. spec_decode/configs/models/t5_1_1/small.gin) next to the target's. `overrides` replace
  fields (e.g. {'dtype': 'float32'}).
  """
  return network.Transformer(gin_utils.t5config_from_gin_file(gin_file, overrides))


def _check_same_architecture(expected: network.T5Config, found: network.T5Config,
                             source: str) -> None:
  differences = [
      f"{field.name} {getattr(found, field.name)!r} (model: {getattr(expected, field.name)!r})"
      for field in dataclasses.fields(network.T5Config)
      if field.name not in _NON_ARCHITECTURE_FIELDS
      and getattr(found, field.name) != getattr(expected, field.name)]
  if differences:
    raise ValueError(f"{source}: the checkpoint's config differs from the model's: "
                     + ", ".join(differences))


def checkpoint_format(path: str) -> tuple[str, str]:
  """(format, resolved path) of a checkpoint `load_params` reads: format 'hf' (a Hugging Face
  folder with config.json), 'demo' (a .safetensors file) or 't5x' (anything else: a T5X
  checkpoint). FileNotFoundError when a local path does not exist."""
  resolved = paths.resolve(path)
  if not resolved.startswith("gs://") and not os.path.exists(resolved):
    raise FileNotFoundError(f"checkpoint not found: {path}")
  if os.path.isfile(os.path.join(resolved, "config.json")):
    return "hf", resolved
  if resolved.endswith(".safetensors"):
    return "demo", resolved
  return "t5x", resolved


def load_params(module: network.Transformer, path: str, dtype: Any = None) -> Params:
  """Parameters for `module` from a checkpoint, checked against it (every path and shape), with
  floating-point leaves cast to `dtype` when given, as numpy arrays in host memory (see
  `decode_layout.restore_params` for a restore straight into a mesh's shards).

  `path`: a T5X checkpoint (directory, its `checkpoint` file, or a msgpack file; local or
  gs://), a Hugging Face T5 folder (with config.json), or a `.safetensors` file of the shipped
  demo format (`spec_decode.t5.demo_pair`). The configs of the last two must match the module's.
  """
  kind, resolved = checkpoint_format(path)
  try:
    if kind == "hf":
      found, params = hf_checkpoints.load_hf(resolved)
      _check_same_architecture(module.config, found, path)
    elif kind == "demo":
      found, params = demo_pair.load_model(resolved)
      _check_same_architecture(module.config, found, path)
    else:
      params = checkpoints.load_t5x(resolved)
  except (ValueError, FileNotFoundError):  # already name the file
    raise
  except Exception as e:  # pylint: disable=broad-except: a reader's own error (truncated file...)
    raise ValueError(f"checkpoint {path} could not be read: {type(e).__name__}: "
                     f"{gin_utils.first_line(e)}") from e
  checkpoints.check_params(checkpoints.expected_param_shapes(module.config), params, path)
  return params if dtype is None else checkpoints.cast_floats(params, dtype)


# --------------------------------------------------------------------------- decode functions


def is_speculative(decode_fn: Callable) -> bool:
  """Whether `decode_fn` follows `decoding.speculative_sample`'s protocol (it takes a draft)."""
  return "draft_tokens_to_logits" in inspect.signature(decode_fn).parameters


def decode_fn_arguments(decode_fn: Callable) -> dict[str, Any]:
  """The keyword arguments `decode_fn` will be called with, where known before the call:
  its defaults, overridden by its gin bindings (when it is gin's configurable, as a config's
  `@decoding.speculative_sample` is), overridden by functools.partial keywords."""
  arguments: dict[str, Any] = {}
  partial_keywords: dict[str, Any] = {}
  fn = decode_fn
  while isinstance(fn, functools.partial):
    partial_keywords = {**fn.keywords, **partial_keywords}
    fn = fn.func
  for name, parameter in inspect.signature(fn).parameters.items():
    if parameter.default is not inspect.Parameter.empty:
      arguments[name] = parameter.default
  if hasattr(fn, "__wrapped__"):  # gin's wrapper (`@decoding.x` in a config): bindings apply
    arguments.update(gin.get_bindings(fn))
  arguments.update(partial_keywords)
  return arguments


# --------------------------------------------------------------------------- models


class _LazyEncDecFeatureConverter:
  """Class attribute that is `seqio.EncDecFeatureConverter`, imported on first use: seqio
  imports TensorFlow, which nothing else here needs.

  Read on an instance (as T5X does: `model.FEATURE_CONVERTER_CLS(pack=False)`) it imports seqio.
  Read on the class before seqio is imported it stays this descriptor: gin, registering the
  class for a config, reads every class attribute, and must not pull in TensorFlow.
  """

  def __get__(self, instance: Any, owner: type) -> Any:
    if instance is None and "seqio" not in sys.modules:
      return self
    import seqio  # pylint: disable=g-import-not-at-top
    return seqio.EncDecFeatureConverter


def _initial_variables(module: network.Transformer, rng: jax.Array,
                       input_shapes: Mapping[str, tuple[int, ...]],
                       input_types: Mapping[str, Any] | None = None) -> dict[str, Any]:
  input_types = input_types or {}
  tokens = {name: jnp.ones(input_shapes[name], input_types.get(name, jnp.int32))
            for name in ("encoder_input_tokens", "decoder_input_tokens")}
  # Jitted: run op by op, initializing even a tiny T5 takes many seconds.
  init = jax.jit(functools.partial(module.init, enable_dropout=False))
  variables = init(rng, tokens["encoder_input_tokens"], tokens["decoder_input_tokens"],
                   tokens["decoder_input_tokens"])
  return unfreeze(variables)


class EncoderDecoderModel:
  """T5X's EncoderDecoderModel protocol over `network.Transformer` (see the module docstring)."""

  FEATURE_CONVERTER_CLS = _LazyEncDecFeatureConverter()

  def __init__(self, module: network.Transformer, input_vocabulary: Any,
               output_vocabulary: Any, optimizer_def: Any = None,
               decode_fn: Callable[..., Any] = decoding.temperature_sample,
               feature_converter_cls: Callable[..., Any] | None = None,
               label_smoothing: float = 0.0, z_loss: float = 0.0,
               loss_normalizing_factor: float | None = None):
    if not isinstance(module, network.Transformer):
      raise ValueError(f"module must be a network.Transformer, got {type(module).__name__}")
    for name, vocabulary in (("input", input_vocabulary), ("output", output_vocabulary)):
      if vocabulary.vocab_size > module.config.vocab_size:
        raise ValueError(f"the {name} vocabulary has {vocabulary.vocab_size} ids but the "
                         f"model's embedding only {module.config.vocab_size}")
    if feature_converter_cls is not None:
      self.FEATURE_CONVERTER_CLS = feature_converter_cls  # pylint: disable=invalid-name
    self.module = module
    self._check_decode_fn(decode_fn)
    self._input_vocabulary = input_vocabulary
    self._output_vocabulary = output_vocabulary
    self.optimizer_def = optimizer_def
    self._decode_fn = decode_fn
    self._label_smoothing = label_smoothing
    self._z_loss = z_loss
    self._loss_normalizing_factor = loss_normalizing_factor
    self._model_calls: ModelCalls = network_model_calls

  def with_model_calls(self, model_calls: ModelCalls) -> "EncoderDecoderModel":
    """A copy of this model whose decodes get their caches and step functions from
    `model_calls` (the loaded draft parameters are shared)."""
    model = copy.copy(self)
    model._model_calls = model_calls  # pylint: disable=protected-access
    return model

  def _check_decode_fn(self, decode_fn: Callable[..., Any]) -> None:
    if is_speculative(decode_fn):
      raise ValueError("a speculative decode_fn needs a draft: use "
                       "models.SpeculativeEncoderDecoderModel")

  @property
  def input_vocabulary(self) -> Any:
    return self._input_vocabulary

  @property
  def output_vocabulary(self) -> Any:
    return self._output_vocabulary

  @property
  def decode_fn(self) -> Callable[..., Any]:
    return self._decode_fn

  @property
  def is_speculative(self) -> bool:
    return is_speculative(self._decode_fn)

  @property
  def decode_settings(self) -> dict[str, Any]:
    """The decode_fn's SAMPLING_ARGUMENTS (and SPECULATIVE_ARGUMENTS when speculative), as
    far as they are known before a call: for reports."""
    arguments = decode_fn_arguments(self._decode_fn)
    return {name: arguments.get(name) for name in SAMPLING_ARGUMENTS}

  # ----------------------------------------------------------------- training protocol

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{'params': ..., 'params_axes': ...} for inputs of these shapes (token dtype int32)."""
    return _initial_variables(self.module, rng, input_shapes, input_types)

  def _compute_logits(self, params: Params, batch: Batch,
                      dropout_rng: jax.Array | None = None) -> jax.Array:
    """Teacher-forced logits [B, L, V] float32."""
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else {}
    return self.module.apply({"params": params}, batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                             enable_dropout=dropout_rng is not None, rngs=rngs)

  def loss_fn(self, params: Params, batch: Batch, dropout_rng: jax.Array | None
              ) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    """T5X's cross-entropy: (loss, (weight_sum, metrics)); the token losses (with label
    smoothing and z-loss) are summed with decoder_loss_weights, then divided by
    loss_normalizing_factor when it is set."""
    logits = self._compute_logits(params, batch, dropout_rng)
    token_loss, z_term = losses.cross_entropy_with_logits(
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
                             return_all_decodes: bool = False, num_decodes: int = 1,
                             prompt_with_targets: bool = False
                             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Decodes a batch with `decode_fn` (see the module docstring for shapes).

    `rng` becomes the decode_fn's `decode_rng`; `decoder_params` are further decode_fn
    keyword arguments (T5X's); `prompt_with_targets` forces the non-zero tokens of
    decoder_input_tokens as a prompt.
    """
    return self._predict(params, batch, rng, decoder_params, return_all_decodes, num_decodes,
                         prompt_with_targets, draft_params=None)

  def _predict(self, params: Params, batch: Batch, rng: jax.Array | None,
               decoder_params: Mapping[str, Any] | None, return_all_decodes: bool,
               num_decodes: int, prompt_with_targets: bool, draft_params: Params | None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    decoder_params = dict(decoder_params or {})
    if rng is not None:
      if "decode_rng" in decoder_params:
        raise ValueError("give the decoding rng as rng or as decoder_params['decode_rng'], "
                         "not both")
      decoder_params["decode_rng"] = rng
    decoder_input_tokens = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
    inputs = decoder_input_tokens if prompt_with_targets else jnp.zeros_like(decoder_input_tokens)
    decodes, scores, aux = self._decode(params, draft_params,
                                        jnp.asarray(batch["encoder_input_tokens"], jnp.int32),
                                        inputs, num_decodes, decoder_params)
    aux = {"scores": scores, **aux}
    if return_all_decodes:
      return decodes, aux
    # Decodes are sorted by score, ascending: the best is last.
    return decodes[:, -1], {name: value[:, -1] for name, value in aux.items()}

  def _decode(self, params: Params, draft_params: Params | None,
              encoder_input_tokens: jax.Array, inputs: jax.Array, num_decodes: int,
              decoder_params: dict[str, Any]) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """The target alone: (decodes [B, n, L], scores [B, n], extra aux {})."""
    del draft_params  # no draft
    cache, tokens_to_logits = self._model_calls("target", self.module, params,
                                                encoder_input_tokens, inputs.shape[1])
    decodes, scores = self._decode_fn(
        inputs=inputs, cache=cache, tokens_to_logits=tokens_to_logits,
        eos_id=self.output_vocabulary.eos_id, num_decodes=num_decodes, **decoder_params)
    return decodes, scores, {}


class SpeculativeEncoderDecoderModel(EncoderDecoderModel):
  """An EncoderDecoderModel whose decode_fn may be speculative, with a draft model.

  `draft_module`: the draft `network.Transformer` (same vocabulary size as the target);
  `draft_checkpoint_path`: its checkpoint (any format of `load_params`), read on first use.
  Every decoding setting (gamma, temperature, verifier, draft_policy, ...) belongs to the
  decode_fn, bound in one place (`decoding.speculative_sample.gamma = 4` in a config, or a
  functools.partial): the model only checks it. With a non-speculative decode_fn (the
  baseline) the target runs alone and no draft is needed.
  """

  def __init__(self, module: network.Transformer, input_vocabulary: Any,
               output_vocabulary: Any, optimizer_def: Any = None,
               decode_fn: Callable[..., Any] = decoding.speculative_sample,
               feature_converter_cls: Callable[..., Any] | None = None,
               label_smoothing: float = 0.0, z_loss: float = 0.0,
               loss_normalizing_factor: float | None = None,
               draft_module: network.Transformer | None = None,
               draft_checkpoint_path: str | None = None):
    self.draft_module = draft_module
    self.draft_checkpoint_path = draft_checkpoint_path
    super().__init__(module, input_vocabulary, output_vocabulary, optimizer_def, decode_fn,
                     feature_converter_cls, label_smoothing, z_loss, loss_normalizing_factor)
    self._draft_params: Params | None = None

  def _check_decode_fn(self, decode_fn: Callable[..., Any]) -> None:
    if not is_speculative(decode_fn):
      return
    if not isinstance(self.draft_module, network.Transformer):
      raise ValueError("a speculative decode_fn needs a draft_module (a network.Transformer), "
                       f"got {self.draft_module!r}")
    target_vocab, draft_vocab = self.module.config.vocab_size, self.draft_module.config.vocab_size
    if draft_vocab != target_vocab:
      raise ValueError(f"target and draft vocabularies differ: the target has {target_vocab} "
                       f"ids, the draft {draft_vocab}")
    gamma = decode_fn_arguments(decode_fn).get("gamma")
    if gamma is None:
      raise ValueError("gamma is not set: bind decoding.speculative_sample.gamma")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    if self.draft_checkpoint_path is not None:
      path = paths.resolve(self.draft_checkpoint_path)
      if not path.startswith("gs://") and not os.path.exists(path):
        raise FileNotFoundError(f"draft checkpoint not found: {self.draft_checkpoint_path}")

  @property
  def decode_settings(self) -> dict[str, Any]:
    settings = super().decode_settings
    if self.is_speculative:
      arguments = decode_fn_arguments(self.decode_fn)
      settings.update({name: arguments[name] for name in SPECULATIVE_ARGUMENTS
                       if name in arguments})
    return settings

  @property
  def draft_params(self) -> Params:
    """The draft's parameters, read from draft_checkpoint_path on first use."""
    if self._draft_params is None:
      if self.draft_module is None or self.draft_checkpoint_path is None:
        raise ValueError("no draft parameters: set draft_module and draft_checkpoint_path, or "
                         "pass draft_params")
      self._draft_params = jax.device_put(
          load_params(self.draft_module, self.draft_checkpoint_path))
    return self._draft_params

  def baseline(self) -> EncoderDecoderModel:
    """The target alone with `decoding.temperature_sample` and this decode_fn's sampling
    settings (same distribution): the model speculative decoding is compared with."""
    arguments = decode_fn_arguments(self.decode_fn)
    decode_fn = functools.partial(decoding.temperature_sample,
                                  **{name: arguments[name] for name in SAMPLING_ARGUMENTS
                                     if name in arguments})
    return EncoderDecoderModel(self.module, self.input_vocabulary, self.output_vocabulary,
                               self.optimizer_def, decode_fn, None, self._label_smoothing,
                               self._z_loss, self._loss_normalizing_factor)

  def get_draft_initial_variables(self, rng: jax.Array,
                                  input_shapes: Mapping[str, tuple[int, ...]],
                                  input_types: Mapping[str, Any] | None = None
                                  ) -> dict[str, Any]:
    """`get_initial_variables` for the draft module (e.g. for its parameter axes)."""
    return _initial_variables(self.draft_module, rng, input_shapes, input_types)

  def predict_batch_with_aux(self, params: Params, batch: Batch, rng: jax.Array | None = None,
                             decoder_params: Mapping[str, Any] | None = None,
                             return_all_decodes: bool = False, num_decodes: int = 1,
                             prompt_with_targets: bool = False,
                             draft_params: Params | None = None
                             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """As EncoderDecoderModel's; `draft_params` default to the loaded `draft_params`."""
    if self.is_speculative and draft_params is None:
      draft_params = self.draft_params
    return self._predict(params, batch, rng, decoder_params, return_all_decodes, num_decodes,
                         prompt_with_targets, draft_params)

  def _decode(self, params: Params, draft_params: Params | None,
              encoder_input_tokens: jax.Array, inputs: jax.Array, num_decodes: int,
              decoder_params: dict[str, Any]) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    if not self.is_speculative:
      return super()._decode(params, None, encoder_input_tokens, inputs, num_decodes,
                             decoder_params)
    max_decode_len = inputs.shape[1]
    cache, tokens_to_logits = self._model_calls("target", self.module, params,
                                                encoder_input_tokens, max_decode_len)
    draft_cache, draft_tokens_to_logits = self._model_calls(
        "draft", self.draft_module, draft_params, encoder_input_tokens, max_decode_len)
    decodes, scores, stats = self.decode_fn(
        inputs=inputs, cache=cache, tokens_to_logits=tokens_to_logits,
        eos_id=self.output_vocabulary.eos_id, draft_cache=draft_cache,
        draft_tokens_to_logits=draft_tokens_to_logits, num_decodes=num_decodes,
        **decoder_params)
    aux = {name: getattr(stats, name) for name in stats.counter_names()}
    aux["alpha"] = stats.alpha
    return decodes, scores, aux
