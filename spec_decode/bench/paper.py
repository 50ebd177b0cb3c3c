"""The paper's Table 2, the one copy in the project.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023), Table 2: a T5-XXL (11B) target with a T5-small, -base or -large draft, batch 1, on
a TPU-v4; per task and temperature, the gamma used, the measured alpha and the walltime speedup.

`TABLE2` maps a row's name, `<task>_<draft size>_t<temperature>` (as the gin files of
configs/table2/ are named), to its `Table2Row`. Every other place that needs
these numbers (the simulated_table2 suite, scripts/reproduce_table2.py, the configs' tests)
reads them here.
"""

from __future__ import annotations

import dataclasses

TARGET = "T5-XXL"
HARDWARE = "TPU-v4"


@dataclasses.dataclass(frozen=True)
class Table2Row:
  """One row: `task` ('EnDe' or 'CNNDM'), `draft` (the paper's M_q), `temperature`, the `gamma`
  the paper used, its measured `alpha` and its walltime `speedup` over the target alone."""
  task: str
  draft: str
  temperature: float
  gamma: int
  alpha: float
  speedup: float

  def summary(self) -> str:
    """e.g. 'alpha 0.75, gamma 7: 3.4x'."""
    return f"alpha {self.alpha:.2f}, gamma {self.gamma}: {self.speedup}x"


TABLE2: dict[str, Table2Row] = {
    "ende_small_t0": Table2Row("EnDe", "T5-small", 0.0, 7, 0.75, 3.4),
    "ende_base_t0": Table2Row("EnDe", "T5-base", 0.0, 7, 0.80, 2.8),
    "ende_large_t0": Table2Row("EnDe", "T5-large", 0.0, 7, 0.82, 1.7),
    "ende_small_t1": Table2Row("EnDe", "T5-small", 1.0, 7, 0.62, 2.6),
    "ende_base_t1": Table2Row("EnDe", "T5-base", 1.0, 5, 0.68, 2.4),
    "ende_large_t1": Table2Row("EnDe", "T5-large", 1.0, 3, 0.71, 1.4),
    "cnndm_small_t0": Table2Row("CNNDM", "T5-small", 0.0, 5, 0.65, 3.1),
    "cnndm_base_t0": Table2Row("CNNDM", "T5-base", 0.0, 5, 0.73, 3.0),
    "cnndm_large_t0": Table2Row("CNNDM", "T5-large", 0.0, 3, 0.74, 2.2),
    "cnndm_small_t1": Table2Row("CNNDM", "T5-small", 1.0, 5, 0.53, 2.3),
    "cnndm_base_t1": Table2Row("CNNDM", "T5-base", 1.0, 3, 0.55, 2.2),
    "cnndm_large_t1": Table2Row("CNNDM", "T5-large", 1.0, 3, 0.56, 1.7),
}
