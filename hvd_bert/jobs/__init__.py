"""The jobs, each written once for both frameworks: ``run(cfg, backend)``.

    pretrain    BERT pretraining (phase 1 / phase 2)
    finetune    BERT fine-tuning: classification, regression (STS-B), SQuAD
    ncf         NCF (NeuMF) recommendation, HR@K / NDCG@K
    run_folder  what every job does with its run folder: the lock, config.json, the log, the last line
    identity    whether a run folder belongs to this run (resume) or another (refuse)

A job reads top to bottom: the backend's process set-up, the data checked against the config,
the model, the engine (``backend.engine``: optimizer, schedule, accumulation, precision,
broadcast), then ``train.engine.fit``. ``backend`` is ``train.backend.get_backend(cfg.framework)``.
"""
