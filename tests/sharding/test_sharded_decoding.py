"""Sharded decoding (`spec_decode.runtime.partitioning`) on 8 simulated CPU devices.

For every mesh (data, model) in (1, 8), (2, 4), (4, 2), (8, 1), speculative decoding of a small
random T5 pair gives exactly the tokens and statistics (scores to float rounding) of the same
decode on one device, greedy and sampled with the same rng; the baseline decoder likewise on one
mesh. Parameters are really split, the compiled loop does not reshard the caches, and meshes
that do not fit are ValueErrors raised before anything compiles.

Compiles are the cost here (each one is the whole engine), so each (mesh, mode) compiles once
and every test reads the cached result.
"""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import core
from spec_decode.engine import decoding
from spec_decode.t5 import network
from spec_decode.runtime import decode_layout
from spec_decode.runtime import partitioning
from spec_decode.aot import programs

# Run at the newest supported JAX too (pytest.ini: the tiers).
pytestmark = pytest.mark.newest

MESH_SHAPES = [(1, 8), (2, 4), (4, 2), (8, 1)]
EOS = 1
GAMMA = 3
BATCH, INPUT_LENGTH, DECODE_LENGTH = 8, 6, 10
# Every split dimension (heads, joined_kv, mlp, vocab) is divisible by 8.
TARGET = network.T5Config(vocab_size=64, emb_dim=16, num_heads=8, head_dim=2,
                          num_encoder_layers=1, num_decoder_layers=2, mlp_dim=16,
                          mlp_activations=("gelu", "linear"), dropout_rate=0.0)
DRAFT = network.T5Config(vocab_size=64, emb_dim=8, num_heads=8, head_dim=1,
                         num_encoder_layers=1, num_decoder_layers=1, mlp_dim=8,
                         mlp_activations=("relu",), dropout_rate=0.0,
                         logits_via_embedding=True)
MODES = {"greedy": dict(temperature=0.0, num_decodes=1),
         "sampled": dict(temperature=1.0, num_decodes=2)}
RNG = jax.random.PRNGKey(7)


def _init(config: network.T5Config, seed: int):
  tokens = jnp.ones((1, 1), jnp.int32)
  variables = network.Transformer(config).init(jax.random.PRNGKey(seed), tokens, tokens, tokens)
  return variables["params"]


@functools.cache
def _problem():
  """(target params, draft params, encoder_input_tokens [B, Le], decoder_inputs [B, L])."""
  rng = np.random.default_rng(0)
  encoder_input_tokens = rng.integers(2, TARGET.vocab_size, (BATCH, INPUT_LENGTH)).astype(np.int32)
  encoder_input_tokens[::2, 4:] = 0  # padding
  decoder_inputs = np.zeros((BATCH, DECODE_LENGTH), np.int32)
  decoder_inputs[1::3, 1:3] = rng.integers(2, TARGET.vocab_size, (len(range(1, BATCH, 3)), 2))
  return _init(TARGET, 1), _init(DRAFT, 2), encoder_input_tokens, decoder_inputs


@functools.partial(jax.jit, static_argnames=("temperature", "num_decodes"))
def _single_device_speculative(params, draft_params, encoder_input_tokens, decoder_inputs, rng,
                               temperature, num_decodes):
  """The reference: the engine and the network on one device, without the partitioning module."""
  length = decoder_inputs.shape[1]
  return decoding.speculative_sample(
      decoder_inputs, network.init_decode_cache(TARGET, params, encoder_input_tokens, length),
      network.make_tokens_to_logits(TARGET, params), EOS,
      draft_cache=network.init_decode_cache(DRAFT, draft_params, encoder_input_tokens, length),
      draft_tokens_to_logits=network.make_tokens_to_logits(DRAFT, draft_params), gamma=GAMMA,
      decode_rng=rng, temperature=temperature, num_decodes=num_decodes)


def _partition_decoders(partitioner, target=TARGET, draft=DRAFT, draft_logical_axis_rules=None,
                        num_decodes=1, loop="speculative_sample", draft_source="model",
                        lookup_min_ngram=None, **settings):
  """The core's decoders (`core.Decoder.predict`, all decodes, decoder inputs forced as
  prompts) partitioned on the layout of target and draft: .baseline(params, encoder tokens,
  decoder inputs, rng) and .speculative(params, draft params, ...) -> (decodes [B, n, L],
  scores [B, n], aux), and the parameters' shardings. `loop` (gamma GAMMA for
  'speculative_sample') with the drafts of `draft_source` (`core.make_draft`, its lookup's
  `lookup_min_ngram`)."""
  layout = decode_layout.decode_layout(partitioner, target, draft, draft_logical_axis_rules)

  def partitioned(decoder):
    def decode(params, draft_params, encoder_input_tokens, decoder_inputs, rng):
      batch = {"encoder_input_tokens": encoder_input_tokens,
               "decoder_input_tokens": decoder_inputs}
      decodes, aux = decoder.predict(params, draft_params, batch, EOS, rng,
                                     return_all_decodes=True, num_decodes=num_decodes,
                                     prompt_with_targets=True, calls=layout)
      return decodes, aux.pop("scores"), aux
    kinds = ("target", "draft" if decoder.uses_draft else None, "batch", "batch", "replicated")
    return layout.partition(decode, kinds)

  if loop == "speculative_sample":
    settings = {"gamma": GAMMA, **settings}
  speculative = core.Decoder.create(
      loop, network.Transformer(target),
      core.make_draft(draft_source, None if draft is None else network.Transformer(draft),
                      lookup_min_ngram=lookup_min_ngram), **settings)
  baseline = partitioned(speculative.baseline())
  return types.SimpleNamespace(
      params_shardings=layout.params_shardings,
      draft_params_shardings=layout.draft_params_shardings,
      speculative=partitioned(speculative),
      baseline=lambda params, *args: baseline(params, None, *args))


@functools.cache
def _reference(mode: str):
  params, draft_params, encoder_input_tokens, decoder_inputs = _problem()
  return jax.device_get(_single_device_speculative(
      params, draft_params, encoder_input_tokens, decoder_inputs, RNG, **MODES[mode]))


@functools.cache
def _sharded(mesh_shape: tuple[int, int], mode: str):
  """(decoders, placed target params, placed draft params, compiled speculative, outputs)."""
  params, draft_params, encoder_input_tokens, decoder_inputs = _problem()
  partitioner = partitioning.PjitPartitioner(mesh_shape=mesh_shape)
  decoders = _partition_decoders(partitioner, **MODES[mode])
  params = jax.device_put(params, decoders.params_shardings)
  draft_params = jax.device_put(draft_params, decoders.draft_params_shardings)
  args = (params, draft_params, encoder_input_tokens, decoder_inputs, RNG)
  compiled = decoders.speculative.lower(*args).compile()
  return decoders, params, draft_params, compiled, jax.device_get(compiled(*args))


def _assert_same_decodes(got, want):
  np.testing.assert_array_equal(got[0], want[0])  # tokens
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)  # log-probabilities
  if len(want) > 2:  # speculative statistics
    for name in ("target_calls", "draft_calls", "accepted_tokens", "generated_tokens",
                 "verified_positions"):
      np.testing.assert_array_equal(got[2][name], getattr(want[2], name), err_msg=name)
    np.testing.assert_allclose(got[2]["acceptance_sum"], want[2].acceptance_sum, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_speculative_decoding_matches_one_device(mesh_shape, mode):
  *_, outputs = _sharded(mesh_shape, mode)
  reference = _reference(mode)
  _assert_same_decodes(outputs, reference)
  assert outputs[0].shape == (BATCH, MODES[mode]["num_decodes"], DECODE_LENGTH)
  assert np.all(outputs[2]["generated_tokens"] > 0)


def test_references_are_not_trivial():
  """Drafts are both accepted and rejected, and the sampled decodes are not the greedy ones."""
  for mode in MODES:
    stats = _reference(mode)[2]
    assert 0 < stats.accepted_tokens.sum() < stats.drafted_tokens.sum(), mode
  assert not np.array_equal(_reference("sampled")[0][:, -1], _reference("greedy")[0][:, 0])


def test_baseline_matches_one_device():
  params, _, encoder_input_tokens, decoder_inputs = _problem()
  reference = jax.jit(lambda p, e, d, r: decoding.temperature_sample(
      d, network.init_decode_cache(TARGET, p, e, d.shape[1]),
      network.make_tokens_to_logits(TARGET, p), EOS, decode_rng=r, num_decodes=2))(
          params, encoder_input_tokens, decoder_inputs, RNG)
  decoders, placed, *_ = _sharded((2, 4), "sampled")
  outputs = decoders.baseline(placed, encoder_input_tokens, decoder_inputs, RNG)
  _assert_same_decodes(jax.device_get(outputs)[:2], jax.device_get(reference))


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES, ids=str)
def test_parameters_are_split_and_draft_replicated(mesh_shape):
  _, params, draft_params, *_ = _sharded(mesh_shape, "greedy")
  num_partitions = mesh_shape[1]
  for name in ("wi_0", "wo"):  # [E, mlp] and [mlp, E]
    kernel = params["decoder"]["layers_1"]["mlp"][name]["kernel"]
    largest = max(shard.data.size for shard in kernel.addressable_shards)
    assert largest * num_partitions == kernel.size, name
  embedding = params["token_embedder"]["embedding"]  # [vocab, embed]: vocab split
  assert embedding.addressable_shards[0].data.shape == (TARGET.vocab_size // num_partitions,
                                                        TARGET.emb_dim)
  for leaf in jax.tree_util.tree_leaves(draft_params):
    assert all(shard.data.shape == leaf.shape for shard in leaf.addressable_shards)
    assert len(leaf.addressable_shards) == 8


def test_draft_may_follow_its_own_rules():
  partitioner = partitioning.PjitPartitioner(mesh_shape=(2, 4))
  decoders = _partition_decoders(
      partitioner, draft_logical_axis_rules=partitioning.standard_logical_axis_rules())
  spec = decoders.draft_params_shardings["decoder"]["layers_0"]["mlp"]["wi"]["kernel"].spec
  assert tuple(spec) == (None, "model")


# --------------------------------------------------------------------------- the compiled loop

def comparable_loop_collectives(compiled: jax.stages.Compiled) -> list[tuple[str, str]]:
  """`collectives_in_loop` of a compiled decode, sorted, each op_name without the jitted
  function's name: what two decoders' loops are compared by."""
  return sorted((op, name.split("/", 1)[1])
                for op, name in programs.collectives_in_loop(compiled.as_text()))


@pytest.fixture(scope="module")
def loop_collectives():
  *_, compiled, _ = _sharded((2, 4), "sampled")
  found = programs.collectives_in_loop(compiled.as_text())
  assert any(op == "all-reduce" for op, _ in found), "the HLO parser found no loop collectives"
  return found


def test_model_calls_in_the_loop_only_all_reduce(loop_collectives):
  """Inside the loop each model call keeps its cache in place: the only collectives of the
  model are the all-reduces of the 'model'-split matmuls (attention out, mlp wo, embedding)."""
  model_ops = [(op, name) for op, name in loop_collectives if "decode_chunk" in name]
  assert model_ops and {op for op, _ in model_ops} == {"all-reduce"}, model_ops


def test_the_loop_has_no_all_to_all(loop_collectives):
  assert not [c for c in loop_collectives if c[0] == "all-to-all"]


def test_the_loop_never_permutes(loop_collectives):
  assert not [c for c in loop_collectives if c[0] == "collective-permute"], loop_collectives


# --------------------------------------------------------------------------- errors


def test_more_partitions_than_devices():
  with pytest.raises(ValueError, match=r"num_partitions=16 needs at least 16 devices, but only 8"):
    partitioning.PjitPartitioner(num_partitions=16)
  with pytest.raises(ValueError, match=r"num_partitions=3 does not divide the 8 devices"):
    partitioning.PjitPartitioner(num_partitions=3)
  with pytest.raises(ValueError, match=r"mesh_shape \(4, 4\) needs 16 devices, but only 8"):
    partitioning.PjitPartitioner(mesh_shape=(4, 4))


def test_num_partitions_takes_the_remaining_devices_for_data():
  assert dict(partitioning.PjitPartitioner(num_partitions=2).mesh.shape) == {"data": 4, "model": 2}


@pytest.mark.parametrize("field,size,mesh_shape,message", [
    ("num_heads", 6, (2, 4), r"'heads' of size 6 is split over mesh axis model of size 4"),
    ("mlp_dim", 12, (1, 8), r"'mlp' of size 12 is split over mesh axis model of size 8"),
])
def test_mesh_must_divide_heads_and_mlp(field, size, mesh_shape, message):
  config = dataclasses.replace(TARGET, **{field: size})
  partitioner = partitioning.PjitPartitioner(mesh_shape=mesh_shape)
  with pytest.raises(ValueError, match=message):
    _partition_decoders(partitioner, target=config)


def test_mesh_must_divide_the_batch():
  params, draft_params, encoder_input_tokens, decoder_inputs = _problem()
  partitioner = partitioning.PjitPartitioner(mesh_shape=(4, 2))
  decoders = _partition_decoders(partitioner)
  with pytest.raises(ValueError, match=r"'batch' of size 6 is split over mesh axis data of size 4"):
    decoders.speculative.lower(params, draft_params, encoder_input_tokens[:6],
                               decoder_inputs[:6], RNG)


def test_unknown_logical_axis_and_mesh_axis_are_named():
  with pytest.raises(ValueError, match=r"mesh axes \['pipeline'\]"):
    partitioning.PjitPartitioner(num_partitions=1, logical_axis_rules=[("batch", "pipeline")])
  partitioner = partitioning.PjitPartitioner(
      num_partitions=1, logical_axis_rules=[("batch", "data")])
  with pytest.raises(ValueError, match=r"logical axes \[.*\] have no partitioning rule"):
    _partition_decoders(partitioner, draft=None)
