"""The training run, framework-free: what a job needs of a framework and the one loop.

    backend     the Backend protocol (hvd_bert.pt.backend, hvd_bert.tf.backend implement it)
    engine      the Engine protocol, the loop (``fit``), checkpoint metadata and resume
    checkpoint  atomic files, checkpoint names and retention, the run folder's lock
    log         what rank 0 shows and records: progress, log lines, metrics.jsonl, TensorBoard
    elastic     Horovod elastic that keeps the configured global batch and schedule
"""
