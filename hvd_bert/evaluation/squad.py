"""SQuAD's official metrics, framework-free: exact match and F1 exactly as the official
``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` scripts define them, so that results compare
directly with published ones (BERT-Base SQuAD v1.1 F1 88.5, BERT-Large about 90.9).

* Answers are normalised the same way in both: lower case, punctuation removed, the articles
  ``a``/``an``/``the`` removed, whitespace collapsed. F1 is over the multisets of normalised
  tokens; each question takes the best score over its gold answers.
* v1.1: every question of the data counts; a question without a prediction scores 0 (and is
  reported on stderr). Output: ``{"exact_match": .., "f1": ..}`` in percent.
* v2.0: a question is unanswerable when it has no gold answer (its gold is then the empty
  string, and an empty prediction scores 1); empty tokens lists give F1 = (both empty); the
  totals count the predicted questions; with no-answer probabilities
  (``null_odds.json``) a prediction whose probability is above ``na_prob_thresh`` (1.0)
  counts as "no answer", and the best threshold over the probabilities is searched
  (``best_exact``/``best_f1`` and their thresholds). Output keys: ``exact``, ``f1``,
  ``total``, ``HasAns_*``, ``NoAns_*``, ``best_*``.

``evaluate(dataset, predictions, na_probs)`` picks the version from the data file's
``version`` field, as one would pick the script.
"""

from __future__ import annotations

import collections
import json
import re
import string
import sys
from pathlib import Path

from hvd_bert.data.records import DatasetError
from hvd_bert.data.squad_json import read_json, read_squad_json

__all__ = ["normalize_answer", "f1_v1", "exact_v1",
           "evaluate_v1", "compute_exact", "compute_f1",
           "evaluate_v2", "evaluate", "evaluate_files", "format_result"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


# ----------------------------------------------------------------------------- v1.1
def _token_f1(pred: list[str], gold: list[str]) -> float:
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_v1(prediction: str, ground_truth: str) -> float:
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def exact_v1(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _questions(dataset: list):
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: list, predictions: dict, warn=lambda m: print(m, file=sys.stderr)) -> dict:
    f1 = em = total = 0.0
    for qa in _questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            warn(f"Unanswered question {qa['id']} will receive score 0.")
            continue
        golds = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        em += max(float(exact_v1(pred, g)) for g in golds)
        f1 += max(f1_v1(pred, g) for g in golds)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


# ----------------------------------------------------------------------------- v2.0
def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    gold, pred = _tokens(a_gold), _tokens(a_pred)
    if not gold or not pred:  # an unanswerable question: F1 is 1 if both are empty, else 0
        return float(gold == pred)
    return _token_f1(pred, gold)


def _raw_scores(dataset: list, preds: dict, warn) -> tuple[dict, dict]:
    exact, f1 = {}, {}
    for qa in _questions(dataset):
        qid = qa["id"]
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in preds:  # (scored 0, as the v1.1 script scores an unanswered question; the v2.0
            warn(f"Missing prediction for {qid}; it will receive score 0")  # script has no total for it)
            exact[qid] = f1[qid] = 0
            continue
        exact[qid] = max(compute_exact(g, preds[qid]) for g in golds)
        f1[qid] = max(compute_f1(g, preds[qid]) for g in golds)
    return exact, f1


def _apply_threshold(scores: dict, na_probs: dict, has_ans: dict, thresh: float) -> dict:
    return {qid: (float(not has_ans[qid]) if na_probs.get(qid, 0.0) > thresh else s)
            for qid, s in scores.items()}


def _eval_dict(exact: dict, f1: dict, qids: list | None = None) -> dict:
    if qids is None:
        total = len(exact)
        return {"exact": 100.0 * sum(exact.values()) / total, "f1": 100.0 * sum(f1.values()) / total,
                "total": total}
    total = len(qids)
    return {"exact": 100.0 * sum(exact[k] for k in qids) / total,
            "f1": 100.0 * sum(f1[k] for k in qids) / total, "total": total}


def _best_threshold(preds: dict, scores: dict, na_probs: dict, has_ans: dict) -> tuple[float, float]:
    score = best = sum(1 for k in has_ans if not has_ans[k] and k in preds)  # (a missing one scores 0)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores or qid not in preds:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        score += diff
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset: list, preds: dict, na_probs: dict | None = None, na_prob_thresh: float = 1.0,
                warn=lambda m: print(m, file=sys.stderr)) -> dict:
    with_probs = na_probs is not None
    na_probs = na_probs if with_probs else {k: 0.0 for k in preds}
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset)}
    has_qids = [k for k, v in has_ans.items() if v]
    no_qids = [k for k, v in has_ans.items() if not v]
    exact_raw, f1_raw = _raw_scores(dataset, preds, warn)
    exact = _apply_threshold(exact_raw, na_probs, has_ans, na_prob_thresh)
    f1 = _apply_threshold(f1_raw, na_probs, has_ans, na_prob_thresh)
    out = _eval_dict(exact, f1)
    if has_qids:
        out.update({f"HasAns_{k}": v for k, v in _eval_dict(exact, f1, has_qids).items()})
    if no_qids:
        out.update({f"NoAns_{k}": v for k, v in _eval_dict(exact, f1, no_qids).items()})
    if with_probs:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(preds, exact_raw, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(preds, f1_raw, na_probs, has_ans)
    return out


# ----------------------------------------------------------------------------- files
def evaluate(data: dict, predictions: dict, na_probs: dict | None = None, warn=None) -> dict:
    """The official evaluation for the data file's ``version`` (``1.1`` or ``v2.0``)."""
    warn = warn or (lambda m: print(m, file=sys.stderr))
    version = str(data.get("version", ""))
    if version in ("1.1", "v1.1"):
        return evaluate_v1(data["data"], predictions, warn)
    if version in ("2.0", "v2.0"):
        return evaluate_v2(data["data"], predictions, na_probs, warn=warn)
    raise DatasetError(f"the SQuAD data file's version is {version!r}: expected '1.1' or 'v2.0'")


def evaluate_files(data_file: str | Path, predictions_file: str | Path,
                   na_prob_file: str | Path | None = None) -> dict:
    data = read_squad_json(data_file, "SQuAD data file")
    preds = read_json(predictions_file, "predictions file")
    if not isinstance(preds, dict) or not all(isinstance(v, str) for v in preds.values()):
        raise DatasetError(f"{predictions_file} is not a SQuAD predictions file (a JSON object of "
                           f"question id -> answer text)")
    na = read_json(na_prob_file, "no-answer probabilities file") if na_prob_file else None
    if na is not None and str(data.get("version")) in ("1.1", "v1.1"):
        raise DatasetError(f"--na-prob is for SQuAD v2.0; {data_file} is version 1.1")
    if na is not None:
        import math

        if not isinstance(na, dict):
            raise DatasetError(f"{na_prob_file} is not a no-answer probabilities file (a JSON object of "
                               f"question id -> a number, the official script's null_odds.json)")
        odd = next(((k, v) for k, v in na.items() if isinstance(v, bool) or not isinstance(v, (int, float))
                    or not math.isfinite(v)), None)
        if odd is not None:
            raise DatasetError(f"{na_prob_file}: the no-answer probability of question {odd[0]} is "
                               f"{odd[1]!r}, not a finite number; give each question's probability as a "
                               f"number")
        missing = [k for k in preds if k not in na]
        if missing:
            raise DatasetError(f"{na_prob_file} has no probability for question {missing[0]} "
                               f"({len(missing)} of {len(preds)} missing)")
    return evaluate(data, preds, na)


def format_result(data_version: str, result: dict) -> str:
    """As the official scripts print it: v1.1 one line, v2.0 indented by 2."""
    return json.dumps(result) if str(data_version) in ("1.1", "v1.1") else json.dumps(result, indent=2)
