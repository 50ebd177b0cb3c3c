"""Where the suite finds the developers' data folder, in one place: $SPEC_DECODE_SHARED, else
`shared` beside the checkout (`../shared`). It holds what no package ships: real text
(WMT, CNN/DailyMail, Tatoeba under data/) and the real T5 vocabulary. A fresh clone has none:
the tests that need it skip, naming what they need (`missing`); everything else, the T5X hook's
tests included, makes its own files."""

import os
import pathlib

SHARED_VARIABLE = "SPEC_DECODE_SHARED"
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get(SHARED_VARIABLE) or REPO_ROOT.parent / "shared")
DATA = SHARED / "data"
T5_VOCAB_FILE = SHARED / "vocab" / "t5_cc_all_32000.model"


def missing(what: str) -> str:
  """A skip reason: `what` (e.g. "the T5 vocabulary") is in the data folder, which is absent."""
  return (f"needs {what} from the developers' data folder, not found at {SHARED} "
          f"(set ${SHARED_VARIABLE} to point elsewhere)")
