"""BERT fine-tuning for sentence(-pair) classification with TensorFlow/Keras on Horovod: the
job of ``hvd_bert.pt.finetune`` (same settings, output and exact sharded evaluation).

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert finetune --framework tf \\
        --set data=TRAIN_DIR --set eval_data=DEV_DIR --set init_checkpoint=runs/pretrain-tf
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.common.bert_weights import WeightsError, write_run_bert_config
from hvd_bert.common.config import FinetuneConfig, to_dict
from hvd_bert.common.finetune import Evaluation, check_finetune_data, resolve_init, total_steps
from hvd_bert.common.runlog import RunLog
from hvd_bert.tf.pretrain import set_threads, summary_writer

__all__ = ["run", "evaluate"]


def eval_dataset(folder: str, meta: dict, rank: int, world_size: int, batch_size: int) -> tf.data.Dataset:
    """This rank's share of the evaluation records: index ``rank mod world_size`` over the files
    in order, as ``hvd_bert.common.finetune.eval_batches``; the last batch may be short."""
    from hvd_bert.tf.data import feature_spec

    files = [str(Path(folder) / s["file"]) for s in meta["shards"]]
    spec = feature_spec(meta)
    ds = tf.data.TFRecordDataset(files).shard(world_size, rank).batch(batch_size)
    return ds.map(lambda r: tf.io.parse_example(r, spec)).prefetch(tf.data.AUTOTUNE)


def evaluate(model, folder: str, meta: dict, batch_size: int) -> dict:
    """Accuracy and mean loss over the whole set (a collective: every rank must call it)."""
    import horovod.tensorflow as hvd

    @tf.function
    def score(batch):
        logits = model(batch, training=False)
        labels = tf.reshape(tf.cast(batch["label_ids"], tf.int32), [-1])
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
                                        tf.float64))
        loss = tf.reduce_sum(tf.cast(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits),
                                     tf.float64))
        return tf.stack([correct, loss, tf.cast(tf.size(labels), tf.float64)])

    totals = tf.zeros([3], tf.float64)
    for b in eval_dataset(folder, meta, hvd.rank(), hvd.size(), batch_size):
        totals += score(b)
    totals = hvd.allreduce(totals, op=hvd.Sum, name="hvd_bert.eval").numpy()  # Horovod: all ranks
    n = max(totals[2], 1.0)
    return {"eval_accuracy": float(totals[0] / n), "eval_loss": float(totals[1] / n),
            "eval_examples": int(totals[2])}


def run(cfg: FinetuneConfig) -> dict:
    import horovod.tensorflow as hvd

    from hvd_bert.tf.bert import (BertForSequenceClassification, build_model, classification_loss,
                                  load_weights, read_checkpoint_weights)
    from hvd_bert.tf.data import stream
    from hvd_bert.tf.engine import Engine, _ensure_init, fit, set_precision_policy

    _ensure_init()
    rank, size = hvd.rank(), hvd.size()
    set_threads(hvd.local_size())
    out = Path(cfg.train.output_dir)
    meta, eval_meta = check_finetune_data(cfg)
    set_precision_policy(cfg.train.precision.mode)

    arrays, config, error = resolve_init(cfg, meta, read_checkpoint_weights) if rank == 0 else (None,) * 3
    config, error = hvd.broadcast_object((config, error), root_rank=0, name="hvd_bert.finetune.config")
    if error:
        raise WeightsError(error)
    bert = replace(config, hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)
    tf.keras.utils.set_random_seed(cfg.train.seed + rank)
    model = build_model(BertForSequenceClassification(bert, len(meta["labels"])), meta["max_seq_length"])
    if arrays is not None:
        load_weights(model, arrays, source=f"init_checkpoint {cfg.init_checkpoint}")
    plan = cfg.train.batch.plan(size)
    steps = total_steps(cfg, meta, size, plan.local_batch_size, plan.backward_passes_per_step)
    train_cfg = replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=steps))
    engine = Engine.from_config(model, classification_loss, train_cfg)  # broadcasts rank 0's weights
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=steps, progress=cfg.progress,
                 writer=summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "accuracy", "lr", "examples_per_s"))
    log.print(f"fine-tuning BERT ({'from ' + cfg.init_checkpoint if arrays is not None else 'from scratch'}, "
              f"TensorFlow) on {cfg.data}: {meta['total_records']} examples, labels {meta['labels']}, "
              f"{cfg.epochs:g} epochs = {steps} steps")

    on_step = Evaluation(cfg, steps, log, lambda: evaluate(
        model, cfg.eval_data, eval_meta, cfg.eval_batch_size))

    def batches_from(micro_step):
        return stream(cfg.data, "bert-classification", rank, size, plan.local_batch_size,
                      seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                      record_striding=len(meta["shards"]) < size, start_batch=micro_step)

    t = cfg.train
    res = fit(engine, batches_from, total_steps=steps, output_dir=out, checkpoint_every=t.checkpoint_every,
              keep_checkpoints=t.keep_checkpoints, log_every=t.log_every, log=log, unit="examples",
              on_step=on_step)
    final = on_step.report(res.steps) if cfg.eval_data else {}
    log.close()
    if rank == 0:
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}; "
              f"checkpoint: {res.checkpoint or 'unchanged'}; metrics: {out / 'metrics.jsonl'}", flush=True)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **final}
