"""Token classification's evaluation, framework-free: entities read from tag sequences as
CoNLL's ``conlleval`` reads them (and ``seqeval``'s default mode, which follows it), and the
entity-level precision, recall and F1 (micro-averaged over entity types) with the accuracy
over words.

An entity is ``(type, first word, last word)``. A chunk ends before a ``B``/``S``/``O``, after an
``E``/``S``, or where the type changes; it starts at a ``B`` or ``S``, at an ``I``/``E`` that
does not continue a chunk of its type, or where the type changes. So IOB1 (``I-PER`` opens an
entity), IOB2 and IOBES files all read as their authors meant. A predicted entity counts as
correct when the same type, start and end is a gold entity.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

__all__ = ["entities", "entity_counts", "scores_of", "evaluate_tokens", "word_tags"]

_ENDS_AFTER = {"E", "S"}  # a chunk ending with this tag ends there
_CLOSES = {"B", "S", "O"}  # this tag ends a chunk before it (unless it is O after O)


def _split(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence's tags: ``[(type, start, end), ...]`` (``end`` inclusive)."""
    out, start, prev, prev_kind = [], 0, "O", ""
    for i, tag in enumerate([*tags, "O"]):
        cur, kind = _split(tag)
        if prev != "O" and (prev in _ENDS_AFTER or cur in _CLOSES or kind != prev_kind):
            out.append((prev_kind, start, i - 1))
        continues = prev not in ("O", *_ENDS_AFTER) and kind == prev_kind
        if cur in ("B", "S") or (cur != "O" and not continues):
            start = i
        prev, prev_kind = cur, kind
    return out


def entity_counts(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> np.ndarray:
    """``[correct entities, predicted entities, gold entities, correct words, words]`` over
    sentences of gold and predicted tags (the same lengths)."""
    c = np.zeros(5)
    for g, p in zip(gold, pred):
        ge, pe = set(entities(g)), set(entities(p))
        c += [len(ge & pe), len(pe), len(ge), sum(a == b for a, b in zip(g, p)), len(g)]
    return c


def scores_of(counts: np.ndarray) -> dict:
    """Precision, recall and F1 of the entities, and the words' accuracy, from summed counts."""
    correct, predicted, gold, right, words = (float(x) for x in counts[:5])
    p = correct / predicted if predicted else 0.0
    r = correct / gold if gold else 0.0
    return {"eval_precision": p, "eval_recall": r, "eval_f1": 2 * p * r / (p + r) if p + r else 0.0,
            "eval_accuracy": right / words if words else 0.0}


def word_tags(logits: np.ndarray, label_ids: np.ndarray, labels: Sequence[str]) -> tuple[list, list]:
    """One record's gold and predicted tags at its words (the positions whose label is not -1)."""
    at = np.flatnonzero(label_ids >= 0)
    return [labels[i] for i in label_ids[at]], [labels[i] for i in logits[at].argmax(-1)]


def evaluate_tokens(score, batches: Iterator[dict[str, np.ndarray]], allreduce,
                    labels: Sequence[str]) -> dict:
    """Entity precision, recall and F1, word accuracy and the mean cross-entropy over the words
    of the whole set: ``score(batch)`` gives logits ``[B, S, labels]``; each record is one
    sequence of words (a sentence, or a window of a long one); ``allreduce`` sums the ranks'
    counts (a collective: every rank calls it, with or without batches)."""
    counts, loss = np.zeros(5), np.zeros(3)  # (loss: the words' cross-entropy sum, words, records)
    for b in batches:
        logits = np.asarray(score(b), np.float64)
        gold_ids = b["label_ids"][:, :logits.shape[1]]
        for row, ids in zip(logits, gold_ids):
            loss[2] += 1
            gold, pred = word_tags(row, ids, labels)
            counts += entity_counts([gold], [pred])
            at = ids >= 0
            if at.any():
                z = row[at]
                top = z.max(axis=1)
                nll = np.log(np.exp(z - top[:, None]).sum(axis=1)) + top - z[np.arange(len(z)), ids[at]]
                loss[:2] += [nll.sum(), len(z)]
    totals = np.asarray(allreduce(np.concatenate([counts, loss])))
    out = scores_of(totals[:5])
    out.update(eval_loss=float(totals[5] / max(totals[6], 1.0)), eval_examples=int(round(totals[7])),
               eval_words=int(round(totals[4])))
    return out
