"""tests/t5x drive the T5X hook with real T5X: they skip, saying why, without `t5x` installed (the
README's test section says how to install it). Everything else they need is made here: T5X's
tiny T5.1.1 checkpoint written by T5X's own Checkpointer (`t5x_setup.write_tiny_checkpoint`),
seqio's test vocabulary, a handful of sentences (`t5x_tasks`)."""

import pathlib

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """The msgpack file of a tiny T5.1.1 checkpoint as T5X's own test data holds it (arrays
  inline), at <tmp>/checkpoint_0/checkpoint."""
  import t5x_setup  # pylint: disable=g-import-not-at-top (imports t5x, which may be absent)
  return t5x_setup.write_tiny_checkpoint(tmp_path_factory.mktemp("t5x_tiny"))
