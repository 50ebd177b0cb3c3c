"""A minimal T5X-style trainer for `network.Transformer` on parallel text; its loop (`fit`) and
command line (`cli`) also drive `spec_decode.training.lm`, the decoder-only language models'.

Run: `python -m spec_decode.training.train --gin_file=configs/train/<x>.gin --model_dir=out/<x>
     [--gin.train.train.num_train_steps=100 ...]`.

What it does (all knobs are arguments of the gin-configurable `train`):
- teacher forcing on seqio-named batches from `spec_decode.training.data`; cross-entropy on
  `decoder_target_tokens` with T5X's optional z-loss and label smoothing (both off by default),
  summed over tokens and divided by the number of target tokens (sum of `decoder_loss_weights`);
- an optax optimizer built by gin (e.g. `@optax.adafactor()` or `@optax.adamw()`), with optional
  global-norm clipping; compute dtype is `network.T5Config.dtype` (params stay float32);
- every `eval_every` steps: eval loss on the eval corpus and sacrebleu BLEU of greedy decodes;
- checkpoints in `model_dir`: `checkpoint_<step>.msgpack` (the project format: flax-serialized
  {step, params, opt_state}) and, via `spec_decode.checkpoints.t5x_format.save_t5x`, T5X's
  legacy layout in `model_dir/t5x/checkpoint_<step>` (`t5x_checkpoints`); the last `keep_checkpoints` are kept;
- a progress line every `log_every` steps: loss, z-loss, accuracy, gradient norm, target tokens/s;
- `initial_model` (a demo model name, a `.safetensors` path in
  `spec_decode.checkpoints.demo_pair`'s format or a T5X checkpoint, of `config`): the parameters
  a new run starts from, with a fresh optimizer (fine-tuning, continued training, a draft's
  distillation); None: `init_params` of `seed`;
- resume: a run restarts from the newest `checkpoint_<step>.msgpack` in `model_dir`. The data
  batch and the dropout rng of step s are pure functions of (seed, s), so a resumed run is
  bitwise identical to an uninterrupted one;
- with `distillation` (a `draft_distillation.Distillation`), white-box distillation of a draft
  on a frozen target instead of cross-entropy: the loss is the divergence between the target's
  and the draft's token distributions on the configured data (the task's targets, the target's
  or the draft's own decodes), logged with alpha and evaluated with alpha at its temperature and
  at T=0 and T=1 (configs/train/draft_whitebox.gin).
"""
from __future__ import annotations

import argparse
import importlib
import functools
import pathlib
import re
import shutil
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import flax.serialization
from flax.training import train_state
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import sentencepiece as spm

from spec_decode.checkpoints import formats
from spec_decode.data import corpora
from spec_decode import gin_utils
from spec_decode import models
from spec_decode import paths
from spec_decode.training import bleu
from spec_decode.training import data
from spec_decode.training import draft_distillation
from spec_decode.training import greedy
from spec_decode.t5 import network


Batch = dict[str, np.ndarray]
StepFn = Callable[[train_state.TrainState, Batch, jax.Array], tuple[train_state.TrainState, dict]]
_CHECKPOINT = re.compile(r"checkpoint_(\d+)\.msgpack$")
# The per-token means of the progress line, after the loss, where the step reports their sums:
# (sum's name, label, format).
_LOGGED_MEANS = (("z_loss_sum", "z_loss", ".2e"), ("correct_sum", "acc", ".3f"),
                 ("alpha_sum", "alpha", ".3f"))


def loss_and_metrics(params: Any, apply_fn: Callable[..., jax.Array], batch: Batch,
                     dropout_rng: jax.Array | None, z_loss: float,
                     label_smoothing: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean per-target-token loss of one batch, plus summed metrics for logging.

  A batch with `encoder_input_tokens` feeds an encoder-decoder; one without, a decoder-only
  language model, whose packed rows also carry `decoder_segment_ids` and `decoder_positions`.
  """
  rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
  inputs, packing = data.network_inputs(batch)
  logits = apply_fn({"params": params}, *inputs, **packing,
                    enable_dropout=dropout_rng is not None, rngs=rngs)
  token_loss, z_term = models.cross_entropy_with_logits(
      logits.astype(jnp.float32), batch["decoder_target_tokens"], z_loss, label_smoothing)
  weights = batch["decoder_loss_weights"].astype(jnp.float32)
  num_tokens = jnp.maximum(jnp.sum(weights), 1.0)
  correct = jnp.argmax(logits, axis=-1) == batch["decoder_target_tokens"]
  metrics = {
      "loss_sum": jnp.sum(token_loss * weights),
      "z_loss_sum": jnp.sum(z_term * weights),
      "correct_sum": jnp.sum(correct * weights),
      "num_tokens": jnp.sum(weights),
  }
  return jnp.sum(token_loss * weights) / num_tokens, metrics


@functools.partial(jax.jit, static_argnames=("z_loss", "label_smoothing", "dropout"),
                   donate_argnums=(0,))
def train_step(state: train_state.TrainState, batch: Batch, rng: jax.Array, z_loss: float,
               label_smoothing: float, dropout: bool) -> tuple[train_state.TrainState, dict]:
  # The dropout rng of step s is fold_in(rng, s): nothing but the step is needed to resume.
  dropout_rng = jax.random.fold_in(rng, state.step) if dropout else None
  grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, state.apply_fn, batch, dropout_rng, z_loss,
                                label_smoothing)
  metrics["grad_norm"] = optax.tree.norm(grads)
  return state.apply_gradients(grads=grads), metrics


@functools.partial(jax.jit, static_argnames=("apply_fn",))
def eval_step(params: Any, apply_fn: Callable[..., jax.Array], batch: Batch) -> dict:
  return loss_and_metrics(params, apply_fn, batch, None, 0.0, 0.0)[1]


def eval_sums(params: Any, apply_fn: Callable[..., jax.Array],
              batches: Iterable[Batch]) -> dict[str, float]:
  """`loss_and_metrics`'s sums over `batches` (no dropout, no z-loss)."""
  sums: dict[str, float] = {}
  for batch in batches:
    for k, v in eval_step(params, apply_fn, batch).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  return sums


@functools.partial(jax.jit, static_argnames=("config",))
def init_params(config: network.NetworkConfig, rng: jax.Array) -> Any:
  """Fresh parameters of the network of `config` (encoder-decoder or decoder-only)."""
  dummy = jnp.ones((1, 8), jnp.int32)
  inputs = (dummy,) * (2 if network.is_decoder_only(config) else 3)
  return network.module_of(config).init(rng, *inputs)["params"]


def create_state(config: network.NetworkConfig, optimizer: optax.GradientTransformation,
                 clip_grad_norm: float | None, seed: int,
                 params: Any = None) -> train_state.TrainState:
  """A fresh train state: `params` (default: `init_params` of `seed`), the optimizer's init."""
  model = network.module_of(config)
  if params is None:
    params = init_params(config, jax.random.PRNGKey(seed))
  if clip_grad_norm:
    optimizer = optax.chain(optax.clip_by_global_norm(clip_grad_norm), optimizer)
  return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optimizer)


def initial_state_params(name_or_path: str | None, config: network.NetworkConfig) -> Any:
  """The parameters (on the device) of `initial_model` (any checkpoint `formats.load_model`
  reads), which must be of `config`'s architecture (its dropout and precision may differ: a
  continued run may add dropout); None for None (a fresh initialization)."""
  if name_or_path is None:
    return None
  initial_config, params = formats.load_model(name_or_path, like=config)
  formats.check_same_architecture(config, initial_config, f"the initial model {name_or_path}")
  return jax.device_put(params)


def latest_checkpoint(model_dir: pathlib.Path) -> pathlib.Path | None:
  found = [(int(m.group(1)), p) for p in model_dir.glob("checkpoint_*.msgpack")
           if (m := _CHECKPOINT.search(p.name))]
  return max(found)[1] if found else None


def save_checkpoint(state: train_state.TrainState, model_dir: pathlib.Path, keep: int,
                    t5x_layout: bool) -> pathlib.Path:
  """Writes the project checkpoint atomically (tmp + rename), then the T5X layout."""
  step = int(state.step)
  path = model_dir / f"checkpoint_{step}.msgpack"
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(flax.serialization.to_bytes(
      {"step": state.step, "params": state.params, "opt_state": state.opt_state}))
  tmp.rename(path)
  old = sorted((int(_CHECKPOINT.search(p.name).group(1)), p)
               for p in model_dir.glob("checkpoint_*.msgpack"))
  for stale_step, stale in old[:-keep]:
    stale.unlink()
    shutil.rmtree(model_dir / "t5x" / f"checkpoint_{stale_step}", ignore_errors=True)
  if t5x_layout:
    # Imported here so that runs without T5X-layout output do not depend on that module.
    from spec_decode.checkpoints import t5x_format  # pylint: disable=g-import-not-at-top
    t5x_format.save_t5x(jax.device_get(state.params), str(model_dir / "t5x"), step)
  return path


def restore_checkpoint(state: train_state.TrainState, path: pathlib.Path) -> train_state.TrainState:
  template = {"step": state.step, "params": state.params, "opt_state": state.opt_state}
  restored = flax.serialization.from_bytes(template, path.read_bytes())
  return state.replace(step=jnp.asarray(restored["step"]), params=restored["params"],
                       opt_state=restored["opt_state"])


def fit(state: train_state.TrainState, stream: Any, model_dir: pathlib.Path,
        evaluate: Callable[[Any], dict[str, float]] | None, *, start_time: float,
        num_train_steps: int, max_wall_time_s: float | None, z_loss: float,
        label_smoothing: float, dropout: bool, eval_every: int | None, checkpoint_every: int,
        keep_checkpoints: int, t5x_checkpoints: bool, log_every: int,
        seed: int, step_fn: StepFn | None = None) -> dict[str, float]:
  """The training loop shared by every network: resumes from the newest checkpoint in
  `model_dir`, then steps through `stream.iterate(step)` (batches as `loss_and_metrics` reads
  them), logging, checkpointing and calling `evaluate(params)` as the module docstring says.
  `step_fn(state, batch, rng)` is the step (default: `train_step`'s cross-entropy); its metrics
  are sums like `loss_and_metrics`'s. Returns the last evaluation's metrics (`{}` without
  `evaluate` or `eval_every`)."""
  if step_fn is None:
    step_fn = functools.partial(train_step, z_loss=z_loss, label_smoothing=label_smoothing,
                                dropout=dropout)
  num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  print(f"model: {num_params:,} params", flush=True)
  if (checkpoint := latest_checkpoint(model_dir)) is not None:
    state = restore_checkpoint(state, checkpoint)
    print(f"resumed from {checkpoint} at step {int(state.step)}", flush=True)
  rng = jax.random.PRNGKey(seed)
  eval_every = eval_every if evaluate is not None else None

  def run_eval(step: int) -> dict[str, float]:
    metrics = evaluate(state.params)
    print(f"eval step {step} " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
          flush=True)
    return metrics

  step = int(state.step)
  window: dict[str, float] = {}
  window_start = time.time()
  metrics: dict[str, float] = {}
  for batch in stream.iterate(step):
    if step >= num_train_steps:
      break
    if max_wall_time_s is not None and time.time() - start_time > max_wall_time_s:
      print(f"wall-time budget of {max_wall_time_s:.0f}s reached at step {step}", flush=True)
      break
    state, step_metrics = step_fn(state, batch, rng)
    step += 1
    for k, v in step_metrics.items():
      window[k] = window.get(k, 0.0) + float(v)
    window["steps"] = window.get("steps", 0.0) + 1
    if step % log_every == 0:
      elapsed = time.time() - window_start
      means = "".join(f"{label} {window[key] / window['num_tokens']:{spec}} "
                      for key, label, spec in _LOGGED_MEANS if key in window)
      print(f"step {step} loss {window['loss_sum'] / window['num_tokens']:.4f} {means}"
            f"grad_norm {window['grad_norm'] / window['steps']:.3f} "
            f"tokens/s {window['num_tokens'] / elapsed:.0f} "
            f"s/step {elapsed / window['steps']:.2f} "
            f"elapsed {time.time() - start_time:.0f}s", flush=True)
      window, window_start = {}, time.time()
    if step % checkpoint_every == 0:
      save_checkpoint(state, model_dir, keep_checkpoints, t5x_checkpoints)
    if eval_every and step % eval_every == 0:
      metrics = run_eval(step)
      window_start = time.time()  # evaluation time is not training throughput

  if step % checkpoint_every:
    save_checkpoint(state, model_dir, keep_checkpoints, t5x_checkpoints)
  if eval_every and step % eval_every:
    metrics = run_eval(step)
  print(f"done at step {step} after {time.time() - start_time:.0f}s", flush=True)
  return metrics


def train(model_dir: str,
          config: network.T5Config = gin.REQUIRED,
          optimizer: optax.GradientTransformation = gin.REQUIRED,
          vocab_path: str = gin.REQUIRED,
          train_corpora: Sequence[str] = gin.REQUIRED,
          eval_corpus: str = gin.REQUIRED,
          data_root: str | None = None,
          max_input_len: int = 64,
          max_target_len: int = 64,
          tokens_per_batch: int = 4096,
          bucket_boundaries: Sequence[int] = (16, 32, 48, 64),
          num_train_steps: int = 1000,
          max_wall_time_s: float | None = None,
          clip_grad_norm: float | None = 1.0,
          z_loss: float = 0.0,
          label_smoothing: float = 0.0,
          eval_every: int | None = 500,
          bleu_examples: int = 200,
          eval_batch_size: int = 64,
          checkpoint_every: int = 500,
          keep_checkpoints: int = 2,
          t5x_checkpoints: bool = True,
          log_every: int = 20,
          seed: int = 0,
          initial_model: str | None = None,
          distillation: draft_distillation.Distillation | None = None) -> dict[str, float]:
  """Trains until `num_train_steps` (or the wall-time budget); returns the last eval metrics.

  `eval_every=None` disables evaluation (then `{}` is returned). With `distillation` the model
  trained is a draft distilled on the frozen target it names (module docstring); evaluation
  then reports the divergence and alpha against that target instead of the loss and accuracy.
  """
  start_time = time.time()
  # What the run starts from and distills on is read first: a bad path fails in one line
  # before anything is written.
  step_fn, distilled_metrics = None, None
  if distillation is not None:
    step_fn, distilled_metrics = draft_distillation.for_trainer(
        distillation, config, z_loss=z_loss, label_smoothing=label_smoothing)
  initial_params = initial_state_params(
      draft_distillation.start_from(distillation, initial_model), config)
  out = pathlib.Path(model_dir)
  out.mkdir(parents=True, exist_ok=True)
  sp = spm.SentencePieceProcessor(model_file=str(paths.resolve(vocab_path)))
  if sp.vocab_size() > config.vocab_size:
    raise ValueError(f"vocabulary has {sp.vocab_size()} ids > config.vocab_size")

  sources, targets = corpora.read_parallel(train_corpora, data_root=data_root)
  stream = data.BatchStream(
      data.encode_pairs(sp, sources, targets, max_input_len, max_target_len),
      tokens_per_batch=tokens_per_batch, boundaries=bucket_boundaries, seed=seed)
  eval_sources, eval_targets = corpora.read_parallel([eval_corpus], data_root=data_root)
  eval_encoded = data.encode_pairs(sp, eval_sources, eval_targets, max_input_len, max_target_len)
  print(f"train pairs {len(stream.encoded.inputs)} in {stream.batches_per_epoch} batches/epoch; "
        f"eval pairs {len(eval_encoded.inputs)}", flush=True)
  state = create_state(config, optimizer, clip_grad_norm, seed, params=initial_params)

  def evaluate(params: Any) -> dict[str, float]:
    batches = data.eval_batches(eval_encoded, eval_batch_size, max_input_len, max_target_len)
    if distilled_metrics is None:
      sums = eval_sums(params, state.apply_fn, batches)
      metrics = {"eval_loss": sums["loss_sum"] / sums["num_tokens"],
                 "eval_accuracy": sums["correct_sum"] / sums["num_tokens"]}
    else:
      metrics = distilled_metrics(params, batches)
    hyps = greedy.translate(config, params, sp, eval_sources[:bleu_examples],
                            max_input_len, max_target_len, eval_batch_size)
    return {**metrics, "eval_bleu": bleu.corpus_bleu(hyps, eval_targets[:bleu_examples])}

  return fit(state, stream, out, evaluate, start_time=start_time,
             num_train_steps=num_train_steps, max_wall_time_s=max_wall_time_s, z_loss=z_loss,
             label_smoothing=label_smoothing, dropout=config.dropout_rate > 0,
             eval_every=eval_every, checkpoint_every=checkpoint_every,
             keep_checkpoints=keep_checkpoints, t5x_checkpoints=t5x_checkpoints,
             log_every=log_every, seed=seed, step_fn=step_fn)


def cli(module: str, function: str, doc: str, argv: Sequence[str] | None) -> int:
  """`python -m <module> --gin_file=... --model_dir=...`: parses the gin files and bindings, then
  calls the gin-configured `<module>.<function>(model_dir)` (a trainer of this package)."""
  parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n")[0])
  gin_utils.add_gin_arguments(parser)
  parser.add_argument("--model_dir", required=True, help="checkpoint/output directory")
  args, bindings = gin_utils.parse_args(parser, sys.argv[1:] if argv is None else argv)

  def run() -> None:
    gin_utils.parse_config(args.gin_file, bindings, args.gin_search_paths)
    # The configs import the module by name, not __main__ (python -m): call that one.
    train_fn = getattr(importlib.import_module(module), function)
    gin_utils.check_bindings_take_effect([train_fn])
    try:
      gin.get_configurable(train_fn)(args.model_dir)
    except FileNotFoundError as e:  # a corpus or vocabulary the config names
      raise gin_utils.UsageError(gin_utils.first_line(e)) from None

  return gin_utils.run(module, run)


def main(argv: Sequence[str] | None = None) -> int:
  return cli("spec_decode.training.train", "train", __doc__, argv)


if __name__ == "__main__":
  sys.exit(main())
