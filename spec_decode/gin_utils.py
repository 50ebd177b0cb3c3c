"""Gin plumbing shared by the command-line programs, and the reader of model gin files.

Configs register what they bind themselves (`from __gin__ import dynamic_registration`, then
`from spec_decode import models`), as T5X's do: no module of the package registers anything with
gin when imported.

* `configured(fn)`: `fn` with the bindings a config gave it. A module that reads a setting
  from gin at call time (e.g. `tasks.data_dir`) calls through it, because a config registers
  only what it binds.
* `t5config_from_gin_file`: the `network.T5Config` a model gin file (and its includes) binds,
  read without touching the global gin config, so a second model (the draft) can come from its
  own file beside the target's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import gin
from gin import config_parser

from spec_decode import paths
from spec_decode.t5 import network

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
