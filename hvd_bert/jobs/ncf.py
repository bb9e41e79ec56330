"""NCF (NeuMF: GMF + MLP, He et al. 2017, NVIDIA's sizes) on Horovod, in either framework.

    horovodrun -np 2 -H localhost:2 --gloo hvd-bert ncf --framework pt \\
        --set data=runs/ml-1m --set target_hr=0.6

Each epoch's training pairs (positives and fresh sampled negatives, shuffled) are the same
for any number of ranks; each rank computes only its own every ``world_size``-th pair
(``data.ncf.EpochData``); binary cross-entropy
on the logits; any optimizer and schedule of the toolkit through the shared loop. After every
``eval_every`` epochs HR@K and NDCG@K are computed on all users, split across the ranks and
summed with an allreduce (``evaluation.ncf.evaluate``); the run stops early once HR@K reaches
``target_hr``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hvd_bert.core.text import plural
from hvd_bert.config import ConfigError
from hvd_bert.files import atomic_write
from hvd_bert.train.loop import fit
from hvd_bert.config import NCFConfig
from hvd_bert.data.ncf import EpochData
from hvd_bert.evaluation.ncf import EpochEvaluation, evaluate
from hvd_bert.data.ncf import load_ncf
from hvd_bert.jobs.run_folder import finish_line, open_run, ranks_agree, with_run_folder

__all__ = ["run"]

FEW_STEPS = 100  # steps an epoch below which a smaller batch is advised


def run(cfg: NCFConfig, backend) -> dict:
    cfg = with_run_folder(cfg, "ncf")
    rank, size = backend.init(cfg.train)
    ranks_agree(cfg, backend)  # the same settings and data everywhere, or one line on every rank
    backend.set_precision(cfg.train.precision.mode)
    out = Path(cfg.train.output_dir)
    data = load_ncf(cfg.data)
    candidates = 1 + data.test_negatives.shape[1]
    if cfg.top_k > candidates:
        raise ConfigError(f"top_k={cfg.top_k}, but each user's held-out item is ranked among {candidates} "
                          f"candidates (it and {candidates - 1} negatives), so HR@{cfg.top_k} would be 1.0: "
                          f"use top_k <= {candidates} (MLPerf: 10)")
    plan = cfg.train.batch.plan(size)
    epochs = EpochData(data, rank, size, plan.local_batch_size, plan.backward_passes_per_step,
                       cfg.num_negatives, cfg.train.seed)
    total = epochs.steps_per_epoch * cfg.epochs
    cfg = replace(cfg, train=replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=total)))
    backend.seed(cfg.train.seed)
    model = backend.neumf(data.n_users, data.n_items, cfg.model)
    engine = backend.engine(model, backend.ncf_loss, cfg.train)

    log = open_run(cfg, backend, rank, total_steps=total, line_keys=("loss", "lr", "samples_per_s"))
    log.print(f"NeuMF ({backend.param_count(model) / 1e6:.2f}M parameters, {backend.label}) on {cfg.data}: "
              f"{data.n_users} users, {data.n_items} items, {len(data.train_users)} positives x "
              f"(1 + {cfg.num_negatives} negatives) = {epochs.steps_per_epoch} steps an epoch, at most "
              f"{plural(cfg.epochs, 'epoch')}")
    if epochs.steps_per_epoch < FEW_STEPS and plan.local_batch_size > 256:  # (the defaults are ml-20m's)
        smaller = max(256, plan.local_batch_size * epochs.steps_per_epoch // FEW_STEPS // 256 * 256)
        log.print(f"note: {epochs.steps_per_epoch} steps an epoch is few for the optimizer to converge in: "
                  f"the default batch ({plan.local_batch_size} a rank) suits ml-20m; for data this size give "
                  f"--set train.batch.local_batch_size={smaller} (and scale train.optim.lr down with it)")

    score = backend.ncf_scorer(model)

    def save_best(step: int, rec: dict) -> None:  # the best model by HR@K: best/ckpt-* and best.json
        engine.save(out / "best", {"micro_step": engine.micro_step}, keep=1)  # (a collective)
        if rank == 0:
            atomic_write(out / "best.json", lambda t: t.write_text(json.dumps(
                {"step": step, "metric": f"hr@{cfg.top_k}", "greater_is_better": True,
                 "score": rec[f"hr@{cfg.top_k}"], "scores": rec}, indent=1)))

    on_step = EpochEvaluation(cfg, epochs.steps_per_epoch, total, log, lambda: evaluate(
        score, data, cfg.top_k, cfg.eval_batch_users, rank, size,
        lambda sums: backend.allreduce_sum(sums, "hvd_bert.ncf.eval")), save_best=save_best)

    def batches_from(micro_step):
        for u, i, y in epochs.stream(micro_step):
            yield backend.ncf_batch(u, i, y)

    res = fit(engine, batches_from, total_steps=total, output_dir=out, log=log, unit="samples",
              on_step=on_step)
    log.close()
    best = on_step.best
    kept = f": {out / 'best'}" if best.get("step") else ""
    finish_line(res, rank, f"best HR@{cfg.top_k} {best['hr']:.4f} (epoch {best['epoch']:g}){kept}", backend,
                out)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **best}
