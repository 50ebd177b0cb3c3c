"""The run `python -m spec_decode.infer` makes (`infer`, bound by the configs), in the order the
package's docstring gives, and `decode_all`: one decoder over every batch, committed in chunks.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import gin
import jax
import numpy as np

from spec_decode import core
from spec_decode import models
from spec_decode import plan
from spec_decode.engine import stats
from spec_decode.gin_utils import UsageError
from spec_decode.infer import chunks
from spec_decode.infer import inputs
from spec_decode.infer import outputs
from spec_decode.infer import stop_signals
from spec_decode.infer import timing
from spec_decode.runtime import call_costs
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode.t5 import network


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  """Where a decode commits its outputs (`chunks`), every how many batches, and the
  signals that stop it between batches."""
  store: chunks.ChunkStore
  period: int
  stop: stop_signals.StopRequest


def _batch_arguments(params: Any, draft_params: Any,
                     batches: Sequence[tuple[dict[str, np.ndarray], int]], seed: int,
                     layout: decode_layout.DecodeLayout) -> Callable[[int], tuple[Any, ...]]:
  """i -> the compiled predict's arguments for batch i, placed on `layout`."""
  return lambda i: (params, draft_params, layout.put_batch(batches[i][0]),
                    layout.put_replicated(jax.random.fold_in(jax.random.PRNGKey(seed), i)))


def decode_all(decoder: core.Decoder, eos_id: int, params: Any, draft_params: Any, *,
               batches: Sequence[tuple[dict[str, np.ndarray], int]], seed: int,
               layout: decode_layout.DecodeLayout,
               progress: Callable[[str, int, int], None] = lambda *_: None,
               checkpointing: Checkpointing | None = None, name: str = "decoder",
               num_decodes: int = 1, timed_calls: dict[str, Any] | None = None
               ) -> outputs.DecodeRun:
  """Compiles `decoder.predict` (`num_decodes` per input, the best kept) once on `layout`
  (`DecodeLayout.partition_predict`) and runs it over `batches`; `params`/`draft_params` as `layout.restore` placed them. Batch i is decoded
  with the rng fold_in(PRNGKey(seed), i), whatever batch a run starts at.

  With `checkpointing`, the batches `name` already committed are read instead of decoded, the
  new ones are committed every `period` batches (and not kept in memory: the outputs returned
  are the committed chunks, read back), and a stop request (SIGTERM/SIGINT) ends the loop after
  the batch in flight: its batches are committed, then `stop_signals.Stopped`.
  `progress(stage, batches done, batches)` is called when compiling starts and after each batch.
  `timed_calls`, where given, gets `name`: (the compiled predict, its arguments by batch) for
  `timing.side_by_side`, compiled here if no batch was left to decode."""
  run = outputs.DecodeRun([], [], 0.0, 0.0)  # without checkpointing: kept in memory
  first, writer = 0, None
  if checkpointing is not None:
    first = checkpointing.store.committed_batches(name)
    writer = chunks.ChunkWriter(checkpointing.store, name, checkpointing.period, first)
    if first:
      print(f"{name}: {first} of {outputs.count(len(batches), 'batch')} committed by an "
            f"earlier run, resuming after them", flush=True)
  compiled, arguments = None, _batch_arguments(params, draft_params, batches, seed, layout)

  def compile_for(args: tuple[Any, ...]) -> Any:
    start = time.perf_counter()
    executable = layout.partition_predict(decoder, eos_id, num_decodes).lower(*args).compile()
    run.compile_seconds = time.perf_counter() - start
    # One untimed call: the first execution of an executable pays one-off costs.
    jax.block_until_ready(executable(*args))
    return executable

  for i in range(first, len(batches)):
    if checkpointing is not None and checkpointing.stop.requested():
      break
    num_real = batches[i][1]
    args = arguments(i)
    if compiled is None:
      progress("compiling", i, len(batches))
      compiled = compile_for(args)
    start = time.perf_counter()
    batch_outputs = jax.block_until_ready(compiled(*args))
    seconds = time.perf_counter() - start
    progress("decoding", i + 1, len(batches))
    batch_decodes, batch_aux = decode_layout.gather(batch_outputs)
    decodes = [batch_decodes[row] for row in range(num_real)]
    aux = [{key: value[row].tolist() for key, value in batch_aux.items()}
           for row in range(num_real)]
    if writer is None:
      run.decodes += decodes
      run.aux += aux
      run.seconds += seconds
    else:
      writer.add(i, decodes, aux, seconds, compile_seconds=run.compile_seconds)
      run.compile_seconds = 0.0  # counted once, in the chunk of the batch that compiled
  if writer is not None:
    writer.flush()
    if writer.first < len(batches) and checkpointing.stop.requested():
      raise stop_signals.Stopped(
          checkpointing.stop.signum,
          f"stopped by {checkpointing.stop.name} after {writer.first} of "
          f"{outputs.count(len(batches), 'batch')} of the {name} (committed in "
          f"{checkpointing.store.directory}); rerun the same command to resume")
  if timed_calls is not None:
    timed_calls[name] = (compiled or compile_for(arguments(0)), arguments)
  # The committed chunks are the outputs: memory stays flat while decoding, and a resumed run's
  # outputs are read exactly as an uninterrupted run's are.
  return run if writer is None else checkpointing.store.read(name)


def _check_batch_size(layout: decode_layout.DecodeLayout, batch_size: int) -> None:
  data = layout.mesh.shape["data"]
  if batch_size % data:
    lower, upper = batch_size // data * data, (batch_size // data + 1) * data
    nearest = f"{lower} or {upper}" if lower else f"{upper}"
    raise UsageError(f"BATCH_SIZE={batch_size} is not a multiple of the mesh's 'data' axis "
                     f"({dict(layout.mesh.shape)}, num_partitions={layout.mesh.shape['model']}):"
                     f" use {nearest}")


def infer(model: models.BaseTransformerModel = gin.REQUIRED,
          dataset_cfg: inputs.DatasetConfig = gin.REQUIRED, checkpoint_path: str = gin.REQUIRED,
          output_dir: str = gin.REQUIRED, compare_with_baseline: bool = False,
          partitioner: Any = None, seed: int = 0, num_printed: int = 10,
          checkpoint_dtype: str | None = None,
          device_memory_gib: float | None = None, checkpoint_period: int = 100,
          timing_rounds: int = 0, restart: bool = False) -> dict[str, Any] | None:
  """Runs inference as described in the module docstring; returns the summary.

  `checkpoint_dtype`: both models' parameters are cast to it on restore (T5X's infer restores
  in 'bfloat16', the hook's draft too); None keeps the checkpoints' dtypes. `device_memory_gib`: the per-device
  memory budget the run's plan must fit (None: the device's own memory where its runtime
  reports it, else unchecked). `checkpoint_period`: batches per committed chunk
  (`chunks`); `timing_rounds` > 0 (with `compare_with_baseline`): the speedup is also
  measured side by side, that many interleaved rounds (`timing`); `restart`: start over
  in an output dir that holds another run's chunks. Returns the summary on process 0, None on
  the others.
  """
  if not isinstance(model, models.BaseTransformerModel):
    raise UsageError("MODEL must be a models.EncoderDecoderModel or models.DecoderOnlyModel, got "
                     f"{type(model).__name__}")
  if compare_with_baseline and not model.is_speculative:
    raise UsageError("COMPARE_WITH_BASELINE needs a decode loop with a draft (DECODE_LOOP, "
                     "e.g. 'speculative_sample')")
  if isinstance(checkpoint_period, bool) or not isinstance(checkpoint_period, int) or (
      checkpoint_period < 1):
    raise UsageError(f"CHECKPOINT_PERIOD must be an integer >= 1, got {checkpoint_period!r}")
  if isinstance(timing_rounds, bool) or not isinstance(timing_rounds, int) or timing_rounds < 0:
    raise UsageError(f"TIMING_ROUNDS must be an integer >= 0, got {timing_rounds!r}")
  if timing_rounds and not compare_with_baseline:
    raise UsageError("TIMING_ROUNDS times the decoder beside the baseline: it needs "
                     "COMPARE_WITH_BASELINE = True")
  outputs.check_output_dir(output_dir)
  start = time.perf_counter()
  examples = inputs.read_examples(dataset_cfg, model)
  input_length, target_length = inputs.feature_lengths(dataset_cfg)
  # A language model decodes its prompt and the continuation in one buffer.
  decode_length = network.decode_length(model.module, input_length, target_length)
  decoder_only = network.is_decoder_only(model.module)
  source = dataset_cfg.mixture_or_task_name or dataset_cfg.input_file or "--text"
  store = chunks.ChunkStore.open(output_dir, _run_identity(
      model, dataset_cfg, source=source, examples=examples, checkpoint_path=checkpoint_path,
      checkpoint_dtype=checkpoint_dtype, seed=seed,
      compare_with_baseline=compare_with_baseline), restart)
  if partitioner is None:  # one device, the same path
    partitioner = partitioning.PjitPartitioner(mesh_shape=(1, 1))
  draft_module = model.draft_module if model.is_speculative else None  # None: a lookup, n-gram
  layout = decode_layout.decode_layout(
      partitioner, model.module.config, None if draft_module is None else draft_module.config)
  _check_batch_size(layout, dataset_cfg.batch_size)
  # Every decode of an input (a beam) has its own caches.
  plan.check_fits(layout, dataset_cfg.batch_size * model.num_decodes, input_length,
                  decode_length, checkpoint_dtype, device_memory_gib)
  # Straight into their shards, once: the baseline run reuses the same arrays.
  params = layout.restore("target", model.module, checkpoint_path, checkpoint_dtype)
  draft_params = None
  if draft_module is not None:
    draft_params = layout.restore("draft", draft_module, model.draft_checkpoint,
                                  checkpoint_dtype)
  elif model.is_speculative and model.decoder.takes_draft_params:  # an n-gram draft's tables
    draft_params = layout.put_replicated(model.draft_params)
  batches = inputs.make_batches(examples, dataset_cfg.batch_size, input_length, target_length,
                                decoder_only)
  print(f"{outputs.count(len(examples), 'example')} in "
        f"{outputs.count(len(batches), 'batch')} of {dataset_cfg.batch_size}")

  name = (f"speculative decoder (target + {model.decoder.draft_description})"
          if model.is_speculative else "target")
  eos_id = model.output_vocabulary.eos_id
  stop = stop_signals.StopRequest()
  with stop.handling():
    checkpointing = Checkpointing(store, checkpoint_period, stop)
    timed_calls = {} if timing_rounds else None
    shared = dict(batches=batches, seed=seed, layout=layout, checkpointing=checkpointing,
                  num_decodes=model.num_decodes, timed_calls=timed_calls)
    run = decode_all(model.decoder, eos_id, params, draft_params,
                     progress=outputs.progress(name), name="decoder", **shared)
    baseline = costs = side_by_side = None
    if compare_with_baseline:
      baseline = decode_all(model.decoder.baseline(), eos_id, params, None,
                            progress=outputs.progress("baseline (target alone)"),
                            name="baseline", **shared)
    if timed_calls:
      print(f"timing both side by side: {outputs.count(timing_rounds, 'round')}")
      side_by_side = timing.side_by_side(timed_calls, len(batches), timing_rounds,
                                               stop.requested)
      if side_by_side is None:
        raise stop_signals.Stopped(
            stop.signum, f"stopped by {stop.name} while timing side by side (every output is "
            f"committed in {store.directory}); rerun the same command to finish")
    # Theorem 3.8 is speculative sampling's; a lookup's calls cost ~nothing.
    if (baseline is not None and draft_module is not None
        and model.decoder.loop.stats is stats.SpeculativeStats):
      print("measuring one target call of 1 and of gamma + 1 tokens, and one draft call")
      costs = call_costs.verification_costs(
          (model.module, params), (model.draft_module, draft_params),
          model.decode_settings["gamma"], dataset_cfg.batch_size, input_length, decode_length)
  if jax.process_index() != 0:  # process 0 alone holds the committed outputs
    return None
  summary, records = outputs.summarize(
      model, source, dataset_cfg, examples, run=run, baseline=baseline, costs=costs,
      eos_id=model.output_vocabulary.eos_id, side_by_side=side_by_side,
      timing_rounds=timing_rounds)
  summary["run_seconds"] = time.perf_counter() - start  # this run's inputs, restore, decode
  out = outputs.write(output_dir, summary, records)
  store.finish()
  outputs.print_report(summary, records, num_printed, out)
  return summary


def _run_identity(model: models.BaseTransformerModel, cfg: inputs.DatasetConfig, *, source: str,
                  examples: Sequence[inputs.Example], checkpoint_path: str,
                  checkpoint_dtype: str | None, seed: int, compare_with_baseline: bool
                  ) -> dict[str, Any]:
  """What fixes a run's outputs, compared by `chunks.ChunkStore` when a run resumes."""
  speculative = model.is_speculative
  return {
      "target": dataclasses.asdict(model.module.config), "checkpoint_path": checkpoint_path,
      "checkpoint_dtype": checkpoint_dtype,
      "draft": model.decoder.draft_description if speculative else None,
      "draft_checkpoint_path": getattr(model, "draft_checkpoint_path", None),
      "decode_loop": model.decoder.loop_name, "decode_settings": model.decode_settings,
      "num_decodes": model.num_decodes,
      "compare_with_baseline": compare_with_baseline, "seed": seed,
      "batch_size": cfg.batch_size, "task_feature_lengths": dict(cfg.task_feature_lengths),
      "source": source, "split": cfg.split if cfg.mixture_or_task_name else None,
      "num_examples": len(examples), "inputs": chunks.inputs_digest(examples)}


