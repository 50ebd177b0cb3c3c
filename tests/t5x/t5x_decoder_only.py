"""T5X's own decoder-only network for the tests that compare the hook's decoder-only model with
it (`spec_decode.t5x.decoder_only_network`). `network()` returns the module; the test skips only
where the T5X installation lacks the example, and fails on an error inside it."""

import types

import pytest

from spec_decode.t5x import decoder_only_network

SKIP_REASON = ("needs T5X's decoder-only network (t5x/examples/decoder_only/network.py), absent "
               "from this T5X installation: install T5X from its repository (README: Tests)")


def network() -> types.ModuleType:
  """T5X's `t5x.examples.decoder_only.network`, or the test skips where T5X lacks it."""
  try:
    return decoder_only_network.network()
  except ImportError as error:
    if error.name != decoder_only_network.MODULE:
      raise
    pytest.skip(SKIP_REASON)
