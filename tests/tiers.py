"""The `newest` marker on some cases of a parametrized test (pytest.ini names the tiers)."""

from collections.abc import Collection, Iterable
from typing import Any

import pytest


def newest_among(cases: Iterable[Any], newest: Collection[Any]) -> list[Any]:
  """`cases` for `pytest.mark.parametrize`, those in `newest` marked `newest`. A case is one
  value or a tuple of the arguments' values; every case named in `newest` must be among
  `cases` (a case renamed would otherwise drop out of the tier silently)."""
  cases = list(cases)
  missing = [case for case in newest if case not in cases]
  if missing:
    raise ValueError(f"newest cases that are not cases: {missing}")
  return [pytest.param(*(case if isinstance(case, tuple) else (case,)),
                       marks=[pytest.mark.newest] if case in newest else [])
          for case in cases]
