"""GLUE, framework-free: each task's published TSV layout (as Google's ``run_classifier.py``
and the GLUE baselines read them) and each task's official metric.

Layouts: CoLA's train/dev files have no header (source, label, original label, sentence);
the others have one, and the columns are taken by position as the reference processors
take them (MNLI's label is the last column, ``gold_label``). Quoting is off (a quote is text),
as in Google's reader. MNLI has two dev files, ``dev_matched.tsv`` and
``dev_mismatched.tsv``, each prepared and scored on its own.

Metrics (GLUE's): CoLA Matthews correlation; MRPC and QQP accuracy and F1 of the positive
class ``1``; STS-B Pearson and Spearman correlation (a regression task); the others
accuracy. ``confusion`` counts are summed over ranks (an allreduce), so every example counts
once; the correlations need the predictions themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GlueTask", "TASKS", "read_task", "confusion", "accuracy", "f1_binary", "matthews",
           "pearson", "spearman", "task_metrics"]


@dataclass(frozen=True)
class GlueTask:
    header: bool
    text_a: int
    text_b: int | None
    label: int
    labels: tuple[str, ...] | None   # None: regression (a float score)
    metrics: tuple[str, ...]


TASKS = {
    "cola": GlueTask(False, 3, None, 1, ("0", "1"), ("mcc",)),
    "sst2": GlueTask(True, 0, None, 1, ("0", "1"), ("accuracy",)),
    "mrpc": GlueTask(True, 3, 4, 0, ("0", "1"), ("accuracy", "f1")),
    "stsb": GlueTask(True, 7, 8, -1, None, ("pearson", "spearman")),
    "qqp": GlueTask(True, 3, 4, 5, ("0", "1"), ("accuracy", "f1")),
    "mnli": GlueTask(True, 8, 9, -1, ("contradiction", "entailment", "neutral"), ("accuracy",)),
    "qnli": GlueTask(True, 1, 2, -1, ("entailment", "not_entailment"), ("accuracy",)),
    "rte": GlueTask(True, 1, 2, -1, ("entailment", "not_entailment"), ("accuracy",)),
    "wnli": GlueTask(True, 1, 2, -1, ("0", "1"), ("accuracy",)),
}


def read_task(task: str, rows: list[list[str]], source: str) -> tuple[list[str], list[str] | None, list[str]]:
    """``(texts_a, texts_b or None, labels)`` from a GLUE task's TSV rows (header included
    where the task has one). A row too short for the task's columns is an error naming its
    line."""
    from hvd_bert.data.records import DatasetError

    t = TASKS[task]
    body = rows[1:] if t.header else rows
    need = max(t.text_a, t.text_b if t.text_b is not None else 0, t.label if t.label >= 0 else 0) + 1
    a, b, y = [], [] if t.text_b is not None else None, []
    for n, r in enumerate(body):
        line = n + (2 if t.header else 1)
        if len(r) < need:
            raise DatasetError(f"{source} line {line} has {len(r)} columns; the {task} layout needs {need} "
                               f"(is this the {task} file? test files have no labels)")
        a.append(r[t.text_a])
        if b is not None:
            b.append(r[t.text_b])
        y.append(r[t.label].strip())
    if t.labels is not None:
        unknown = sorted(set(y) - set(t.labels))
        if unknown:
            raise DatasetError(f"{source}: labels {unknown[:5]} are not {task}'s {list(t.labels)}")
    else:
        try:
            [float(v) for v in y]
        except ValueError:
            raise DatasetError(f"{source}: a {task} score is not a number") from None
    return a, b, y


# ----------------------------------------------------------------------------- metrics
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
