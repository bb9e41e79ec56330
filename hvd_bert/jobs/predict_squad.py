"""``hvd-bert predict`` for a SQuAD model (see ``jobs.predict``): answers to questions about
contexts, from a SQuAD file, JSON lines of questions and contexts, or a prepared dev set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hvd_bert.config import PredictConfig
from hvd_bert.data.kinds import KIND_SQUAD
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import SIDECAR, read_sidecar
from hvd_bert.data.squad import convert_examples, read_questions
from hvd_bert.evaluation.finetune import eval_batches, prepared_answers, span_logits, squad_scores
from hvd_bert.evaluation.squad_predictions import predictions
from hvd_bert.jobs.predict_model import load_scorer, output_path, tokenizer_of, vocab_mismatch
from hvd_bert.files import atomic_write

__all__ = ["answer"]

# How a checkpoint that does not say (a Hugging Face folder) turns questions into features:
# Google's run_squad defaults.
SQUAD_SHAPE = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}


def answer(cfg: PredictConfig, backend, rec: dict, rank: int, size: int) -> dict:
    source = Path(cfg.input).expanduser()
    out = output_path(cfg, ".predictions.json")
    shape = {k: rec.get(k) or v for k, v in SQUAD_SHAPE.items()}
    shape["max_seq_length"] = cfg.max_seq_length or shape["max_seq_length"]
    v2 = bool(rec.get("version_2_with_negative"))
    prepared = (source / SIDECAR).is_file()
    if prepared:
        meta = read_sidecar(source, KIND_SQUAD)
        if meta["is_training"]:
            raise DatasetError(f"{source} was prepared for training (no prediction maps): prepare it again "
                               f"with hvd-bert prepare-squad --split dev, or give the SQuAD file itself")
        error = vocab_mismatch(rec, meta, cfg.checkpoint, source)
        if error:
            raise DatasetError(error)
        v2, shape["max_seq_length"] = bool(meta["version_2_with_negative"]), meta["max_seq_length"]
    score, shape["max_seq_length"] = load_scorer(backend, cfg, shape["max_seq_length"], backend.bert_span)

    if prepared:  # every feature scored once, the answers made on rank 0
        allreduce = lambda x: backend.allreduce_sum(x, "hvd_bert.predict")  # noqa: E731
        got = prepared_answers(score, eval_batches(source, meta, rank, size, cfg.batch_size), allreduce,
                               source, meta, cfg, rank)
        order, preds, nbest, odds, gold = [], {}, {}, {}, None
        if got is not None:
            examples, preds, nbest, odds = got
            order = [e["qas_id"] for e in examples]
            qas = [{"id": e["qas_id"], "answers": [{"text": a} for a in e["answers"]]}
                   for e in examples if e["answers"]]
            gold = [{"paragraphs": [{"qas": qas}]}] if qas else None
    else:  # rank r answers the questions r, r + P, ... on its own, rank 0 gathers the answers
        examples, gold_file = read_questions(source)
        gold = gold_file["data"] if gold_file else None
        mine = examples[rank::size]
        tok, lower = tokenizer_of(cfg.checkpoint, rec)
        vocab = tok.get_vocab()

        def tokenize_words(words):
            return [e.tokens for e in tok.encode_batch(words, add_special_tokens=False)] if words else []
        feats = convert_examples(mine, tokenize_words, vocab, shape["max_seq_length"], shape["doc_stride"],
                                 shape["max_query_length"], is_training=False)
        for uid, f in enumerate(feats):
            f["unique_id"] = uid

        def batches():
            for s in range(0, len(feats), cfg.batch_size):
                chunk = feats[s:s + cfg.batch_size]
                yield {"unique_ids": np.asarray([f["unique_id"] for f in chunk], np.int64),
                       **{k: np.asarray([f[k] for f in chunk], np.int64)
                          for k in ("input_ids", "input_mask", "segment_ids")}}
        rows = span_logits(score, batches(), shape["max_seq_length"])
        results = {uid: (row[0].tolist(), row[1].tolist()) for uid, row in rows.items()}
        answered = predictions([{"qas_id": e.qas_id, "doc_tokens": e.doc_tokens} for e in mine], feats,
                               results, cfg.n_best_size, cfg.max_answer_length, lower, v2,
                               cfg.null_score_diff_threshold)
        parts = backend.allgather_object(answered, "hvd_bert.predict_squad")
        order = [e.qas_id for e in examples]
        preds, nbest, odds = ({k: v for part in parts for k, v in part[i].items()} for i in range(3))

    if rank == 0:
        _write(out, order, preds, nbest, odds if v2 else None)
        line = f"wrote {len(order)} answers of {cfg.checkpoint} on {source} to {out}"
        scores = squad_scores(gold, preds, odds, v2) if gold else {}
        if scores:
            em = scores.get("eval_exact_match", scores.get("eval_exact"))
            line += f"; against the answers in {source.name}: EM {em:.2f} F1 {scores['eval_f1']:.2f}"
        print(line, flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")  # no rank exits before the file is written
    return {"stopped": False, "predictions": len(order), "output": str(out)}


def _write(out: Path, order: list[str], preds: dict, nbest: dict, odds: dict | None) -> None:
    """``.json``: the official predictions file (question id -> answer); ``.jsonl``/``.tsv``:
    each question's answer, its probability among the n-best (v2.0: and the null odds)."""
    if out.suffix.lower() == ".json":
        text = json.dumps({q: preds[q] for q in order}, indent=4) + "\n"
    else:
        rows = []
        for q in order:
            p = next((c["probability"] for c in nbest[q] if c["text"] == preds[q]), 0.0)
            rows.append({"id": q, "answer": preds[q], "probability": p,
                         **({"null_odds": odds[q]} if odds is not None else {})})
        if out.suffix.lower() == ".tsv":
            keys = ["id", "answer", "probability"] + (["null_odds"] if odds is not None else [])
            text = "\n".join(["\t".join(keys)] + ["\t".join(str(r[k]) for k in keys) for r in rows]) + "\n"
        else:
            text = "".join(json.dumps(r) + "\n" for r in rows)
    atomic_write(out, lambda t: t.write_text(text))
