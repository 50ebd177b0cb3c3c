"""Random tiny Hugging Face T5 models and the same weights as our params, for parity tests.

`hf_model_and_params(directory, name, seed)` builds a random
`transformers.T5ForConditionalGeneration` from `HF_CONFIGS[name]`, saves it with
`save_pretrained(directory)` and loads that folder with `spec_decode.checkpoints.hf_format.load_hf`,
returning `(hf_model in eval mode, T5Config, params)`. Requires torch and transformers; tests
that use them are marked `needs_hf` (the "test" extra installs both on Python 3.11 only: see
setup.py).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="torch and transformers are not installed (the 'test' extra, Python 3.11)")

# Tiny configurations covering both T5 generations; every one has num_heads * d_kv != d_model
# and unequal encoder/decoder depths so that a transposed or misrouted weight cannot hide.
HF_CONFIGS = {
    # T5 1.0: ReLU MLP, logits through the shared embedding scaled by 1/sqrt(d_model).
    "t5_1_0": dict(vocab_size=96, d_model=16, d_kv=6, d_ff=40, num_heads=4, num_layers=2,
                   num_decoder_layers=3, feed_forward_proj="relu", tie_word_embeddings=True),
    # T5.1.1: gated-gelu MLP, separate lm_head, non-default relative-position buckets.
    "t5_1_1": dict(vocab_size=96, d_model=12, d_kv=8, d_ff=28, num_heads=3, num_layers=3,
                   num_decoder_layers=2, feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False, relative_attention_num_buckets=16,
                   relative_attention_max_distance=20),
}


def random_hf_model(name: str, seed: int):
  """A random T5ForConditionalGeneration (eval mode) for `HF_CONFIGS[name]`.

  HF initializes every layer norm to 1 and, in transformers 5, shares lm_head with the
  embedding even for untied configs; both are re-drawn here so that a swapped norm or a
  wrongly tied head changes the outputs.
  """
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(transformers.T5Config(**HF_CONFIGS[name]))
  with torch.no_grad():
    for param_name, param in model.named_parameters():
      if "layer_norm" in param_name:
        param.uniform_(0.5, 1.5)
    if not HF_CONFIGS[name]["tie_word_embeddings"]:
      model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
  return model.eval()


def hf_model_and_params(directory: str, name: str, seed: int = 0):
  """(hf_model, T5Config, params): a random HF model saved to `directory` and loaded back."""
  from spec_decode.checkpoints import hf_format  # pylint: disable=g-import-not-at-top

  model = random_hf_model(name, seed)
  model.save_pretrained(os.fspath(directory))
  config, params = hf_format.load_hf(directory)
  return model, config, params
