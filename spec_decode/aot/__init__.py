"""`python -m spec_decode.aot`: a run config's decode compiled for an accelerator topology from
this host, and what the compiler says of it (memory per device, costs, collectives).

Run: `python -m spec_decode.aot --gin_file=<run config> ... --topology=v4-8
[--num_partitions=P] [--draft_gin_file=F] [--batch_size=B] [--call_tokens=1,2,...]
[--programs=decode,baseline,target_calls,draft_call,draft_placement] [--alpha=A]
[--collective_latency=S] [--output_json=F]`.

  * `topologies`: named TPU slices (Cloud names like v4-8, or libtpu's v4:1x1x1), described by
    libtpu's compile-only client, so no TPU is needed (`pip install "jax[tpu]"`, Python 3.12);
  * `programs`: the programs compiled on a `decode_layout.DecodeLayout` over those devices: the
    decode exactly as `spec_decode.infer` compiles it, its baseline, and one model call of k fed
    tokens alone; XLA's memory and cost analyses read back;
  * `report`: the reading of a run's programs: memory next to `spec_decode.plan`'s formula and
    the chip's HBM, v(k) and c from XLA's cost model and from a roofline of the compiled flops
    and bytes against the chip's published peaks, Theorem 3.8's speedup from them, the
    collectives inside the loop, the operations each call runs in sequence and a cost model
    with one fitted latency per operation (`fit_op_latency`);
  * `placement`: where the target is split over several chips, the draft's call replicated
    and sharded like the target, priced by its roofline and its collectives (at an assumed
    latency each), and the placement to use;
  * `cli`: the command.
Everything here is compiled, not run: `optimal_seconds` is XLA's cost model and a roofline is a
bound, neither a measurement (`scripts/accelerator_check.sh` measures, where a device is lent).
"""
