"""T5X's own decoder-only network, `t5x.examples.decoder_only.network`: what T5X's decoder-only
gin files, the benchmark's T5X peer for language models and the identity tests build T5X's
`DecoderOnlyModel` over.

T5X's repository has it; its folder has no `__init__.py`, so an installation that packages
only Python packages leaves it out. `network()` returns the module, or raises ImportError
(MISSING, `name` MODULE) where the installation lacks it; any other ImportError (one raised
inside the network) propagates as it is.
"""

import importlib
import types

MODULE = "t5x.examples.decoder_only.network"
MISSING = ("T5X's decoder-only network (t5x/examples/decoder_only/network.py) is absent from "
           "this T5X installation: install T5X from its repository")


def network() -> types.ModuleType:
  """T5X's `t5x.examples.decoder_only.network`; ImportError (MISSING) where T5X lacks it."""
  try:
    return importlib.import_module(MODULE)
  except ModuleNotFoundError as error:
    # Only the example's own absence; a module the network imports that is missing is a break.
    if error.name not in (MODULE, MODULE.rpartition(".")[0]):
      raise
    raise ImportError(MISSING, name=MODULE) from error
