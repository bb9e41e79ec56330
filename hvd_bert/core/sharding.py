"""Shard assignment as pure functions of (items, rank, world_size, epoch, seed).

Data code receives rank and size; it does not call Horovod. Within an epoch every item goes
to exactly one rank and per-rank counts differ by at most one; each epoch reshuffles with a
seed derived from (seed, epoch), so every rank computes the same permutation independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

import numpy as np

__all__ = ["check_epochs", "epoch_permutation", "split_evenly", "assign_files", "assign_records", "ReadPlan",
           "plan_reads", "TooFewShardsError", "ShardingError"]

T = TypeVar("T")


class ShardingError(ValueError):
    """The data cannot be split over the ranks as asked (the user's to fix: one line)."""


class TooFewShardsError(ShardingError):
    """Fewer shard files than ranks: some rank would get no data."""


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


def epoch_permutation(n: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """The order of ``n`` items in ``epoch``: a permutation that depends only on
    (n, epoch, seed); the identity when ``shuffle`` is off."""
    if not shuffle:
        return np.arange(n)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch) & 0xFFFFFFFF, 0x5EED])
    return rng.permutation(n)


def split_evenly(n: int, parts: int, index: int) -> range:
    """Contiguous range ``index`` of ``n`` items cut into ``parts`` pieces whose sizes differ
    by at most one (the first ``n % parts`` pieces are one longer)."""
    _check_rank(index, parts)
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return range(start, start + q + (1 if index < r else 0))


def assign_files(files: Sequence[T], rank: int, world_size: int, epoch: int = 0, seed: int = 0,
                 shuffle: bool = True) -> list[T]:
    """The whole files that ``rank`` reads in ``epoch``.

    Files are permuted per epoch and dealt round-robin (rank r takes positions r, r+P, ...),
    so counts differ by at most one. Fewer files than ranks is a :class:`TooFewShardsError`.
    """
    _check_rank(rank, world_size)
    if len(files) < world_size:
        raise TooFewShardsError(
            f"{len(files)} shard file(s) for {world_size} ranks: every rank needs at least one "
            f"file. Write at least {world_size} shards (e.g. prepare the data with "
            f"--num-shards {world_size * 4}), or ask for record-level striding "
            f"(record_striding=True), where every rank reads every file and keeps every "
            f"{world_size}-th record")
    order = epoch_permutation(len(files), epoch, seed, shuffle)
    return [files[i] for i in order[rank::world_size]]


def assign_records(n_records: int, rank: int, world_size: int, epoch: int = 0, seed: int = 0,
                   shuffle: bool = True) -> np.ndarray:
    """Indices of the records ``rank`` takes in ``epoch``, out of ``n_records`` (strided over
    the epoch's permutation: counts differ by at most one)."""
    _check_rank(rank, world_size)
    return epoch_permutation(n_records, epoch, seed, shuffle)[rank::world_size]


@dataclass(frozen=True)
class ReadPlan:
    """What one rank reads in one epoch: ``files`` in order, and of the records met while
    reading them in that order, those with ``index % record_stride == record_offset``."""

    files: tuple
    record_stride: int = 1
    record_offset: int = 0


def plan_reads(files: Sequence[T], rank: int, world_size: int, epoch: int = 0, seed: int = 0,
               shuffle: bool = True, record_striding: bool = False) -> ReadPlan:
    """Whole files per rank (the default, and the fast path), or with ``record_striding``
    every rank reads all files in the epoch's order and keeps every ``world_size``-th record
    (for fewer files than ranks)."""
    _check_rank(rank, world_size)
    if not files:
        raise ValueError("no input files: pass at least one shard file")
    if record_striding:
        order = epoch_permutation(len(files), epoch, seed, shuffle)
        return ReadPlan(tuple(files[i] for i in order), world_size, rank)
    return ReadPlan(tuple(assign_files(files, rank, world_size, epoch, seed, shuffle)))


# ---------------------------------------------------------------------------- reading order
# A windowed shuffle that both readers reproduce exactly: records (numbered in the order this
# rank reads them) are cut into windows of `shuffle_buffer`, and each window is sorted by
# shuffle_keys(index, seed). The keys are three Lehmer (Park-Miller) rounds modulo the prime
# 2^31 - 1: each round is a bijection, so keys are distinct, and every product stays below
# 2^48, so numpy and TensorFlow int64 arithmetic give the same numbers.
LEHMER_M = 2**31 - 1
_ROUNDS = ((48271, 0), (69621, 1), (16807, 2))


def stream_seed(seed: int, epoch: int, rank: int) -> int:
    """The shuffle seed of one rank's stream in one epoch (a number below 2^31 - 1)."""
    return ((int(seed) * 1_000_003 + int(epoch)) * 1_000_003 + int(rank)) % LEHMER_M


def round_constants(stream: int) -> list[tuple[int, int]]:
    return [(a, (stream * 2_654_435_761 + 97 * (i + 1)) % LEHMER_M) for a, i in _ROUNDS]


def shuffle_keys(indices: np.ndarray, stream: int) -> np.ndarray:
    """Distinct pseudo-random sort keys for record indices (see above)."""
    k = np.asarray(indices, dtype=np.int64) % LEHMER_M
    for a, c in round_constants(stream):
        k = (k * a + c) % LEHMER_M
    return k


def window_order(n: int, start_index: int, stream: int) -> np.ndarray:
    """The permutation of one window of ``n`` records whose first record has index
    ``start_index``."""
    return np.argsort(shuffle_keys(np.arange(start_index, start_index + n), stream), kind="stable")


def rank_record_count(counts: Sequence[int], files: Sequence, plan: ReadPlan) -> int:
    """Records one rank reads under ``plan``, from the per-file counts."""
    by_file = dict(zip(files, counts))
    total = sum(by_file[f] for f in plan.files)
    if plan.record_stride == 1:
        return total
    return len(range(plan.record_offset, total, plan.record_stride))


def epoch_batches(files: Sequence, counts: Sequence[int], world_size: int, local_batch_size: int,
                  epoch: int = 0, seed: int = 0, record_striding: bool = False,
                  shuffle: bool = True) -> int:
    """Batches per rank in ``epoch``: the same on every rank (the smallest rank's count), so no
    rank starts an allreduce that another never joins."""
    per_rank = [rank_record_count(counts, files, plan_reads(files, r, world_size, epoch, seed, shuffle,
                                                            record_striding))
                for r in range(world_size)]
    n = min(per_rank) // local_batch_size
    if n == 0:
        total = sum(counts)
        if min(per_rank) == 0 or local_batch_size == 1:  # (a smaller batch cannot help)
            fix = (f"use fewer ranks (at most {max(1, min(len([c for c in counts if c]), total))} for "
                   f"these shards) or more data, or prepare it again with fewer shards (--num-shards)")
        else:
            fix = "use a smaller train.batch.local_batch_size, fewer ranks or more data"
        raise ShardingError(
            f"a rank gets only {min(per_rank)} records in epoch {epoch} ({total} records in {len(counts)} "
            f"shard(s) over {world_size} ranks), fewer than one local batch of {local_batch_size}; {fix}")
    return n


def check_epochs(files: Sequence, counts: Sequence[int], world_size: int, local_batch_size: int,
                 micro_steps: int, seed: int = 0, record_striding: bool = False,
                 max_epochs: int = 100) -> None:
    """Before the first step: every epoch the run will read (``micro_steps`` micro-batches per
    rank in all) gives every rank at least one batch, or the ShardingError naming the fix that
    applies (``epoch_batches``); a rank's share of the shards changes from epoch to epoch."""
    done, epoch = 0, 0
    while done < micro_steps and epoch < max_epochs:
        done += epoch_batches(files, counts, world_size, local_batch_size, epoch, seed, record_striding)
        epoch += 1
