"""T5 itself: the network, its vocabulary and its CPU kernels (its checkpoints:
`spec_decode.checkpoints`).

  network      T5 1.0 / T5.1.1 in Flax with T5X's parameter tree; multi-token cached decoding
               (the engine's model contract); every name of the four modules below it
  layers       the layers both models are built of, the shared decoder stack among them
  ops          the products they compute with (`Ops`), plain XLA's and the TPU's
  decoder_only T5X's decoder-only language model
  vocab        SentencePiece vocabularies with T5's conventions, seqio's API, no TensorFlow
  cpu_kernels  the network's products on XLA:CPU, among them the small-row matmul kernel
"""
