"""Where and how a decode program runs: its devices, its mesh, its layout on them, its costs.

  platforms      what a program runs with, chosen from the devices it is compiled for: the
                 network's products (the CPU kernel on one CPU device, plain XLA on TPU and
                 GPU) and XLA's compiler options
  partitioning   the ('data', 'model') mesh, T5X's logical axis rules (`PjitPartitioner`, bound
                 by the run configs as T5X's), shardings and their checks
  decode_layout  where a decode's parameters, caches and batches live on the mesh: the one place
                 a decode is compiled, and restores straight into shards
  call_costs     the c and v of Theorem 3.8, measured on this machine
"""
