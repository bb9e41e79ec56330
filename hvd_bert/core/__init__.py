"""The math, framework-free (numpy and the standard library): what both backends compute and
are tested against.

    optim       LAMB, NVLAMB, LARS, SGD-momentum, AdamW as pure functions with explicit state
    schedules   ``step -> lr`` functions, batch scaling rules, ``make_schedule`` from a config
    batch       global = local x backward_passes_per_step x world_size; accumulation boundaries
    sharding    files and records to ranks, per epoch
    cost_model  the alpha-beta allreduce model behind ``hvd-bert simulate``
    model_size  memory per rank and step time of ZeRO stages and tensor parallelism (simulate)
    activations what BERT's forward pass keeps for the backward pass, from the shape
    kernels     what the fused kernels of both frameworks agree on (GELU forms, the compile switch)
    zero        ZeRO's partition over the ranks: shards, partial norms, one rank's sharded step
    init        layout-independent initialisation: each tensor's seed, BERT's rule per tensor
    text        how numbers read in the toolkit's lines (sizes in their unit, plurals)
"""
