"""BERT pretraining with PyTorch on Horovod: the toolkit's main job.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert pretrain --framework pt \\
        --set data=DATA_DIR --set train.output_dir=runs/tiny

Reads top to bottom: Horovod and the config, the data's sidecar checked against the config,
the model, the engine (optimizer, schedule, accumulation, AMP, broadcast), resume, then the
loop. Rank 0 prints the batch arithmetic once and logs loss, MLM accuracy, LR and
sequences/s (a progress bar, a JSON-lines file and TensorBoard). Checkpoints are atomic; a run
resumes from the newest one; SIGTERM saves and stops. Phase 2 starts from a phase-1
checkpoint's weights with a fresh optimizer (``init_checkpoint``), as NVIDIA does.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import horovod.torch as hvd

from hvd_bert.common.bert_config import bert_preset
from hvd_bert.common.bert_data import check_pretraining_data
from hvd_bert.common.bert_weights import write_run_bert_config
from hvd_bert.common.config import PretrainConfig, to_dict
from hvd_bert.common.runlog import MetricWindow, RunLog
from hvd_bert.pt.bert import BertForPreTraining, load_weights, pretraining_loss, read_checkpoint_weights
from hvd_bert.pt.data import ShardedDataset
from hvd_bert.pt.engine import Engine, _ensure_init

__all__ = ["run", "load_init_checkpoint"]


def load_init_checkpoint(model: torch.nn.Module, path: str, rank: int) -> None:
    """Phase-1 (or converted TensorFlow) weights into the model on rank 0; the engine then
    broadcasts them. Only weights: the optimizer and schedule start fresh, as NVIDIA's phase 2.
    Position embeddings grow from 128 to 512 rows as needed."""
    if rank == 0:
        arrays, _ = read_checkpoint_weights(path)
        load_weights(model, arrays, source=f"init_checkpoint {path}")


def _summary_writer(logdir: Path):
    """A TensorBoard writer that does not import TensorFlow: TensorBoard falls back to its own
    stub when the marker module ``tensorboard.compat.notf`` exists (as in its no-TF builds).
    TensorFlow must stay out of this process: tfrecord and TensorFlow cannot share one."""
    import sys
    import types

    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(logdir))


def run(cfg: PretrainConfig) -> dict:
    _ensure_init()  # checks the launch (e.g. srun without --mpi=pmix), then hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    out = Path(cfg.train.output_dir)
    meta = check_pretraining_data(cfg.data, cfg.max_seq_length, cfg.max_predictions_per_seq)

    bert = bert_preset(cfg.model, vocab_size=meta["vocab_size"],
                       max_position_embeddings=max(512, cfg.max_seq_length),
                       hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)
    torch.manual_seed(cfg.train.seed + rank)  # per-rank dropout streams; weights come from rank 0
    model = BertForPreTraining(bert)
    if cfg.init_checkpoint:
        load_init_checkpoint(model, cfg.init_checkpoint, rank)
    engine = Engine.from_config(model, cfg.train)  # broadcasts rank 0's weights
    plan = engine.plan
    engine.resume(out)  # newest checkpoint of this run, if any
    data = ShardedDataset(cfg.data, "bert-pretraining", rank, size, plan.local_batch_size,
                          seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                          record_striding=cfg.record_striding or len(meta["shards"]) < size)
    batches = data.stream(start_batch=engine.micro_step)  # the data position of the checkpoint

    total = cfg.train.schedule.total_steps
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=total, initial_step=engine.step_count, progress=cfg.progress,
                 writer=_summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "mlm_accuracy", "lr", "sequences_per_s"))
    n_params = sum(p.numel() for p in model.parameters())
    log.print(f"model: BERT-{cfg.model} ({n_params / 1e6:.1f}M parameters), data: {cfg.data} "
              f"({meta['total_records']} sequences of {cfg.max_seq_length}, {len(meta['shards'])} shards)")
    log.print(f"batch: {plan.describe()}")  # printed once
    if engine.step_count:
        log.print(f"resumed from step {engine.step_count} in {out}")
    engine.install_stop_handler()

    window = MetricWindow(engine.k)
    t0, steps_since, saved, stopped, last = time.perf_counter(), 0, engine.step_count, False, {}
    ckpt = None
    while engine.step_count < total:
        batch = next(batches)
        with engine.autocast():
            loss, metrics = pretraining_loss(model, batch)
        window.add({"loss": loss.detach(), "mlm_accuracy": metrics["mlm_accuracy"]})
        if not engine.backward(loss):
            continue
        result = engine.step()
        steps_since += 1
        local = window.take()
        if not result.skipped:
            log.advance()
        if result.step % cfg.train.log_every == 0 or result.step == total:
            # Horovod: every rank joins these averages (collectives)
            mean = {k: engine.average(v, f"hvd_bert.{k}") for k, v in local.items()}
            dt = time.perf_counter() - t0
            last = dict(step=result.step, loss=mean["loss"], mlm_accuracy=mean["mlm_accuracy"],
                        lr=result.lr, sequences_per_s=plan.global_batch_size * steps_since / dt,
                        grad_norm=result.grad_norm, loss_scale=result.loss_scale,
                        skipped_steps=engine.skipped_steps, time=time.time())
            log.record(last)
            t0, steps_since = time.perf_counter(), 0
        if (cfg.train.checkpoint_every and result.step % cfg.train.checkpoint_every == 0
                and result.step != saved):
            ckpt = engine.save(out, {"micro_step": engine.micro_step}, cfg.train.keep_checkpoints)
            saved = result.step
        if engine.should_stop():  # SIGTERM on any rank (e.g. SLURM's time limit)
            stopped = True
            break
    if saved != engine.step_count:
        ckpt = engine.save(out, {"micro_step": engine.micro_step}, cfg.train.keep_checkpoints)
    log.close()
    if rank == 0:
        print(f"{'stopped by a signal at' if stopped else 'finished'} step {engine.step_count}; "
              f"checkpoint: {ckpt or 'unchanged'}; metrics: {out / 'metrics.jsonl'}; "
              f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}", flush=True)
    return {"steps": engine.step_count, "stopped": stopped, "last": last}
