"""The models the benchmark times: `Model` (a network with its parameters) and `Pair` (a target,
its draft and the inputs they decode).

  shipped_pair(texts, ...)   the shipped demo pair (spec_decode/assets/demo) on given English
                             texts; `demo_files_exist()` says whether it is shipped.
  random_pair(name, config)  random weights with the config's model gin files, random inputs,
                             no EOS (every row decodes to the length limit).
  near_bigram_pair(config)   a random-weight target with damped residual branches and a
                             1+1-layer draft made of its own parameters, which agree most of the
                             time without training; random inputs, no EOS.
  build_pair(PairConfig)     the pair PairConfig.source names.
Inputs are [N, input_length] int32, 0-padded, each row ending in EOS.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from spec_decode import gin_utils
from spec_decode.runtime import platforms
from spec_decode.bench.config import PairConfig, SimulatedTable2Config
from spec_decode.checkpoints import t5x_format
from spec_decode.checkpoints import demo_pair
from spec_decode.t5 import network
from spec_decode.t5 import vocab


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A named network (`network.Network`: T5's or a decoder-only LM) with its parameters (on the
  default device)."""
  name: str
  module: network.Network
  params: Any

  @property
  def config(self) -> network.NetworkConfig:
    return self.module.config

  @property
  def num_params(self) -> int:
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(self.params)))

  def decode_step_trees(self) -> dict[str, Any]:
    """The parameters one cached decoder call reads: {'decoder': the decoder stack and its
    logits layer, without the token embedding} plus {'token_embedder': ...} when the logits go
    through it (otherwise the token lookup reads only a few rows, neglected). T5's embedding is
    beside its stacks, a language model's inside its decoder."""
    decoder = dict(self.params["decoder"])
    embedding = (decoder.pop("token_embedder") if "token_embedder" in decoder
                 else self.params["token_embedder"])
    if self.config.logits_via_embedding:
      return {"decoder": decoder, "token_embedder": embedding}
    return {"decoder": decoder}

  @property
  def decode_step_weight_bytes(self) -> int:
    """Parameter bytes one cached decoder call reads (`decode_step_trees`)."""
    return int(sum(leaf.size * leaf.dtype.itemsize
                   for leaf in jax.tree_util.tree_leaves(self.decode_step_trees())))

  def describe(self) -> dict[str, Any]:
    config = dataclasses.asdict(self.config)
    config["dtype"] = np.dtype(self.config.dtype).name
    return {"name": self.name, "num_params": self.num_params, "config": config}


def random_params(config: network.NetworkConfig, seed: int) -> Any:
  """`t5x_format.random_params` on the default device, in the model's activation dtype (as
  T5X's inference restores a bfloat16 model's checkpoint: in bfloat16, so a step reads what it
  would read there). Drawn on the device itself off CPU (`on_device`: T5.1.1-XXL in seconds);
  on CPU by numpy, whose values the tests pin."""
  on_device = platforms.Platform.default().name != "cpu"
  params = t5x_format.random_params(config, seed, config.dtype, on_device=on_device)
  return params if on_device else jax.device_put(params)


def random_model(name: str, gin_file: str, overrides: Mapping[str, Any], seed: int) -> Model:
  """A model with the config of a model gin file (plus overrides) and random weights
  (`random_params`: only the shapes matter for speed)."""
  module = network.module_of(gin_utils.read_model_config(gin_file, overrides))
  return Model(name, module, random_params(module.config, seed))


@dataclasses.dataclass(frozen=True, eq=False)
class Pair:
  """A target, its draft, the inputs they decode ([N, input_length], 0-padded: encoder inputs, or
  a language model's prompts), the EOS id (`target.config.vocab_size` = none: every row runs to
  its length limit) and `max_decode_len`, an encoder-decoder's decode length (a language model's
  decode holds its input_length prompt positions before those: `decode_length`)."""
  name: str
  target: Model
  draft: Model
  inputs: np.ndarray
  eos_id: int
  max_decode_len: int
  description: str

  @property
  def has_eos(self) -> bool:
    return self.eos_id < self.target.config.vocab_size

  @property
  def decoder_only(self) -> bool:
    return network.is_decoder_only(self.target.config)

  @property
  def decode_length(self) -> int:
    """Positions a decode holds: `max_decode_len`, after an input_length prompt for a language
    model (`network.decode_length`)."""
    return network.decode_length(self.target.config, self.inputs.shape[1], self.max_decode_len)

  def new_tokens(self, tokens: np.ndarray) -> np.ndarray:
    """[B] the tokens each row of a batch of inputs [B, input_length] decodes when no EOS stops
    it: `max_decode_len`, or a language model's `decode_length` less its prompt (a shorter
    prompt leaves more of the decode)."""
    if not self.decoder_only:
      return np.full(tokens.shape[0], self.max_decode_len)
    return self.decode_length - np.asarray(network.prompt_lengths(tokens))

  def batch(self, index: int, batch_size: int) -> np.ndarray:
    """The index-th batch of inputs, cycling through them (each repetition sees new ones)."""
    rows = [(index * batch_size + i) % len(self.inputs) for i in range(batch_size)]
    return self.inputs[rows]

  def describe(self) -> dict[str, Any]:
    return {"name": self.name, "description": self.description, "eos_id": self.eos_id,
            "has_eos": self.has_eos, "decoder_only": self.decoder_only,
            "input_length": int(self.inputs.shape[1]),
            "num_inputs": int(self.inputs.shape[0]), "max_decode_len": self.max_decode_len,
            "target": self.target.describe(), "draft": self.draft.describe()}


def random_inputs(vocab_size: int, input_length: int, count: int, seed: int,
                  prompts: bool = False) -> np.ndarray:
  """`count` rows of random tokens (ids >= 3, past T5's pad/eos/unk) of random length, 0-padded
  to input_length: each ending in EOS, or with `prompts` a language model's prompts (BOS 0, then
  the tokens, no EOS)."""
  rng = np.random.default_rng(seed)
  inputs = np.zeros((count, input_length), np.int32)
  for row in inputs:
    length = int(rng.integers(input_length // 2, input_length))
    tokens = rng.integers(vocab.UNK_ID + 1, vocab_size, length - 1)
    if prompts:
      row[1:length] = tokens
    else:
      row[:length - 1] = tokens
      row[length - 1] = vocab.EOS_ID
  return inputs


def demo_files_exist() -> bool:
  """Whether the shipped demo pair's weights are present (they are optional in a checkout)."""
  return all((demo_pair.ASSET_DIR / f"{name}.safetensors").exists()
             for name in ("target", "draft"))


def shipped_pair(texts: Sequence[str], input_prefix: str, input_length: int,
                 max_decode_len: int, description: str, draft: str = "draft",
                 target: str = "target") -> Pair:
  """The shipped demo pair decoding `texts` (English; prefixed, encoded and cut to input_length
  with EOS kept last, `vocab.trim_with_eos`, then 0-padded); `draft` and `target` other models
  of the demo format and vocabulary (`.safetensors` paths, e.g. a draft distilled by
  `spec_decode.training.draft_distillation`) in place of the shipped ones."""
  if not demo_files_exist():
    raise FileNotFoundError(f"{demo_pair.ASSET_DIR} lacks target.safetensors or draft.safetensors")
  loaded = {}
  for role, name in (("target", target), ("draft", draft)):
    model_config, params = demo_pair.load_model(name)
    label = f"demo {role}" if name == role else f"{role} {name}"
    loaded[role] = Model(label, network.Transformer(model_config), jax.device_put(params))
  vocabulary = vocab.SentencePieceVocabulary(str(demo_pair.VOCAB_PATH))
  inputs = np.zeros((len(texts), input_length), np.int32)
  for row, text in zip(inputs, texts):
    ids = vocab.trim_with_eos(vocabulary.encode(input_prefix + text), input_length,
                              vocabulary.eos_id)
    row[:len(ids)] = ids
  return Pair("demo", loaded["target"], loaded["draft"], inputs, vocabulary.eos_id,
              max_decode_len, description)


def random_pair(name: str, config: PairConfig | SimulatedTable2Config, num_inputs: int
                ) -> Pair:
  """Random weights with the configs' model gin files, random inputs, no EOS."""
  target = random_model(f"{name} target", config.target_gin, config.target_overrides,
                        config.seed)
  draft = random_model(f"{name} draft", config.draft_gin, config.draft_overrides,
                       config.seed + 1)
  vocab_size = target.config.vocab_size
  inputs = random_inputs(vocab_size, config.input_length, num_inputs, config.seed,
                         prompts=network.is_decoder_only(target.config))
  return Pair(name, target, draft, inputs, vocab_size, config.max_decode_len,
              f"random weights ({config.target_gin}, {config.draft_gin}), random inputs, no EOS")


# PairConfig.source's values.
PAIR_SOURCES = ("auto", "demo", "random", "near_bigram")
# The parameters a residual branch ends in (attention output and MLP output projections):
# scaling them scales what each sublayer adds to the residual stream.
_RESIDUAL_OUTPUTS = ("out", "wo")


def _scaled(tree: Mapping[str, Any], scale: float) -> dict[str, Any]:
  """A copy of a parameter tree with every `out`/`wo` kernel multiplied by `scale` (the other
  leaves are the same arrays)."""
  result = {}
  for key, value in tree.items():
    if key in _RESIDUAL_OUTPUTS:
      kernel = value["kernel"]
      result[key] = {"kernel": (kernel * np.float32(scale)).astype(kernel.dtype)}
    elif isinstance(value, Mapping):
      result[key] = _scaled(value, scale)
    else:
      result[key] = value
  return result


def near_bigram_pair(config: PairConfig) -> Pair:
  """A target and draft that agree most of the time without training.

  Target: random weights (`random_params`) with the config of `config.target_gin`
  plus `target_overrides`, every residual branch (the attention and MLP output kernels
  `out`/`wo` of every stack) scaled by `config.residual_scale`. The residual stream then stays
  close to the current token's embedding, so the target is close to a bigram model: its next
  token depends mostly on the last one.
  Draft: the same config with one layer per stack (an encoder-decoder's encoder and decoder, a
  language model's decoder), whose parameters are the target's own arrays (the same objects,
  not copies): the token embedding, the logits layer, the final norms, the relative-position
  biases and layer 0 of each stack (so its branches are scaled too). The scale sets how often
  they agree (greedy alpha); `draft_gin` is not used.
  Random inputs, no EOS (eos_id = vocab_size).
  """
  if config.residual_scale <= 0:
    raise ValueError(f"PairConfig.residual_scale must be > 0, got {config.residual_scale}")
  target_module = network.module_of(gin_utils.read_model_config(config.target_gin,
                                                                config.target_overrides))
  target_config = target_module.config
  decoder_only = network.is_decoder_only(target_config)
  params = _scaled(random_params(target_config, config.seed), config.residual_scale)
  if decoder_only:
    draft_config = dataclasses.replace(target_config, num_layers=1)
    shared = {"decoder": ("token_embedder", "relpos_bias", "decoder_norm", "layers_0",
                          "logits_dense")}
  else:
    draft_config = dataclasses.replace(target_config, num_encoder_layers=1,
                                       num_decoder_layers=1)
    shared = {"encoder": ("relpos_bias", "encoder_norm", "layers_0"),
              "decoder": ("relpos_bias", "decoder_norm", "layers_0", "logits_dense")}
  # logits_dense exists only in untied models; tied ones share the embedding. T5's embedding is
  # beside its stacks.
  draft_params = {stack: {name: params[stack][name] for name in names if name in params[stack]}
                  for stack, names in shared.items()}
  if "token_embedder" in params:
    draft_params["token_embedder"] = params["token_embedder"]
  name = f"near-bigram {'/'.join(pathlib.PurePath(config.target_gin).with_suffix('').parts[-2:])}"
  layers = "1 layer" if decoder_only else "1+1 layers"
  target = Model(f"{name} target", target_module, params)
  draft = Model(f"{name} draft ({layers})", network.module_of(draft_config), draft_params)
  vocab_size = target_config.vocab_size
  inputs = random_inputs(vocab_size, config.input_length, config.num_random_inputs,
                         config.seed, prompts=decoder_only)
  stacks = "the decoder" if decoder_only else "both stacks"
  description = (
      f"near-bigram pair: random weights ({config.target_gin}), residual branches (attention "
      f"and MLP output kernels, {stacks}) scaled by {config.residual_scale:g}; the draft "
      f"has {layers} and shares the target's arrays (embedding, logits layer, final norms, "
      "relative-position biases, layer 0 of each stack); random inputs, no EOS")
  return Pair(name, target, draft, inputs, vocab_size, config.max_decode_len, description)


def build_pair(config: PairConfig) -> Pair:
  """The pair `config.source` names: 'demo' (the shipped pair on its bundled English
  sentences), 'random', 'near_bigram' (`near_bigram_pair`), or 'auto' (demo when its files
  exist, else random)."""
  if config.source not in PAIR_SOURCES:
    raise ValueError(f"PairConfig.source must be one of {', '.join(map(repr, PAIR_SOURCES))}, "
                     f"got {config.source!r}")
  # Settings only one source reads: bound for another, they could not take effect.
  defaults = PairConfig()
  shipped = config.source == "demo" or (config.source == "auto" and demo_files_exist())
  if config.source == "near_bigram":
    ignored = ("draft_gin", "draft_overrides")
  elif shipped:  # the shipped pair's own models
    ignored = ("residual_scale", "target_gin", "draft_gin", "target_overrides",
               "draft_overrides")
  else:
    ignored = ("residual_scale",)
  for name in ignored:
    if getattr(config, name) != getattr(defaults, name):
      which = " (the shipped demo pair, present)" if config.source == "auto" else ""
      raise ValueError(f"PairConfig.{name} does not apply to PairConfig.source = "
                       f"{config.source!r}{which}: set source = 'random' for other models")
  if config.source == "near_bigram":
    return near_bigram_pair(config)
  if shipped:
    texts = (demo_pair.ASSET_DIR / "examples.en").read_text().splitlines()
    return shipped_pair(texts, config.input_prefix, config.input_length, config.max_decode_len,
                        "the shipped demo pair (spec_decode/assets/demo), bundled English "
                        "sentences")
  return random_pair("random", config, config.num_random_inputs)
