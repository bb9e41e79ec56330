"""SQuAD answers from a model's start and end logits, as Google BERT's ``run_squad.py`` writes
them (``write_predictions``): the n best spans of each question over its features (the
max-context rule, at most ``max_answer_length`` tokens), the WordPiece span mapped back to the
original text (``final_text``), and for v2.0 the null answer when its score beats the best
span by ``null_score_diff_threshold``. Writes ``predictions.json``, ``nbest_predictions.json``
and ``null_odds.json``, the files the official evaluation reads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from hvd_bert.files import atomic_write

__all__ = ["predictions", "final_text", "write_predictions"]


def _best_indexes(logits, n_best_size: int) -> list[int]:
    return [i for i, _ in sorted(enumerate(logits), key=lambda x: x[1], reverse=True)[:n_best_size]]


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _basic_tokens(text: str, do_lower_case: bool) -> list[str]:
    """Google's ``BasicTokenizer``: cleaning, CJK spacing, lower case and accents stripped when
    lower-casing, split on whitespace and punctuation (``tokenizers``' BERT normaliser and
    pre-tokenizer do the same)."""
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    norm = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case,
                          lowercase=do_lower_case)
    return [t for t, _ in BertPreTokenizer().pre_tokenize_str(norm.normalize_str(text))]


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
    chars, ns_to_s = [], {}
    for i, c in enumerate(text):
        if c != " ":
            ns_to_s[len(chars)] = i
            chars.append(c)
    return "".join(chars), ns_to_s


def final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """The predicted WordPiece text projected back onto the original words (Google's
    ``get_final_text``): the original text when the two cannot be aligned."""
    tok_text = " ".join(_basic_tokens(orig_text, do_lower_case))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_map = _strip_spaces(orig_text)
    tok_ns, tok_map = _strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_map.items()}
    o_start = orig_map.get(tok_s_to_ns[start]) if start in tok_s_to_ns else None
    o_end = orig_map.get(tok_s_to_ns[end]) if end in tok_s_to_ns else None
    if o_start is None or o_end is None:
        return orig_text
    return orig_text[o_start:o_end + 1]


def predictions(examples: Sequence[dict], features: Sequence[dict], results: dict[int, tuple],
                n_best_size: int = 20, max_answer_length: int = 30, do_lower_case: bool = True,
                version_2: bool = False, null_score_diff_threshold: float = 0.0
                ) -> tuple[dict, dict, dict]:
    """``(predictions, nbest, null_odds)`` as Google's ``write_predictions`` makes them.
    ``examples``: ``{"qas_id", "doc_tokens"}`` in file order; ``features``: the prediction maps
    (``features.jsonl``); ``results``: unique id -> ``(start_logits, end_logits)``, every
    feature scored once. ``null_odds`` is empty for v1.1."""
    by_example: dict[int, list[dict]] = {}
    for f in features:
        by_example.setdefault(f["example_index"], []).append(f)
    preds, nbest_all, odds = {}, {}, {}
    for ei, ex in enumerate(examples):
        feats = sorted(by_example.get(ei, []), key=lambda f: f["doc_span_index"])
        prelim = []
        score_null, null_fi, null_start, null_end = 1000000, 0, 0.0, 0.0
        for fi, f in enumerate(feats):
            start_logits, end_logits = results[f["unique_id"]]
            to_orig = {int(k): v for k, v in f["token_to_orig_map"].items()}
            max_ctx = {int(k): v for k, v in f["token_is_max_context"].items()}
            if version_2:
                null = start_logits[0] + end_logits[0]
                if null < score_null:
                    score_null, null_fi, null_start, null_end = null, fi, start_logits[0], end_logits[0]
            for s in _best_indexes(start_logits, n_best_size):
                for e in _best_indexes(end_logits, n_best_size):
                    if s >= len(f["tokens"]) or e >= len(f["tokens"]) or s not in to_orig or e not in to_orig:
                        continue
                    if not max_ctx.get(s, False) or e < s or e - s + 1 > max_answer_length:
                        continue
                    prelim.append((fi, s, e, start_logits[s], end_logits[e]))
        if version_2:
            prelim.append((null_fi, 0, 0, null_start, null_end))
        prelim.sort(key=lambda p: p[3] + p[4], reverse=True)
        seen, nbest = set(), []
        for fi, s, e, sl, el in prelim:
            if len(nbest) >= n_best_size:
                break
            f = feats[fi]
            if s > 0:
                to_orig = {int(k): v for k, v in f["token_to_orig_map"].items()}
                tok_text = " ".join(f["tokens"][s:e + 1]).replace(" ##", "").replace("##", "")
                tok_text = " ".join(tok_text.strip().split())
                orig_text = " ".join(ex["doc_tokens"][to_orig[s]:to_orig[e] + 1])
                text = final_text(tok_text, orig_text, do_lower_case)
                if text in seen:
                    continue
            else:
                text = ""
            seen.add(text)
            nbest.append((text, sl, el))
        if version_2 and "" not in seen:
            nbest.append(("", null_start, null_end))
        if not nbest:
            nbest.append(("empty", 0.0, 0.0))
        probs = _softmax([sl + el for _, sl, el in nbest])
        best_non_null = next((n for n in nbest if n[0]), None)
        nbest_all[ex["qas_id"]] = [{"text": t, "probability": p, "start_logit": sl, "end_logit": el}
                                   for (t, sl, el), p in zip(nbest, probs)]
        if not version_2:
            preds[ex["qas_id"]] = nbest[0][0]
        else:
            diff = score_null - best_non_null[1] - best_non_null[2]
            odds[ex["qas_id"]] = diff
            preds[ex["qas_id"]] = "" if diff > null_score_diff_threshold else best_non_null[0]
    return preds, nbest_all, odds


def write_predictions(folder: str | Path, preds: dict, nbest: dict, odds: dict | None) -> list[Path]:
    """``predictions.json``, ``nbest_predictions.json`` (and ``null_odds.json`` for v2.0) in
    the official layout, written atomically."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = [("predictions.json", preds), ("nbest_predictions.json", nbest)] + (
        [("null_odds.json", odds)] if odds else [])
    for name, obj in files:
        atomic_write(folder / name, lambda t, o=obj: t.write_text(json.dumps(o, indent=4) + "\n"))
    return [folder / n for n, _ in files]
