"""Checkpoints: locating, identifying, reading, slicing and checking them, in every format.

  formats            which format a path is (`locate`, once per run), a network's parameters from
                     any of them, checked (`load_params`), a checkpoint's config without its
                     weights (`checkpoint_config`)
  t5x_format         T5X checkpoints (legacy msgpack, TensorStore, Orbax), both ways, read whole
                     or slice by slice (`open_t5x_params`, `read_slice`: sharded restores); the
                     parameter tree every format shares (T5X's names), its shapes and checks
  hf_format          Hugging Face T5 folders, both ways
  hf_hub             Hugging Face Hub ids (hf://ORG/NAME) as folders in the Hub's cache
  demo_pair          the shipped demo pair's file format (float16 safetensors + its T5Config)
  architecture       a T5X checkpoint's config, told by its parameters' shapes
  checkpoint_faults  a truncated, corrupt or non-finite checkpoint named in one line
  storage            local and gs:// files, read alike (gs:// within a bounded wait)
  ngram_format       unigram and bigram drafts (`engine.ngram.NGramModel`) as .npz files

The network itself (`spec_decode.t5.network`: T5Config, the parameter tree a config has) and
the vocabulary stay in `spec_decode/t5/`: they are T5's architecture, which a checkpoint is
read for, not files. This package reads T5's tree, so it sits above `t5/`; `storage` imports
nothing of the package, and `t5/vocab` reads gs:// vocabularies through it.
"""
