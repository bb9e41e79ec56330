"""Google BERT's ``create_pretraining_data.py`` algorithm, framework-free: documents of token
ids -> sentence-pair instances (with random next sentences from the same shard) -> masked-LM
records (80% [MASK], 10% random word, 10% kept) in Google's feature layout."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from hvd_bert.data.records import (serialize_rows)
from hvd_bert.data.vocab import SPECIAL_TOKENS

__all__ = ["PretrainingSettings", "Instance", "create_instances", "masked_records", "special_ids"]


@dataclass(frozen=True)
class PretrainingSettings:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    do_lower_case: bool = True
    seed: int = 12345

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be >= 8, got {self.max_seq_length}")
        if not 0 < self.masked_lm_prob < 1:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1 or self.dupe_factor < 1:
            raise ValueError("max_predictions_per_seq and dupe_factor must be >= 1")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ValueError(f"max_predictions_per_seq {self.max_predictions_per_seq} is more than the "
                             f"max_seq_length of {self.max_seq_length} positions there are to mask: give "
                             f"--max-predictions-per-seq {self.max_seq_length} or less (BERT uses 20 at 128, "
                             f"80 at 512)")



# ----------------------------------------------------------------------------- instances
@dataclass
class Instance:
    """[CLS] a [SEP] b [SEP] before masking (``masked_records`` masks a chunk of them at once)."""
    tokens: list[int]
    len_a: int
    is_random_next: bool


def _truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Google's truncation (the longer side loses a token at its front or back, at random,
    until the pair fits), counted first and cut once."""
    a0, a1, b0, b1 = 0, len(a), 0, len(b)
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        if a1 - a0 > b1 - b0:
            if rng.random() < 0.5:
                a0 += 1
            else:
                a1 -= 1
        elif rng.random() < 0.5:
            b0 += 1
        else:
            b1 -= 1
    a[:] = a[a0:a1]
    b[:] = b[b0:b1]


def _instances_from_document(docs: list[list[list[int]]], di: int, s: PretrainingSettings,
                             ids: dict, vocab_size: int, rng: random.Random) -> list[Instance]:
    document = docs[di]
    max_num_tokens = s.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < s.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    instances, chunk, length, i = [], [], 0, 0
    while i < len(document):
        seg = document[i]
        chunk.append(seg)
        length += len(seg)
        if i == len(document) - 1 or length >= target:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for c in chunk[:a_end] for t in c]
                b: list[int] = []
                random_next = False
                if len(chunk) == 1 or rng.random() < 0.5:
                    random_next = True
                    target_b = target - len(a)
                    rdi = di
                    for _ in range(10):
                        rdi = rng.randint(0, len(docs) - 1)
                        if rdi != di:
                            break
                    rdoc = docs[rdi]
                    start = rng.randint(0, len(rdoc) - 1)
                    for j in range(start, len(rdoc)):
                        b.extend(rdoc[j])
                        if len(b) >= target_b:
                            break
                    i -= len(chunk) - a_end  # put the unused segments back
                else:
                    for c in chunk[a_end:]:
                        b.extend(c)
                _truncate_seq_pair(a, b, max_num_tokens, rng)
                if a and b:
                    instances.append(Instance([ids["[CLS]"], *a, ids["[SEP]"], *b, ids["[SEP]"]], len(a),
                                              random_next))
            chunk, length = [], 0
        i += 1
    return instances


def create_instances(docs: list[list[list[int]]], s: PretrainingSettings, ids: dict, vocab_size: int,
                     rng: random.Random) -> list[Instance]:
    """Google's algorithm over tokenized documents: ``dupe_factor`` passes, shuffled."""
    docs = [d for d in docs if d]
    rng.shuffle(docs)
    instances = []
    for _ in range(s.dupe_factor):
        for di in range(len(docs)):
            instances.extend(_instances_from_document(docs, di, s, ids, vocab_size, rng))
    rng.shuffle(instances)
    return instances


def masked_records(instances: list[Instance], s: PretrainingSettings, vocab_size: int, mask_id: int,
             gen: np.random.Generator, chunk: int = 2048) -> Iterator[bytes]:
    """The instances, masked, as ``tf.train.Example`` records in Google's features (padded
    with zeros), a chunk at a time.

    Google's masking, drawn with numpy for a chunk at once: ``num = min(max_predictions,
    max(1, round(len * masked_lm_prob)))`` positions uniformly among the tokens that are not
    [CLS] or [SEP] (Google shuffles them and takes the first ``num``: the same distribution),
    each replaced by [MASK] (80%), kept (10%) or a random token (10%)."""
    seq, pred = s.max_seq_length, s.max_predictions_per_seq
    col = np.arange(seq)[None, :]
    for c in range(0, len(instances), chunk):
        part = instances[c:c + chunk]
        n = len(part)
        ids = np.zeros((n, seq), np.int64)
        for r, inst in enumerate(part):
            ids[r, :len(inst.tokens)] = inst.tokens
        t = np.array([len(i.tokens) for i in part])[:, None]
        la = np.array([i.len_a for i in part])[:, None]
        real = col < t
        segs = ((col >= la + 2) & real).astype(np.int64)
        cand = ((col >= 1) & (col <= la)) | ((col >= la + 2) & (col <= t - 2))
        want = np.maximum(1, np.round(t[:, 0] * s.masked_lm_prob).astype(np.int64))
        num = np.minimum(np.minimum(pred, want), cand.sum(axis=1))
        keys = np.where(cand, gen.random((n, seq)), 2.0)
        first = np.argsort(keys, axis=1, kind="stable")[:, :pred]
        valid = np.arange(pred)[None, :] < num[:, None]
        pos = np.sort(np.where(valid, first, seq), axis=1)   # chosen positions, ascending, then pads
        pos = np.where(valid, pos, 0)
        rows = np.arange(n)[:, None]
        labels = np.where(valid, ids[rows, pos], 0)
        r1, r2 = gen.random((n, pred)), gen.random((n, pred))
        new = np.where(r1 < 0.8, mask_id, np.where(r2 < 0.5, labels, gen.integers(0, vocab_size, (n, pred))))
        masked = ids.copy()
        masked[np.broadcast_to(rows, pos.shape)[valid], pos[valid]] = new[valid]
        nsp = np.array([[i.is_random_next] for i in part], np.int64)
        yield from serialize_rows({"input_ids": (masked, "int"), "input_mask": (real.astype(np.int64), "int"),
                                   "segment_ids": (segs, "int"), "masked_lm_positions": (pos, "int"),
                                   "masked_lm_ids": (labels, "int"),
                                   "masked_lm_weights": (valid.astype(np.float32), "float"),
                                   "next_sentence_labels": (nsp, "int")})


def special_ids(tok) -> dict:
    vocab = tok.get_vocab()
    return {t: vocab[t] for t in SPECIAL_TOKENS}
