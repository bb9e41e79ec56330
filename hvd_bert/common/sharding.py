"""Shard assignment as pure functions of (items, rank, world_size, epoch, seed).

Data code receives rank and size; it does not call Horovod. Within an epoch every item goes
to exactly one rank and per-rank counts differ by at most one; each epoch reshuffles with a
seed derived from (seed, epoch), so every rank computes the same permutation independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

import numpy as np

__all__ = ["epoch_permutation", "split_evenly", "assign_files", "assign_records", "ReadPlan",
           "plan_reads", "TooFewShardsError"]

T = TypeVar("T")


class TooFewShardsError(ValueError):
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
