"""tests/sharding needs 8 JAX devices, which on CPU must be requested before JAX starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/sharding

so it runs in its own process (scripts/test.sh does this; the main run passes
--ignore=tests/sharding). With fewer devices every test here is skipped, saying why.
"""

import pathlib

import jax
import pytest

REQUIRED_DEVICES = 8


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  if jax.device_count() >= REQUIRED_DEVICES:
    return
  skip = pytest.mark.skip(
      reason=f"needs {REQUIRED_DEVICES} devices but JAX sees {jax.device_count()}: run "
             "XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/sharding")
  for item in items:
    if pathlib.Path(__file__).parent in item.path.parents:
      item.add_marker(skip)
