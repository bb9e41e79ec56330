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
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np

from hvd_bert.config import (BatchConfig, ConfigError, OptimConfig, ScheduleConfig, TrainConfig,
                                    _require, doc)
from hvd_bert.data.ncf import NCFData, _positive_lookup, epoch_keys, epoch_pairs

__all__ = ["NCFConfig", "ModelConfig", "rank_of_positive", "hit_rate_ndcg", "eval_users", "eval_candidates",
           "EpochData", "EpochEvaluation", "popularity_scores", "evaluate"]


@dataclass(frozen=True)
class ModelConfig:
    """NeuMF sizes (NVIDIA's defaults): GMF factors and the MLP's layer widths (the first is
    the concatenated user and item MLP embeddings)."""

    factors: int = doc(64, "GMF embedding size")
    layers: tuple[int, ...] = doc((256, 256, 128, 64), "MLP widths; layers[0] / 2 is each MLP embedding")
    dropout: float = doc(0.0, "dropout between MLP layers")

    def __post_init__(self) -> None:
        _require(self.factors > 0, f"model.factors must be > 0, got {self.factors}")
        _require(len(self.layers) >= 1 and all(w > 0 for w in self.layers),
                 f"model.layers must be positive widths, got {self.layers}")
        _require(self.layers[0] % 2 == 0, f"model.layers[0] must be even (user + item), got {self.layers[0]}")


@dataclass(frozen=True)
class NCFConfig:
    """NCF (NeuMF) on implicit feedback with Horovod. Defaults: NVIDIA's model and Adam
    settings, sized for the synthetic ml-1m data on a small machine."""

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="adamw", lr=0.0045, beta1=0.25, beta2=0.5, eps=1e-8, weight_decay=0.0),
        schedule=ScheduleConfig(name="constant", total_steps=1),
        batch=BatchConfig(local_batch_size=8192, backward_passes_per_step=1),
        log_every=20, checkpoint_every=0, output_dir=""), "")
    model: ModelConfig = doc(ModelConfig(), "")
    data: str = doc("", "folder from hvd-bert prepare-ncf; empty: synthetic ml-1m prepared under the cache")
    epochs: int = doc(20, "maximum epochs (sets train.schedule.total_steps)")
    num_negatives: int = doc(4, "sampled negatives per positive in each epoch")
    target_hr: float = doc(0.0, "stop when HR@K reaches this (0: run all epochs)")
    top_k: int = doc(10, "K of HR@K and NDCG@K")
    eval_every: float = doc(1.0, "evaluate every this many epochs (fractions: within an epoch)")
    eval_batch_users: int = doc(1024, "users scored per evaluation batch on one rank")
    progress: bool = doc(False, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        _require(self.epochs > 0, f"epochs must be > 0, got {self.epochs}")
        _require(self.num_negatives > 0, f"num_negatives must be > 0, got {self.num_negatives}")
        _require(0 <= self.target_hr <= 1, f"target_hr must be in [0, 1], got {self.target_hr}")
        _require(self.top_k > 0 and self.eval_every > 0 and self.eval_batch_users > 0,
                 "top_k, eval_every and eval_batch_users must be > 0")


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


# ----------------------------------------------------------------------------- training data
class EpochData:
    """Each epoch's training pairs (every positive and ``num_negatives`` fresh negatives per
    positive) in an order shuffled with a seed of the epoch (``ncf_data.epoch_pairs``): rank
    ``r`` takes positions ``r, r + P, ...`` of it and computes only those pairs, so every rank
    does 1/P of the sampling, and the epoch (its pairs and their order) does not depend on the
    number of ranks. Every rank gets ``steps_per_epoch x k`` micro-batches of
    ``local_batch_size``; the tail that does not fill a global batch is left out."""

    CHUNK = 1 << 20  # pairs computed at a time (memory stays bounded at any data size)

    def __init__(self, data: NCFData, rank: int, world_size: int, local_batch_size: int,
                 backward_passes_per_step: int, num_negatives: int = 4, seed: int = 0):
        self.data, self.rank, self.world_size = data, rank, world_size
        self.b, self.k = local_batch_size, backward_passes_per_step
        self.num_negatives, self.seed = num_negatives, seed
        self.lookup = _positive_lookup(data.train_users, data.train_items, data.n_items)
        n = len(data.train_users) * (1 + num_negatives)
        global_batch = local_batch_size * backward_passes_per_step * world_size
        self.steps_per_epoch = n // global_batch
        if self.steps_per_epoch < 1:
            raise ConfigError(f"the global batch {global_batch} is larger than an epoch ({n} training "
                              f"pairs); lower train.batch.local_batch_size")
        self.micro_per_epoch = self.steps_per_epoch * backward_passes_per_step

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """This rank's ``(users, items, labels)`` micro-batches of ``epoch`` from ``start`` on."""
        keys, b, d = epoch_keys(self.seed, epoch), self.b, self.data
        per_chunk = max(1, self.CHUNK // b)
        for m0 in range(start, self.micro_per_epoch, per_chunk):
            m1 = min(m0 + per_chunk, self.micro_per_epoch)
            positions = self.rank + self.world_size * np.arange(m0 * b, m1 * b, dtype=np.int64)
            u, i, y = epoch_pairs(d.train_users, d.train_items, d.n_items, self.num_negatives, positions,
                                  keys, self.lookup)
            for m in range(m1 - m0):
                s = slice(m * b, (m + 1) * b)
                yield u[s], i[s], y[s]

    def stream(self, start_micro: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        epoch, start = divmod(start_micro, self.micro_per_epoch)
        while True:
            yield from self.epoch(epoch, start)
            epoch, start = epoch + 1, 0


class EpochEvaluation:
    """The jobs' ``on_step`` hook: after every ``eval_every`` epochs (and the last step) run
    ``evaluate()`` (a collective returning ``{"hr", "ndcg"}``), record HR@K, NDCG@K, the wall
    time since training started and the time spent evaluating, keep the best, and stop once
    ``target_hr`` is reached."""

    def __init__(self, cfg: NCFConfig, steps_per_epoch: int, total_steps: int, log, evaluate):
        self.cfg, self.steps_per_epoch, self.total, self.log, self.evaluate = (
            cfg, steps_per_epoch, total_steps, log, evaluate)
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
            self.best.update(hr=res["hr"], ndcg=res["ndcg"], epoch=epoch)
        if cfg.target_hr and res["hr"] >= cfg.target_hr:
            self.log.print(f"target HR@{k} {cfg.target_hr} reached at epoch {epoch:.3g} after "
                           f"{rec['time_s']:.1f} s")
            self.best.update(reached_s=rec["time_s"], reached_train_s=rec["train_s"], reached_epoch=epoch,
                             hr_at_target=res["hr"], ndcg_at_target=res["ndcg"])
            return True
        return False
