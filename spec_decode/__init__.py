"""spec_decode: exact speculative decoding (Leviathan et al., 2023) of T5 in the T5X ecosystem.

Layout, bottom to top (each layer imports only the ones below it; README.md's Layout table
says what each owns):
  engine/        the decoders a researcher extends: sampling, verification rules, drafting
                 policies, the jitted loops, toy models. Pure JAX, no gin.
  paths          where the package, its configs and the data are found.
  t5/            the T5 network (multi-token cached decoding), its vocabulary, its CPU kernels.
  checkpoints/   every checkpoint format, located, identified, read, sliced and checked.
  core, models, plan, gin_utils, runtime/, data/
                 the T5X-style layer, named as in T5X: the one decode core, the model
                 protocol, the memory plan (`python -m spec_decode.plan`), the command line;
                 where and how a program runs (platforms, the mesh, the decode's layout on it,
                 the calls' measured costs); seqio tasks and parallel text.
  infer/         `python -m spec_decode.infer`: gin-configured inference.
  aot/           `python -m spec_decode.aot`: a run compiled for a TPU topology from any host.
  training/      trainer, data, distillation, BLEU: the tools that made the demo pair.
  bench/         `python -m spec_decode.bench`: the benchmark suites.
  t5x/           the T5X hook: T5X's runners decode speculatively.
  configs/       gin configs (package data; registration happens in them, as in T5X).
  assets/demo/   the shipped demo pair.
"""
