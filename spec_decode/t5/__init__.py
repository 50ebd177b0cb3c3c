"""T5 itself: the network and its files.

  network      T5 1.0 / T5.1.1 in Flax with T5X's parameter tree; multi-token cached decoding
               (the engine's model contract)
  checkpoints     T5X checkpoints (legacy msgpack, TensorStore, Orbax), both ways; the tree
  storage      local and gs:// files, read alike (gs:// within a bounded wait)
  hf_checkpoints  Hugging Face checkpoints, both ways
  vocab        SentencePiece vocabularies with T5's conventions, seqio's API, no TensorFlow
  demo_pair    the shipped demo pair's file format (float16 safetensors + its T5Config)
"""
