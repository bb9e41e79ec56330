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
from pathlib import Path

import torch
import horovod.torch as hvd

from hvd_bert.common.bert_config import bert_preset
from hvd_bert.common.bert_data import check_pretraining_data
from hvd_bert.common.bert_weights import write_run_bert_config
from hvd_bert.common.config import PretrainConfig, to_dict
from hvd_bert.common.runlog import RunLog
from hvd_bert.pt.bert import BertForPreTraining, load_weights, pretraining_loss, read_checkpoint_weights
from hvd_bert.pt.data import ShardedDataset
from hvd_bert.pt.engine import Engine, _ensure_init, fit

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
    data = ShardedDataset(cfg.data, "bert-pretraining", rank, size, engine.plan.local_batch_size,
                          seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                          record_striding=cfg.record_striding or len(meta["shards"]) < size)
    total = cfg.train.schedule.total_steps
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=total, progress=cfg.progress,
                 writer=_summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "mlm_accuracy", "lr", "sequences_per_s"))
    n_params = sum(p.numel() for p in model.parameters())
    log.print(f"model: BERT-{cfg.model} ({n_params / 1e6:.1f}M parameters), data: {cfg.data} "
              f"({meta['total_records']} sequences of {cfg.max_seq_length}, {len(meta['shards'])} shards)")
    t = cfg.train
    res = fit(engine, data.stream, pretraining_loss, total_steps=total, output_dir=out,
              checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints,
              log_every=t.log_every, log=log, unit="sequences")
    log.close()
    if rank == 0:
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}; "
              f"checkpoint: {res.checkpoint or 'unchanged'}; metrics: {out / 'metrics.jsonl'}; "
              f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}", flush=True)
    return {"steps": res.steps, "stopped": res.stopped_by_signal,
            "last": res.history[-1] if res.history else {}}
