"""GLUE's official metrics, framework-free (as the GLUE baselines and scikit-learn compute them):
accuracy; F1 of class ``1`` (MRPC, QQP); Matthews correlation (CoLA); Pearson and Spearman
correlation (STS-B, a regression task). :func:`task_metrics` gives each task its own."""

from __future__ import annotations

import numpy as np

from hvd_bert.data.glue import TASKS

__all__ = ["confusion", "accuracy", "f1_binary", "matthews", "pearson", "spearman", "task_metrics"]


def confusion(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> np.ndarray:
    """Counts ``[gold, pred]``."""
    cm = np.zeros((num_labels, num_labels), np.int64)
    np.add.at(cm, (np.asarray(gold, np.int64), np.asarray(pred, np.int64)), 1)
    return cm


def accuracy(cm: np.ndarray) -> float:
    return float(np.trace(cm) / max(cm.sum(), 1))


def f1_binary(cm: np.ndarray, positive: int = 1) -> float:
    tp = cm[positive, positive]
    fp, fn = cm[:, positive].sum() - tp, cm[positive, :].sum() - tp
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def matthews(cm: np.ndarray) -> float:
    """Matthews correlation of a confusion matrix (the multi-class form; 0 when undefined)."""
    cm = cm.astype(np.float64)
    t, p, c, s = cm.sum(axis=1), cm.sum(axis=0), np.trace(cm), cm.sum()
    den = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / den) if den else 0.0


def pearson(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    den = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / den) if den else 0.0


def _ranks(v: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    sv = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    return pearson(_ranks(np.asarray(x, np.float64)), _ranks(np.asarray(y, np.float64)))


def task_metrics(task: str | None, cm: np.ndarray | None = None, predictions=None, gold=None) -> dict:
    """The task's metrics (``eval_<name>``): from the summed confusion matrix for the
    classification tasks, from the predictions for STS-B. Without a task: accuracy, and F1 for
    two labels."""
    names = TASKS[task].metrics if task else (("accuracy", "f1") if cm is not None and len(cm) == 2
                                               else ("accuracy",))
    out = {}
    for name in names:
        if name == "accuracy":
            out["eval_accuracy"] = accuracy(cm)
        elif name == "f1":
            out["eval_f1"] = f1_binary(cm)
        elif name == "mcc":
            out["eval_mcc"] = matthews(cm)
        elif name == "pearson":
            out["eval_pearson"] = pearson(predictions, gold)
        elif name == "spearman":
            out["eval_spearman"] = spearman(predictions, gold)
    return out
