"""spec_decode: exact speculative decoding (Leviathan et al., 2023) of T5 in the T5X ecosystem.

Layout, bottom to top (each layer imports only the ones below it):
  engine/      the decoders a researcher extends: sampling, verification rules, drafting
               policies, the jitted loops, toy models. Pure JAX, no gin.
  t5/          the T5 network (multi-token cached decoding), checkpoints, vocabularies.
  losses, models, partitioning, decode_layout, plan, infer, tasks, corpora, call_costs,
  gin_utils, paths
               the T5X-style layer, named as in T5X: model protocol, sharding, memory plan,
               gin-configured inference (`python -m spec_decode.infer`), seqio tasks.
  training/    trainer, data, distillation, BLEU: the tools that made the demo pair.
  bench/       `python -m spec_decode.bench`: the benchmark suites.
  configs/     gin configs (package data; registration happens in them, as in T5X).
  assets/demo/ the shipped demo pair.
"""
