"""NCF training and evaluation, framework-free: the job's config, each rank's share of an
epoch, the evaluation users of each rank, and HR@K / NDCG@K from scores (vectorised numpy).

Evaluation (He et al. 2017, NVIDIA's NCF; MLPerf): every user's held-out item is ranked among
its sampled negatives (100, or MLPerf's 999: chosen when the data is prepared) by the model's
score. The item's rank is the number of negatives that
score at least as high (ties count against the model, so a constant model scores 0, not 1).
HR@K is the fraction of users whose item ranks below K; NDCG@K adds ``1 / log2(rank + 2)``
for those. Rank ``r`` of ``P`` scores users ``r, r + P, ...``; the sums and the user count
are combined with one allreduce, so the result does not depend on the number of ranks.
"""

from __future__ import annotations

import time

import numpy as np

from hvd_bert.config import NCFConfig
from hvd_bert.data.ncf import NCFData

__all__ = ["rank_of_positive", "hit_rate_ndcg", "eval_users", "eval_candidates",
           "EpochEvaluation", "popularity_scores", "evaluate"]


# ----------------------------------------------------------------------------- metrics
def rank_of_positive(scores: np.ndarray) -> np.ndarray:
    """``scores [n, 1 + negatives]`` with the held-out item in column 0 -> its 0-based rank."""
    scores = np.asarray(scores)
    return (scores[:, 1:] >= scores[:, :1]).sum(axis=1)


def hit_rate_ndcg(scores: np.ndarray, k: int = 10) -> tuple[float, float, int]:
    """``(sum of hits, sum of NDCG, users)`` of a block of users (sums: add across ranks)."""
    r = rank_of_positive(scores)
    hit = r < k
    return float(hit.sum()), float((hit / np.log2(r + 2.0)).sum()), len(r)


def eval_users(n_users: int, rank: int, world_size: int) -> np.ndarray:
    return np.arange(rank, n_users, world_size, dtype=np.int64)


def eval_candidates(data: NCFData, users: np.ndarray) -> np.ndarray:
    """``[len(users), 1 + negatives]`` items to score: the held-out item, then its negatives."""
    return np.concatenate([data.test_items[users, None], data.test_negatives[users]], axis=1)


def evaluate(score, data: NCFData, k: int = 10, batch_users: int = 1024, rank: int = 0,
             world_size: int = 1, allreduce=None) -> dict:
    """HR@K and NDCG@K over all users, split across the ranks (see the module docstring).
    ``score(users, items)`` (int64 arrays of one length) returns the model's scores as an array;
    ``allreduce`` sums the ranks' ``[hits, ndcg, users]`` (a collective)."""
    users = eval_users(data.n_users, rank, world_size)
    sums = np.zeros(3)
    for s in range(0, len(users), batch_users):
        u = users[s:s + batch_users]
        cand = eval_candidates(data, u)
        scores = np.asarray(score(np.repeat(u, cand.shape[1]), cand.ravel().astype(np.int64)), np.float64)
        sums += hit_rate_ndcg(scores.reshape(len(u), -1), k)
    if allreduce is not None:
        sums = np.asarray(allreduce(sums))
    return {"hr": sums[0] / max(sums[2], 1), "ndcg": sums[1] / max(sums[2], 1), "users": int(sums[2])}


def popularity_scores(data: NCFData, users: np.ndarray) -> np.ndarray:
    """The popularity baseline: an item's score is its training count."""
    counts = np.bincount(data.train_items, minlength=data.n_items).astype(np.float64)
    return counts[eval_candidates(data, users)]


class EpochEvaluation:
    """The jobs' ``on_step`` hook: after every ``eval_every`` epochs (and the last step) run
    ``evaluate()`` (a collective returning ``{"hr", "ndcg"}``), record HR@K, NDCG@K, the wall
    time since training started and the time spent evaluating, keep the best, and stop once
    ``target_hr`` is reached. ``save_best(step, res)`` (every rank: it may be a collective)
    runs at each evaluation that improves HR@K."""

    def __init__(self, cfg: NCFConfig, steps_per_epoch: int, total_steps: int, log, evaluate, save_best=None):
        self.cfg, self.steps_per_epoch, self.total, self.log, self.evaluate = (
            cfg, steps_per_epoch, total_steps, log, evaluate)
        self.save_best = save_best
        self.start, self.eval_s = time.perf_counter(), 0.0
        self.interval = max(1, round(cfg.eval_every * steps_per_epoch))
        self.best: dict = {"hr": 0.0, "ndcg": 0.0, "epoch": 0}

    def __call__(self, result, _metrics=None) -> bool:
        cfg, k = self.cfg, self.cfg.top_k
        if result.step % self.interval and result.step != self.total:
            return False
        t = time.perf_counter()
        res = self.evaluate()
        self.eval_s += time.perf_counter() - t
        epoch = result.step / self.steps_per_epoch
        wall = time.perf_counter() - self.start
        rec = {"step": result.step, "epoch": epoch, f"hr@{k}": res["hr"], f"ndcg@{k}": res["ndcg"],
               "time_s": wall, "eval_s": self.eval_s, "train_s": wall - self.eval_s}
        self.log.record(rec, prefix="eval", show=False)
        self.log.print(f"epoch {epoch:.3g}: HR@{k} {res['hr']:.4f}, NDCG@{k} {res['ndcg']:.4f} "
                       f"({rec['time_s']:.1f} s)")
        if res["hr"] > self.best["hr"]:
            self.best.update(hr=res["hr"], ndcg=res["ndcg"], epoch=epoch, step=result.step)
            if self.save_best is not None:
                self.save_best(result.step, rec)
        if cfg.target_hr and res["hr"] >= cfg.target_hr:
            self.log.print(f"target HR@{k} {cfg.target_hr} reached at epoch {epoch:.3g} after "
                           f"{rec['time_s']:.1f} s")
            self.best.update(reached_s=rec["time_s"], reached_train_s=rec["train_s"], reached_epoch=epoch,
                             hr_at_target=res["hr"], ndcg_at_target=res["ndcg"])
            return True
        return False
