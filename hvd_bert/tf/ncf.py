"""NCF (NeuMF) with TensorFlow/Keras on Horovod: the job of ``hvd_bert.pt.ncf`` (same data
split, settings, evaluation and output) on the custom-loop engine.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert ncf --framework tf --set data=DIR
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.common.config import to_dict
from hvd_bert.common.ncf import (EpochData, EpochEvaluation, NCFConfig, eval_candidates, eval_users,
                                 hit_rate_ndcg)

__all__ = ["NeuMF", "evaluate", "run"]


class NeuMF(tf.keras.Model):
    """``call({"users", "items"})`` -> float32 logits ``[B]``; NVIDIA's initialisation."""

    def __init__(self, n_users: int, n_items: int, factors: int = 64,
                 layers: tuple[int, ...] = (256, 256, 128, 64), dropout: float = 0.0, **kw):
        super().__init__(**kw)
        half = layers[0] // 2
        def emb(n, d, name):  # a fresh initialiser each: one instance would repeat its values
            return tf.keras.layers.Embedding(n, d, name=name,
                                             embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=0.01))

        self.mf_user, self.mf_item = emb(n_users, factors, "mf_user"), emb(n_items, factors, "mf_item")
        self.mlp_user, self.mlp_item = emb(n_users, half, "mlp_user"), emb(n_items, half, "mlp_item")
        self.mlp = [tf.keras.layers.Dense(w, activation="relu", kernel_initializer="glorot_uniform",
                                          name=f"mlp_{i}") for i, w in enumerate(layers[1:])]
        self.drop = tf.keras.layers.Dropout(dropout)
        self.final = tf.keras.layers.Dense(1, kernel_initializer="lecun_uniform", name="final")

    def call(self, batch, training=False):
        u, i = batch["users"], batch["items"]
        gmf = self.mf_user(u) * self.mf_item(i)
        x = tf.concat([self.mlp_user(u), self.mlp_item(i)], axis=-1)
        for layer in self.mlp:
            x = self.drop(layer(x), training=training)
        return tf.cast(tf.squeeze(self.final(tf.concat([gmf, x], axis=-1)), -1), tf.float32)


def ncf_loss(model, batch):
    logits = model(batch, training=True)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["labels"], logits=logits))


def evaluate(model, data, k: int = 10, batch_users: int = 1024, rank: int = 0, world_size: int = 1,
             allreduce=None) -> dict:
    """HR@K and NDCG@K over all users, as ``hvd_bert.pt.ncf.evaluate``."""
    score = tf.function(lambda u, i: model({"users": u, "items": i}, training=False))
    users = eval_users(data.n_users, rank, world_size)
    sums = np.zeros(3)
    for s in range(0, len(users), batch_users):
        u = users[s:s + batch_users]
        cand = eval_candidates(data, u)
        scores = score(tf.constant(np.repeat(u, cand.shape[1]).astype(np.int32)),
                       tf.constant(cand.ravel().astype(np.int32)))
        sums += hit_rate_ndcg(scores.numpy().reshape(len(u), -1), k)
    if allreduce is not None:
        sums = allreduce(sums)
    return {"hr": sums[0] / max(sums[2], 1), "ndcg": sums[1] / max(sums[2], 1), "users": int(sums[2])}


def run(cfg: NCFConfig) -> dict:
    import horovod.tensorflow as hvd

    from hvd_bert.common.ncf_data import load_ncf
    from hvd_bert.common.runlog import RunLog
    from hvd_bert.tf.engine import Engine, _ensure_init, fit, set_precision_policy
    from hvd_bert.tf.pretrain import set_threads, summary_writer

    _ensure_init()
    rank, size = hvd.rank(), hvd.size()
    set_threads(hvd.local_size())
    set_precision_policy(cfg.train.precision.mode)
    out = Path(cfg.train.output_dir)
    data = load_ncf(cfg.data)
    plan = cfg.train.batch.plan(size)
    epochs = EpochData(data, rank, size, plan.local_batch_size, plan.backward_passes_per_step,
                       cfg.num_negatives, cfg.train.seed)
    total = epochs.steps_per_epoch * cfg.epochs
    train_cfg = replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=total))
    tf.keras.utils.set_random_seed(cfg.train.seed)
    m = cfg.model
    model = NeuMF(data.n_users, data.n_items, m.factors, m.layers, m.dropout)
    model({"users": tf.zeros([1], tf.int32), "items": tf.zeros([1], tf.int32)})
    engine = Engine.from_config(model, ncf_loss, train_cfg)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    log = RunLog(out, rank, total_steps=total, progress=cfg.progress,
                 writer=summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "lr", "samples_per_s"))
    n_params = sum(int(tf.size(v)) for v in model.trainable_variables)
    log.print(f"NeuMF ({n_params / 1e6:.2f}M parameters, TensorFlow) on {cfg.data}: {data.n_users} users, "
              f"{data.n_items} items, {len(data.train_users)} positives x (1 + {cfg.num_negatives} "
              f"negatives) = {epochs.steps_per_epoch} steps an epoch, at most {cfg.epochs} epochs")

    def allreduce(sums):
        return hvd.allreduce(tf.constant(sums), op=hvd.Sum, name="hvd_bert.ncf.eval").numpy()  # Horovod:

    on_step = EpochEvaluation(cfg, epochs.steps_per_epoch, total, log, lambda: evaluate(
        model, data, cfg.top_k, cfg.eval_batch_users, rank, size, allreduce))

    def batches_from(micro_step):
        for u, i, y in epochs.stream(micro_step):
            yield {"users": tf.constant(u), "items": tf.constant(i), "labels": tf.constant(y)}

    t = cfg.train
    res = fit(engine, batches_from, total_steps=total, output_dir=out, checkpoint_every=t.checkpoint_every,
              keep_checkpoints=t.keep_checkpoints, log_every=t.log_every, log=log, unit="samples",
              on_step=on_step)
    log.close()
    if rank == 0:
        best = on_step.best
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}: best "
              f"HR@{cfg.top_k} {best['hr']:.4f} (epoch {best['epoch']:g}); metrics: {out / 'metrics.jsonl'}",
              flush=True)
    return {"steps": res.steps, **on_step.best}
