"""BERT fine-tuning for sentence(-pair) classification on Horovod, in either framework.

    horovodrun -np 2 -H localhost:2 --gloo hvd-bert finetune --framework pt \\
        --set data=TRAIN_DIR --set eval_data=DEV_DIR --set init_checkpoint=runs/pretrain-pt-stdlib-seq128

The pretrained encoder comes from ``init_checkpoint`` (a run folder, a checkpoint, or a
portable ``.npz`` from either framework; its model size comes with it); the classifier starts
from BERT's initialisation. Training uses the shared loop: accumulation, mixed precision,
checkpoints, resume and SIGTERM as in pretraining. The evaluation scores every record of
``eval_data`` once across the ranks (``common.finetune.evaluate_classification``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hvd_bert.common.bert_weights import WeightsError
from hvd_bert.common.config import FinetuneConfig
from hvd_bert.common.engine import fit
from hvd_bert.common.finetune import (Evaluation, check_finetune_data, eval_batches, evaluate_classification,
                                      resolve_init, total_steps)
from hvd_bert.jobs._output import finish_line, open_run, with_run_folder

__all__ = ["run"]


def run(cfg: FinetuneConfig, backend) -> dict:
    cfg = with_run_folder(cfg, "finetune")
    rank, size = backend.init(cfg.train)
    out = Path(cfg.train.output_dir)
    meta, eval_meta = check_finetune_data(cfg)
    backend.set_precision(cfg.train.precision.mode)

    # The pretrained weights are read on rank 0; every rank learns the model config (or the error).
    arrays, config, error = (resolve_init(cfg, meta, backend.read_checkpoint_weights) if rank == 0
                             else (None, None, None))
    config, error = backend.broadcast_object((config, error), "hvd_bert.finetune.config")
    if error:
        raise WeightsError(error)
    bert = replace(config, hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)
    backend.seed(cfg.train.seed + rank)
    model = backend.bert_classifier(bert, len(meta["labels"]), meta["max_seq_length"])
    if arrays is not None:
        backend.load_weights(model, arrays, source=f"init_checkpoint {cfg.init_checkpoint}")
    plan = cfg.train.batch.plan(size)
    steps = total_steps(cfg, meta, size, plan.local_batch_size, plan.backward_passes_per_step)
    cfg = replace(cfg, train=replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=steps)))
    engine = backend.engine(model, backend.classification_loss, cfg.train)

    log = open_run(cfg, backend, rank, total_steps=steps, bert=bert,
                   line_keys=("loss", "accuracy", "lr", "examples_per_s"))
    log.print(f"fine-tuning BERT ({'from ' + cfg.init_checkpoint if arrays is not None else 'from scratch'}, "
              f"{backend.label}) on {cfg.data}: {meta['total_records']} examples, labels {meta['labels']}, "
              f"{cfg.epochs:g} epochs = {steps} steps")

    score = backend.classification_scorer(model, cfg.train.precision.mode)
    on_step = Evaluation(cfg, steps, log, lambda: evaluate_classification(
        score, eval_batches(cfg.eval_data, eval_meta, rank, size, cfg.eval_batch_size),
        lambda totals: backend.allreduce_sum(totals, "hvd_bert.eval"), len(meta["labels"]),
        (eval_meta or meta).get("task")))

    def batches_from(micro_step):
        return backend.record_batches(cfg.data, "bert-classification", rank, size, plan.local_batch_size,
                                      seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                                      record_striding=len(meta["shards"]) < size, start=micro_step)

    t = cfg.train
    res = fit(engine, batches_from, total_steps=steps, output_dir=out, checkpoint_every=t.checkpoint_every,
              keep_checkpoints=t.keep_checkpoints, log_every=t.log_every, log=log, unit="examples",
              on_step=on_step, max_skipped_steps=t.max_skipped_steps)
    final = on_step.report(res.steps) if cfg.eval_data else {}
    log.close()
    finish_line(res, rank, f"checkpoint: {res.checkpoint or 'unchanged'}; metrics: {out / 'metrics.jsonl'}",
                backend)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **final}
