"""Fine-tuning's evaluation, framework-free: which evaluation records each rank scores, and
the evaluation of each task (classification, regression, SQuAD) with its official metric.

Evaluation is exact: every record of the evaluation set is scored once. Rank ``r`` of ``P``
takes the records whose index (over the files in order) is ``r mod P``, in batches without
dropping a remainder. Classification sums counts and a confusion matrix with an allreduce;
regression and SQuAD need the outputs themselves, so each rank writes its rows into a zero
array of the whole set and one allreduce sums them (a dense gather: every row comes from
exactly one rank, which the summed row counts check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from hvd_bert.data.kinds import spec_for_meta
from hvd_bert.config import FinetuneConfig
from hvd_bert.data.records import decode_batch, iter_records
from hvd_bert.evaluation.direction import better, greater_is_better

__all__ = ["eval_batches", "Evaluation", "best_metric_of", "evaluate_classification", "evaluate_regression",
           "evaluate_squad", "prepared_answers", "span_logits", "squad_scores", "dense_gather"]

def eval_batches(folder: str | Path, meta: dict, rank: int, world_size: int, batch_size: int,
                 trim: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """This rank's share of the evaluation records (see the module docstring), decoded, in
    batches; the last one may be short, and a rank may have none. ``trim``: cut each batch
    to its longest sequence, rounded up to this many tokens (``padding.trim_padding``)."""
    from hvd_bert.data.padding import trim_padding

    spec = spec_for_meta(meta)
    rows, index = [], 0

    def batch():
        b = decode_batch(rows, spec)
        return trim_padding(b, trim) if trim else b

    for shard in meta["shards"]:
        for _, rec in iter_records(Path(folder) / shard["file"]):
            if index % world_size == rank:
                rows.append(rec)
                if len(rows) == batch_size:
                    yield batch()
                    rows = []
            index += 1
    if rows:
        yield batch()


def dense_gather(rows: dict[int, np.ndarray], n: int, shape: tuple[int, ...], allreduce) -> np.ndarray:
    """The rows ``index -> array of shape`` that the ranks hold between them, as one
    ``[n, *shape]`` array on every rank: each rank writes its own rows into zeros and one
    allreduce sums them. Every index must come from exactly one rank (checked with a count)."""
    out = np.zeros((n, int(np.prod(shape)) + 1), np.float64)
    for i, v in rows.items():
        out[i, :-1] = np.asarray(v, np.float64).ravel()
        out[i, -1] += 1
    out = np.asarray(allreduce(out.ravel())).reshape(n, -1)
    counts = np.rint(out[:, -1]).astype(np.int64)
    if (counts != 1).any():
        bad = np.flatnonzero(counts != 1)
        raise RuntimeError(f"evaluation rows {bad[:5].tolist()} were scored {counts[bad[:5]].tolist()} times "
                           f"across the ranks (every one must be scored once)")
    return out[:, :-1].reshape(n, *shape)


def evaluate_regression(score, batches: Iterator[dict[str, np.ndarray]], allreduce, n: int, rank: int,
                        world_size: int) -> dict:
    """Mean squared error, Pearson and Spearman correlation (GLUE's STS-B metrics) over the
    ``n`` records of the set: ``score(batch)`` gives ``[B, 1]`` predictions of a batch of
    :func:`eval_batches` (record ``rank + j * world_size`` is this rank's ``j``-th)."""
    from hvd_bert.evaluation.glue import pearson, spearman

    rows, j = {}, 0
    for b in batches:
        pred = np.asarray(score(b), np.float64).reshape(-1)
        for p, y in zip(pred, b["label_values"].reshape(-1)):
            rows[rank + j * world_size] = np.array([p, y])
            j += 1
    both = dense_gather(rows, n, (2,), allreduce)
    pred, gold = both[:, 0], both[:, 1]
    return {"eval_pearson": pearson(pred, gold), "eval_spearman": spearman(pred, gold),
            "eval_loss": float(np.mean((pred - gold) ** 2)), "eval_examples": n}


def span_logits(score, batches: Iterator[dict[str, np.ndarray]], max_seq_length: int
                ) -> dict[int, np.ndarray]:
    """Each scored SQuAD feature's start and end logits (``[2, max_seq_length]``) by its unique
    id. Padding gets -10000: it is never an answer, nor one of the n-best starts and ends (which
    makes the predictions independent of how far a batch was trimmed)."""
    rows = {}
    for b in batches:
        start, end = (np.asarray(x, np.float64) for x in score(b))
        real = b["input_mask"].sum(axis=1)
        for uid, st, en, n_tokens in zip(b["unique_ids"].reshape(-1), start, end, real):
            row = np.full((2, max_seq_length), -10000.0)
            row[0, :n_tokens], row[1, :n_tokens] = st[:n_tokens], en[:n_tokens]
            rows[int(uid)] = row
    return rows


def evaluate_squad(score, batches: Iterator[dict[str, np.ndarray]], allreduce, folder: str | Path,
                   meta: dict, cfg: FinetuneConfig, rank: int, output_dir: str | Path | None) -> dict:
    """SQuAD prediction and its official scores: every feature of the prepared dev set is
    scored once across the ranks (``score(batch) -> (start_logits, end_logits)``, each
    ``[B, S]``, possibly trimmed), the logits are gathered densely, and rank 0 writes
    ``predictions.json``, ``nbest_predictions.json`` (and ``null_odds.json`` for v2.0) to
    ``output_dir`` in the official layout (``squad.predictions``: n-best, the longest answer,
    the v2.0 null threshold) and scores them against the gold answers as the official
    scripts do (``squad_metrics``). Returns the scores on rank 0 ({} elsewhere)."""
    from hvd_bert.evaluation.squad_predictions import write_predictions

    answers = prepared_answers(score, batches, allreduce, folder, meta, cfg, rank)
    if answers is None:
        return {}
    examples, preds, nbest, odds = answers
    v2 = bool(meta["version_2_with_negative"])
    if output_dir is not None:
        write_predictions(output_dir, preds, nbest, odds if v2 else None)
    gold = [{"paragraphs": [{"qas": [{"id": e["qas_id"], "answers": [{"text": a} for a in e["answers"]]}
                                     for e in examples]}]}]
    return {**squad_scores(gold, preds, odds, v2), "eval_examples": len(examples),
            "eval_features": meta["total_records"]}


def prepared_answers(score, batches: Iterator[dict[str, np.ndarray]], allreduce, folder: str | Path,
                     meta: dict, cfg, rank: int) -> tuple[list[dict], dict, dict, dict] | None:
    """The answers to a prepared SQuAD set (``prepare-squad --split dev``), its features scored
    once across the ranks: on rank 0 ``(examples, predictions, nbest, null_odds)``
    (``squad_predictions.predictions``, with ``cfg``'s n-best size, longest answer and null
    threshold), None elsewhere."""

    from hvd_bert.data.squad import FIRST_UNIQUE_ID
    from hvd_bert.evaluation.squad_predictions import predictions

    s, n = meta["max_seq_length"], meta["total_records"]
    rows = {uid - FIRST_UNIQUE_ID: row for uid, row in span_logits(score, batches, s).items()}
    logits = dense_gather(rows, n, (2, s), allreduce)
    if rank != 0:
        return None
    from hvd_bert.data.squad import read_side_files

    examples, features = read_side_files(folder, meta)
    results = {f["unique_id"]: (logits[f["unique_id"] - FIRST_UNIQUE_ID, 0].tolist(),
                                logits[f["unique_id"] - FIRST_UNIQUE_ID, 1].tolist()) for f in features}
    preds, nbest, odds = predictions(examples, features, results, cfg.n_best_size, cfg.max_answer_length,
                                     meta["do_lower_case"], bool(meta["version_2_with_negative"]),
                                     cfg.null_score_diff_threshold)
    return examples, preds, nbest, odds


def squad_scores(gold: list, preds: dict, odds: dict, version_2: bool) -> dict:
    """The official scores of ``preds`` against ``gold`` (a SQuAD file's ``data``), named as
    the evaluation logs them (``eval_exact_match``/``eval_f1``; v2.0: ``eval_exact``, the
    HasAns/NoAns split and the best thresholds)."""
    from hvd_bert.evaluation.squad import evaluate_v1, evaluate_v2

    quiet = lambda _m: None  # noqa: E731  (every question has a prediction)
    if version_2:
        res = evaluate_v2(gold, preds, odds, warn=quiet)
        out = {"eval_exact": res["exact"], "eval_f1": res["f1"]}
        out.update({f"eval_{k}": v for k, v in res.items() if k.startswith(("HasAns_", "NoAns_", "best_"))
                    and not k.endswith("_total")})
        return out
    res = evaluate_v1(gold, preds, warn=quiet)
    return {"eval_exact_match": res["exact_match"], "eval_f1": res["f1"]}


def evaluate_classification(score, batches: Iterator[dict[str, np.ndarray]], allreduce,
                            num_labels: int | None = None, task: str | None = None) -> dict:
    """Accuracy, mean cross-entropy and the task's metrics (:func:`glue.task_metrics`: MCC for
    CoLA, F1 for MRPC/QQP and any two-label set) over the whole set: ``score(batch)`` gives
    the logits ``[B, labels]`` of one batch of :func:`eval_batches`, ``allreduce`` sums the
    ranks' ``[loss sum, count, confusion matrix...]`` (a collective: every rank must call it,
    with or without batches of its own, and so ``num_labels`` is given, not seen)."""
    from hvd_bert.evaluation.glue import confusion, task_metrics

    cm, sums = None, np.zeros(2)
    for b in batches:
        logits = np.asarray(score(b), np.float64)
        labels = b["label_ids"].reshape(-1)
        num_labels = num_labels or logits.shape[1]
        top = logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        nll = log_z - logits[np.arange(len(labels)), labels]
        part = confusion(logits.argmax(axis=1), labels, num_labels)
        cm = part if cm is None else cm + part
        sums += [nll.sum(), len(labels)]
    if num_labels is None:
        raise ValueError("num_labels is needed on a rank without evaluation batches")
    cm = np.zeros((num_labels, num_labels)) if cm is None else cm
    totals = np.asarray(allreduce(np.concatenate([sums, cm.ravel().astype(np.float64)])))
    cm = np.rint(totals[2:]).astype(np.int64).reshape(num_labels, num_labels)
    n = max(totals[1], 1.0)
    out = {"eval_accuracy": float(np.trace(cm) / n), "eval_loss": float(totals[0] / n),
           "eval_examples": int(totals[1])}
    out.update(task_metrics(task, cm))
    return out


# what the evaluation line shows, in this order (SQuAD's scores are percentages)
_SHOWN = (("eval_exact_match", "EM", 2), ("eval_exact", "EM", 2), ("eval_accuracy", "accuracy", 4),
          ("eval_f1", "F1", 4), ("eval_mcc", "MCC", 4), ("eval_pearson", "Pearson", 4),
          ("eval_spearman", "Spearman", 4), ("eval_best_f1", "best F1", 2))


# every score a fine-tuning evaluation gives, of any task (SQuAD v2.0 adds its HasAns_, NoAns_ and
# best_ scores): a best_metric outside them is a misspelling, refused before training
SCORES = ("eval_accuracy", "eval_loss", "eval_f1", "eval_mcc", "eval_pearson", "eval_spearman",
          "eval_precision", "eval_recall", "eval_exact_match", "eval_exact")
SQUAD_V2_PREFIXES = ("eval_HasAns_", "eval_NoAns_", "eval_best_")
# the scores each task's evaluation can give (classification: F1 with two labels or a GLUE task's,
# MCC with CoLA's; SQuAD v2.0 adds SQUAD_V2_PREFIXES' scores)
TASK_SCORES = {"classification": ("eval_accuracy", "eval_loss", "eval_f1", "eval_mcc"),
               "regression": ("eval_pearson", "eval_spearman", "eval_loss"),
               "token-classification": ("eval_f1", "eval_precision", "eval_recall", "eval_accuracy",
                                        "eval_loss"),
               "squad": ("eval_exact_match", "eval_exact", "eval_f1")}


def best_metric_of(cfg: FinetuneConfig, task: str, glue_task: str | None) -> str:
    """The score that decides the best model: ``cfg.best_metric``, else the task's own (GLUE's
    first metric, SQuAD's and token classification's F1, regression's Pearson, classification's
    accuracy). A name no evaluation gives is a ConfigError naming the ones there are (whether
    this task gives it is known at its first evaluation)."""
    if cfg.best_metric:
        from hvd_bert.config import ConfigError

        if cfg.best_metric not in SCORES and not cfg.best_metric.startswith(SQUAD_V2_PREFIXES):
            raise ConfigError(f"best_metric {cfg.best_metric!r} is no score of an evaluation; give one of "
                              f"{', '.join(SCORES)} (SQuAD v2.0 also eval_HasAns_f1, eval_best_f1, ...)")
        kind = "regression" if task == "regression" else task if task in TASK_SCORES else "classification"
        v2 = kind == "squad" and cfg.best_metric.startswith(SQUAD_V2_PREFIXES)
        if cfg.best_metric not in TASK_SCORES[kind] and not v2:  # (another task's: refused before training)
            raise ConfigError(f"best_metric {cfg.best_metric!r} is not a score of {kind}'s evaluation; give "
                              f"one of {', '.join(TASK_SCORES[kind])}")
        return cfg.best_metric
    if glue_task:
        from hvd_bert.data.glue import TASKS
        return f"eval_{TASKS[glue_task].metrics[0]}"
    return {"squad": "eval_f1", "regression": "eval_pearson", "token-classification": "eval_f1"}.get(
        task, "eval_accuracy")


class Evaluation:
    """The fine-tuning jobs' evaluation: ``report(step)`` runs ``evaluate()`` (a collective
    returning the task's ``eval_*`` scores and ``eval_examples``; SQuAD's only on rank 0,
    which then shares them), prints and records it; as ``fit``'s ``on_step`` hook it reports
    every ``eval_every`` steps before the last (the job reports the last itself).

    As the Trainer does: each report that improves ``metric`` calls ``save_best(step, res)``
    (rank 0 writes best.npz and best.json), and after ``patience`` reports in a row without
    improvement the hook returns True, which stops the run (every rank decides alike: the
    scores are the same on every rank)."""

    def __init__(self, cfg: FinetuneConfig, total_steps: int, log, evaluate, broadcast=None,
                 positive: str | None = None, metric: str = "eval_accuracy", save_best=None):
        self.cfg, self.total, self.log, self.evaluate = cfg, total_steps, log, evaluate
        self.broadcast, self.positive = broadcast, positive  # positive: the class F1 is of
        self.metric, self.save_best = metric, save_best
        self.larger: bool | None = None  # (from its name, at the first report)
        self.best: tuple[float, int] | None = None  # (score, step)
        self.since_best = 0
        self.last: tuple[int, dict] | None = None  # the latest report: (step, scores)

    def report(self, step: int) -> dict:
        if self.last is not None and self.last[0] == step:  # (an early stop evaluated this step)
            return self.last[1]
        res = self.evaluate()
        if self.broadcast is not None:
            res = self.broadcast(res)
        squad = "eval_exact_match" in res or "eval_exact" in res
        named = {"eval_f1": f"F1 of {self.positive!r}"} if self.positive and not squad else {}
        shown = ", ".join(f"{named.get(k, label)} {res[k]:.{2 if squad else digits}f}"
                          for k, label, digits in _SHOWN if k in res)
        loss = f" (loss {res['eval_loss']:.4f})" if "eval_loss" in res else ""
        self.log.print(f"eval at step {step}: {shown} on {res['eval_examples']} "
                       f"{'questions' if squad else 'examples'}{loss}")
        self.log.record({"step": step, **res}, prefix="eval", show=False)
        self._track(step, res)
        self.last = (step, res)
        return res

    def _track(self, step: int, res: dict) -> None:
        if self.metric not in res:
            from hvd_bert.config import ConfigError
            raise ConfigError(f"best_metric {self.metric!r} is not among this task's scores "
                              f"{sorted(k for k in res if k.startswith('eval_'))}; give one of those")
        if self.larger is None:
            try:
                self.larger = greater_is_better(self.metric, getattr(self.cfg, "greater_is_better", None))
            except ValueError as e:
                from hvd_bert.config import ConfigError
                raise ConfigError(str(e)) from None
        score = float(res[self.metric])
        if step and better(score, self.best[0] if self.best else None, self.larger):
            self.best, self.since_best = (score, step), 0
            if self.save_best is not None:
                self.save_best(step, res)
        elif step:
            self.since_best += 1

    def __call__(self, result, _metrics=None) -> bool:
        every = self.cfg.eval_every
        if self.cfg.eval_data and every and result.step % every == 0 and result.step < self.total:
            self.report(result.step)
            patience = self.cfg.early_stopping_patience
            if patience and self.since_best >= patience:
                self.log.print(f"early stopping at step {result.step}: {self.metric} has not improved on "
                               f"{self.best[0]:.4f} (step {self.best[1]}) for {patience} evaluations")
                return True
        return False
