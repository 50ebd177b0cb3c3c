"""Exact speculative decoding inside T5X (`speculative`) and its gin files, T5X's own sampler
for the benchmark (`sampler`), and T5X's decoder-only network where its wheel leaves it out
(`decoder_only_network`); needs `t5x` installed."""
