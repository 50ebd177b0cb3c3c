#!/usr/bin/env bash
# The fast tier, for before every commit: the modules whose tests take seconds (layering and
# configs, sampling and verification laws, the network against Hugging Face, checkpoints, the CPU
# kernel, the models, the command lines, a registered loop through every runner); about 2.5
# minutes on this project's 2-core CPU. It leaves out the exactness suite, greedy identity of
# the decoders, infer end to end, the T5X hook and sharding: scripts/test.sh runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q -n 2 --dist loadfile "$@" \
  tests/test_layout.py tests/test_vocab.py tests/test_configs.py tests/test_plan.py \
  tests/test_sampling.py tests/test_verify.py tests/test_demo_pair.py tests/test_distill.py \
  tests/test_decode_loops.py tests/test_t5_decoding.py tests/test_checkpoints.py \
  tests/test_cpu_kernels.py tests/test_models.py tests/test_cli.py tests/test_network.py \
  tests/test_call_costs.py tests/test_tree_calls.py tests/test_engine_cost.py \
  tests/test_infer_timing.py
