"""Exact speculative decoding as a T5X model: `t5x.infer`, `t5x.eval` and `utils.get_infer_fn`
drive it unchanged, with T5X's own partitioner and checkpointer.

`SpeculativeEncoderDecoderModel` IS a `t5x.models.EncoderDecoderModel`, and
`SpeculativeDecoderOnlyModel` a `t5x.models.DecoderOnlyModel` (a language model, causal or a
prefix LM, decoding the continuation of each row's prompt as T5X's does). Their `module` is
spec_decode's `network.Transformer` or `network.DecoderOnlyTransformer`, which have T5X's
parameter trees (`t5x.examples.t5.network`'s, `t5x.examples.decoder_only.network`'s: the user's
T5X checkpoint restores through T5X's checkpointer unchanged) and decode k tokens per call,
which speculative decoding needs (the target verifies gamma + 1 tokens in one call); the draft
is a network of the target's family. Both share `_SpeculativeModel`. Decoding is
`core.Decoder`'s, the core every runner shares: a loop of `spec_decode.engine.loops` (by
default the speculative form of the user's decode_fn: 'speculative_sample' for
`temperature_sample`, 'speculative_beam_search' for `beam_search`) with the model's constructor
arguments (gin: DECODE_LOOP, GAMMA, VERIFIER, DRAFT_POLICY in speculative.gin, nowhere else).

Parameters. `params` (what T5X restores, partitions and passes to every compiled step) is the
target's tree plus one subtree `params[DRAFT_PARAMS_KEY]` holding the draft's:
  * `get_initial_variables` declares both (so T5X's partitioner places both: the draft's
    `params_axes` are all None, i.e. replicated, unless `shard_draft`, which keeps its logical
    axis names so the draft is model-sharded by the same rules as the target);
  * `restore_draft_params`, a T5X `RestoreStateTransformationFn` bound into
    `utils.RestoreCheckpointConfig.state_transformation_fns`, adds the draft's parameters, read
    from its own T5X checkpoint, to the target checkpoint's state as T5X reads it; T5X then
    casts, shards and places them like any parameter;
so the draft reaches the compiled function as an argument, never as a compiled-in constant.
Restores go through `CheckedCheckpointManager` (or `CheckedCheckpointer`), bound in
speculative.gin, which checks every restored parameter of both for NaN and infinity, naming it.

Shapes (B batch, n num_decodes, L decoder length) are T5X's: `predict_batch_with_aux` (T5X's
arguments of each model class) returns decodes [B, L] and aux values [B] (with
return_all_decodes: [B, n, L] and [B, n], sorted by score, best last). aux holds 'scores'
(T5X's: the decode's log-probability under the law sampled, or the target's own with
`rescale_log_probs=False` bound; beam search: T5X's beam score) and the loop's stats per
example (`spec_decode.engine.stats`: `SpeculativeStats.aux()`, its counters, 'alpha' and
'tokens_per_target_call'; `BeamSearchStats.aux()`, target and draft calls, beam steps,
coverage by tree depth and beam steps per target call);
`t5x.infer` writes them to its outputs in mode 'predict_with_aux'
(speculative_infer.gin and speculative_decoder_only_infer.gin set it). Scoring and losses use
the target alone.

`speculative_version(model, ...)` turns a user's configured T5X `EncoderDecoderModel` (a T5X
T5 network, vocabularies, optimizer, losses, decode_fn) or `DecoderOnlyModel` (T5X's
decoder-only network) into its speculative version: the target's config is the T5X network's,
the draft's is read from its checkpoint's parameter shapes (one of the other family is refused),
and the decode is the T5X decode_fn's speculative form (see `decode_fn_settings`:
`temperature_sample`'s distribution, or `beam_search` with its alpha and T5X's num_decodes
beams). Bad settings
(gamma < 1, a missing draft checkpoint, a draft whose vocabulary differs from the target's, an
unknown verifier or drafting policy) raise a one-line ValueError when the model is built, before
anything is restored or compiled.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import posixpath
from typing import Any, Callable, Mapping, MutableMapping

import flax.core
import gin
import jax
import jax.numpy as jnp
from absl import logging
from flax.linen import partitioning as nn_partitioning
from t5x import checkpoints as t5x_checkpoints
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from tensorflow.io import gfile

from spec_decode import core
from spec_decode.checkpoints import architecture
from spec_decode.checkpoints import checkpoint_faults
from spec_decode.checkpoints import formats
from spec_decode.checkpoints import t5x_format
from spec_decode.engine import loops
from spec_decode.t5 import network

PyTree = Any
# The subtree of `params` that holds the draft's parameters.
DRAFT_PARAMS_KEY = "speculative_draft"


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
  """(target params, draft params) from the model's `params`; draft params None where the
  model has no draft network (an n-gram lookup draft alone)."""
  target = {name: value for name, value in params.items() if name != DRAFT_PARAMS_KEY}
  return target, params.get(DRAFT_PARAMS_KEY)


def config_from_t5x(t5x_config: Any,
                    config_class: type[network.NetworkConfig] = network.T5Config
                    ) -> network.NetworkConfig:
  """This network's config for a T5X network config whose field names it shares: a `T5Config`
  for `t5x.examples.t5.network.T5Config`, a `DecoderOnlyConfig` (`config_class`) for
  `t5x.examples.decoder_only.network.TransformerConfig`."""
  fields = {field.name: getattr(t5x_config, field.name)
            for field in dataclasses.fields(t5x_config)}
  try:
    return config_class(**fields)
  except TypeError as e:
    raise ValueError(f"not a network config this model can run as a {config_class.__name__}: "
                     f"{e}") from None


def existing_checkpoint(path: str | None, *, role: str = "draft",
                        macro: str = "DRAFT_CHECKPOINT_PATH") -> str:
  """`path`, or ValueError naming `macro` where none is set or naming the missing path."""
  if not path:
    raise ValueError(f"no {role} checkpoint: set {macro}")
  if not gfile.exists(path):
    raise ValueError(f"{role} checkpoint not found: {path}")
  return path


def check_target_checkpoint(checkpoint_path: Any) -> None:
  """Reads the target's T5X checkpoint (T5X's CHECKPOINT_PATH) as far as its msgpack index, as
  the draft's is read, so that a truncated or corrupt one is named (`checkpoint_faults`) before
  T5X restores it, whose own error names no file. Paths T5X resolves itself (a list, a directory
  of several checkpoints, an Orbax one, none) are left to T5X."""
  if not isinstance(checkpoint_path, str) or not gfile.exists(
      posixpath.join(checkpoint_path, "checkpoint")):
    return
  with checkpoint_faults.reading(checkpoint_path):
    t5x_checkpoints.load_t5x_checkpoint(checkpoint_path, lazy_parameters=True)


def read_draft_params(path: str, shapes_only: bool = False) -> PyTree:
  """The parameters of the T5X checkpoint `path` as numpy arrays, read by T5X for its legacy
  format and by `checkpoints.t5x_format` for the Orbax one T5X writes by default (T5X reads
  Orbax checkpoints only into a train state); with `shapes_only`, leaves that only carry
  `.shape` (nothing but the index or the metadata is read). A checkpoint that cannot be read is
  a ValueError naming its file (`checkpoint_faults`)."""
  item = formats.t5x_orbax_state_item(path)
  with checkpoint_faults.reading(path):
    if item == path:
      return t5x_checkpoints.load_t5x_checkpoint(path, lazy_parameters=shapes_only)["target"]
    return architecture.t5x_param_shapes(item) if shapes_only else t5x_format.load_t5x(item)


def draft_config_from_checkpoint(draft_checkpoint_path: str,
                                 target_config: network.NetworkConfig
                                 ) -> network.NetworkConfig:
  """The draft's config, of the target's family, read from the parameter shapes of its T5X
  checkpoint (only the msgpack index or the Orbax metadata is read;
  `architecture.config_from_params`: what shapes cannot tell is the target's; a checkpoint of
  the other family is a ValueError)."""
  path = existing_checkpoint(draft_checkpoint_path)
  return architecture.config_from_params(read_draft_params(path, shapes_only=True),
                                         target_config, path)


# The speculative form of each T5X decode function, and the arguments passed on to it whatever
# their value (the law sampled, whose topk default differs from the loops'; the brevity alpha).
_SPECULATIVE_FORMS = {
    t5x_decoding.temperature_sample: ("speculative_sample",
                                      ("temperature", "topk", "topp", "max_decode_steps")),
    t5x_decoding.beam_search: ("speculative_beam_search", ("alpha",)),
}
# The arguments this model keeps at T5X's defaults, and why another value cannot take effect.
_FIXED_ARGUMENTS = {
    "cache_offset": "speculative decoding keeps T5X's default 0 (its caches have the batch "
                    "leading)",
    "state_callback_fn": "it edits T5X's per-token loop state before each step, and a "
                         "speculative iteration commits up to gamma + 1 tokens from one target "
                         "call without building that state",
}


def _at_default(value: Any, default: Any) -> bool:
  try:
    return value is default or bool(value == default)
  except ValueError:  # an array compares elementwise: bound, so not T5X's default
    return False


def _bound_arguments(decode_fn: Callable[..., Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
  """(the T5X function under gin and functools.partial, every argument it runs with that has
  a default: its defaults, then gin bindings, then partial keywords)."""
  fn, partial_keywords = decode_fn, {}
  while isinstance(fn, functools.partial):
    partial_keywords = {**fn.keywords, **partial_keywords}
    fn = fn.func
  original = inspect.unwrap(fn)
  arguments = {name: parameter.default
               for name, parameter in inspect.signature(original).parameters.items()
               if parameter.default is not inspect.Parameter.empty}
  try:
    arguments.update(gin.get_bindings(fn))
  except ValueError:  # not gin-configured
    pass
  return original, {**arguments, **partial_keywords}


def decode_fn_settings(decode_fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
  """(the decode loop that reproduces a T5X decode_fn speculatively, its settings).

  `t5x.decoding.temperature_sample` (plain, gin-bound or a functools.partial):
  'speculative_sample' with its temperature/topk/topp/max_decode_steps, temperature 0 where
  topk is 1 (T5X's default: greedy at any temperature, and the engine's greedy path where no
  temperature given at run time in decoder_params overrides it; topk 1 stays, so one that does
  samples T5X's argmax too). `t5x.decoding.beam_search`: 'speculative_beam_search' with its
  alpha (the beam size is T5X's num_decodes). Every other argument of T5X's function bound to
  another value than T5X's default is passed on (the loop's settings check, run when the model
  is built, refuses by name what the loop cannot honour), or refused here saying why: one the
  model gives the loop itself (`loops.RUNNER_ARGUMENTS`: the batch, DecoderParams' num_decodes,
  the rng, a language model's prompt lengths) or one of `_FIXED_ARGUMENTS`. Any other
  decode_fn: ValueError.
  """
  original, arguments = _bound_arguments(decode_fn)
  if original not in _SPECULATIVE_FORMS:
    raise ValueError(f"speculative decoding reproduces t5x.decoding.temperature_sample or "
                     f"beam_search, not {getattr(original, '__name__', original)!r}")
  loop, always_passed = _SPECULATIVE_FORMS[original]
  defaults = {name: parameter.default
              for name, parameter in inspect.signature(original).parameters.items()}
  settings = {}
  for name, value in arguments.items():
    if name not in always_passed and _at_default(value, defaults[name]):
      continue
    why = ("the model gives it to the loop itself" if name in loops.RUNNER_ARGUMENTS
           else _FIXED_ARGUMENTS.get(name))
    if why is not None:
      raise ValueError(f"t5x.decoding.{original.__name__}.{name} = {value!r} cannot take "
                       f"effect: {why}")
    settings[name] = value
  if original is t5x_decoding.temperature_sample and settings["topk"] == 1:
    settings["temperature"] = 0.0
  return loop, settings


def _replicated(axes: PyTree) -> PyTree:
  """Logical axis metadata naming no axis: T5X's partitioner then replicates the parameter."""
  return jax.tree_util.tree_map(
      lambda meta: nn_partitioning.AxisMetadata(names=(None,) * len(meta.names)), axes,
      is_leaf=lambda leaf: isinstance(leaf, nn_partitioning.AxisMetadata))


class _SpeculativeModel:
  """What the speculative T5X models share, mixed in before the T5X model class it makes
  speculative: decoding with a draft (`core.Decoder`), the draft's parameters declared beside
  the target's, the target's alone for T5X's losses and scores.

  The constructor takes the target's `module`, then T5X's arguments of the model class
  (`t5x_args`, `t5x_kwargs`, passed on, with the decoder's loop as T5X's decode_fn), and:
  `draft_module`, a network of the target's family and vocabulary size; `decode_loop`, a loop
  of `spec_decode.engine.loops` ('speculative_sample' by default); `gamma` drafts per target
  call; `verifier`, `draft_policy`, rules of `spec_decode.engine.verify` /
  `spec_decode.engine.drafting`; `temperature`, `topk`, `topp`, `max_decode_steps`, the sampled
  distribution (the engine's conventions: temperature 0 is greedy, topk 0 no truncation);
  `loop_settings`, a loop's own settings (a setting left None is the loop's default);
  `shard_draft`, which shards the draft's parameters by their logical axes instead of
  replicating them; `draft_source` ('model', 'lookup', 'lookup+model'), `lookup_max_ngram` and
  `lookup_min_ngram`, the drafts (`core.make_draft`): a lookup alone takes no `draft_module`
  and declares no draft parameters.
  """

  def __init__(self, module: network.Network, *t5x_args: Any,
               draft_module: network.Network | None = None, draft_source: str = "model",
               lookup_max_ngram: int = 4, lookup_min_ngram: int | None = None,
               decode_loop: str = "speculative_sample",
               gamma: int | None = None, verifier: str | None = None,
               draft_policy: str | None = None, temperature: float | None = None,
               topk: int | None = None, topp: float | None = None,
               max_decode_steps: int | None = None,
               loop_settings: Mapping[str, Any] | None = None, shard_draft: bool = False,
               **t5x_kwargs: Any):
    self.decoder = core.Decoder.create(
        decode_loop, module,
        core.make_draft(draft_source, draft_module, lookup_max_ngram, lookup_min_ngram),
        gamma=gamma, verifier=verifier,
        draft_policy=draft_policy, temperature=temperature, topk=topk, topp=topp,
        max_decode_steps=max_decode_steps, **dict(loop_settings or {}))
    self.draft_module = draft_module
    self.shard_draft = shard_draft
    # T5X's constructor wants a decode_fn; decoding is the decoder's (predict_batch_with_aux).
    super().__init__(module, *t5x_args, decode_fn=self.decoder.loop.fn, **t5x_kwargs)

  @abc.abstractmethod  # T5X's models are abc.ABCs
  def _init_module(self, module: network.Network, rng: jax.Array,
                   tokens: Mapping[str, jax.Array]) -> dict[str, Any]:
    """`module`'s variables, initialized on the batch features `tokens` (all-ones arrays of
    T5X's input shapes)."""

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Any],
                            input_types: Mapping[str, Any] | None = None
                            ) -> flax.core.FrozenDict:
    """{'params': target's + {DRAFT_PARAMS_KEY: draft's}, 'params_axes': likewise}."""
    input_types = input_types or {}
    tokens = {name: jnp.ones(shape, input_types.get(name, jnp.int32))
              for name, shape in input_shapes.items() if name.endswith("_tokens")}
    target_rng, draft_rng = jax.random.split(rng)
    target, draft = (
        None if module is None else flax.core.unfreeze(self._init_module(module, module_rng,
                                                                         tokens))
        for module, module_rng in ((self.module, target_rng), (self.draft_module, draft_rng)))
    if draft is None:  # a lookup alone: the target's variables only
      return flax.core.freeze({"params": target["params"],
                               "params_axes": target["params_axes"]})
    draft_axes = draft["params_axes"] if self.shard_draft else _replicated(draft["params_axes"])
    return flax.core.freeze({
        "params": {**target["params"], DRAFT_PARAMS_KEY: draft["params"]},
        "params_axes": {**target["params_axes"], DRAFT_PARAMS_KEY: draft_axes}})

  def _predict(self, params: PyTree, batch: Mapping[str, jax.Array], rng: jax.Array | None,
               decoder_params: MutableMapping[str, Any] | None, return_all_decodes: bool,
               num_decodes: int, **options: Any
               ) -> tuple[jax.Array, Mapping[str, jax.Array]]:
    """T5X's predict_batch_with_aux, decoding speculatively (`core.Decoder.predict`; shapes
    and aux in the module docstring)."""
    target_params, draft_params = split_params(params)
    return self.decoder.predict(target_params, draft_params, batch,
                                self.output_vocabulary.eos_id or 1, rng=rng,
                                decoder_params=decoder_params,
                                return_all_decodes=return_all_decodes, num_decodes=num_decodes,
                                **options)


class SpeculativeEncoderDecoderModel(_SpeculativeModel, t5x_models.EncoderDecoderModel):
  """A `t5x.models.EncoderDecoderModel` that decodes with a draft: `module` and `draft_module`
  are `network.Transformer`s; the constructor's arguments are `_SpeculativeModel`'s and T5X's
  EncoderDecoderModel's (input_vocabulary, output_vocabulary, optimizer_def,
  feature_converter_cls, label_smoothing, z_loss, loss_normalizing_factor,
  default_decoder_params).
  """

  def _init_module(self, module: network.Network, rng: jax.Array,
                   tokens: Mapping[str, jax.Array]) -> dict[str, Any]:
    return module.init(rng, tokens["encoder_input_tokens"], tokens["decoder_input_tokens"],
                       tokens["decoder_input_tokens"], enable_dropout=False)

  def _compute_logits(self, params: PyTree, batch: Mapping[str, jax.Array],
                      dropout_rng: jax.Array | None = None,
                      mutable: Any = False, other_variables: PyTree | None = None) -> Any:
    """The target's teacher-forced logits [B, L, V] (T5X's signature; packed batches, which
    this network does not take, are refused)."""
    if "encoder_segment_ids" in batch or "decoder_segment_ids" in batch:
      raise ValueError("packed batches are not supported: set DatasetConfig.pack = False")
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    target_params, _ = split_params(params)
    return self.module.apply(
        {"params": target_params, **(other_variables or {})}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"],
        enable_dropout=rngs is not None, rngs=rngs, mutable=mutable)

  def predict_batch_with_aux(self, params: PyTree, batch: Mapping[str, jax.Array],
                             rng: jax.Array | None = None,
                             decoder_params: MutableMapping[str, Any] | None = None,
                             return_all_decodes: bool | None = None,
                             num_decodes: int | None = None,
                             prompt_with_targets: bool = False
                             ) -> tuple[jax.Array, Mapping[str, jax.Array]]:
    """T5X's EncoderDecoderModel.predict_batch_with_aux, decoding speculatively."""
    if return_all_decodes is None:
      return_all_decodes = self._default_decoder_params.return_all_decodes
    if num_decodes is None:
      num_decodes = self._default_decoder_params.num_decodes
    return self._predict(params, batch, rng, decoder_params, return_all_decodes, num_decodes,
                         prompt_with_targets=prompt_with_targets)


class SpeculativeDecoderOnlyModel(_SpeculativeModel, t5x_models.DecoderOnlyModel):
  """A `t5x.models.DecoderOnlyModel` that decodes with a draft: `module` and `draft_module`
  are `network.DecoderOnlyTransformer`s; T5X's `inputs_bidirectional_attention` (a prefix LM)
  is the target module's. The constructor's arguments are `_SpeculativeModel`'s and T5X's
  DecoderOnlyModel's (vocabulary, optimizer_def, feature_converter_cls, label_smoothing,
  z_loss, loss_normalizing_factor). T5X's losses and scores run unchanged on the target's
  parameters (its `_compute_logits` calls the module with T5X's decoder-only arguments).
  """

  def __init__(self, module: network.DecoderOnlyTransformer, *t5x_args: Any, **kwargs: Any):
    super().__init__(module, *t5x_args,
                     inputs_bidirectional_attention=module.inputs_bidirectional_attention,
                     **kwargs)

  def _init_module(self, module: network.Network, rng: jax.Array,
                   tokens: Mapping[str, jax.Array]) -> dict[str, Any]:
    return module.init(rng, tokens["decoder_input_tokens"], tokens["decoder_input_tokens"],
                       enable_dropout=False)

  def _compute_logits(self, params: PyTree, batch: Mapping[str, jax.Array],
                      dropout_rng: jax.Array | None = None,
                      mutable: Any = False, other_variables: PyTree | None = None) -> Any:
    """T5X's teacher-forced logits [B, L, V] of the target alone."""
    target_params, _ = split_params(params)
    return super()._compute_logits(target_params, batch, dropout_rng, mutable, other_variables)

  def predict_batch_with_aux(self, params: PyTree, batch: Mapping[str, jax.Array],
                             rng: jax.Array | None = None, *,
                             return_all_decodes: bool = False, num_decodes: int = 1,
                             decoder_params: MutableMapping[str, Any] | None = None
                             ) -> tuple[jax.Array, Mapping[str, jax.Array]]:
    """T5X's DecoderOnlyModel.predict_batch_with_aux, decoding speculatively: the batch is
    `seqio.DecoderFeatureConverter`'s, the decodes the continuations of each row's prompt."""
    return self._predict(params, batch, rng, decoder_params, return_all_decodes, num_decodes)


SpeculativeModel = SpeculativeEncoderDecoderModel | SpeculativeDecoderOnlyModel


def speculative_version(model: t5x_models.EncoderDecoderModel | t5x_models.DecoderOnlyModel,
                        draft_checkpoint_path: str | None, gamma: int | None,
                        verifier: str | None = None,
                        draft_policy: str | None = None, shard_draft: bool = False,
                        decode_loop: str | None = None,
                        loop_settings: Mapping[str, Any] | None = None,
                        draft_source: str = "model", lookup_max_ngram: int = 4,
                        lookup_min_ngram: int | None = None,
                        target_checkpoint_path: Any = None) -> SpeculativeModel:
  """`model` decoding speculatively with the draft of `draft_checkpoint_path`: a T5X
  EncoderDecoderModel over a T5X T5 network becomes a `SpeculativeEncoderDecoderModel`, a T5X
  DecoderOnlyModel over T5X's decoder-only network (`DecoderWrapper`) a
  `SpeculativeDecoderOnlyModel` (with its `inputs_bidirectional_attention`, the draft's too).
  Same target config, vocabularies, optimizer, losses, feature converter and default decoder
  params; its decode_fn's speculative form (`decode_fn_settings`: the decode loop, unless
  `decode_loop` names one, and its settings). The draft's config is read from its checkpoint
  (`draft_config_from_checkpoint`; one of the other family is refused). With `draft_source`
  'lookup' the drafts are n-gram lookups and no draft checkpoint is read (giving one is an
  error: it would be ignored). `target_checkpoint_path` (T5X's CHECKPOINT_PATH) is checked
  readable (`check_target_checkpoint`)."""
  if not isinstance(model, (t5x_models.EncoderDecoderModel, t5x_models.DecoderOnlyModel)):
    raise ValueError(f"speculative decoding takes a T5X EncoderDecoderModel or "
                     f"DecoderOnlyModel, not {type(model).__name__}")
  check_target_checkpoint(target_checkpoint_path)
  decoder_only = isinstance(model, t5x_models.DecoderOnlyModel)
  target_config = config_from_t5x(
      model.module.config, network.DecoderOnlyConfig if decoder_only else network.T5Config)
  loop_for_decode_fn, decode_settings = decode_fn_settings(model.decode_fn)
  sampling = {name: decode_settings.pop(name) for name in core.SAMPLING_SETTINGS
              if name in decode_settings}
  if draft_source == "ngram":  # its tables would have to join T5X's train state
    raise ValueError("DRAFT_SOURCE 'ngram' runs in spec_decode.infer; the T5X hook takes "
                     "'model', 'lookup' or 'lookup+model'")
  if draft_source == "lookup" and draft_checkpoint_path:
    raise ValueError("DRAFT_SOURCE 'lookup' uses no draft model: unset DRAFT_CHECKPOINT_PATH "
                     "(the draft would be ignored)")
  # pylint: disable=protected-access
  if decoder_only:
    # Both are prefix LMs or neither: T5X's DecoderOnlyModel has one attention pattern.
    as_module = functools.partial(
        network.DecoderOnlyTransformer,
        inputs_bidirectional_attention=model._inputs_bidirectional_attention)
    model_class = SpeculativeDecoderOnlyModel
    vocabularies, t5x_kwargs = (model.output_vocabulary,), {}
  else:
    as_module = network.Transformer
    model_class = SpeculativeEncoderDecoderModel
    vocabularies = (model.input_vocabulary, model.output_vocabulary)
    t5x_kwargs = {"default_decoder_params": model._default_decoder_params}
  draft_module = None
  if draft_source != "lookup":
    draft_module = as_module(draft_config_from_checkpoint(draft_checkpoint_path, target_config))
  return model_class(
      as_module(target_config), *vocabularies, model.optimizer_def, draft_module=draft_module,
      draft_source=draft_source, lookup_max_ngram=lookup_max_ngram,
      lookup_min_ngram=lookup_min_ngram, gamma=gamma,
      verifier=verifier, draft_policy=draft_policy, shard_draft=shard_draft,
      decode_loop=decode_loop or loop_for_decode_fn,
      loop_settings={**decode_settings, **dict(loop_settings or {})},
      feature_converter_cls=model.FEATURE_CONVERTER_CLS,
      label_smoothing=model._label_smoothing, z_loss=model._z_loss,
      loss_normalizing_factor=model._loss_normalizing_factor, **t5x_kwargs, **sampling)
  # pylint: enable=protected-access


def restore_draft_params(state_dict: PyTree, target_state_dict: PyTree, *,
                         is_resuming: bool = False,
                         draft_checkpoint_path: str | None) -> PyTree:
  """T5X `RestoreStateTransformationFn`: adds the draft's parameters, read from its own T5X
  checkpoint, to the restored checkpoint state at target[DRAFT_PARAMS_KEY] (unless the
  checkpoint already holds them: one saved from this model). T5X then casts, shards and places
  them as declared by `get_initial_variables`. Without a draft checkpoint (an n-gram lookup
  alone, whose model declares no draft parameters; a model draft without one is refused by
  `speculative_version`) the state is left as it is. A draft that cannot be read is a
  ValueError naming its file, non-finite values in it one naming the file and the parameter
  (`checkpoint_faults`; the draft is read whole here, so it is checked here, where its path is
  known). The target's arrays are mostly not read yet (T5X reads TensorStore and Orbax arrays
  after this transformation): `CheckedCheckpointManager` checks them once restored."""
  del target_state_dict, is_resuming  # the draft is added whatever is restored
  if DRAFT_PARAMS_KEY in state_dict["target"] or not draft_checkpoint_path:
    return state_dict
  path = existing_checkpoint(draft_checkpoint_path)
  draft = read_draft_params(path)
  checkpoint_faults.check_finite_params(draft, path)
  return {**state_dict, "target": {**state_dict["target"], DRAFT_PARAMS_KEY: draft}}


class _CheckedRestore:
  """Mixed in before a T5X checkpointer or checkpoint manager: every parameter of the train
  state it restores (the target's and the draft's, whether stored inline, in TensorStore or by
  Orbax, after T5X's cast to the restore dtype, which can overflow to infinity) is checked
  finite where T5X placed it (`checkpoint_faults.check_finite_params`: one reduction per array,
  on its devices), so a NaN is named before anything decodes."""

  def restore(self, *args: Any, **kwargs: Any) -> Any:
    state = super().restore(*args, **kwargs)  # pytype: disable=attribute-error
    checkpoint_faults.check_finite_params(state.params,
                                          str(kwargs.get("path") or "CHECKPOINT_PATH"))
    return state


class CheckedCheckpointManager(_CheckedRestore, t5x_checkpoints.OrbaxCheckpointManagerInterface):
  """T5X's checkpoint manager (t5x.infer's and t5x.eval's with `use_orbax`, their default, for
  T5X's legacy and Orbax checkpoints), its restores checked finite (`_CheckedRestore`)."""


class CheckedCheckpointer(_CheckedRestore, t5x_checkpoints.Checkpointer):
  """T5X's legacy checkpointer (the runs' without `use_orbax`), its restores checked finite
  (`_CheckedRestore`)."""
