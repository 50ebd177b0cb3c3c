"""Draft distillation (DistillSpec, Zhou et al., 2024) as a T5X model: `t5x.train` trains a draft
on a frozen target's token distributions, with T5X's own trainer, partitioner, checkpointer and
data pipeline; the checkpoints it writes are the draft's alone, ready to be
DRAFT_CHECKPOINT_PATH in configs/t5x/speculative.gin.

`DistillationEncoderDecoderModel` IS a `t5x.models.EncoderDecoderModel`, and
`DistillationDecoderOnlyModel` a `t5x.models.DecoderOnlyModel`, over the draft's T5X network (the
user's model gin file: its module, vocabularies, optimizer, decode_fn, feature converter and
loss normalizing factor). Its `params` (what T5X initializes, restores, trains and saves) are
the draft's. The target (`target_module`, spec_decode's network of the draft's family, whose
parameter tree is T5X's) and its parameters, restored from its T5X checkpoint once when the
model is built (`speculative.read_draft_params`: T5X's checkpoint utilities for T5X's legacy
format, the Orbax item otherwise; every parameter checked finite), are held by the model as a
constant: no gradient reaches them and no checkpoint holds them.

`loss_fn` is the divergence (`spec_decode.training.divergences`, at `temperature`) between the
target's and the draft's teacher-forced token distributions on the batch's targets, weighted by
`decoder_loss_weights`, summed and divided by T5X's loss_normalizing_factor where one is set (as
T5X's cross-entropy is); its metrics are T5X's (accuracy of the draft on the targets, loss, ...)
plus 'alpha' (mean over target tokens of sum min(p, q), the acceptance rate of speculative
sampling at `temperature`), 'alpha_t0' and 'alpha_t1' (the same at temperatures 0, where the
argmaxes must agree, and 1: `divergences.alpha_sums`) and 'divergence/<name>' per target token.
T5X's `eval_fn` (the loss_fn without an rng: on the task's targets, no decoding), scores and
decodes are the draft's, unchanged. An encoder-decoder's batches are unpacked
(`DatasetConfig.pack = False`, which distill_draft.gin sets); a decoder-only target takes T5X's
packed batches.

The batch's targets are chosen by `data_source`, the standalone trainer's choices and code
(`draft_distillation.DATA_SOURCES`, `check_data_source`, `source_batch`): the task's targets
('dataset'), the target's greedy decodes or samples at `temperature` of the batch's inputs
('target_greedy', 'target_sample', through spec_decode's decoder), the draft's own samples at
`temperature` from the parameters being trained ('draft_sample', through the model's own
`predict_batch_with_aux` and decode_fn, which must be T5X's temperature_sample, under
stop_gradient), or 'mixture': the first round(`draft_sample_fraction` * B) rows the draft's
samples, the others the task's targets. Decodes replace decoder_target_tokens, and as T5X's
EncDecFeatureConverter writes them, decoder_input_tokens (the targets shifted right) and
decoder_loss_weights (up to and including the first EOS). They are drawn in the train step
from the rng T5X gives loss_fn (split from the dropout rng). Decoding sources are an
encoder-decoder's: a decoder-only model takes 'dataset' only.

`distillation_version(model, target_checkpoint_path, ...)` turns a user's configured T5X model of
the draft into its distillation version; the target's config is read from its checkpoint's
parameter shapes (`architecture.config_from_params`; what shapes cannot tell is the draft's).
Bad settings (no or a missing target checkpoint, target and draft vocabularies that differ, an
unknown divergence, beta where it cannot take effect, temperature <= 0, T5X's z_loss or label
smoothing, which are cross-entropy's, an unknown data source or a fraction that cannot take
effect, a decoding source for a decoder-only model, draft samples without a temperature
sampler as decode_fn) raise a one-line ValueError when the model is built, before anything is
compiled.
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics
from t5x import losses as t5x_losses
from t5x import models as t5x_models

from spec_decode.checkpoints import architecture
from spec_decode.checkpoints import checkpoint_faults
from spec_decode.t5 import network
from spec_decode.t5x import speculative
from spec_decode.training import data
from spec_decode.training import divergences
from spec_decode.training import draft_distillation

PyTree = Any


class _DistillationModel:
  """What the distillation T5X models share, mixed in before the T5X model class of the draft:
  the frozen target and the divergence loss.

  The constructor takes the draft's `module`, T5X's arguments of the model class (`t5x_args`,
  `t5x_kwargs`, passed on), and: `target_module`, a spec_decode network of the draft's family
  and vocabulary size; `target_params`, its parameters (held as a constant); `divergence`, a
  name of `divergences.DIVERGENCES`; `temperature`; `beta`, the 'jsd' divergence's;
  `data_source`, a name of `draft_distillation.DATA_SOURCES`, and its `draft_sample_fraction`.
  """

  def __init__(self, module: Any, *t5x_args: Any, target_module: network.Network,
               target_params: PyTree, divergence: str = "tv", temperature: float = 1.0,
               beta: float | None = None, data_source: str = "dataset",
               draft_sample_fraction: float | None = None, **t5x_kwargs: Any):
    self.beta = divergences.resolve_beta(divergence, beta)
    divergences.check(divergence, self.beta, temperature)
    self.data_source = data_source
    self.draft_sample_fraction = draft_sample_fraction
    self.divergence = divergence
    self.temperature = temperature
    super().__init__(module, *t5x_args, **t5x_kwargs)
    _check_data_source(self, data_source, draft_sample_fraction)
    self.target_module = target_module
    self.target_params = jax.device_put(target_params)

  def _training_batch(self, params: PyTree, batch: Mapping[str, jax.Array],
                      rng: jax.Array) -> Mapping[str, jax.Array]:
    """The batch of `data_source` (module docstring); the decoding sources are the
    encoder-decoder's (`_check_data_source` refuses them to a decoder-only model)."""
    del params, rng
    return batch

  @abc.abstractmethod  # T5X's models are abc.ABCs
  def _target_logits(self, batch: Mapping[str, jax.Array]) -> jax.Array:
    """The frozen target's teacher-forced logits [B, L, V] of the batch."""

  def loss_fn(self, params: PyTree, batch: Mapping[str, jax.Array],
              dropout_rng: jax.Array | None) -> tuple[jax.Array, Mapping[str, Any]]:
    """T5X's loss_fn with the divergence from the target in place of the cross-entropy, on the
    batch of `data_source` where an rng is given (training), else on `batch` (T5X's eval_fn)."""
    if dropout_rng is not None and self.data_source != "dataset":
      sample_rng, dropout_rng = jax.random.split(dropout_rng)
      batch = self._training_batch(params, batch, sample_rng)
    draft_logits = self._compute_logits(params, batch, dropout_rng)  # pytype: disable=attribute-error
    target_logits = jax.lax.stop_gradient(self._target_logits(batch))
    loss_normalizing_factor, weights = t5x_losses.get_loss_normalizing_factor_and_weights(
        self._loss_normalizing_factor, batch)  # pytype: disable=attribute-error
    if weights is None:
      weights = batch["decoder_target_tokens"] > 0
    sums = divergences.weighted_sums(self.divergence, target_logits, draft_logits, weights,
                                     temperature=self.temperature, beta=self.beta)
    alphas = divergences.alpha_sums(target_logits, draft_logits, weights)
    loss = sums["divergence_sum"]
    if loss_normalizing_factor is not None:
      loss /= loss_normalizing_factor
    # T5X's packing and padding counts: by segment ids, else by nonzero tokens.
    segment_ids = {k[:-len("_segment_ids")]: v for k, v in batch.items()
                   if k.endswith("_segment_ids")}
    if not segment_ids:
      segment_ids = {k: v != 0 for k, v in batch.items()
                     if k in ("encoder_input_tokens", "decoder_target_tokens")}
    metrics = self._compute_metrics(  # pytype: disable=attribute-error
        logits=draft_logits, targets=batch["decoder_target_tokens"], mask=weights, loss=loss,
        segment_ids=segment_ids)
    metrics.update({
        "alpha": clu_metrics.Average(total=sums["alpha_sum"], count=sums["num_tokens"]),
        **{name: clu_metrics.Average(total=total, count=sums["num_tokens"])
           for name, total in (("alpha_t0", alphas["alpha_t0_sum"]),
                               ("alpha_t1", alphas["alpha_t1_sum"]))},
        f"divergence/{self.divergence}": clu_metrics.Average(total=sums["divergence_sum"],
                                                             count=sums["num_tokens"]),
    })
    return loss, metrics


class DistillationEncoderDecoderModel(_DistillationModel, t5x_models.EncoderDecoderModel):
  """A `t5x.models.EncoderDecoderModel` of a draft that trains on a frozen target's token
  distributions: `target_module` is a `network.Transformer`; the other arguments are
  `_DistillationModel`'s and T5X's EncoderDecoderModel's."""

  def _training_batch(self, params: PyTree, batch: Mapping[str, jax.Array],
                      rng: jax.Array) -> Mapping[str, jax.Array]:
    length = batch["decoder_target_tokens"].shape[1]

    def decode_target(rows: Mapping[str, jax.Array], greedy: bool) -> jax.Array:
      return draft_distillation.sample(
          self.target_module.config, self.target_params, rows["encoder_input_tokens"], rng,
          0.0 if greedy else self.temperature, length)

    def decode_draft(rows: Mapping[str, jax.Array]) -> jax.Array:
      # The draft's own decode (its decode_fn, T5X's temperature_sample) of the whole
      # distribution at the distillation temperature; no gradient flows through the samples.
      decodes, _ = self.predict_batch_with_aux(
          jax.lax.stop_gradient(params), rows, rng=rng, num_decodes=1, return_all_decodes=False,
          decoder_params={"temperature": self.temperature, "topk": 0, "topp": 0.0})
      return decodes

    return draft_distillation.source_batch(
        self.data_source, self.draft_sample_fraction, dict(batch), decode_target=decode_target,
        decode_draft=decode_draft)

  def _target_logits(self, batch: Mapping[str, jax.Array]) -> jax.Array:
    if "encoder_segment_ids" in batch or "decoder_segment_ids" in batch:
      raise ValueError("packed batches are not supported: set DatasetConfig.pack = False")
    return self.target_module.apply(
        {"params": self.target_params}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=False)


class DistillationDecoderOnlyModel(_DistillationModel, t5x_models.DecoderOnlyModel):
  """A `t5x.models.DecoderOnlyModel` of a draft that trains on a frozen target's token
  distributions: `target_module` is a `network.DecoderOnlyTransformer` with the model's
  `inputs_bidirectional_attention`; the other arguments are `_DistillationModel`'s and T5X's
  DecoderOnlyModel's."""

  def _target_logits(self, batch: Mapping[str, jax.Array]) -> jax.Array:
    return self.target_module.apply(
        {"params": self.target_params}, batch["decoder_input_tokens"],
        batch["decoder_target_tokens"], decoder_segment_ids=batch.get("decoder_segment_ids"),
        decoder_positions=batch.get("decoder_positions"),
        decoder_causal_attention=self._get_decoder_causal_attention(batch),
        enable_dropout=False)


DistillationModel = DistillationEncoderDecoderModel | DistillationDecoderOnlyModel


def _check_data_source(model: t5x_models.BaseTransformerModel, data_source: str,
                       draft_sample_fraction: float | None) -> None:
  """One-line ValueError for a data source the T5X model cannot train on."""
  draft_distillation.check_data_source(
      data_source, draft_sample_fraction,
      decoder_only=isinstance(model, t5x_models.DecoderOnlyModel))
  if data_source == "dataset":
    return
  if model.output_vocabulary.eos_id != data.EOS_ID:
    raise ValueError(f"data source {data_source!r} ends decodes at EOS id {data.EOS_ID}; the "
                     f"draft's vocabulary's is {model.output_vocabulary.eos_id}")
  if data_source in draft_distillation.ON_POLICY_SOURCES and not {
      "temperature", "topk", "topp"} <= set(inspect.signature(model.decode_fn).parameters):
    raise ValueError(f"data source {data_source!r} samples with the draft's decode_fn, which "
                     f"takes no temperature: bind decoding.temperature_sample")


def distillation_version(model: t5x_models.EncoderDecoderModel | t5x_models.DecoderOnlyModel,
                         target_checkpoint_path: str | None, divergence: str = "tv",
                         temperature: float = 1.0, beta: float | None = None,
                         data_source: str = "dataset",
                         draft_sample_fraction: float | None = None) -> DistillationModel:
  """`model` (the draft's configured T5X model: an EncoderDecoderModel over a T5X T5 network or
  a DecoderOnlyModel over T5X's decoder-only network) trained on the token distributions of the
  target of the T5X checkpoint `target_checkpoint_path`, on the data of `data_source` (module
  docstring). Same module,
  vocabularies, optimizer, decode_fn, feature converter, loss normalizing factor and default
  decoder params."""
  if not isinstance(model, (t5x_models.EncoderDecoderModel, t5x_models.DecoderOnlyModel)):
    raise ValueError(f"draft distillation takes a T5X EncoderDecoderModel or "
                     f"DecoderOnlyModel, not {type(model).__name__}")
  # pylint: disable=protected-access
  if model._z_loss or model._label_smoothing:
    raise ValueError("z_loss and label_smoothing are cross-entropy's: they cannot take effect "
                     "with distillation")
  divergences.check(divergence, divergences.resolve_beta(divergence, beta), temperature)
  _check_data_source(model, data_source, draft_sample_fraction)
  decoder_only = isinstance(model, t5x_models.DecoderOnlyModel)
  path = speculative.existing_checkpoint(target_checkpoint_path, role="target",
                                         macro="TARGET_CHECKPOINT_PATH")
  draft_config = speculative.config_from_t5x(
      model.module.config, network.DecoderOnlyConfig if decoder_only else network.T5Config)
  target_config = architecture.config_from_params(
      speculative.read_draft_params(path, shapes_only=True), draft_config, path)
  if target_config.vocab_size != draft_config.vocab_size:
    raise ValueError(f"target and draft vocabularies differ: the target has "
                     f"{target_config.vocab_size} ids, the draft {draft_config.vocab_size}")
  target_params = speculative.read_draft_params(path)
  checkpoint_faults.check_finite_params(target_params, path)
  shared = dict(target_params=target_params, divergence=divergence, temperature=temperature,
                beta=beta, data_source=data_source, draft_sample_fraction=draft_sample_fraction,
                decode_fn=model.decode_fn,
                feature_converter_cls=model.FEATURE_CONVERTER_CLS,
                loss_normalizing_factor=model._loss_normalizing_factor)
  if decoder_only:
    bidirectional = model._inputs_bidirectional_attention
    return DistillationDecoderOnlyModel(
        model.module, model.output_vocabulary, model.optimizer_def,
        target_module=network.DecoderOnlyTransformer(
            target_config, inputs_bidirectional_attention=bidirectional),
        inputs_bidirectional_attention=bidirectional, **shared)
  return DistillationEncoderDecoderModel(
      model.module, model.input_vocabulary, model.output_vocabulary, model.optimizer_def,
      target_module=network.Transformer(target_config),
      default_decoder_params=model._default_decoder_params, **shared)
  # pylint: enable=protected-access
