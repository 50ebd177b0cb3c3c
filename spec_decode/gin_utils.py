"""Gin plumbing shared by the command-line programs, and the reader of model gin files.

Configs register what they bind themselves (`from __gin__ import dynamic_registration`, then
`from spec_decode import models`), as T5X's do: no module of the package registers anything with
gin when imported.

Every program (`infer`, `plan`, `bench`, `training.train`) takes T5X's flags: `--gin_file`
(repeatable), `--gin.NAME=VALUE` and `--gin_bindings='NAME = VALUE'` (repeatable),
`--gin_search_paths`. Mistakes are `UsageError`s: one line naming the file or binding, before
anything is built:
* `add_gin_arguments(parser)`, `parse_args(parser, argv)` -> (flags, bindings);
* `parse_config(gin_files, bindings)`: a missing file, a value that is not a Python literal
  (strings need inner quotes), a macro left `%gin.REQUIRED`;
* `check_bindings_take_effect(entry_points)`: every binding must be reachable from the
  program's entry points through the config's references (`@x`, `%MACRO`); one that is not
  (a macro nothing uses, a setting of a decode_fn the model does not use) cannot take effect;
* `run(program, main)`: prints a `UsageError` as `program: error: ...` and returns 2.
* `configured(fn)`: `fn` with the bindings a config gave it. A module that reads a setting
  from gin at call time (e.g. `tasks.data_dir`) calls through it, because a config registers
  only what it binds.
* `t5config_from_gin_file`: the `network.T5Config` a model gin file (and its includes) binds,
  read without touching the global gin config, so a second model (the draft) can come from its
  own file beside the target's.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gin
from gin import config as gin_config
from gin import config_parser

from spec_decode import paths
from spec_decode.t5 import network

GIN_FLAGS_HELP = ("gin: --gin_file=FILE (repeatable), --gin.NAME=VALUE (T5X's form; strings "
                  "need inner quotes: --gin.INFER_OUTPUT_DIR=\"'out/x'\"), "
                  "--gin_bindings='NAME = VALUE' (repeatable), --gin_search_paths=DIR")


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
  for path in [str(paths.ROOT), *search_paths]:
    gin.add_config_file_search_path(path)
  for gin_file in gin_files:
    if not os.path.isfile(paths.resolve(gin_file)):
      raise UsageError(f"gin file not found: {gin_file}")
  # gin logs an ERROR for every search path an include is not found in, even when a later one
  # has it; an include found nowhere still raises.
  logging.disable(logging.ERROR)
  try:
    for gin_file in gin_files:
      try:
        gin.parse_config_file(paths.resolve(gin_file))
      except (IOError, ValueError, SyntaxError, NameError, TypeError) as e:
        raise UsageError(f"{gin_file}: {first_line(e)}") from None
  finally:
    logging.disable(logging.NOTSET)
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


def _references(value: Any) -> Iterator[gin_config.ConfigurableReference]:
  if isinstance(value, gin_config.ConfigurableReference):
    yield value
  elif isinstance(value, Mapping):
    for item in value.values():
      yield from _references(item)
  elif isinstance(value, (list, tuple, set)):
    for item in value:
      yield from _references(item)


def _describe(key: tuple[str, str], arguments: Mapping[str, Any]) -> str:
  scope, selector = key
  if selector == "gin.macro":
    return f"macro {scope}"
  module_and_name = ".".join(selector.split(".")[-2:])  # as configs write it: decoding.x
  names = ", ".join(sorted(arguments))
  return f"{scope + '/' if scope else ''}{module_and_name}.{{{names}}}"


def check_bindings_take_effect(entry_points: Sequence[Callable[..., Any]]) -> None:
  """UsageError naming the first binding that no entry point reaches (see the docstring).

  Unscoped bindings of a selector apply in every scope, so any reference to it reaches them.
  """
  bindings = dict(gin_config._CONFIG)  # pylint: disable=protected-access
  # A configs' registration names a function or class by its module path, or by the path a
  # config imported it from (`from spec_decode import bench` registers
  # `spec_decode.bench.BenchConfig` for `spec_decode.bench.config.BenchConfig`).
  reached_keys = {("", f"{fn.__module__}.{fn.__qualname__}") for fn in entry_points}
  reached_keys |= {("", selector)
                   for selector, configurable in gin_config._REGISTRY.items()  # pylint: disable=protected-access
                   if any(configurable.wrapped is fn for fn in entry_points)}
  pending = list(reached_keys)
  while pending:
    scope, selector = pending.pop()
    for key in ((scope, selector), ("", selector)):
      for reference in _references(bindings.get(key, {})):
        if reference.selector == "gin.macro":  # %NAME: the binding ('NAME', 'gin.macro')
          found = [(reference.scopes[0], "gin.macro")]
        else:
          found = [reference.config_key, ("", reference.config_key[1])]
        for new in found:
          if new not in reached_keys:
            reached_keys.add(new)
            pending.append(new)
  for key, arguments in bindings.items():
    if key not in reached_keys and (key[1] == "gin.macro" or ("", key[1]) not in reached_keys):
      raise UsageError(f"gin binding of {_describe(key, arguments)} cannot take effect: nothing "
                       "this run calls uses it")


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


# How a model gin file may name the config (the last: imported with its package path).
_T5CONFIG_SELECTORS = ("T5Config", "network.T5Config", "spec_decode.t5.network.T5Config")


class _Unresolved:
  """Stands for a gin reference or macro while reading a model gin file's literals."""

  def __init__(self, text: str):
    self.text = text


class _LiteralsOnly(config_parser.ParserDelegate):

  def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> _Unresolved:
    return _Unresolved("@" + scoped_configurable_name + ("()" if evaluate else ""))

  def macro(self, macro_name: str) -> _Unresolved:
    return _Unresolved("%" + macro_name)


def _t5config_bindings(gin_file: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
  """The unscoped `network.T5Config` bindings of a gin file and its includes (last wins)."""
  path = paths.resolve(gin_file)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model gin file not found: {gin_file}")
  if path in seen:
    raise ValueError(f"{gin_file}: circular include")
  fields: dict[str, Any] = {}
  with open(path) as f:
    for statement in config_parser.ConfigParser(f, _LiteralsOnly()):
      if isinstance(statement, config_parser.IncludeStatement):
        fields.update(_t5config_bindings(statement.filename, seen + (path,)))
      elif (isinstance(statement, config_parser.BindingStatement) and not statement.scope
            and statement.selector in _T5CONFIG_SELECTORS):
        if isinstance(statement.value, _Unresolved):
          raise ValueError(f"{gin_file}: network.T5Config.{statement.arg_name} is bound to "
                           f"{statement.value.text}; a model gin file read for a second model "
                           "may only bind literal values")
        fields[statement.arg_name] = statement.value
  return fields


def t5config_from_gin_file(gin_file: str,
                           overrides: Mapping[str, Any] | None = None) -> network.T5Config:
  """The `network.T5Config` bound in a model gin file, with `overrides` replacing fields (e.g.
  {'dtype': 'float32'}); ValueError when the file binds an incomplete config or a reference."""
  fields = _t5config_bindings(gin_file)
  fields.update(overrides or {})
  try:
    return network.T5Config(**fields)
  except TypeError as e:
    raise ValueError(f"{gin_file}: not a complete network.T5Config ({e})") from None
