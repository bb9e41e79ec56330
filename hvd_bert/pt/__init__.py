"""PyTorch frontend of hvd_bert: ``backend`` (what the jobs call), ``engine``, ``optim``,
``models/`` (BERT, NeuMF), ``data`` (the TFRecord reader) and ``kernels``."""


def init_horovod(horovod_cfg=None) -> None:
    """``hvd.init()`` once, with the ``horovod.*`` settings (``hvd_bert.cluster.horovod.init_horovod``)."""
    import horovod.torch as hvd

    from hvd_bert.cluster import horovod as cluster

    cluster.init_horovod(hvd, horovod_cfg)
