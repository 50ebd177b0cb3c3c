"""`python -m spec_decode.infer`'s command line: flags to gin bindings, the run, exit status."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

import gin

from spec_decode import gin_utils
from spec_decode.gin_utils import UsageError
from spec_decode.infer import inputs
from spec_decode.infer import run
from spec_decode.infer import stop_signals
from spec_decode.infer import timing

DEFAULT_GIN_FILE = "configs/demo/infer.gin"


def _task_directory_bindings(args: argparse.Namespace) -> list[str]:
  """--data_dir and --tfds_data_dir as the bindings of `spec_decode.data.tasks` they stand for:
  one gin text, since gin parses each binding on its own and the import must precede them
  (a config need not import the tasks itself)."""
  bindings = [f"tasks.{name}.path = {value!r}" for name, value in (
      ("data_dir", args.data_dir), ("tfds_data_dir", args.tfds_data_dir)) if value is not None]
  if not bindings:
    return []
  return ["\n".join(["from __gin__ import dynamic_registration",
                     "from spec_decode.data import tasks", *bindings])]


def _task_settings() -> list[Callable[..., Any]]:
  """The `spec_decode.data.tasks` functions whose bindings the config's task reads (none without a
  task): they take effect although `infer` reaches them through no gin reference."""
  cfg = gin_utils.configured(inputs.DatasetConfig)()
  if cfg.mixture_or_task_name is None:
    return []
  # Only a task imports TensorFlow.
  from spec_decode.data import tasks  # pylint: disable=g-import-not-at-top
  return tasks.settings_read_by(cfg.mixture_or_task_name)


def _run(args: argparse.Namespace, bindings: list[str]) -> int:
  if args.text is not None and args.input_file is not None:
    raise UsageError("give --text or --input_file, not both")
  gin_utils.initialize_distributed(args)
  command_line_settings = timing.after_the_command_line(bindings)
  # The flags replace the config's input source, so they come after every other binding.
  if args.text is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.input_file = None",
                 f"infer.DatasetConfig.texts = {args.text!r}"]
  if args.input_file is not None:
    bindings += ["MIXTURE_OR_TASK_NAME = None", "infer.DatasetConfig.texts = None",
                 f"infer.DatasetConfig.input_file = {args.input_file!r}"]
  bindings += _task_directory_bindings(args)
  gin_utils.parse_config(args.gin_file or [DEFAULT_GIN_FILE], bindings, args.gin_search_paths)
  try:
    gin_utils.check_bindings_take_effect([run.infer, *_task_settings()])
    gin.get_configurable(run.infer)(restart=args.restart, **command_line_settings)
  except (ValueError, FileNotFoundError) as e:  # a model, checkpoint or input the config names
    raise UsageError(gin_utils.first_line(e)) from None
  except stop_signals.Stopped as e:
    print(f"spec_decode.infer: {gin_utils.first_line(e)}", file=sys.stderr)
    return e.status
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m spec_decode.infer",
      description="T5X-style inference with speculative decoding (see the package docstring).")
  gin_utils.add_gin_arguments(parser, DEFAULT_GIN_FILE)
  parser.add_argument("--text", action="append", default=None,
                      help="an input to decode instead of the config's (repeatable)")
  parser.add_argument("--input_file", default=None,
                      help="decode this file's lines instead of the config's inputs")
  parser.add_argument("--data_dir", default=None,
                      help="data root of the file tasks (binds tasks.data_dir.path)")
  parser.add_argument("--tfds_data_dir", default=None,
                      help="where the TFDS tasks' datasets are prepared (T5X's flag; binds "
                           "tasks.tfds_data_dir.path)")
  parser.add_argument("--restart", action="store_true",
                      help="start over in an INFER_OUTPUT_DIR holding another run's chunks "
                           "(without it a rerun resumes there, or is refused if it differs)")
  gin_utils.add_distributed_arguments(parser)
  args, bindings = gin_utils.parse_args(parser, sys.argv[1:] if argv is None else argv)
  return gin_utils.run("spec_decode.infer", lambda: _run(args, bindings))


