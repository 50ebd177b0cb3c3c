"""The registry of decode loops: a loop registered here is what every entry point can run.

A decode loop is a function of the engine's contract (`spec_decode.engine.decoding`):

    loop(inputs [B, L], cache, tokens_to_logits, eos_id, *, decode_rng, num_decodes,
         [draft_cache, draft_tokens_to_logits,]  # when registered with uses_draft=True
         **settings)
      -> (decodes [B, num_decodes, L], log_probs [B, num_decodes])
       | (decodes, log_probs, stats)   # stats.aux() -> {name: [B, num_decodes, ...] array}

A loop that returns stats registers their class (`stats=`, the contract of
`spec_decode.engine.stats`), so a run can total its decodes' counters.

`settings` are the loop's own keyword arguments (gamma, verifier, temperature, ...): the
runners pass exactly the ones a config sets, so a setting the loop does not take is refused by
name before anything is traced. A loop names the settings it takes as data (`data_settings`:
arrays, traced ones included, so that one compiled decoder serves every value, as T5X's
temperature, topk, topp and max_decode_steps do); every other setting is static, a Python value
fixed when the loop compiles, and an array given for one is refused by name before anything is
traced. Registering is one decorator:

    @loops.register("my_loop", uses_draft=True, check_settings=my_check)
    def my_loop(inputs, cache, tokens_to_logits, eos_id, *, draft_cache, ...): ...

and the loop is then available by name to `spec_decode.infer` (DECODE_LOOP), the T5X hook
(DECODE_LOOP), the benchmark and the tests, through `spec_decode.core.Decoder`.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import jax
import numpy as np

# Keyword arguments the runners give every loop themselves: never settings of a config.
RUNNER_ARGUMENTS = ("inputs", "cache", "tokens_to_logits", "eos_id", "decode_rng",
                    "num_decodes", "initial_index", "draft_cache", "draft_tokens_to_logits")


@dataclasses.dataclass(frozen=True)
class DecodeLoop:
  """A registered decode loop: its function, whether it needs a draft model, the check of
  its settings (ValueError naming the setting) run before anything is traced, the loop of
  the target alone whose output a speculative loop reproduces (its baseline) and the class of
  the stats it returns (None: it returns none)."""
  name: str
  fn: Callable[..., Any]
  uses_draft: bool
  check_settings: Callable[..., None] | None = None
  baseline: str = "temperature_sample"
  stats: type | None = None
  data_settings: tuple[str, ...] = ()

  @property
  def setting_names(self) -> tuple[str, ...]:
    return tuple(name for name in inspect.signature(self.fn).parameters
                 if name not in RUNNER_ARGUMENTS)

  def defaults(self) -> dict[str, Any]:
    """Every setting's default value (None where the loop has none)."""
    parameters = inspect.signature(self.fn).parameters
    return {name: (None if parameters[name].default is inspect.Parameter.empty
                   else parameters[name].default) for name in self.setting_names}

  def check(self, settings: Mapping[str, Any]) -> None:
    """ValueError for a setting this loop does not take, or one its own check refuses."""
    unknown = sorted(set(settings) - set(self.setting_names))
    if unknown:
      raise ValueError(f"decode loop {self.name!r} takes no setting "
                       f"{', '.join(map(repr, unknown))} (its settings: "
                       f"{', '.join(self.setting_names)})")
    if self.check_settings is not None:
      self.check_settings(**{**self.defaults(), **settings})

  @property
  def static_settings(self) -> tuple[str, ...]:
    """The settings that must be Python values (fixed when the loop compiles)."""
    return tuple(name for name in self.setting_names if name not in self.data_settings)

  def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Runs the loop: (decodes, log_probs, aux), aux {} for a loop that returns no stats.
    ValueError for an array (traced or not) given for a static setting."""
    for name in self.static_settings:
      if isinstance(kwargs.get(name), (jax.Array, np.ndarray)):
        raise ValueError(f"decode loop {self.name!r} takes {name} as a Python value, fixed "
                         f"when it compiles, not as an array (its data settings: "
                         f"{', '.join(self.data_settings) or 'none'})")
    decodes, log_probs, *stats = self.fn(*args, **kwargs)
    return decodes, log_probs, (stats[0].aux() if stats else {})


_LOOPS: dict[str, DecodeLoop] = {}


def register(name: str, *, uses_draft: bool,
             check_settings: Callable[..., None] | None = None,
             baseline: str = "temperature_sample", stats: type | None = None,
             data_settings: tuple[str, ...] = ()) -> Callable:
  """Decorator registering a decode loop under `name` (see the module docstring).
  `check_settings(**settings)` receives every setting (defaults filled in); `baseline` names
  the loop of the target alone that it is compared with (given the settings both take);
  `stats` is the class of the stats the loop returns; `data_settings` the settings it takes as
  arrays (the others are static)."""

  def add(fn: Callable[..., Any]) -> Callable[..., Any]:
    if name in _LOOPS and _LOOPS[name].fn is not fn:
      raise ValueError(f"a different decode loop is already registered as {name!r}")
    _LOOPS[name] = DecodeLoop(name, fn, uses_draft, check_settings, baseline, stats,
                              tuple(data_settings))
    return fn

  return add


def get(name: str) -> DecodeLoop:
  """The loop registered as `name`; ValueError naming the registered ones."""
  if name not in _LOOPS:
    raise ValueError(f"unknown decode loop {name!r}; registered: {', '.join(sorted(_LOOPS))}")
  return _LOOPS[name]


def names() -> tuple[str, ...]:
  return tuple(sorted(_LOOPS))
