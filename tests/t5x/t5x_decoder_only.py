"""T5X's own decoder-only network for the tests that compare the hook's decoder-only model with
it: `spec_decode.t5x.decoder_only_network` (T5X's wheel leaves the network out; `$T5X_SOURCE`
names a checkout holding it, which scripts/test.sh extracts from a T5X git mirror). `network()`
returns the module or skips the test saying how to provide it. `PRELUDE` is the loader as
Python source, to run first in a subprocess (`python -c PRELUDE + ...`), so that a T5X gin
file's `from t5x.examples.decoder_only import network` works in `python -m t5x.infer`.
"""

import types

import pytest

from spec_decode.t5x import decoder_only_network

SKIP_REASON = ("needs T5X's decoder-only network, absent from T5X's wheel: set T5X_SOURCE to a "
               "T5X source checkout (README: Tests)")


def network() -> types.ModuleType:
  """T5X's `t5x.examples.decoder_only.network`, or the test skips (see the module docstring)."""
  try:
    return decoder_only_network.network()
  except ImportError:
    pytest.skip(SKIP_REASON)


PRELUDE = ("from spec_decode.t5x import decoder_only_network; "
           "decoder_only_network.install(); ")
