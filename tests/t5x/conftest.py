"""tests/t5x drive the T5X hook with real T5X: they skip, saying why, without `t5x` installed
(its wheels are in ../shared/wheels) or without ../shared (T5X's tiny checkpoint, the T5
vocabulary, the text data)."""

import pathlib

import pytest

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / "shared"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  del config
  if SHARED.is_dir():
    return
  skip = pytest.mark.skip(reason=f"needs ../shared (T5X's tiny checkpoint, the T5 vocabulary, "
                                 f"text data), not found at {SHARED}")
  here = pathlib.Path(__file__).parent
  for item in items:
    if here in item.path.parents:
      item.add_marker(skip)
