"""Gin plumbing shared by the command-line programs, and the reader of model gin files.

Configs register what they bind themselves (`from __gin__ import dynamic_registration`, then
`from spec_decode import models`), as T5X's do: no module of the package registers anything with
gin when imported.

Every program (`infer`, `plan`, `bench`, `training.train`) takes T5X's flags: `--gin_file`
(repeatable), `--gin.NAME=VALUE` and `--gin_bindings='NAME = VALUE'` (repeatable),
`--gin_search_paths`. Mistakes are `UsageError`s: one line naming the file or binding, before
anything is built:
* `add_gin_arguments(parser)`, `parse_args(parser, argv)` -> (flags, bindings);
* `parse_config(gin_files, bindings)`: a missing file, a row of a table (configs/table2/,
  configs/table3/) given without its runner's harness, a value that is not a Python literal
  (strings need inner quotes), a macro left `%gin.REQUIRED`;
* `check_bindings_take_effect(entry_points)`: every binding must be reachable from the
  program's entry points through the config's references (`@x`, `%MACRO`); one that is not
  (a macro nothing uses, a setting of a decode_fn the model does not use) cannot take effect;
  a macro bound only to None is unset, not a binding (the configs' defaults of settings a run
  may bind elsewhere, e.g. LOOP_SETTINGS beside a model's own loop_settings binding);
* `run(program, main)`: prints a `UsageError` as `program: error: ...` and returns 2.
* `add_distributed_arguments(parser)`, `initialize_distributed(args)`: T5X's multi-process
  flags, and the one place JAX's distributed system is started (an entry point calls it first).
* `configured(fn)`: `fn` with the bindings a config gave it. A module that reads a setting
  from gin at call time (e.g. `tasks.data_dir`) calls through it, because a config registers
  only what it binds.
* `bound_network_config()`: the network config a parsed config binds (a T5 or a decoder-only
  model's); `read_model_config`: the one a model gin file (and its includes) binds, read by gin
  itself, the live config left as it was, so a second model can come from its own file;
  `read_run_config`: a run config's target, draft, batch size and lengths, what `plan` and
  `aot` size and compile.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
from gin import config_parser

from spec_decode import paths
from spec_decode.checkpoints import formats
from spec_decode.t5 import network

GIN_FLAGS_HELP = ("gin: --gin_file=FILE (repeatable), --gin.NAME=VALUE (T5X's form; strings "
                  "need inner quotes: --gin.INFER_OUTPUT_DIR=\"'out/x'\"), "
                  "--gin_bindings='NAME = VALUE' (repeatable), --gin_search_paths=DIR")

# Where a run config's speculative model binds its draft network.
_DRAFT_BINDINGS = ("models.SpeculativeEncoderDecoderModel.draft_module",
                   "models.SpeculativeDecoderOnlyModel.draft_module")


class UsageError(Exception):
  """A user's mistake (flag, file, binding, input), reported as one line with exit status 2."""


def add_gin_arguments(parser: argparse.ArgumentParser, default_gin_file: str | None = None
                      ) -> None:
  """T5X's gin flags; `--gin.NAME=VALUE` is collected by `parse_args`."""
  default = f" (default {default_gin_file})" if default_gin_file else ""
  parser.add_argument("--gin_file", action="append", default=[],
                      help=f"gin config file, repeatable{default}")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="a gin binding, e.g. \"BATCH_SIZE = 8\" (repeatable)")
  parser.add_argument("--gin_search_paths", action="append", default=[],
                      help="extra directories where gin files and includes are looked up")
  parser.epilog = ((parser.epilog + "\n") if parser.epilog else "") + GIN_FLAGS_HELP


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]
               ) -> tuple[argparse.Namespace, list[str]]:
  """(flags, gin bindings): `--gin_bindings` first, then `--gin.NAME=VALUE` in order."""
  known, rest = parser.parse_known_args(argv)
  bindings = list(known.gin_bindings)
  for arg in rest:
    match = re.fullmatch(r"--gin\.([\w.%/]+)=(.*)", arg, re.DOTALL)
    if not match:
      parser.error(f"unrecognized argument {arg!r} (gin bindings are --gin.NAME=VALUE)")
    bindings.append(f"{match.group(1)} = {match.group(2)}")
  return known, bindings


def first_line(error: BaseException) -> str:
  """An error's first line: gin appends the config location on further lines."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _binding_error(binding: str, error: Exception) -> UsageError:
  """A binding gin could not parse; for an unquoted string, the corrected flag."""
  name, _, value = binding.partition("=")
  name, value = name.strip(), value.strip()
  try:
    ast.literal_eval(value)
  except (ValueError, SyntaxError):
    if value and not value.startswith(("@", "%", "'", '"')):
      return UsageError(f"--gin.{name}={value}: {value} is not a value; strings need inner "
                        f"quotes: --gin.{name}=\"'{value}'\"")
  return UsageError(f"binding '{binding}': {first_line(error)}")


def parse_config(gin_files: Sequence[str], bindings: Sequence[str],
                 search_paths: Sequence[str] = (), finalize: bool = True) -> None:
  """Clears gin and parses the files, then the bindings, then finalizes (a required macro left
  unset is an error; a reader of the config alone, like `plan`, passes finalize=False).

  Relative files are found as `paths.resolve` finds them; includes in the search paths, the
  package's root first.
  """
  gin.clear_config()
  search_paths = [str(paths.CONFIG_ROOT), str(paths.ROOT), *search_paths]
  for path in search_paths:
    gin.add_config_file_search_path(path)
  # As T5X finds them: from the working directory, else from the search paths.
  located = []
  for gin_file in gin_files:
    candidates = [paths.resolve(gin_file)] + [os.path.join(path, gin_file)
                                              for path in search_paths]
    found = next((path for path in candidates if os.path.isfile(path)), None)
    if found is None:
      raise UsageError(f"gin file not found: {gin_file}")
    located.append(found)
  # gin logs an ERROR for every search path an include is not found in, even when a later one
  # has it; an include found nowhere still raises.
  logging.disable(logging.ERROR)
  try:
    for gin_file, path in zip(gin_files, located):
      try:
        gin.parse_config_file(path)
      except (IOError, ValueError, SyntaxError, NameError, TypeError) as e:
        raise UsageError(f"{gin_file}: {first_line(e)}") from None
  finally:
    logging.disable(logging.NOTSET)
  _check_harness(gin_files)
  for binding in bindings:
    try:
      gin.parse_config(binding)
    except (ValueError, SyntaxError, NameError, TypeError) as e:
      raise _binding_error(binding, e) from None
  if not finalize:
    return
  try:
    gin.finalize()
  except ValueError as e:
    macro = re.match(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", first_line(e))
    if macro:
      raise UsageError(f"required gin macro {macro.group(1)} is not set (e.g. "
                       f"--gin.{macro.group(1)}=...)") from None
    raise UsageError(first_line(e)) from None


def _binds(configurable: Any) -> bool:
  """Whether the parsed config binds anything of `configurable`."""
  try:
    return bool(gin.get_bindings(configurable))
  except ValueError:  # never registered: nothing binds it
    return False


def _check_harness(gin_files: Sequence[str]) -> None:
  """UsageError where the files bind no network and one of them is a row whose folder (or the
  one above) holds a runner's harness, `spec_decode.gin`, which binds the model and the run: a
  row alone sets only macros, so every later error (an unregistered network config, a binding
  nothing uses) would hide the one missing file."""
  if any(_binds(configurable) for configurable in (
      network.T5Config, network.Transformer, network.DecoderOnlyConfig,
      network.DecoderOnlyTransformer)):
    return
  for gin_file in gin_files:
    folder = os.path.dirname(gin_file)
    for harness in (os.path.join(folder, "spec_decode.gin"),
                    os.path.join(os.path.dirname(folder), "spec_decode.gin")):
      if harness != gin_file and os.path.isfile(paths.resolve(harness)):
        raise UsageError(f"{gin_file} binds no model: give its runner's harness first, "
                         f"--gin_file={harness} --gin_file={gin_file}")


class _Reference:
  """A `@scope/selector` or `%MACRO` in a binding's value, as `_BindingReader` records it."""

  def __init__(self, name: str, is_macro: bool):
    self.name, self.is_macro = name, is_macro


class _BindingReader(config_parser.ParserDelegate):
  """Parses gin's own printout of the config (`gin.config_str()`), recording references."""

  def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> _Reference:
    del evaluate
    return _Reference(scoped_configurable_name, is_macro=False)

  def macro(self, macro_name: str) -> _Reference:
    return _Reference(macro_name, is_macro=True)


def _references(value: Any) -> Iterator[_Reference]:
  if isinstance(value, _Reference):
    yield value
  elif isinstance(value, Mapping):
    for item in value.values():
      yield from _references(item)
  elif isinstance(value, (list, tuple, set)):
    for item in value:
      yield from _references(item)


def check_bindings_take_effect(entry_points: Sequence[Callable[..., Any]]) -> None:
  """UsageError naming the first binding that no entry point reaches (see the docstring).
  Read from gin's public printout of the config: each binding is keyed by (scope, the
  configurable gin resolves its selector to) or by its macro's name. Unscoped bindings of a
  configurable apply in every scope, so any reference to it reaches them."""
  statements = [statement for statement in config_parser.ConfigParser(
      io.StringIO(gin.config_str()), _BindingReader())
                if isinstance(statement, config_parser.BindingStatement)]

  def key(scope: str, selector: str) -> tuple[str, Any]:
    return scope, id(gin.get_configurable(selector))

  bindings: dict[tuple[str, Any], list[config_parser.BindingStatement]] = {}
  for statement in statements:
    binding_key = (("%", statement.selector) if not statement.arg_name
                   else key(statement.scope, statement.selector))
    bindings.setdefault(binding_key, []).append(statement)
  reached = set()
  for fn in entry_points:
    try:
      reached.add(("", id(gin.get_configurable(fn))))
    except ValueError:  # no config binds it: it reaches nothing
      pass
  pending = list(reached)
  while pending:
    scope, configurable = pending.pop()
    for found_key in {(scope, configurable), ("", configurable)}:
      for statement in bindings.get(found_key, ()):
        for reference in _references(statement.value):
          if reference.is_macro:
            new = [("%", reference.name)]
          else:
            ref_scope, _, selector = reference.name.rpartition("/")
            new = [key(ref_scope, selector), key("", selector)]
          for new_key in new:
            if new_key not in reached:
              reached.add(new_key)
              pending.append(new_key)
  for binding_key, found in bindings.items():
    if binding_key in reached or (binding_key[0] != "%" and ("", binding_key[1]) in reached):
      continue
    first = found[0]
    if not first.arg_name and all(statement.value is None for statement in found):
      continue  # unset: nothing to take effect
    if not first.arg_name:
      what = f"macro {first.selector}"
    else:
      names = ", ".join(sorted({statement.arg_name for statement in found}))
      scope = f"{first.scope}/" if first.scope else ""
      what = f"{scope}{'.'.join(first.selector.split('.')[-2:])}.{{{names}}}"
    raise UsageError(f"gin binding of {what} cannot take effect: nothing this run calls "
                     "uses it")


def _macro(name: str) -> Any:
  """The value of gin macro `name`, or None when the config does not define it."""
  try:
    return gin.query_parameter(f"%{name}")
  except ValueError:
    return None


@dataclasses.dataclass(frozen=True)
class RunConfig:
  target: network.NetworkConfig
  draft: network.NetworkConfig | None
  batch_size: int | None
  input_length: int | None
  target_length: int | None


def read_run_config(gin_files: Sequence[str], bindings: Sequence[str] = (),
                    draft_gin_file: str | None = None) -> RunConfig:
  """The target, draft, batch size and lengths a run config describes, as `spec_decode.plan`
  reads them (its docstring says from where); a run's required macros (checkpoint paths, ...)
  may stay unset."""
  parse_config(gin_files, bindings, finalize=False)
  target = bound_network_config()
  if draft_gin_file is not None:
    draft = read_model_config(draft_gin_file)
  else:
    reference = None  # not bound: from the draft's checkpoint, if any
    for binding in _DRAFT_BINDINGS:
      try:
        reference = gin.query_parameter(binding)
        break
      except ValueError:
        pass
    draft_path = _macro("DRAFT_CHECKPOINT_PATH")
    if reference is not None:
      draft = reference.scoped_configurable_fn().config
    elif _macro("DRAFT_SOURCE") == "ngram":  # no network: its tables are O(V K) numbers
      draft = None
    elif isinstance(draft_path, str):
      try:
        draft = formats.checkpoint_config(draft_path, like=target)
      except (ValueError, OSError) as e:
        raise UsageError(f"the draft's config could not be read from DRAFT_CHECKPOINT_PATH "
                         f"({first_line(e)}): give --draft_gin_file") from None
    else:
      draft = None
  lengths = _macro("TASK_FEATURE_LENGTHS") or {}
  return RunConfig(target, draft, _macro("BATCH_SIZE"), lengths.get("inputs"),
                   lengths.get("targets"))


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
  """T5X's multi-process flags (its train.py's), for `initialize_distributed`."""
  parser.add_argument("--multiprocess_gpu", action="store_true",
                      help="start JAX's distributed system (T5X's flag; any backend), from "
                           "the three flags below")
  parser.add_argument("--coordinator_address", default=None,
                      help="host:port of process 0 (with --multiprocess_gpu)")
  parser.add_argument("--process_count", type=int, default=None,
                      help="number of processes (with --multiprocess_gpu)")
  parser.add_argument("--process_index", type=int, default=None,
                      help="this process's index, 0 first (with --multiprocess_gpu)")


def initialize_distributed(args: argparse.Namespace) -> None:
  """Starts JAX's distributed system when this process is one of several, before anything
  touches the devices: from `add_distributed_arguments`' flags, else from a cluster's
  environment: JAX_COORDINATOR_ADDRESS (read by JAX) with JAX_NUM_PROCESSES and JAX_PROCESS_ID
  (read here), or SLURM_NTASKS / OMPI_COMM_WORLD_SIZE > 1 or a comma-separated
  TPU_WORKER_HOSTNAMES (JAX's cluster detection fills in the rest). Elsewhere, a multi-host
  TPU VM without these variables say, give --multiprocess_gpu. UsageError for flags that
  contradict each other or a start that fails."""
  given = [f"--{name}" for name in ("coordinator_address", "process_count", "process_index")
           if getattr(args, name) is not None]
  if not args.multiprocess_gpu:
    if given:
      raise UsageError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} "
                       "--multiprocess_gpu")
    _initialize_from_environment()
    return
  if args.process_count is not None and args.process_index is not None and not (
      0 <= args.process_index < args.process_count):
    raise UsageError(f"--process_index={args.process_index} is not in 0..{args.process_count - 1} "
                     f"(--process_count={args.process_count})")
  try:
    jax.distributed.initialize(args.coordinator_address, args.process_count, args.process_index)
  except (ValueError, RuntimeError) as error:  # e.g. no coordinator given or detected
    raise UsageError("--multiprocess_gpu: JAX's distributed system did not start: "
                     f"{first_line(error)}") from error


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  return int(value) if value else None


def _initialize_from_environment() -> None:
  if jax.distributed.is_initialized():
    return
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    jax.distributed.initialize(num_processes=_env_int("JAX_NUM_PROCESSES"),
                               process_id=_env_int("JAX_PROCESS_ID"))
  elif ((_env_int("SLURM_NTASKS") or 1) > 1 or (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1
        or "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")):
    jax.distributed.initialize()


def run(program: str, main: Callable[[], int | None]) -> int:
  """`main()`'s status, or 2 after printing a UsageError as one line on stderr."""
  try:
    return main() or 0
  except UsageError as e:  # raised inside a configurable, gin appends lines naming it
    print(f"{program}: error: {first_line(e)}", file=sys.stderr)
    return 2


def configured(fn: Callable[..., Any]) -> Callable[..., Any]:
  """gin's configurable of `fn` when a config has registered it, else `fn` itself."""
  try:
    return gin.get_configurable(fn)
  except ValueError:  # no config binds it
    return fn


def bound_network_config(overrides: Mapping[str, Any] | None = None
                         ) -> network.NetworkConfig:
  """The network config the parsed config binds, with `overrides` replacing fields: a
  `network.DecoderOnlyConfig` where it binds that class or `network.DecoderOnlyTransformer` (a
  configs/models/decoder_only/ file), else a `network.T5Config`."""
  decoder_only = _binds(network.DecoderOnlyTransformer) or _binds(network.DecoderOnlyConfig)
  config_class = network.DecoderOnlyConfig if decoder_only else network.T5Config
  return gin.get_configurable(config_class)(**dict(overrides or {}))


def read_model_config(gin_file: str, overrides: Mapping[str, Any] | None = None
                      ) -> network.NetworkConfig:
  """The network config a model gin file (and its includes) binds (`bound_network_config`),
  read by gin itself, with
  `overrides` replacing fields (e.g. {'dtype': 'float32'}), so a second model (a draft, the
  benchmark's pair) can come from its own file. The live config is put back as it was (gin's
  printout of it, `gin.config_str()`, parses back to the same bindings). ValueError naming the
  file for a missing file or an incomplete config."""
  path = paths.resolve(gin_file)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model gin file not found: {gin_file}")
  saved = gin.config_str()
  try:
    with gin.unlock_config():
      gin.clear_config()
      for root in (paths.CONFIG_ROOT, paths.ROOT):
        gin.add_config_file_search_path(str(root))
      gin.parse_config_file(path)
      try:
        return bound_network_config(overrides)
      except (TypeError, ValueError) as e:
        raise ValueError(f"{gin_file}: not a complete network config ({first_line(e)})"
                         ) from None
  finally:
    with gin.unlock_config():  # locked again on leaving, when it was
      gin.clear_config()
      gin.parse_config(saved)
