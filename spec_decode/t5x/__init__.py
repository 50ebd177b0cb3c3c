"""Exact speculative decoding inside T5X (`speculative`) and its gin files; needs `t5x` installed."""
