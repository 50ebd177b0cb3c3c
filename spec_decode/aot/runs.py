"""A run config read as `spec_decode.infer` reads it, for compiling only: the model (its
decoder and num_decodes), the decode layout on given devices, the checkpoint dtype and sizes;
no checkpoint, vocabulary or data is read (`read_run`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp

from spec_decode.aot import programs
from spec_decode.runtime import decode_layout
from spec_decode import models
from spec_decode import gin_utils
from spec_decode.t5 import network

# T5's EOS id, which every vocabulary of the project's configs has. The vocabulary is not read
# (it may be a gs:// file): a compiled program takes the id as a constant, whose value does not
# change the program's size or cost.
EOS_ID = 1


@dataclasses.dataclass(frozen=True)
class StandInVocabulary:
  """What the model reads of a vocabulary when it is only compiled: its size and EOS id."""
  vocab_size: int
  eos_id: int = EOS_ID


@dataclasses.dataclass(frozen=True)
class Run:
  """What a run config decodes, read without restoring anything."""
  model: models.EncoderDecoderModel
  layout: decode_layout.DecodeLayout
  checkpoint_dtype: Any
  batch_size: int
  input_length: int
  target_length: int
  row_name: str  # the last gin file's name: a Table 2 row's, for a configs/table2 row file

  @property
  def decode_length(self) -> int:
    """The decoder's positions: the targets', or a language model's prompt and continuation."""
    return network.decode_length(self.layout.target, self.input_length, self.target_length)


def _resolved(value: Any) -> Any:
  """A bound value with gin's macro references evaluated."""
  if isinstance(value, gin.config.ConfigurableReference):
    return value.scoped_configurable_fn()
  return value


def _bound(selector: str, default: Any = None) -> Any:
  try:
    return _resolved(gin.query_parameter(selector))
  except ValueError:  # not bound
    return default


def read_run(args: argparse.Namespace, bindings: Sequence[str],
             devices: Sequence[jax.Device]) -> Run:
  """The model, layout and sizes of `spec_decode.infer`'s run of this config on `devices`."""
  config = gin_utils.read_run_config(args.gin_file, bindings, args.draft_gin_file)
  model_reference = gin.query_parameter("%MODEL")
  # Bound over the config's own (gin evaluates every binding of a call, so passing these as
  # arguments would still read the config's vocabulary and draft checkpoint).
  stand_in = StandInVocabulary(config.target.vocab_size)
  vocabularies = (("vocabulary",) if network.is_decoder_only(config.target)
                  else ("input_vocabulary", "output_vocabulary"))
  overrides: dict[str, Any] = {name: stand_in for name in vocabularies}
  if issubclass(model_reference.configurable.wrapped, (models.SpeculativeEncoderDecoderModel,
                                                       models.SpeculativeDecoderOnlyModel)):
    overrides["draft_checkpoint_path"] = None  # the draft's config is `config.draft`
    if config.draft is not None:
      overrides["draft_module"] = network.module_of(
          dataclasses.replace(config.draft, dtype=config.target.dtype))
  for name, value in overrides.items():
    gin.bind_parameter(f"{model_reference.configurable.selector}.{name}", value)
  model = model_reference.scoped_configurable_fn()
  partitioner_reference = gin.query_parameter("infer.infer.partitioner")
  partitioner_overrides: dict[str, Any] = {"devices": devices}
  if args.num_partitions is not None:
    partitioner_overrides.update(num_partitions=args.num_partitions, mesh_shape=None)
  partitioner = partitioner_reference.scoped_configurable_fn(**partitioner_overrides)
  draft_module = model.draft_module if model.is_speculative else None
  layout = decode_layout.decode_layout(
      partitioner, model.module.config, None if draft_module is None else draft_module.config)
  sizes = {"batch size": args.batch_size or config.batch_size,
           "input length": args.input_length or config.input_length,
           "target length": args.target_length or config.target_length}
  for name, value in sizes.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive integer (set it in the config or by its "
                       f"flag), got {value!r}")
  data = layout.mesh.shape["data"]
  if sizes["batch size"] % data:
    raise ValueError(f"batch size {sizes['batch size']} is not a multiple of the mesh's 'data' "
                     f"axis ({dict(layout.mesh.shape)}): give --num_partitions or a topology "
                     "of fewer chips")
  dtype = _bound("infer.infer.checkpoint_dtype")
  row = os.path.splitext(os.path.basename(args.gin_file[-1]))[0]
  return Run(model, layout, None if dtype is None else jnp.dtype(dtype), sizes["batch size"],
             sizes["input length"], sizes["target length"],
             row)


def decode_program(run: Run, progress: Callable[[str], None] = lambda _: None
                   ) -> programs.Program | str:
  """The run's decode compiled (`programs.predict_program`), or in one line XLA:TPU's refusal
  to compile a decode whose temporaries the chip's HBM cannot hold (RESOURCE_EXHAUSTED): a
  batch that does not fit."""
  try:
    return programs.predict_program(
        run.layout, run.model.decoder, eos_id=EOS_ID, num_decodes=run.model.num_decodes,
        batch_size=run.batch_size, input_length=run.input_length,
        target_length=run.target_length, param_dtype=run.checkpoint_dtype, progress=progress)
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return gin_utils.first_line(e)
