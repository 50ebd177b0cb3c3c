"""The peer suite: the pair's weights exported with `hf_checkpoints.save_hf` and decoded by Hugging
Face `T5ForConditionalGeneration.generate` (PyTorch, CPU) without and with `assistant_model`,
interleaved with our baseline and speculative decoders, batch 1; at temperature 0, whether each
output is our baseline's token for token.

torch and transformers are optional: without them the suite records why it did not run.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from typing import Any, Sequence

import jax
import numpy as np

from spec_decode.bench.config import PeerConfig
from spec_decode.bench.decoders import RunOutput, Variant, generated_lengths
from spec_decode.bench.machine import usable_cores
from spec_decode.bench.pairs import Pair
from spec_decode.bench.timing import interleave, summarize
from spec_decode.bench.workspace import Workspace
from spec_decode.t5 import hf_checkpoints
from spec_decode.t5 import vocab


class HuggingFacePair:
  """The pair's weights as Hugging Face `T5ForConditionalGeneration` models (PyTorch, CPU),
  exported with `hf_checkpoints.save_hf`; `run(temperature, assisted, repetition)` decodes the
  pair's batch-1 input of that repetition with `generate` and returns a RunOutput."""

  def __init__(self, pair: Pair, directory: str, gamma: int, num_threads: int,
               assistant_schedule: str):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self._torch, self._transformers = torch, transformers
    torch.set_num_threads(num_threads)
    # generate() warns about its own assistant's internal arguments on every assisted call,
    # and loading draws progress bars: neither belongs in the benchmark's output.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    loaded = {}
    for name in ("target", "draft"):
      model = getattr(pair, name)
      path = os.path.join(directory, name)
      hf_checkpoints.save_hf(model.config, jax.device_get(model.params), path)
      loaded[name] = transformers.T5ForConditionalGeneration.from_pretrained(
          path, dtype=torch.float32).eval()
    self.target, self.draft = loaded["target"], loaded["draft"]
    self.pair = pair
    self.eos_id = pair.eos_id if pair.has_eos else None
    for model in (self.target, self.draft):
      # generate() fills every unset (None) option from the model's own generation config, so
      # a pair without EOS must clear it there: save_hf writes eos_token_id 1.
      model.generation_config.eos_token_id = self.eos_id
    self.draft.generation_config.num_assistant_tokens = gamma
    self.draft.generation_config.num_assistant_tokens_schedule = assistant_schedule
    # 0 disables the assistant's own confidence stop: it drafts gamma tokens, as ours does.
    self.draft.generation_config.assistant_confidence_threshold = 0.0

  def run(self, temperature: float, assisted: bool, repetition: int) -> RunOutput:
    torch = self._torch
    max_decode_len = self.pair.max_decode_len
    tokens = self.pair.batch(repetition, 1)[0]
    input_ids = torch.tensor(tokens[tokens > 0][None].astype(np.int64))
    # top_k=0: the full distribution, as ours (Hugging Face's default is 50).
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0 else {"do_sample": False})
    generation_config = self._transformers.GenerationConfig(
        max_new_tokens=max_decode_len, num_beams=1, use_cache=True,
        decoder_start_token_id=0, eos_token_id=self.eos_id, pad_token_id=0, **sampling)
    torch.manual_seed(repetition)
    with torch.inference_mode():
      start = time.perf_counter()
      output = self.target.generate(input_ids, generation_config=generation_config,
                                    assistant_model=self.draft if assisted else None)
      seconds = time.perf_counter() - start
    new_tokens = output[:, 1:].numpy()  # after the decoder start token
    decodes = np.zeros((1, max_decode_len), np.int32)
    decodes[:, :new_tokens.shape[1]] = new_tokens
    return RunOutput(seconds, int(generated_lengths(new_tokens, self.pair.eos_id).sum()),
                     decodes)


def greedy_agreement(reference: Sequence[RunOutput], other: Sequence[RunOutput],
                     eos_id: int) -> dict[str, Any]:
  """Token-for-token agreement of two decoders' batch-1 outputs on the same inputs, each up to
  and including its first EOS."""
  identical, first_differences = 0, []
  for ref, out in zip(reference, other):
    ref_tokens = np.asarray(vocab.until_eos(ref.decodes[0].tolist(), eos_id))
    out_tokens = np.asarray(vocab.until_eos(out.decodes[0].tolist(), eos_id))
    if np.array_equal(ref_tokens, out_tokens):
      identical += 1
      continue
    common = min(len(ref_tokens), len(out_tokens))
    differs = np.nonzero(ref_tokens[:common] != out_tokens[:common])[0]
    first_differences.append(int(differs[0]) if len(differs) else common)
  return {"identical": identical, "compared": len(reference),
          "all_identical": identical == len(reference),
          "first_difference_positions": first_differences}


def peer_suite(workspace: Workspace, config: PeerConfig, scratch_dir: str) -> dict[str, Any]:
  """Per temperature, batch 1: ours (baseline, speculative) and Hugging Face's (generate,
  assisted generate) interleaved on the same inputs; at temperature 0, whether each output is
  ours baseline's token for token. The exported models live in a temporary folder of
  `scratch_dir`."""
  pair, decoders = workspace.pair("pair"), workspace.decoders("pair")
  gamma = workspace.configs["pair"].gamma
  num_threads = config.num_threads or usable_cores()
  result: dict[str, Any] = {"pair": pair.name, "batch_size": 1, "gamma": gamma,
                            "torch_num_threads": num_threads, "jax_usable_cores": usable_cores(),
                            "assistant_schedule": config.assistant_schedule,
                            "max_decode_len": pair.max_decode_len, "temperatures": []}
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    result["error"] = f"Hugging Face peer unavailable: {e}"
    return result
  result.update(torch_version=torch.__version__, transformers_version=transformers.__version__)
  with tempfile.TemporaryDirectory(dir=scratch_dir) as directory:
    hf = HuggingFacePair(pair, directory, gamma, num_threads, config.assistant_schedule)
    for temperature in config.temperatures:
      runs = {
          "ours baseline": functools.partial(decoders.run, Variant(temperature), batch_size=1),
          "ours speculative": functools.partial(decoders.run, Variant(temperature, gamma),
                                                batch_size=1),
          "hf generate": functools.partial(hf.run, temperature, False),
          "hf assisted": functools.partial(hf.run, temperature, True),
      }
      entry: dict[str, Any] = {"temperature": temperature}
      try:
        outputs = interleave(runs, config.repetitions)
      except Exception as e:  # pylint: disable=broad-except
        # Recorded, not raised: e.g. a transformers cache that rejects unequal encoder and
        # decoder depths must not hide every other result.
        entry["error"] = f"{type(e).__name__}: {e}"
        result["temperatures"].append(entry)
        continue
      summaries = {label: summarize(out) for label, out in outputs.items()}
      rate = {label: summary["tokens_per_s"] for label, summary in summaries.items()}
      entry.update(summaries)
      entry["ours_speedup"] = rate["ours speculative"] / rate["ours baseline"]
      entry["hf_speedup"] = rate["hf assisted"] / rate["hf generate"]
      entry["ours_speculative_over_hf_assisted"] = rate["ours speculative"] / rate["hf assisted"]
      entry["ours_baseline_over_hf_generate"] = rate["ours baseline"] / rate["hf generate"]
      if temperature == 0:
        entry["greedy_agreement_with_ours_baseline"] = {
            label: greedy_agreement(outputs["ours baseline"], outputs[label], pair.eos_id)
            for label in ("ours speculative", "hf generate", "hf assisted")}
      result["temperatures"].append(entry)
  return result
