"""Tools that make and judge a target/draft pair (the shipped demo pair was made with them).

  train        the T5X-style trainer (`python -m spec_decode.training.train`)
  data         parallel text under the data root, SentencePiece training, length-bucketed batches
  greedy       greedy corpus translation, shared by bleu and distill
  bleu         BLEU of a model on held-out corpora
  distill      sequence-level distillation data: a target's own translations
  divergences  per-position divergences between target and draft distributions, and alpha
  draft_distillation  white-box distillation of a draft on a frozen target (DistillSpec),
               the trainer's `distillation` option
  export_demo  a trainer checkpoint as a shipped demo model
"""
