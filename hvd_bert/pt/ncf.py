"""NCF (NeuMF: GMF + MLP, He et al. 2017, NVIDIA's sizes) with PyTorch on Horovod.

    horovodrun -np 2 -H localhost:2 --gloo python -m hvd_bert ncf --framework pt \\
        --set data=runs/ml-1m --set target_hr=0.6

Each epoch every rank builds the same shuffled training pairs (positives and fresh sampled
negatives, ``common.ncf.EpochData``) and takes every ``world_size``-th; binary cross-entropy on
the logits; any optimizer and schedule of the toolkit through the shared loop
(``engine.fit``: accumulation, mixed precision, checkpoints, resume, SIGTERM). After every
``eval_every`` epochs HR@K and NDCG@K are computed on all users, split across the ranks and
summed with an allreduce; the run stops early once HR@K reaches ``target_hr``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hvd_bert.common.config import to_dict
from hvd_bert.common.ncf import (EpochData, EpochEvaluation, NCFConfig, eval_candidates, eval_users,
                                 hit_rate_ndcg)

__all__ = ["NeuMF", "evaluate", "run"]


class NeuMF(nn.Module):
    """``forward(users, items)`` -> logits ``[B]``. Initialisation as NVIDIA's NCF: embeddings
    N(0, 0.01), MLP layers Glorot-uniform, the final layer LeCun-uniform."""

    def __init__(self, n_users: int, n_items: int, factors: int = 64,
                 layers: tuple[int, ...] = (256, 256, 128, 64), dropout: float = 0.0):
        super().__init__()
        half = layers[0] // 2
        self.mf_user, self.mf_item = nn.Embedding(n_users, factors), nn.Embedding(n_items, factors)
        self.mlp_user, self.mlp_item = nn.Embedding(n_users, half), nn.Embedding(n_items, half)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(layers[:-1], layers[1:]))
        self.dropout = dropout
        self.final = nn.Linear(factors + layers[-1], 1)
        for e in (self.mf_user, self.mf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(e.weight, 0.0, 0.01)
        for lin in self.mlp:
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)
        bound = (3.0 / self.final.in_features) ** 0.5
        nn.init.uniform_(self.final.weight, -bound, bound)
        nn.init.zeros_(self.final.bias)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.mf_user(users) * self.mf_item(items)
        x = torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1)
        for lin in self.mlp:
            x = F.relu(lin(x))
            if self.dropout and self.training:
                x = F.dropout(x, self.dropout)
        return self.final(torch.cat([gmf, x], dim=-1)).squeeze(-1)


def ncf_loss(model: NeuMF, batch: dict) -> torch.Tensor:
    logits = model(batch["users"], batch["items"])
    return F.binary_cross_entropy_with_logits(logits.float(), batch["labels"])


@torch.no_grad()
def evaluate(model: nn.Module, data, k: int = 10, batch_users: int = 1024, rank: int = 0,
             world_size: int = 1, allreduce=None) -> dict:
    """HR@K and NDCG@K over all users (see ``hvd_bert.common.ncf``); ``allreduce`` sums the
    ranks' ``[hits, ndcg, users]`` (a collective)."""
    was_training = model.training
    model.eval()
    users = eval_users(data.n_users, rank, world_size)
    sums = np.zeros(3)
    for s in range(0, len(users), batch_users):
        u = users[s:s + batch_users]
        cand = eval_candidates(data, u)
        scores = model(torch.from_numpy(np.repeat(u, cand.shape[1])),
                       torch.from_numpy(cand.ravel().astype(np.int64)))
        sums += hit_rate_ndcg(scores.float().view(len(u), -1).numpy(), k)
    if allreduce is not None:
        sums = allreduce(sums)
    model.train(was_training)
    return {"hr": sums[0] / max(sums[2], 1), "ndcg": sums[1] / max(sums[2], 1), "users": int(sums[2])}


def run(cfg: NCFConfig) -> dict:
    import horovod.torch as hvd

    from hvd_bert.common.ncf_data import load_ncf
    from hvd_bert.common.runlog import RunLog
    from hvd_bert.pt.engine import Engine, _ensure_init, fit
    from hvd_bert.pt.pretrain import _summary_writer

    _ensure_init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    out = Path(cfg.train.output_dir)
    data = load_ncf(cfg.data)
    plan = cfg.train.batch.plan(size)
    epochs = EpochData(data, rank, size, plan.local_batch_size, plan.backward_passes_per_step,
                       cfg.num_negatives, cfg.train.seed)
    total = epochs.steps_per_epoch * cfg.epochs
    train_cfg = replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=total))
    torch.manual_seed(cfg.train.seed)
    m = cfg.model
    model = NeuMF(data.n_users, data.n_items, m.factors, m.layers, m.dropout)
    engine = Engine.from_config(model, train_cfg)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    log = RunLog(out, rank, total_steps=total, progress=cfg.progress,
                 writer=_summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=("loss", "lr", "samples_per_s"))
    n_params = sum(p.numel() for p in model.parameters())
    log.print(f"NeuMF ({n_params / 1e6:.2f}M parameters) on {cfg.data}: {data.n_users} users, {data.n_items} "
              f"items, {len(data.train_users)} positives x (1 + {cfg.num_negatives} negatives) = "
              f"{epochs.steps_per_epoch} steps an epoch, at most {cfg.epochs} epochs")

    def allreduce(sums):
        return hvd.allreduce(torch.from_numpy(sums), op=hvd.Sum, name="hvd_bert.ncf.eval").numpy()  # Horovod:

    on_step = EpochEvaluation(cfg, epochs.steps_per_epoch, total, log, lambda: evaluate(
        model, data, cfg.top_k, cfg.eval_batch_users, rank, size, allreduce))

    def batches_from(micro_step):
        for u, i, y in epochs.stream(micro_step):
            yield {"users": torch.from_numpy(u.astype(np.int64)),
                   "items": torch.from_numpy(i.astype(np.int64)), "labels": torch.from_numpy(y)}

    t = cfg.train
    res = fit(engine, batches_from, ncf_loss, total_steps=total, output_dir=out,
              checkpoint_every=t.checkpoint_every, keep_checkpoints=t.keep_checkpoints, log_every=t.log_every,
              log=log, unit="samples", on_step=on_step)
    log.close()
    if rank == 0:
        best = on_step.best
        print(f"{'stopped by a signal at' if res.stopped_by_signal else 'finished'} step {res.steps}: best "
              f"HR@{cfg.top_k} {best['hr']:.4f} (epoch {best['epoch']:g}); metrics: {out / 'metrics.jsonl'}",
              flush=True)
    return {"steps": res.steps, **on_step.best}
