"""Where T5X's decoder-only network comes from (`spec_decode.t5x.decoder_only_network`): a T5X
installation without the example is one ImportError saying so, the one case the T5X tests skip
(`t5x_decoder_only`); an ImportError raised inside the network is a break, and propagates."""

import types

import pytest

import t5x_decoder_only
from spec_decode.t5x import decoder_only_network


def _importing_raises(monkeypatch, error: ImportError) -> None:
  """`decoder_only_network`'s import of the network raises `error`."""

  def import_module(name: str):
    del name
    raise error

  monkeypatch.setattr(decoder_only_network, "importlib",
                      types.SimpleNamespace(import_module=import_module))


@pytest.mark.parametrize("missing", [decoder_only_network.MODULE, "t5x.examples.decoder_only"])
def test_an_installation_without_the_example_says_so(monkeypatch, missing):
  _importing_raises(monkeypatch, ModuleNotFoundError(f"No module named '{missing}'",
                                                     name=missing))
  with pytest.raises(ImportError, match="absent from this T5X installation") as raised:
    decoder_only_network.network()
  assert raised.value.name == decoder_only_network.MODULE
  with pytest.raises(pytest.skip.Exception, match="install T5X from its repository"):
    t5x_decoder_only.network()


@pytest.mark.parametrize("error", [
    ModuleNotFoundError("No module named 'flax.linen.attention2'", name="flax.linen.attention2"),
    ImportError("cannot import name 'MultiHeadDotProductAttention' from 't5x.examples.t5.layers'"),
])
def test_an_import_error_inside_the_network_is_not_a_missing_example(monkeypatch, error):
  _importing_raises(monkeypatch, error)
  with pytest.raises(ImportError) as raised:
    t5x_decoder_only.network()
  assert raised.value is error
