"""The text a run decodes or a trainer reads.

  tasks    seqio tasks of the paper's experiments (TFDS and local files), registered on import
           (the only module that imports seqio, and so TensorFlow)
  corpora  parallel text on disk, and a run's input lines
  ngrams   `python -m spec_decode.data.ngrams`: a unigram or bigram draft estimated from text
"""
