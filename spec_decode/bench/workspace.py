"""What the suites share within one run: `Workspace` builds the two pairs ('pair': PairConfig's,
'simulated': SimulatedTable2Config's), their compiled decoders (on the run's partitioner) and
their step timings on first use, so suites that need the same pair or timing neither rebuild
nor recompile it."""

from __future__ import annotations

from typing import Any, Mapping

from spec_decode.runtime import partitioning
from spec_decode.bench.config import PairConfig, SimulatedTable2Config
from spec_decode.bench.decoders import PairDecoders
from spec_decode.bench.pairs import Pair, build_pair, random_pair
from spec_decode.bench.simulated import SIMULATED
from spec_decode.bench.timing import call_sequence_seconds

# The simulated pair's random inputs: enough that repetitions see different ones.
_SIMULATED_NUM_INPUTS = 8


class Workspace:
  """The pairs by name ('pair' | 'simulated'), their decoders, and their calls' timings."""

  def __init__(self, pair_config: PairConfig, simulated_config: SimulatedTable2Config,
               compiler_options: Mapping[str, Any],
               partitioner: partitioning.PjitPartitioner):
    self.compiler_options = compiler_options
    self.partitioner = partitioner
    self.configs: dict[str, PairConfig | SimulatedTable2Config] = {
        "pair": pair_config, "simulated": simulated_config}
    self._pairs: dict[str, Pair] = {}
    self._decoders: dict[str, PairDecoders] = {}
    self._steps: dict[tuple, float] = {}

  def pair(self, which: str) -> Pair:
    if which not in self._pairs:
      if which == "pair":
        self._pairs[which] = build_pair(self.configs[which])
      else:
        self._pairs[which] = random_pair(f"{SIMULATED} T5.1.1", self.configs[which],
                                         _SIMULATED_NUM_INPUTS)
    return self._pairs[which]

  def decoders(self, which: str) -> PairDecoders:
    if which not in self._decoders:
      self._decoders[which] = PairDecoders(self.pair(which), self.compiler_options,
                                            self.partitioner)
    return self._decoders[which]

  def calls(self, which: str, batch_size: int, calls: tuple[tuple[Any, ...], ...]) -> float:
    """`call_sequence_seconds` of the pair's ('target' | 'draft', tokens fed[, one_logits])
    calls at its decode shapes, measured once."""
    key = (which, batch_size, calls)
    if key not in self._steps:
      pair, config = self.pair(which), self.configs[which]
      self._steps[key] = call_sequence_seconds(
          [(getattr(pair, model), *rest) for model, *rest in calls], batch_size,
          pair.inputs.shape[1], pair.decode_length, config.step_calls,
          config.step_repetitions, self.compiler_options)
    return self._steps[key]

  def step(self, which: str, model: str, batch_size: int, num_tokens: int) -> float:
    """Seconds of one call of the pair's 'target' or 'draft' alone."""
    return self.calls(which, batch_size, ((model, num_tokens),))

  def costs(self, which: str, batch_size: int, gamma: int) -> dict[str, float]:
    """c = draft 1-token call / target 1-token call, v = target (gamma+1)-token call / target
    1-token call (each model timed alone), the step times they come from, and the seconds of
    one fixed-gamma iteration's model calls made in the engine's order (draft: the 2-token
    catch-up, which asks for one token's logits, and gamma - 1 one-token calls; target: the
    (gamma+1)-token call) in one loop —
    on a CPU whose cache holds the target alone but not both models, more than the sum."""
    target_step = self.step(which, "target", batch_size, 1)
    draft_step = self.step(which, "draft", batch_size, 1)
    verify_step = self.step(which, "target", batch_size, gamma + 1)
    iteration = self.calls(which, batch_size,
                           (("draft", 2, True),) + (("draft", 1),) * (gamma - 1)
                           + (("target", gamma + 1),))
    return {"c": draft_step / target_step, "v": verify_step / target_step,
            "target_step_s": target_step, "draft_step_s": draft_step,
            "verify_step_s": verify_step, "iteration_calls_s": iteration,
            "interleaved_over_isolated": iteration / (verify_step + gamma * draft_step)}
