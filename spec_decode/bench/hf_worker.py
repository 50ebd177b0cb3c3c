"""Hugging Face `generate` in a process of its own, for the peer suite: JAX's and PyTorch's
thread pools contend when one process holds both, so each framework runs alone while the other
waits on a pipe.

`python -m spec_decode.bench.hf_worker DIRECTORY GAMMA NUM_THREADS ASSISTANT_SCHEDULE EOS_ID
MAX_NEW_TOKENS DEVICE` (started by `suites.peer.HuggingFaceWorker`). DIRECTORY holds `target/`
and `draft/`, folders written by `hf_format.save_hf`; EOS_ID -1 = no EOS (every row runs to
MAX_NEW_TOKENS). PyTorch uses NUM_THREADS threads; the assistant drafts GAMMA tokens per
iteration with ASSISTANT_SCHEDULE ('constant' or Hugging Face's 'heuristic'). DEVICE: 'cpu',
'cuda' or 'auto' (CUDA when torch sees it, else the CPU).

Protocol, one JSON object per line:
  worker -> parent, once the models are loaded: {"torch_version", "transformers_version",
    "torch_device"}, or {"error": message} (e.g. torch or transformers missing, no CUDA
    device for DEVICE 'cuda') and the worker exits.
  parent -> worker: {"input_ids": [n] ints (no padding), "temperature": float, "assisted": bool,
    "seed": int}; EOF ends the worker.
  worker -> parent: {"seconds": the generate call alone, "new_tokens": [m] ints, the tokens
    after the decoder start token}, or {"error": "Type: message"}.
stdout carries the protocol alone: whatever the libraries print goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO


class _Generator:
  """The exported target and draft as `T5ForConditionalGeneration` models (float32) on
  `device`."""

  def __init__(self, directory: str, gamma: int, num_threads: int, assistant_schedule: str,
               eos_id: int | None, max_new_tokens: int, device: str):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.torch, self.transformers = torch, transformers
    if device == "auto":
      device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
      raise RuntimeError("torch sees no CUDA device")
    self.device = torch.device(device)
    torch.set_num_threads(num_threads)
    # generate() warns about its own assistant's internal arguments on every assisted call,
    # and loading draws progress bars: neither belongs in the benchmark's output.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    self.target, self.draft = (
        transformers.T5ForConditionalGeneration.from_pretrained(
            os.path.join(directory, name), dtype=torch.float32).to(self.device).eval()
        for name in ("target", "draft"))
    self.eos_id, self.max_new_tokens = eos_id, max_new_tokens
    for model in (self.target, self.draft):
      # generate() fills every unset (None) option from the model's own generation config, so
      # a pair without EOS must clear it there: save_hf writes eos_token_id 1.
      model.generation_config.eos_token_id = eos_id
    self.draft.generation_config.num_assistant_tokens = gamma
    self.draft.generation_config.num_assistant_tokens_schedule = assistant_schedule
    # 0 disables the assistant's own confidence stop: it drafts gamma tokens, as ours does.
    self.draft.generation_config.assistant_confidence_threshold = 0.0

  def generate(self, input_ids: list[int], temperature: float, assisted: bool, seed: int
               ) -> dict[str, Any]:
    torch = self.torch
    # top_k=0: the full distribution, as ours (Hugging Face's default is 50).
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0 else {"do_sample": False})
    generation_config = self.transformers.GenerationConfig(
        max_new_tokens=self.max_new_tokens, num_beams=1, use_cache=True,
        decoder_start_token_id=0, eos_token_id=self.eos_id, pad_token_id=0, **sampling)
    torch.manual_seed(seed)
    input_tensor = torch.tensor([input_ids], dtype=torch.int64, device=self.device)
    with torch.inference_mode():
      self._synchronize()
      start = time.perf_counter()
      output = self.target.generate(input_tensor, generation_config=generation_config,
                                    assistant_model=self.draft if assisted else None)
      self._synchronize()  # CUDA runs asynchronously: the time ends when its work does
      seconds = time.perf_counter() - start
    return {"seconds": seconds, "new_tokens": output[0, 1:].tolist()}

  def _synchronize(self) -> None:
    if self.device.type == "cuda":
      self.torch.cuda.synchronize(self.device)


def _send(stream: TextIO, message: dict[str, Any]) -> None:
  stream.write(json.dumps(message) + "\n")
  stream.flush()


def serve(argv: list[str]) -> None:
  """Loads the models, then answers requests from stdin until EOF."""
  protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints go to stderr from here on
  directory, gamma, num_threads, schedule, eos_id, max_new_tokens, device = argv
  try:
    generator = _Generator(directory, int(gamma), int(num_threads), schedule,
                           None if int(eos_id) < 0 else int(eos_id), int(max_new_tokens),
                           device)
  except (ImportError, RuntimeError) as e:
    _send(protocol, {"error": f"Hugging Face peer unavailable: {e}"})
    return
  _send(protocol, {"torch_version": generator.torch.__version__,
                   "transformers_version": generator.transformers.__version__,
                   "torch_device": str(generator.device)})
  for line in sys.stdin:
    request = json.loads(line)
    try:
      reply = generator.generate(request["input_ids"], request["temperature"],
                                 request["assisted"], request["seed"])
    except Exception as e:  # pylint: disable=broad-except
      # Sent, not raised: the parent records it beside every other result.
      reply = {"error": f"{type(e).__name__}: {e}"}
    _send(protocol, reply)


if __name__ == "__main__":
  serve(sys.argv[1:])
