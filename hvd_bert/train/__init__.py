"""The training run, framework-free: what a job needs of a framework and the one loop.

    backend     the Backend protocol (hvd_bert.pt.backend, hvd_bert.tf.backend implement it)
    engine      the Engine protocol, StepResult, the checkpoint metadata, resume checks
    loop        fit: the one training loop and its step bookkeeping (logging, checkpoint cadence)
    elastic     Horovod elastic as a hook of fit; how a job was launched (plain or elastic)
    checkpoint  atomic files, checkpoint names and retention, the run folder's lock
    sharded_checkpoint  the sharded format both frameworks write: per-rank shards, an index, resharding
    sharded_state  an engine's declared state (named tensors, splits, ZeRO ranges, counters), saved
                and loaded by one owner: who writes what, every metadata key and its check
    sharded_writer  the background writer of sharded checkpoints; a save abandoned by an elastic reset
    sharded_index  what a sharded checkpoint's index and shard headers may say, validated before use
    run_folder  the run folder's one owner: its checks and lock, for a job and a script's fit
    identity    whether a run folder's checkpoints belong to this run (resume) or another (refuse)
    trackers    train.report_to: TensorBoard and MLflow, as Trainer's report_to
    watchdog    the stall watchdog: a rank that makes no progress ends the job with one line
    memory      the start-of-run memory line, the process's peak, the phase that reached it
    log         what rank 0 shows and records: progress, log lines, metrics.jsonl, TensorBoard
"""
