"""The benchmark's suites, one module each. A suite is `<name>_suite(workspace, config, ...)
-> dict` of plain data (JSON-ready after `report.plain`), where `workspace` is the run's
`bench.workspace.Workspace` and `config` the suite's gin-bound dataclass of `bench.config`.

  own_baseline      our speculative decoders against our baseline, beside Theorem 3.8.
  engine_cost       the engine's own kernels and seconds per iteration, apart from the models.
  peer              the same weights decoded by Hugging Face `generate` with and without
                    `assistant_model`.
  simulated_table2  the paper's Table 2 rows at real model sizes, acceptance forced by a coin.
  physical_limit    weight bytes per baseline step / step time against the copy bandwidth.
  verify_cost       v(k): a k-token decoder call's cost over a 1-token call's, k = 1..8, at
                    T5.1.1-base/-large, beside the machine's roofline.
"""
