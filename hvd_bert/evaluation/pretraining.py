"""Pretraining's held-out evaluation, framework-free: masked-LM loss and accuracy and
next-sentence accuracy over every held-out sequence once, summed across ranks."""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["evaluate_pretraining"]


def evaluate_pretraining(score, batches: Iterator[dict[str, np.ndarray]], allreduce) -> dict:
    """Held-out masked-LM loss and accuracy (over the real predictions, ``masked_lm_weights``)
    and next-sentence accuracy over the whole set: ``score(batch)`` gives ``(mlm_logits
    [B, P, V], nsp_logits [B, 2])``; ``allreduce`` sums the ranks' ``[mlm loss sum, mlm
    correct, predictions, nsp correct, sequences]`` (a collective)."""
    sums = np.zeros(5)
    for b in batches:
        mlm, nsp = (np.asarray(x, np.float64) for x in score(b))
        ids, w = b["masked_lm_ids"], b["masked_lm_weights"].astype(np.float64)
        top = mlm.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(mlm - top).sum(axis=-1)) + top[..., 0]
        nll = log_z - np.take_along_axis(mlm, ids[..., None].astype(np.int64), axis=-1)[..., 0]
        labels = b["next_sentence_labels"].reshape(-1)
        sums += [(nll * w).sum(), ((mlm.argmax(-1) == ids) * w).sum(), w.sum(),
                 (nsp.argmax(-1) == labels).sum(), len(labels)]
    s = np.asarray(allreduce(sums))
    return {"eval_mlm_loss": float(s[0] / max(s[2], 1)), "eval_mlm_accuracy": float(s[1] / max(s[2], 1)),
            "eval_nsp_accuracy": float(s[3] / max(s[4], 1)), "eval_examples": int(s[4])}
