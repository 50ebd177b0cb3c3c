"""Tests of spec_decode.t5.vocab: T5 id conventions, extra ids, decode rules, errors, real vocab."""

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import sentencepiece

import shared_data
from spec_decode.t5.vocab import SentencePieceVocabulary, t5_vocabulary

REAL_VOCAB = shared_data.T5_VOCAB_FILE

_TEXT = ["the quick brown fox jumps over the lazy dog",
         "a house is wonderful and the dog is happy",
         "speculative decoding makes models faster"] * 20


def _train(path: Path, **ids) -> Path:
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(_TEXT), model_writer=model, vocab_size=40, model_type="unigram",
      minloglevel=2, **ids)
  path.write_bytes(model.getvalue())
  return path


@pytest.fixture(scope="module")
def t5_style_model(tmp_path_factory) -> Path:
  """A tiny SentencePiece model with T5's ids: pad 0, eos 1, unk 2, no bos; 40 pieces."""
  return _train(tmp_path_factory.mktemp("spm") / "tiny.model",
                pad_id=0, eos_id=1, unk_id=2, bos_id=-1)


def test_ids_and_sizes(t5_style_model):
  vocab = SentencePieceVocabulary(str(t5_style_model), extra_ids=3)
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (0, 1, 2, -1)
  assert vocab.extra_ids == 3
  assert vocab.vocab_size == 43
  assert SentencePieceVocabulary(str(t5_style_model)).vocab_size == 40


def test_extra_ids_are_numbered_from_the_end(t5_style_model):
  reverse = SentencePieceVocabulary(str(t5_style_model), extra_ids=3)
  assert [reverse.encode(f"<extra_id_{i}>")[-1] for i in range(3)] == [42, 41, 40]
  forward = SentencePieceVocabulary(str(t5_style_model), extra_ids=3, reverse_extra_ids=False)
  assert [forward.encode(f"<extra_id_{i}>")[-1] for i in range(3)] == [40, 41, 42]
  ids = reverse.encode("the dog <extra_id_0> house")
  assert 42 in ids
  assert reverse.decode(ids) == "the dog <extra_id_0> house"


def test_encode_has_no_eos_and_round_trips(t5_style_model):
  vocab = SentencePieceVocabulary(str(t5_style_model))
  ids = vocab.encode("the lazy dog is happy")
  assert ids and vocab.eos_id not in ids and vocab.pad_id not in ids
  assert vocab.decode(ids) == "the lazy dog is happy"


def test_decode_stops_at_eos_drops_pad_and_maps_unknown_ids(t5_style_model):
  vocab = SentencePieceVocabulary(str(t5_style_model), extra_ids=3)
  first, second = vocab.encode("the house"), vocab.encode("is happy")
  assert vocab.decode(first + [vocab.eos_id] + second) == "the house"
  assert vocab.decode([0] + first + [0, 0]) == "the house"
  assert vocab.decode(np.array(first + [1, 0, 0], dtype=np.int32)) == "the house"
  # Ids past the vocabulary (e.g. a checkpoint's padded embedding rows) read as UNK.
  assert vocab.decode([vocab.vocab_size + 5]) == vocab.decode([vocab.unk_id])
  assert "\u2047" in vocab.decode([vocab.unk_id])


def test_pickle_round_trip(t5_style_model):
  vocab = SentencePieceVocabulary(str(t5_style_model), extra_ids=2)
  clone = pickle.loads(pickle.dumps(vocab))
  assert clone == vocab
  assert clone.encode("the fox <extra_id_1>") == vocab.encode("the fox <extra_id_1>")


def test_errors(tmp_path, t5_style_model):
  missing = tmp_path / "missing.model"
  with pytest.raises(FileNotFoundError, match=str(missing)):
    SentencePieceVocabulary(str(missing))
  default_ids = _train(tmp_path / "default.model")  # SentencePiece's defaults: unk 0, bos 1, eos 2
  with pytest.raises(ValueError, match=r"\(pad, eos, unk\)"):
    SentencePieceVocabulary(str(default_ids))
  garbage = tmp_path / "garbage.model"
  garbage.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    SentencePieceVocabulary(str(garbage))
  vocab = SentencePieceVocabulary(str(t5_style_model))
  with pytest.raises(ValueError, match="negative token id -1"):
    vocab.decode([5, -1])


def test_real_t5_vocabulary():
  if not REAL_VOCAB.is_file():
    pytest.skip(shared_data.missing("the real T5 vocabulary"))
  vocab = t5_vocabulary(str(REAL_VOCAB))
  assert vocab.vocab_size == 32100
  text = "translate English to German: The house is wonderful."
  ids = vocab.encode(text)
  assert ids == [13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5]
  assert vocab.decode(ids + [vocab.eos_id, 37]) == text
  assert vocab.encode("<extra_id_0>")[-1] == 32099
  assert vocab.encode("<extra_id_99>")[-1] == 32000
