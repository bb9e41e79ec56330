"""GLUE's published TSV layouts, framework-free (as Google's ``run_classifier.py`` and the GLUE
baselines read them); each task's official metric is in ``hvd_bert.evaluation.glue``.

Layouts: CoLA's train/dev files have no header (source, label, original label, sentence);
the others have one, and the columns are taken by position as the reference processors
take them (MNLI's label is the last column, ``gold_label``). Quoting is off (a quote is text),
as in Google's reader. MNLI has two dev files, ``dev_matched.tsv`` and
``dev_mismatched.tsv``, each prepared and scored on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


__all__ = ["GlueTask", "TASKS", "read_task"]


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
