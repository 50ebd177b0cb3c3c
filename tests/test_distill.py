"""`spec_decode.training.distill`: the written corpus is line-aligned with the sources and holds the
model's own greedy translations."""

import jax
import sentencepiece as spm

from spec_decode.data import corpora
from spec_decode.checkpoints import demo_pair
from spec_decode.training import distill
from spec_decode.training import greedy
from spec_decode.t5 import network
from spec_decode.training import train


def test_writes_the_models_translations_aligned_with_the_sources(tmp_path):
  config = network.T5Config(vocab_size=8000, dtype="float32", emb_dim=16, num_heads=2,
                            head_dim=8, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32)
  params = train.init_params(config, jax.random.PRNGKey(0))
  demo_pair.save_model(params, config, tmp_path / "tiny.safetensors")
  sources = ["A dog runs.", "Two men talk on a bench \u2028 at night.", "Hello!"]
  (tmp_path / "corpus.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
  (tmp_path / "corpus.de").write_text("x\ny\nz\n", encoding="utf-8")

  distill.main(["--model", str(tmp_path / "tiny.safetensors"), "--corpus", "corpus",
                "--data_root", str(tmp_path), "--output", str(tmp_path / "out" / "train"),
                "--max_decode_len", "8", "--batch_size", "2"])

  _, loaded = demo_pair.load_model(str(tmp_path / "tiny.safetensors"))
  sp = spm.SentencePieceProcessor(model_file=str(demo_pair.VOCAB_PATH))
  expected = [(s, " ".join(t.split()))
              for s, t in zip(sources, greedy.translate(config, loaded, sp, sources, 64, 8, 3))
              if t.strip()]
  assert expected, "the tiny model should translate at least one sentence"
  written_sources, targets = corpora.read_parallel([str(tmp_path / "out" / "train")])
  assert list(zip(written_sources, targets)) == expected
