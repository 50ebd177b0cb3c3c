"""Exact speculative decoding inside T5X (`speculative`) and its gin files, and T5X's own sampler
for the benchmark (`sampler`); needs `t5x` installed."""
