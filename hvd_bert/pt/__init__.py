"""The PyTorch backend of hvd_bert.

    backend     what the jobs call (the train.backend.Backend protocol, in PyTorch)
    engine      Horovod's DistributedOptimizer, accumulation, AMP, checkpoints (train.engine.Engine)
    engine_checkpoints  the engine's save and resume (consolidated or sharded, any layout)
    step        a step decided on the device: the norm, clip and skip with no host read
    optim       LAMB, NVLAMB, LARS as torch optimizers (checked against core.optim)
    zero        ZeRO stages 1 and 2: the optimizer state (and gradients) split over the ranks
    zero_state  ZeRO's shards in and out: consolidated checkpoints, elastic commits and recovery
    optim_parts what an optimizer's rule runs over: parts of tensors, their norms; torch's SGD and AdamW rules
    parallel_layers  column- and row-parallel linear layers any model can use, through a plan
    tensor_parallel  BERT's layers split over a group of ranks by its plan (Megatron-style), process sets
    data        the TFRecord reader (the core's reading order)
    checkpoint  reading checkpoint files without unpickling code
    sharded     sharded checkpoints: each rank's share, written in the background, read under any layout
    models      BERT and NeuMF
    kernels     the CPU kernels in C (GELU, dropout, optimizer steps, the tied embedding)
"""


def init_horovod(horovod_cfg=None, process_sets: bool = False) -> None:
    """``hvd.init()`` once, with the ``horovod.*`` settings (``hvd_bert.cluster.horovod.init_horovod``)."""
    import horovod.torch as hvd

    from hvd_bert.cluster import horovod as cluster

    cluster.init_horovod(hvd, horovod_cfg, process_sets)
