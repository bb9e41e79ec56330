"""BERT fine-tuning for sentence(-pair) classification with PyTorch on Horovod.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert finetune --framework pt \\
        --set data=TRAIN_DIR --set eval_data=DEV_DIR --set init_checkpoint=runs/pretrain

The pretrained encoder comes from ``init_checkpoint`` (a run folder, a checkpoint, or a
portable ``.npz`` from either framework; its model size comes with it), the classifier
starts from BERT's initialisation. Training uses the shared loop (``engine.fit``):
accumulation, mixed precision, checkpoints, resume and SIGTERM as in pretraining. The
evaluation scores every record of ``eval_data`` once across the ranks and sums the counts
with an allreduce; its accuracy is printed and recorded in ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch
import horovod.torch as hvd

from hvd_bert.common.bert_weights import WeightsError, write_run_bert_config
from hvd_bert.common.config import FinetuneConfig, to_dict
from hvd_bert.common.finetune import (Evaluation, check_finetune_data, eval_batches, resolve_init,
                                      total_steps)
from hvd_bert.common.runlog import RunLog
from hvd_bert.pt.bert import (BertForSequenceClassification, classification_loss, load_weights,
                              read_checkpoint_weights)
from hvd_bert.pt.data import ShardedDataset
from hvd_bert.pt.engine import Engine, _ensure_init, fit
from hvd_bert.pt.pretrain import _summary_writer

__all__ = ["run", "evaluate"]


@torch.no_grad()
def evaluate(model: torch.nn.Module, folder: str, meta: dict, batch_size: int, autocast) -> dict:
    """Accuracy and mean loss over the whole set (a collective: every rank must call it)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # correct, loss sum, count
    for b in eval_batches(folder, meta, hvd.rank(), hvd.size(), batch_size):
        t = {k: torch.from_numpy(v) for k, v in b.items()}
        with autocast():
            logits = model(t["input_ids"], t["segment_ids"], t["input_mask"]).float()
        labels = t["label_ids"].view(-1)
        totals += torch.tensor([(logits.argmax(-1) == labels).sum().item(),
                                torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item(),
                                len(labels)], dtype=torch.float64)
    model.train()
    totals = hvd.allreduce(totals, op=hvd.Sum, name="hvd_bert.eval")  # Horovod: all ranks' counts
    n = max(totals[2].item(), 1.0)
    return {"eval_accuracy": totals[0].item() / n, "eval_loss": totals[1].item() / n,
            "eval_examples": int(totals[2].item())}


def _model_config(cfg: FinetuneConfig, meta: dict, rank: int):
    """The pretrained weights (rank 0) and the model config, which every rank learns."""
    arrays, config, error = resolve_init(cfg, meta, read_checkpoint_weights) if rank == 0 else (None,) * 3
    config, error = hvd.broadcast_object((config, error), root_rank=0, name="hvd_bert.finetune.config")
    if error:
        raise WeightsError(error)
    return arrays, replace(config, hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)


def run(cfg: FinetuneConfig) -> dict:
    _ensure_init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    out = Path(cfg.train.output_dir)
    meta, eval_meta = check_finetune_data(cfg)
    arrays, bert = _model_config(cfg, meta, rank)
    torch.manual_seed(cfg.train.seed + rank)
    model = BertForSequenceClassification(bert, len(meta["labels"]))
    if arrays is not None:
        load_weights(model, arrays, source=f"init_checkpoint {cfg.init_checkpoint}")
    plan = cfg.train.batch.plan(size)
    steps = total_steps(cfg, meta, size, plan.local_batch_size, plan.backward_passes_per_step)
    train_cfg = replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=steps))
    engine = Engine.from_config(model, train_cfg)  # broadcasts rank 0's weights
    data = ShardedDataset(cfg.data, "bert-classification", rank, size, plan.local_batch_size,
                          seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                          record_striding=len(meta["shards"]) < size)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=steps, progress=cfg.progress,
                 writer=_summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "accuracy", "lr", "examples_per_s"))
    log.print(f"fine-tuning BERT ({'from ' + cfg.init_checkpoint if arrays is not None else 'from scratch'}) "
              f"on {cfg.data}: {meta['total_records']} examples, labels {meta['labels']}, "
              f"{cfg.epochs:g} epochs = {steps} steps")

    on_step = Evaluation(cfg, steps, log, lambda: evaluate(
        model, cfg.eval_data, eval_meta, cfg.eval_batch_size, engine.autocast))

    t = cfg.train
    res = fit(engine, data.stream, classification_loss, total_steps=steps, output_dir=out,
              checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints,
              log_every=t.log_every, log=log, unit="examples", on_step=on_step)
    final = on_step.report(res.steps) if cfg.eval_data else {}
    log.close()
    if rank == 0:
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}; "
              f"checkpoint: {res.checkpoint or 'unchanged'}; metrics: {out / 'metrics.jsonl'}", flush=True)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **final}
