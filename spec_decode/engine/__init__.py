"""The speculative decoding engine: what a decoder author reads and extends.

Pure JAX (no gin, no T5, no checkpoints): models enter only through the model contract
`tokens_to_logits(state) -> (logits, new_cache)` written down in `contract`, with its history.

  contract   the model contract: `DecodingState`, its optional fields and what each added
  sampling   logits -> the distribution actually sampled (temperature, top-k, top-p); draws
  verify     verification rules as exact laws ('token', 'block', lossy 'lenient'); a registry
  drafting   drafting policies ('fixed', 'expected_speedup', 'confidence'); a registry
  decoding   `temperature_sample` (the baseline) and the conventions every sampler follows;
             re-exports `speculative_sample`
  speculative_sampling
             `speculative_sample`: drafts, one verification call, exact acceptance
  decode_rows
             the per-row problem and bookkeeping both samplers share (setup, commit, finish)
  stats      `SpeculativeStats`, the counters a speculative decode reports (alpha, calls, ...)
  beam_search, speculative_beam_search
             T5X's beam search (one shared step) and its exact speculative form
  loops      the registry of decode loops by name: what every runner (infer, the T5X hook,
             the benchmark) can run; a new loop is one `loops.register`
  token_tree, tree_rules, tree_shape
             `speculative_tree_sample`: a tree of drafts per row, one target call, exact
             recursive rejection sampling along it; the rules ('multi_round', ...), a registry;
             the tree's shape, fixed or chosen per row from the draft's likeliest paths
  lookup     n-gram lookup drafts from the input and the output so far (no draft model),
             alone or beside a draft model; 'no proposal' is all -inf logits
  ngram      unigram and bigram language models as drafts (the paper's trivial drafts), estimated
             from token sequences
  toy        prefix-hash toy models honoring the contract with a real cache (for tests)
"""

# Importing them registers the built-in loops with `loops`.
from spec_decode.engine import beam_search
from spec_decode.engine import decoding
from spec_decode.engine import speculative_beam_search
from spec_decode.engine import token_tree

