"""configs/table2/*.gin, the paper's Table 2 rows, as t5x.infer runs them after T5X's harness
(configs/table2/t5x.gin), and their T5 1.0 variants (configs/table2/t5_1_0/, after that folder's
t5x.gin): each parses as t5x.infer parses it (its includes found, T5X's xxl.gin or
t5_1_0/11B.gin made speculative) with the gamma, temperature of the same row of the paper's
Table 2 (`spec_decode.bench.paper`), its draft, target and task (one subprocess per harness, as
gin binds t5x.infer's `__main__`). tests/test_configs.py runs the same rows through
spec_decode.infer's harnesses."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from spec_decode.bench import paper

# The slow tier (imports T5X in subprocesses to parse the rows).
pytestmark = pytest.mark.slow

pytest.importorskip("t5x.infer",
                    reason="needs t5x, installed from its repository (README: Tests)")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
ROWS = sorted((REPO_ROOT / "configs" / "table2").glob("*_t[01].gin"))
HARNESS = "configs/table2/t5x.gin"
T5_1_0_ROWS = sorted((REPO_ROOT / "configs" / "table2" / "t5_1_0").glob("*_t[01].gin"))
T5_1_0_HARNESS = "configs/table2/t5_1_0/t5x.gin"
MACROS = ("GAMMA", "TEMPERATURE", "DRAFT_CHECKPOINT_PATH", "MIXTURE_OR_TASK_NAME",
          "CHECKPOINT_PATH")
# Parses each row as `python -m t5x.infer --gin_search_paths=<repo> --gin_file=<harness>
# --gin_file=<row> --gin.INFER_OUTPUT_DIR=...` does and prints its macros and what MODEL is.
PARSE_ROWS = """
import json, os, sys
import gin
import t5x.infer
from t5x import gin_utils
infer = t5x.infer.infer  # gin binds `__main__.infer`, t5x.infer's entry point
rows, macros = json.loads(sys.argv[1]), json.loads(sys.argv[2])
parsed = {}
for row in rows:
  gin.clear_config()
  gin_utils.parse_gin_flags([sys.argv[3], *t5x.infer._DEFAULT_GIN_SEARCH_PATHS],
                            [sys.argv[4], row],
                            ["INFER_OUTPUT_DIR = 'table2_out'"])  # the user's flag
  parsed[row] = {macro: gin.query_parameter('%' + macro) for macro in macros}
  parsed[row]['MODEL'] = gin.query_parameter('%MODEL').selector
  parsed[row]['mlp_activations'] = gin.query_parameter(
      't5x.examples.t5.network.T5Config.mlp_activations')
print(json.dumps(parsed))
"""


def _parse_rows(rows, macros, harness):
  """{row: {macro: value, 'MODEL': selector, 'mlp_activations': the target's}} as t5x.infer
  parses `harness` then each row."""
  env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
  run = subprocess.run([sys.executable, "-c", PARSE_ROWS, json.dumps([str(r) for r in rows]),
                        json.dumps(macros), str(REPO_ROOT), harness], env=env,
                       capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("harness, rows, target, draft_path, mlp_activations", [
    (HARNESS, ROWS, "/t5_1_1_xxl/checkpoint_", "/t5_1_1_{}/checkpoint_", ["gelu", "linear"]),
    (T5_1_0_HARNESS, T5_1_0_ROWS, "/t5_11B/checkpoint_", "/t5_{}/checkpoint_", ["relu"]),
])
def test_rows_parse_as_t5x_infer_runs_of_the_paper_rows(harness, rows, target, draft_path,
                                                        mlp_activations):
  assert len(rows) == 12
  parsed = _parse_rows(rows, MACROS, harness)
  for row in rows:
    task, draft, _ = row.stem.split("_")
    values = parsed[str(row)]
    paper_row = paper.TABLE2[row.stem]
    assert values["GAMMA"] == paper_row.gamma, row.name
    assert values["TEMPERATURE"] == paper_row.temperature, row.name
    assert draft_path.format(draft) in values["DRAFT_CHECKPOINT_PATH"], row.name
    assert target in values["CHECKPOINT_PATH"], row.name
    assert values["MIXTURE_OR_TASK_NAME"] == {"ende": "wmt_ende", "cnndm": "cnn_dailymail"}[task]
    assert values["MODEL"].endswith("speculative_version"), values["MODEL"]
    assert list(values["mlp_activations"]) == mlp_activations, row.name


LOOKUP_ROWS = sorted((REPO_ROOT / "configs" / "table2" / "lookup").glob("*.gin"))


def test_lookup_rows_parse_as_t5x_infer_runs():
  """The CNN/DM lookup rows (configs/table2/lookup/) after T5X's harness: lookup drafts, no
  draft checkpoint for the lookup alone, the base draft for the combination."""
  macros = MACROS + ("DRAFT_SOURCE", "LOOKUP_MAX_NGRAM", "LOOKUP_MIN_NGRAM")
  parsed = _parse_rows(LOOKUP_ROWS, macros, HARNESS)
  assert len(LOOKUP_ROWS) == 3
  for row in LOOKUP_ROWS:
    values = parsed[str(row)]
    assert values["MIXTURE_OR_TASK_NAME"] == "cnn_dailymail", row.name
    assert values["MODEL"].endswith("speculative_version"), values["MODEL"]
    assert values["LOOKUP_MAX_NGRAM"] == 4
    if row.stem == "cnndm_base_t0":
      assert values["DRAFT_SOURCE"] == "lookup+model" and values["LOOKUP_MIN_NGRAM"] == 2
      assert "/t5_1_1_base/" in values["DRAFT_CHECKPOINT_PATH"]
    else:
      assert values["DRAFT_SOURCE"] == "lookup" and values["DRAFT_CHECKPOINT_PATH"] is None
      assert values["TEMPERATURE"] == float(row.stem[-1])
