"""The peer suite: the pair's weights exported with `hf_format.save_hf` and decoded by Hugging
Face `T5ForConditionalGeneration.generate` (PyTorch; on the CPU, or CUDA with
`PeerConfig.torch_device`) without and with `assistant_model`, and, where T5X is installed,
by T5X's standard sampler (`bench.t5x_sampler`: the paper's baseline), interleaved with our
baseline and speculative decoders, batch 1; at temperature 0, whether each output is our
baseline's token for token.

Hugging Face runs in a process of its own (`bench.hf_worker`): while one framework decodes, the
other waits on a pipe, so their thread pools never contend. torch and transformers are optional:
without them the suite records why it did not run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Sequence

import jax
import numpy as np

from spec_decode import paths
from spec_decode.bench import hf_worker
from spec_decode.bench.config import PeerConfig
from spec_decode.bench.decoders import PairDecoders, RunOutput, Variant, generated_lengths
from spec_decode.bench.machine import usable_cores
from spec_decode.bench.pairs import Pair
from spec_decode.bench.t5x_sampler import T5XSampler
from spec_decode.bench.timing import interleave, summarize
from spec_decode.bench.workspace import Workspace
from spec_decode.checkpoints import hf_format
from spec_decode.t5 import vocab


class HuggingFaceWorker:
  """The pair's weights exported to `directory` with `hf_format.save_hf` and served by a
  `bench.hf_worker` process; `run(temperature, assisted, repetition)` sends it the pair's batch-1
  input of that repetition and waits (this process idle) for a RunOutput. Raises RuntimeError
  naming why when the worker cannot serve (e.g. no torch). `close()` ends the worker."""

  def __init__(self, pair: Pair, directory: str, gamma: int, num_threads: int,
               assistant_schedule: str, torch_device: str = "cpu"):
    if pair.decoder_only:
      raise RuntimeError("Hugging Face has no class for T5X's decoder-only language models (T5 "
                         "layers without cross-attention)")
    for name in ("target", "draft"):
      model = getattr(pair, name)
      hf_format.save_hf(model.config, jax.device_get(model.params),
                             os.path.join(directory, name))
    self.pair = pair
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(paths.ROOT)] + [p for p in [environment.get("PYTHONPATH")] if p])
    # The worker keeps OpenMP's own wait policy (set OMP_WAIT_POLICY to change it): on a quiet
    # 2-core EPYC, PASSIVE made torch's 2-thread T5.1.1-base generate slower (13.3 vs 16.0
    # tokens/s); only under load from other work did spinning threads hurt it.
    eos_id = pair.eos_id if pair.has_eos else -1
    self._process = subprocess.Popen(
        [sys.executable, "-m", hf_worker.__name__, directory, str(gamma), str(num_threads),
         assistant_schedule, str(eos_id), str(pair.max_decode_len), torch_device],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment)
    try:
      self.versions = self._receive()
    except RuntimeError:
      self.close()
      raise

  def _receive(self) -> dict[str, Any]:
    line = self._process.stdout.readline()
    if not line:
      raise RuntimeError(f"the Hugging Face worker exited (status {self._process.wait()}); its "
                         "stderr says why")
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(reply["error"])
    return reply

  def run(self, temperature: float, assisted: bool, repetition: int) -> RunOutput:
    tokens = self.pair.batch(repetition, 1)[0]
    request = {"input_ids": tokens[tokens > 0].tolist(), "temperature": temperature,
               "assisted": assisted, "seed": repetition}
    self._process.stdin.write(json.dumps(request) + "\n")
    self._process.stdin.flush()
    reply = self._receive()
    new_tokens = np.asarray(reply["new_tokens"], np.int32)[None]
    decodes = np.zeros((1, self.pair.max_decode_len), np.int32)
    decodes[:, :new_tokens.shape[1]] = new_tokens
    return RunOutput(reply["seconds"],
                     int(generated_lengths(new_tokens, self.pair.eos_id).sum()), decodes)

  def close(self) -> None:
    """Closes the worker's stdin (its signal to exit) and waits for it."""
    self._process.stdin.close()
    self._process.wait()
    self._process.stdout.close()


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


def _compare(hf: HuggingFaceWorker | None, t5x: T5XSampler | None, decoders: PairDecoders,
             gamma: int, temperature: float, repetitions: int) -> dict[str, Any]:
  """One temperature's entry: the decoders interleaved (Hugging Face's and T5X's sampler where
  given), their summaries and ratios, and at temperature 0 the token-for-token agreement with
  ours baseline; an error is recorded, not raised (e.g. a transformers cache that rejects
  unequal encoder and decoder depths must not hide every other result)."""
  runs = {
      "ours baseline": functools.partial(decoders.run, Variant(temperature), batch_size=1),
      "ours speculative": functools.partial(decoders.run, Variant(temperature, gamma),
                                            batch_size=1),
  }
  if hf is not None:
    runs["hf generate"] = functools.partial(hf.run, temperature, False)
    runs["hf assisted"] = functools.partial(hf.run, temperature, True)
  if t5x is not None:
    runs["t5x sampler"] = functools.partial(t5x.run, temperature)
  entry: dict[str, Any] = {"temperature": temperature}
  try:
    outputs = interleave(runs, repetitions)
  except Exception as e:  # pylint: disable=broad-except
    entry["error"] = f"{type(e).__name__}: {e}"
    return entry
  summaries = {label: summarize(out) for label, out in outputs.items()}
  rate = {label: summary["tokens_per_s"] for label, summary in summaries.items()}
  entry.update(summaries)
  entry["ours_speedup"] = rate["ours speculative"] / rate["ours baseline"]
  if hf is not None:
    entry["hf_speedup"] = rate["hf assisted"] / rate["hf generate"]
    entry["ours_speculative_over_hf_assisted"] = rate["ours speculative"] / rate["hf assisted"]
    entry["ours_baseline_over_hf_generate"] = rate["ours baseline"] / rate["hf generate"]
  if t5x is not None:
    entry["ours_speculative_over_t5x_sampler"] = rate["ours speculative"] / rate["t5x sampler"]
    entry["ours_baseline_over_t5x_sampler"] = rate["ours baseline"] / rate["t5x sampler"]
  if temperature == 0:
    entry["greedy_agreement_with_ours_baseline"] = {
        label: greedy_agreement(outputs["ours baseline"], outputs[label], decoders.pair.eos_id)
        for label in runs if label != "ours baseline"}
  return entry


def peer_suite(workspace: Workspace, config: PeerConfig, scratch_dir: str) -> dict[str, Any]:
  """Per temperature, batch 1: ours (baseline, speculative), Hugging Face's (generate, assisted
  generate) and T5X's sampler interleaved on the same inputs (`_compare`), each peer where it
  can run (else 'error' says why Hugging Face did not, 't5x_error' why T5X did not). The
  exported models live in a temporary folder of `scratch_dir`."""
  pair, decoders = workspace.pair("pair"), workspace.decoders("pair")
  gamma = workspace.configs["pair"].gamma
  num_threads = config.num_threads or usable_cores()
  result: dict[str, Any] = {
      "pair": pair.name, "pair_description": pair.description,
      "target_params": pair.target.num_params, "draft_params": pair.draft.num_params,
      "batch_size": 1, "gamma": gamma, "torch_num_threads": num_threads,
      "jax_usable_cores": usable_cores(), "assistant_schedule": config.assistant_schedule,
      "max_decode_len": pair.max_decode_len, "decoder_only": pair.decoder_only,
      "decode_length": pair.decode_length, "temperatures": []}
  with tempfile.TemporaryDirectory(dir=scratch_dir) as directory:
    hf = None
    try:
      hf = HuggingFaceWorker(pair, directory, gamma, num_threads, config.assistant_schedule,
                             config.torch_device)
      result.update(hf.versions)
    except RuntimeError as e:
      result["error"] = str(e)
    try:
      t5x = T5XSampler(pair)
    except RuntimeError as e:
      t5x, result["t5x_error"] = None, str(e)
    if hf is None and t5x is None:
      return result
    try:
      result["temperatures"] = [_compare(hf, t5x, decoders, gamma, temperature,
                                         config.repetitions)
                                for temperature in config.temperatures]
    finally:
      if hf is not None:
        hf.close()
  return result
