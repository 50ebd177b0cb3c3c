"""White-box distillation of a draft on its frozen target (DistillSpec, Zhou et al., 2024): the
draft is trained on the target's token distributions with a divergence matched to speculative
decoding, rather than on reference tokens (the trainers' cross-entropy) or on the target's greedy
outputs alone (`distill`'s sequence-level data). One step and one evaluation serve both model
families: encoder-decoder drafts (`train.train`) and decoder-only language models
(`lm.train_lm`, on its packed text).

Contract:
- `Distillation` (gin-configurable, `train.train.distillation`, `lm.train_lm.distillation`) names
  the frozen target (a demo model name, or any checkpoint `formats.load_model` reads, of the
  draft's family: a `.safetensors` file in `spec_decode.checkpoints.demo_pair`'s format, or a T5X
  checkpoint such as the trainers write under `model_dir/t5x/checkpoint_<step>`; the draft the
  run starts from is the trainer's `initial_model`, same forms, or
  `initial_draft`, its older name, `start_from`), the divergence
  (`divergences.DIVERGENCES`; `beta` for 'jsd' only), the `temperature` both distributions are
  taken at (the decoding temperature alpha is wanted for: total variation is then exactly
  1 - alpha at a position), and the data source:
    'dataset'        the task's targets (the trainer's batches as they are)
    'target_greedy'  the target's greedy decodes of the batch's inputs
    'target_sample'  the target's samples at `temperature`
    'draft_sample'   the draft's own samples at `temperature`, from its current parameters
                     (on-policy: the positions speculative decoding will meet)
    'mixture'        a `draft_sample_fraction` of the rows (rounded) the draft's samples, the
                     others the task's targets.
  Decodes are as long as the batch's targets, weighted up to and including their first EOS.
  The decoding sources decode an encoder-decoder's inputs: a decoder-only draft takes 'dataset'
  only.
  Bad settings (an unknown divergence or source, beta where it cannot take effect or outside
  (0, 1), a fraction outside (0, 1) or without 'mixture', temperature <= 0) are a one-line
  ValueError when it is built; a target that does not restore, or whose vocabulary is not the
  draft's, a decoding source for a decoder-only draft, or the trainer's z-loss or label
  smoothing, when the trainer starts (`for_trainer`).
- `for_trainer(distillation, draft_config, ...)`: the step and the evaluation a trainer runs
  with, the target loaded once.
- `train_step(state, batch, rng, target_params=..., ...)`: one optimizer step of the draft (the
  trainer's `train_state.TrainState`, its params the draft's). The target's parameters are an
  argument, read and never updated (no gradient reaches them); the step's samples and dropout
  use fold_in(rng, step), so a resumed run is identical to an uninterrupted one. Metrics are the
  trainer's sums: loss_sum (the divergence), alpha_sum, num_tokens, grad_norm.
- `eval_sums(...)`: divergence and alpha on evaluation batches (teacher-forced task targets,
  no decoding): alpha at the distillation temperature and at T=0 and T=1
  (`divergences.alpha_sums`).
- `check_data_source` and `source_batch` are the data sources' one definition, which the T5X
  models (`spec_decode.t5x.distillation`) share with their own decodes.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from spec_decode import core
from spec_decode.checkpoints import formats
from spec_decode.t5 import network
from spec_decode.training import data
from spec_decode.training import divergences

Batch = dict[str, Any]
# The data a draft is distilled on (module docstring), for this trainer and the T5X models.
DATA_SOURCES = ("dataset", "target_greedy", "target_sample", "draft_sample", "mixture")
# The sources that decode the draft's own samples in the training step.
ON_POLICY_SOURCES = ("draft_sample", "mixture")


def check_data_source(data_source: str, draft_sample_fraction: float | None,
                      decoder_only: bool = False) -> None:
  """One-line ValueError for an unknown source, a fraction that cannot take effect, or a
  decoding source for a decoder-only draft."""
  if data_source not in DATA_SOURCES:
    raise ValueError(f"unknown data source {data_source!r}; known: {', '.join(DATA_SOURCES)}")
  if decoder_only and data_source != "dataset":
    raise ValueError(f"data source {data_source!r} decodes an encoder-decoder's inputs: a "
                     f"decoder-only model takes 'dataset' only")
  if data_source == "mixture":
    if draft_sample_fraction is None or not 0.0 < draft_sample_fraction < 1.0:
      raise ValueError(f"data source 'mixture' needs a draft_sample_fraction in (0, 1), got "
                       f"{draft_sample_fraction}")
  elif draft_sample_fraction is not None:
    raise ValueError(f"draft_sample_fraction takes effect with data source 'mixture' only, "
                     f"not {data_source!r}")


@dataclasses.dataclass(frozen=True)
class Distillation:
  """What the draft is distilled from and how (see the module docstring)."""
  target: str
  # The draft the run starts from under its first name: the trainers' `initial_model` now
  # (`start_from`); kept so configs that bind it still run.
  initial_draft: str | None = None
  divergence: str = "tv"
  temperature: float = 1.0
  beta: float | None = None
  data_source: str = "dataset"
  draft_sample_fraction: float | None = None

  def __post_init__(self):
    divergences.check(self.divergence, divergences.resolve_beta(self.divergence, self.beta),
                      self.temperature)
    check_data_source(self.data_source, self.draft_sample_fraction)

  @property
  def jsd_beta(self) -> float:
    return divergences.resolve_beta(self.divergence, self.beta)


def load_target(distillation: Distillation, draft_config: network.NetworkConfig
                ) -> tuple[network.NetworkConfig, Any]:
  """(config, params on the device) of the frozen target, a model of the draft's family; its
  vocabulary must be the draft's."""
  try:
    config, params = formats.load_model(distillation.target, like=draft_config)
  except FileNotFoundError as e:
    raise ValueError(f"the distillation target does not restore: {e}") from None
  if config.vocab_size != draft_config.vocab_size:
    raise ValueError(f"target and draft vocabularies differ: the target has {config.vocab_size} "
                     f"ids, the draft {draft_config.vocab_size}")
  return config, jax.device_put(params)


def start_from(distillation: Distillation | None, initial_model: str | None) -> str | None:
  """The checkpoint a trainer's run starts from: its `initial_model`, or the distillation's
  `initial_draft` (the same setting's first name); ValueError when both are set."""
  initial_draft = None if distillation is None else distillation.initial_draft
  if initial_draft is not None and initial_model is not None:
    raise ValueError(f"the run's starting point is set twice: initial_model {initial_model!r} "
                     f"and Distillation.initial_draft {initial_draft!r} (its older name)")
  return initial_model if initial_draft is None else initial_draft


def sample(config: network.T5Config, params: Any, encoder_input_tokens: jax.Array,
           rng: jax.Array, temperature: float, length: int) -> jax.Array:
  """Decodes [B, length] of the model (EOS included, 0 after) at `temperature` (0: greedy),
  through the core's temperature_sample loop."""
  decoder = core.Decoder.create("temperature_sample", network.Transformer(config),
                                temperature=temperature)
  batch = {"encoder_input_tokens": encoder_input_tokens,
           "decoder_input_tokens": jnp.zeros((encoder_input_tokens.shape[0], length), jnp.int32)}
  return decoder.predict(params, None, batch, data.EOS_ID, rng=rng)[0]


def with_targets(batch: Batch, decodes: jax.Array) -> Batch:
  """`batch` with `decodes` [B, L] as its targets: shifted right as decoder inputs, weighted up
  to and including each row's first EOS (all positions of a row without one)."""
  is_eos = decodes == data.EOS_ID
  after_eos = (jnp.cumsum(is_eos, axis=1) - is_eos) > 0
  targets = jnp.where(after_eos, data.PAD_ID, decodes).astype(jnp.int32)
  inputs = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))  # BOS = 0
  return {**batch, "decoder_input_tokens": inputs, "decoder_target_tokens": targets,
          "decoder_loss_weights": (~after_eos).astype(jnp.int32)}


def source_batch(data_source: str, draft_sample_fraction: float | None, batch: Batch, *,
                 decode_target: Callable[[Batch, bool], jax.Array],
                 decode_draft: Callable[[Batch], jax.Array]) -> Batch:
  """The batch the divergence is taken on for `data_source`: `batch` itself, or decodes of its
  inputs as its targets (`with_targets`). `decode_target(rows, greedy)` decodes the target on a
  batch's rows (greedy, or samples at the distillation temperature), `decode_draft(rows)` samples
  the draft at that temperature; each returns [rows, L] with L the batch's target length."""
  if data_source == "dataset":
    return batch
  if data_source in ("target_greedy", "target_sample"):
    return with_targets(batch, decode_target(batch, data_source == "target_greedy"))
  if data_source == "draft_sample":
    return with_targets(batch, decode_draft(batch))
  # 'mixture': the first rows (the trainers' rows are shuffled) are the draft's samples.
  rows = round(draft_sample_fraction * batch["decoder_target_tokens"].shape[0])
  head = {k: v[:rows] for k, v in batch.items()}
  sampled = with_targets(head, decode_draft(head))
  return {k: jnp.concatenate([sampled[k], jnp.asarray(v[rows:], sampled[k].dtype)])
          for k, v in batch.items()}


def training_batch(distillation: Distillation, target_config: network.NetworkConfig,
                   target_params: Any, draft_config: network.NetworkConfig, draft_params: Any,
                   batch: Batch, rng: jax.Array) -> Batch:
  """The batch the divergence is taken on: the trainer's, or decodes of its inputs."""
  length = batch["decoder_target_tokens"].shape[1]
  temperature = distillation.temperature
  return source_batch(
      distillation.data_source, distillation.draft_sample_fraction, batch,
      decode_target=lambda rows, greedy: sample(
          target_config, target_params, rows["encoder_input_tokens"], rng,
          0.0 if greedy else temperature, length),
      decode_draft=lambda rows: sample(
          draft_config, jax.lax.stop_gradient(draft_params), rows["encoder_input_tokens"], rng,
          temperature, length))


def _logits(config: network.NetworkConfig, params: Any, batch: Batch,
            dropout_rng: jax.Array | None = None) -> jax.Array:
  rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
  inputs, packing = data.network_inputs(batch)
  return network.module_of(config).apply({"params": params}, *inputs, **packing,
                                         enable_dropout=dropout_rng is not None, rngs=rngs)


def _sums(distillation: Distillation, target_logits: jax.Array, draft_logits: jax.Array,
          batch: Batch) -> dict[str, jax.Array]:
  return divergences.weighted_sums(distillation.divergence, target_logits, draft_logits,
                                   batch["decoder_loss_weights"],
                                   temperature=distillation.temperature,
                                   beta=distillation.jsd_beta)


@functools.partial(jax.jit, static_argnames=("distillation", "target_config", "draft_config",
                                             "dropout"), donate_argnums=(0,))
def train_step(state: train_state.TrainState, batch: Batch, rng: jax.Array, *,
               target_params: Any, distillation: Distillation, target_config: network.NetworkConfig,
               draft_config: network.NetworkConfig, dropout: bool
               ) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
  sample_rng, dropout_rng = jax.random.split(jax.random.fold_in(rng, state.step))
  batch = training_batch(distillation, target_config, target_params, draft_config, state.params,
                         batch, sample_rng)
  target_logits = jax.lax.stop_gradient(_logits(target_config, target_params, batch))

  def loss(params: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    draft_logits = _logits(draft_config, params, batch, dropout_rng if dropout else None)
    sums = _sums(distillation, target_logits, draft_logits, batch)
    return sums["divergence_sum"] / jnp.maximum(sums["num_tokens"], 1.0), sums

  (_, sums), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
  metrics = {"loss_sum": sums["divergence_sum"], "alpha_sum": sums["alpha_sum"],
             "num_tokens": sums["num_tokens"], "grad_norm": optax.tree.norm(grads)}
  return state.apply_gradients(grads=grads), metrics


@functools.partial(jax.jit, static_argnames=("distillation", "target_config", "draft_config"))
def _eval_step(target_params: Any, draft_params: Any, batch: Batch, *,
               distillation: Distillation, target_config: network.NetworkConfig,
               draft_config: network.NetworkConfig) -> dict[str, jax.Array]:
  target_logits = _logits(target_config, target_params, batch)
  draft_logits = _logits(draft_config, draft_params, batch)
  return {**_sums(distillation, target_logits, draft_logits, batch),
          **divergences.alpha_sums(target_logits, draft_logits, batch["decoder_loss_weights"])}


def eval_sums(distillation: Distillation, target_config: network.NetworkConfig, target_params: Any,
              draft_config: network.NetworkConfig, draft_params: Any,
              batches: Iterable[Batch]) -> dict[str, float]:
  """{'divergence_sum', 'alpha_sum', 'num_tokens', 'alpha_t0_sum', 'alpha_t1_sum'} over
  `batches` (their own targets): alpha at the distillation temperature, and at 0 and 1."""
  sums: dict[str, float] = {}
  for batch in batches:
    for k, v in _eval_step(target_params, draft_params, batch, distillation=distillation,
                           target_config=target_config, draft_config=draft_config).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  return sums


def for_trainer(distillation: Distillation, draft_config: network.NetworkConfig, *,
                z_loss: float, label_smoothing: float
                ) -> tuple[Callable[..., Any], Callable[[Any, Iterable[Batch]], dict[str, float]]]:
  """(step_fn, evaluate) of a trainer distilling a draft of `draft_config`: `step_fn(state,
  batch, rng)` is `train_step` on the frozen target (loaded once, here), `evaluate(params,
  batches)` the metrics of `eval_sums`: eval_<divergence>, eval_alpha (at the distillation
  temperature), eval_alpha_t0 and eval_alpha_t1. One-line ValueErrors (module docstring)
  before anything compiles."""
  if z_loss or label_smoothing:
    raise ValueError("z_loss and label_smoothing are cross-entropy's: they cannot take effect "
                     "with distillation")
  check_data_source(distillation.data_source, distillation.draft_sample_fraction,
                    decoder_only=network.is_decoder_only(draft_config))
  target_config, target_params = load_target(distillation, draft_config)
  step_fn = functools.partial(train_step, target_params=target_params, distillation=distillation,
                              target_config=target_config, draft_config=draft_config,
                              dropout=draft_config.dropout_rate > 0)

  def evaluate(params: Any, batches: Iterable[Batch]) -> dict[str, float]:
    sums = eval_sums(distillation, target_config, target_params, draft_config, params, batches)
    return {f"eval_{distillation.divergence}": sums["divergence_sum"] / sums["num_tokens"],
            "eval_alpha": sums["alpha_sum"] / sums["num_tokens"],
            "eval_alpha_t0": sums["alpha_t0_sum"] / sums["num_tokens"],
            "eval_alpha_t1": sums["alpha_t1_sum"] / sums["num_tokens"]}

  return step_fn, evaluate
