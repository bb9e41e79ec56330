"""Batches padded to their longest sequence instead of to ``max_seq_length`` (fine-tuning).

Prepared records are padded to the set's ``max_seq_length``; most GLUE sentences are a
fraction of it. :func:`trim_padding` cuts a batch's sequence features back to its longest
sequence (rounded up to ``multiple`` tokens, which bounds the number of shapes a compiled
step sees). :func:`length_grouped` first regroups the batches of a rank so that sequences of
similar length share a batch: every ``group`` consecutive batches are pooled, sorted by
length and cut into batches again, whose order is then shuffled. The records of a rank and
the number of batches per epoch do not change, so the ranks still agree on the number of
steps, and the order depends only on the seed, the epoch and the rank (the same in both
frameworks, which read the same records in the same order).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

__all__ = ["SEQUENCE_FEATURES", "lengths", "trim_padding", "length_grouped"]

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")


def lengths(batch: dict) -> np.ndarray:
    """Real tokens per sequence (the ``input_mask`` ones: prepared records are padded at the end)."""
    return np.asarray(batch["input_mask"]).sum(axis=1)


def trim_padding(batch: dict, multiple: int = 8) -> dict:
    """``batch`` with its sequence features cut to the longest sequence, rounded up to
    ``multiple`` (never beyond the prepared length)."""
    full = np.asarray(batch["input_ids"]).shape[1]
    longest = int(lengths(batch).max()) if len(batch["input_ids"]) else full
    keep = min(full, max(multiple, -(-longest // multiple) * multiple))
    if keep == full:
        return batch
    return {k: (v[:, :keep] if k in SEQUENCE_FEATURES or _per_position(k, v, full) else v)
            for k, v in batch.items()}


def _per_position(name: str, value, full: int) -> bool:
    """A label a position (token classification's ``label_ids``, as long as the sequence)."""
    return name == "label_ids" and np.ndim(value) == 2 and np.shape(value)[1] == full


def _group(batches: list[dict], rng: np.random.Generator, multiple: int) -> list[dict]:
    size = len(batches[0]["input_ids"])
    pooled = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    order = np.argsort(lengths(pooled), kind="stable")
    cut = [order[i:i + size] for i in range(0, len(order), size)]
    return [trim_padding({k: v[idx] for k, v in pooled.items()}, multiple) for idx in
            (cut[j] for j in rng.permutation(len(cut)))]


def length_grouped(batches: Iterable[dict], group: int, seed: tuple[int, ...], *, multiple: int = 8,
                   start: int = 0) -> Iterator[dict]:
    """The batches of one epoch of one rank, regrouped by length (see the module docstring)
    and trimmed, from batch ``start`` on. ``seed`` (the run's seed, the epoch, the rank) orders
    the batches of each group; all batches must have the same size."""
    pending: list[dict] = []
    index = n = 0

    def flush():
        nonlocal n
        rng = np.random.default_rng([*seed, index])
        for b in _group(pending, rng, multiple):
            if n >= start:
                yield b
            n += 1

    for batch in batches:
        pending.append(batch)
        if len(pending) == group:
            yield from flush()
            pending, index = [], index + 1
    if pending:
        yield from flush()
