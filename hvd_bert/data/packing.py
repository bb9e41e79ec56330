"""Pretraining batches packed: several sequences share one row, so fewer padded tokens pass
through the encoder (MLPerf's packed samples, done per batch, as the batch is read).

Prepared pretraining records are padded to ``max_seq_length``; on Wikipedia about 8% of the
tokens at sequence 128 and 22% at 512 are padding. :func:`pack_batch` places the batch's
sequences, longest first, each into the first row with room for it (first-fit decreasing),
and returns a batch with fewer rows plus what the model needs to keep the sequences apart:

    input_ids, segment_ids, input_mask  [R, S]  the packed rows (mask 1 on real tokens)
    position_ids                        [R, S]  each token's position in its own sequence
    sequence_ids                        [R, S]  1, 2, ... per sequence of the row, 0 on padding:
                                                a token attends only to its own sequence's tokens
    cls_positions                       [B]     each sequence's first token, as an index into
                                                the rows flattened to [R * S]
    masked_lm_positions                 [B, P]  the masked tokens, indices into [R * S]
    segment_offsets                     [N + 1] (``segments=True``) where each sequence, and each
                                                row's padding tail, starts in the rows flattened
                                                to [R * S], then R * S: the spans that varlen
                                                attention keeps apart, with no [R, S, S] mask

``masked_lm_ids``, ``masked_lm_weights`` and ``next_sentence_labels`` stay per sequence, in
the batch's order, so the loss (the masked-LM mean over the batch's real predictions, the
next-sentence mean over its sequences) is the unpacked batch's. The step still trains the
same sequences; only the rows they occupy change. Sequences longer than half a row never
share one, so the saving comes from the short ones.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PACKED_FEATURES", "pack_batch", "is_packed", "row_fill"]

PACKED_FEATURES = ("position_ids", "sequence_ids", "cls_positions", "segment_offsets")  # (the last one
# only in a batch packed with segments=True)


def is_packed(batch: dict) -> bool:
    return "cls_positions" in batch


def _first_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, offset) of each sequence and the number of rows: sequences taken longest first
    (ties in batch order), each into the first row with room for it."""
    row = np.empty(len(lengths), dtype=np.int64)
    offset = np.empty(len(lengths), dtype=np.int64)
    used: list[int] = []  # tokens used per row
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        for r, u in enumerate(used):
            if u + n <= capacity:
                row[i], offset[i] = r, u
                used[r] = u + n
                break
        else:
            row[i], offset[i] = len(used), 0
            used.append(n)
    return row, offset, len(used)


def pack_batch(batch: dict, segments: bool = False) -> dict:
    """The batch with its sequences packed into as few rows as first-fit decreasing finds (see
    the module docstring). A batch of full rows comes back with the same rows in the same order
    (plus the packed features; ``segments``: ``segment_offsets`` too)."""
    ids = np.asarray(batch["input_ids"])
    b, s = ids.shape
    mask = np.asarray(batch["input_mask"])
    lengths = np.maximum(mask.sum(axis=1).astype(np.int64), 1)  # ([CLS] at least: a row's own slot)
    row, offset, rows = _first_fit_decreasing(lengths, s)

    # every real token's place: sequence i's token t goes to (row[i], offset[i] + t)
    seq_of = np.repeat(np.arange(b), lengths)
    tok = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    dest = row[seq_of] * s + offset[seq_of] + tok
    rank_in_row = np.empty(b, dtype=np.int64)  # 1, 2, ... by offset within each row
    order = np.lexsort((offset, row))
    starts = np.r_[0, np.flatnonzero(np.diff(row[order])) + 1]
    rank_in_row[order] = np.arange(b) - np.repeat(starts, np.diff(np.r_[starts, b])) + 1

    def scatter(values: np.ndarray, fill=0) -> np.ndarray:
        out = np.full(rows * s, fill, dtype=values.dtype)
        out[dest] = values
        return out.reshape(rows, s)

    out = dict(batch)
    out["input_ids"] = scatter(ids[seq_of, tok])
    out["segment_ids"] = scatter(np.asarray(batch["segment_ids"])[seq_of, tok])
    out["input_mask"] = scatter(np.ones(len(dest), dtype=mask.dtype))
    out["position_ids"] = scatter(tok.astype(ids.dtype))
    out["sequence_ids"] = scatter(rank_in_row[seq_of].astype(ids.dtype))
    base = row * s + offset
    out["cls_positions"] = base.astype(ids.dtype)
    pos = np.asarray(batch["masked_lm_positions"])
    out["masked_lm_positions"] = (base[:, None] + pos).astype(pos.dtype)
    if segments:  # every sequence's start and end; a row's first sequence starts it, so rows are in
        out["segment_offsets"] = np.unique(np.r_[base, base + lengths, rows * s]).astype(np.int64)
    return out


def row_fill(batch: dict) -> float:
    """The fraction of the batch's token slots that hold real tokens."""
    mask = np.asarray(batch["input_mask"])
    return float(mask.sum()) / mask.size if mask.size else 1.0
