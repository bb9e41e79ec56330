"""BERT pretraining with TensorFlow/Keras on Horovod: the same job as ``hvd_bert.pt.pretrain``.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert pretrain --framework tf \\
        --set data=DATA_DIR --set train.output_dir=runs/tiny-tf

Reads top to bottom: Horovod and the config, the data's sidecar checked against the config,
the precision policy and the model, the engine (optimizer, schedule, accumulation with one
grouped allreduce per step, loss scaling, broadcast), resume, then the loop. Output, resume,
phase 2 (``init_checkpoint``: a TensorFlow checkpoint or run folder, or a portable ``.npz``
from either framework) and SIGTERM handling are the PyTorch job's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.common.bert_config import bert_preset
from hvd_bert.common.bert_data import check_pretraining_data
from hvd_bert.common.bert_weights import write_run_bert_config
from hvd_bert.common.config import PretrainConfig, to_dict
from hvd_bert.common.runlog import RunLog

__all__ = ["run", "summary_writer", "set_threads", "load_init_checkpoint"]


class summary_writer:  # noqa: N801  (SummaryWriter's interface over tf.summary)
    def __init__(self, logdir: Path):
        self._w = tf.summary.create_file_writer(str(logdir))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        with self._w.as_default():
            tf.summary.scalar(tag, value, step=step)

    def close(self) -> None:
        self._w.close()


def set_threads(local_size: int) -> None:
    """One process per CPU slot: split the cores between the local ranks."""
    n = max(1, (os.cpu_count() or 1) // local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # already initialised in this process
        pass


def load_init_checkpoint(model, path: str, rank: int) -> None:
    """Weights (not optimizer state) from a checkpoint into the model on rank 0; the engine
    broadcasts them."""
    if rank == 0:
        from hvd_bert.tf.bert import load_weights, read_checkpoint_weights
        arrays, _ = read_checkpoint_weights(path)
        load_weights(model, arrays, source=f"init_checkpoint {path}")


def run(cfg: PretrainConfig) -> dict:
    import horovod.tensorflow as hvd

    from hvd_bert.tf.bert import BertForPreTraining, build_model, pretraining_loss
    from hvd_bert.tf.data import stream
    from hvd_bert.tf.engine import Engine, _ensure_init, fit, set_precision_policy

    _ensure_init()  # checks the launch (e.g. srun without --mpi=pmix), then hvd.init()
    rank, size = hvd.rank(), hvd.size()
    set_threads(hvd.local_size())
    out = Path(cfg.train.output_dir)
    meta = check_pretraining_data(cfg.data, cfg.max_seq_length, cfg.max_predictions_per_seq)

    set_precision_policy(cfg.train.precision.mode)
    bert = bert_preset(cfg.model, vocab_size=meta["vocab_size"],
                       max_position_embeddings=max(512, cfg.max_seq_length),
                       hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)
    # per-rank dropout streams (Python, numpy and TF seeds: Keras initialisers draw from all);
    # the weights come from rank 0
    tf.keras.utils.set_random_seed(cfg.train.seed + rank)
    model = build_model(BertForPreTraining(bert), cfg.max_seq_length, cfg.max_predictions_per_seq)
    if cfg.init_checkpoint:
        load_init_checkpoint(model, cfg.init_checkpoint, rank)
    engine = Engine.from_config(model, pretraining_loss, cfg.train)  # broadcasts rank 0's weights
    total = cfg.train.schedule.total_steps
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=total, progress=cfg.progress,
                 writer=summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "mlm_accuracy", "lr", "sequences_per_s"))
    n_params = sum(int(tf.size(v)) for v in model.trainable_variables)
    log.print(f"model: BERT-{cfg.model} ({n_params / 1e6:.1f}M parameters, TensorFlow), data: {cfg.data} "
              f"({meta['total_records']} sequences of {cfg.max_seq_length}, {len(meta['shards'])} shards)")

    def batches_from(micro_step):
        return stream(cfg.data, "bert-pretraining", rank, size, engine.plan.local_batch_size,
                      seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                      record_striding=cfg.record_striding or len(meta["shards"]) < size,
                      start_batch=micro_step)

    t = cfg.train
    res = fit(engine, batches_from, total_steps=total, output_dir=out, checkpoint_every=t.checkpoint_every,
              keep_checkpoints=t.keep_checkpoints, log_every=t.log_every, log=log, unit="sequences")
    log.close()
    if rank == 0:
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}; "
              f"checkpoint: {res.checkpoint or 'unchanged'}; metrics: {out / 'metrics.jsonl'}; "
              f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}", flush=True)
    return {"steps": res.steps, "stopped": res.stopped_by_signal,
            "last": res.history[-1] if res.history else {}}
