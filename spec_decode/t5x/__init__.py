"""Exact speculative decoding inside T5X (`speculative`) and its gin files, drafts trained by
`t5x.train` on a frozen target's distributions (`distillation`), T5X's own sampler
for the benchmark (`sampler`), and T5X's decoder-only network, or why it cannot be had
(`decoder_only_network`); needs `t5x` installed."""
