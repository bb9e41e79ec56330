"""The jobs, each written once for both frameworks: ``run(cfg, backend)``.

    pretrain   BERT pretraining (phase 1 / phase 2)          hvd_bert/jobs/pretrain.py
    finetune   BERT sentence(-pair) classification           hvd_bert/jobs/finetune.py
    ncf        NCF (NeuMF) recommendation, HR@K / NDCG@K     hvd_bert/jobs/ncf.py

A job reads top to bottom: the backend's process set-up, the data checked against the config,
the model, the engine (``backend.engine``: optimizer, schedule, accumulation, precision,
broadcast), then ``train.engine.fit``. ``backend`` is ``train.backend.get_backend(cfg.framework)``.
"""
