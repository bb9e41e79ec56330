"""Predictions on your own text with a fine-tuned model, in either framework:

    hvd-bert predict runs/ft reviews.tsv --output predictions.jsonl
    hvd-bert predict runs/squad questions.jsonl      # {"question": ..., "context": ...} per line
    hvd-bert predict runs/ner eng.testb              # a CoNLL file: a tag for every word
    hvd-bert predict runs/ft reviews.tsv -np 2       # split over 2 ranks

The checkpoint says what it predicts: a fine-tuning run folder holds ``task.json`` (the task,
the label names in the classifier's order, the case and sequence length it was trained with,
SQuAD's stride and question length) and ``vocab.txt`` beside its checkpoints (and
``best.npz``); a Hugging Face folder of a ``BertForSequenceClassification`` holds ``id2label``
and its tokenizer, one of a ``BertForQuestionAnswering`` its tokenizer.

* Classification and regression: the input is a TSV/CSV with a header, a JSON-lines file
  (tokenized here, as ``prepare-classification`` does), or a prepared folder. Rank ``r`` of
  ``P`` scores the examples ``r, r + P, ...``; one allreduce gathers the outputs, and rank 0
  writes one prediction per example, in input order: the label name, its probability and
  every label's (regression: the value).
* SQuAD: the input is a SQuAD file, JSON lines of questions and contexts, or a folder from
  ``prepare-squad --split dev``. Rank ``r`` answers the questions ``r, r + P, ...`` (Google's
  windows, n-best and longest-answer rules, ``squad_predictions``), rank 0 writes them in input
  order: ``.json`` is the official predictions file, ``.jsonl``/``.tsv`` add each answer's
  probability (v2.0: the null odds). Gold answers in the input are scored officially.
* Token classification (NER): the input is a CoNLL file, with or without tags
  (``jobs.predict_tokens``); tags in it are scored as ``seqeval`` scores entities.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from hvd_bert.config import ConfigError, PredictConfig
from hvd_bert.data.classification import encode_pairs, label_number, read_texts
from hvd_bert.data.finetune import REGRESSION, SQUAD, TOKENS, prediction_mismatch
from hvd_bert.data.kinds import KIND_CLASSIFY
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import SIDECAR, read_sidecar
from hvd_bert.evaluation.finetune import dense_gather, eval_batches
from hvd_bert.jobs.predict_model import load_scorer, model_record, output_path, tokenizer_of, vocab_mismatch
from hvd_bert.jobs.predict_squad import answer
from hvd_bert.jobs.predict_tokens import tag_words
from hvd_bert.jobs.run_folder import ranks_agree
from hvd_bert.files import atomic_write
from hvd_bert.train.checkpoint import pick_checkpoint

__all__ = ["run"]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def run(cfg: PredictConfig, backend) -> dict:
    if not cfg.checkpoint or not cfg.input:
        raise ConfigError("give the checkpoint and the input: hvd-bert predict CHECKPOINT INPUT "
                          "[--output FILE]")
    rank, size = backend.init(cfg.train)
    output_path(cfg, ".predictions.jsonl")  # (an output over an input: refused before anything is read)
    ranks_agree(cfg, backend)  # the same settings and data everywhere, or one line on every rank
    ckpt, what = pick_checkpoint(cfg.checkpoint, cfg.pick)  # a run folder: its best model by default
    if what:
        cfg = replace(cfg, checkpoint=str(ckpt))
        if rank == 0:
            print(f"predicting with {what}", flush=True)
    rec = model_record(cfg.checkpoint)
    if rec["task"] == SQUAD:
        return answer(cfg, backend, rec, rank, size)
    if rec["task"] == TOKENS:
        return tag_words(cfg, backend, rec, rank, size)
    labels = rec.get("labels") or []
    n_out = 1 if rec["task"] == REGRESSION else len(labels)
    source = Path(cfg.input).expanduser()
    out = output_path(cfg, ".predictions.jsonl")
    build = lambda config, seq: backend.bert_classifier(config, n_out, seq)  # noqa: E731
    gold = None  # (the input's labels, when it has them: the predictions are scored)

    if (source / SIDECAR).is_file():  # a prepared set: its records, its labels checked against the model's
        meta = read_sidecar(source, KIND_CLASSIFY)
        error = prediction_mismatch(cfg.checkpoint, meta, str(source)) if meta.get("labels") else None
        error = error or vocab_mismatch(rec, meta, cfg.checkpoint, source)
        if error:
            raise DatasetError(error)
        n, ids = meta["total_records"], list(range(meta["total_records"]))
        score, _ = load_scorer(backend, cfg, meta["max_seq_length"], build)
        mine = eval_batches(source, meta, rank, size, cfg.batch_size)  # rank r: records r, r + P, ...
    else:
        ids, texts_a, texts_b, gold = read_texts(source, cfg.text_a, cfg.text_b, cfg.id, cfg.label)
        try:  # (checked before scoring)
            gold = gold_values(gold, labels, rec["task"] == REGRESSION, source)
        except DatasetError as e:
            if cfg.label:  # (the labels asked for must fit; a column that is only called label need not)
                raise
            gold = None
            if rank == 0:
                print(f"note: not scored: {e}", flush=True)
        n = len(ids)
        score, seq = load_scorer(backend, cfg, cfg.max_seq_length or rec.get("max_seq_length") or 128, build)
        tok, _ = tokenizer_of(cfg.checkpoint, rec)
        share = range(rank, n, size)
        feats = list(encode_pairs(tok, [texts_a[i] for i in share],
                                  [texts_b[i] for i in share] if texts_b is not None else None, seq))

        def batches():
            for s in range(0, len(feats), cfg.batch_size):
                chunk = feats[s:s + cfg.batch_size]
                yield {k: np.asarray([f[j] for f in chunk], np.int64)
                       for j, k in enumerate(("input_ids", "input_mask", "segment_ids"))}
        mine = batches()

    rows, golds, j = {}, {}, 0
    labelled = (source / SIDECAR).is_file() and bool(meta.get("labels") or rec["task"] == REGRESSION)
    for batch in mine:
        truth = batch.get("label_values", batch.get("label_ids")) if labelled else None
        for i, logits in enumerate(np.asarray(score(batch), np.float64).reshape(-1, n_out)):
            rows[rank + j * size] = logits  # this rank's j-th example is the input's rank + j * P
            if truth is not None:  # (a prepared set's own labels: scored as the fine-tuning evaluation)
                golds[rank + j * size] = np.asarray(truth, np.float64).reshape(-1)[i:i + 1]
            j += 1
    outputs = dense_gather(rows, n, (n_out,), lambda x: backend.allreduce_sum(x, "hvd_bert.predict"))
    if labelled:
        got = dense_gather(golds, n, (1,), lambda x: backend.allreduce_sum(x, "hvd_bert.predict.gold"))[:, 0]
        gold = got if rec["task"] == REGRESSION else got.astype(np.int64)
    metrics = scores(outputs, gold, len(labels), rec) if gold is not None else {}
    if rank == 0:
        _write(out, ids, outputs, labels, rec["task"] == REGRESSION)
        what = "values" if rec["task"] == REGRESSION else f"labels {labels}"
        print(f"wrote {n} predictions ({what}) of {cfg.checkpoint} on {source} to {out}", flush=True)
        if metrics:
            print(f"scored against the input's labels ({n} examples): "
                  + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)
        elif gold is not None:  # (a regression set of one value: no correlation is defined)
            print(f"not scored: the input's labels are all {gold[0]:g}, and Pearson's and Spearman's "
                  f"correlations are undefined for a constant", flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")  # no rank exits before the file is written
    return {"stopped": False, "predictions": n, "output": str(out), **metrics}


def gold_values(gold: list[str] | None, labels: list[str], regression: bool, source: Path):
    """The input's gold labels as the model's outputs count them (label indices, or numbers for
    regression), or None; a label the model does not have is a DatasetError naming it."""
    if gold is None:
        return None
    if regression:
        try:
            values = np.asarray([label_number(g) for g in gold], np.float64)
        except ValueError:
            bad = next(g for g in gold if not _number(g))
            raise DatasetError(f"{source}: the label {bad!r} is not a number, and this model predicts "
                               f"values (regression); give numeric labels, or --label another "
                               f"column") from None
        if not np.isfinite(values).all():
            bad = gold[int(np.argmin(np.isfinite(values)))]
            raise DatasetError(f"{source}: the label {bad!r} is not a finite number; give finite numeric "
                               f"labels, or --label another column")
        return values
    unknown = sorted(set(gold) - set(labels))
    if unknown:
        raise DatasetError(f"{source}: labels {unknown[:5]} are not among the model's {labels}; give the "
                           f"labels it was fine-tuned on, or --label another column")
    return np.asarray([labels.index(g) for g in gold], np.int64)


def _number(text: str) -> bool:
    try:
        label_number(text)
        return True
    except ValueError:
        return False


def scores(outputs: np.ndarray, gold: np.ndarray, n_labels: int, rec: dict) -> dict:
    """The fine-tuning evaluation's metrics (``evaluation.glue.task_metrics``: the task's, or
    accuracy and F1 for two labels; regression: Pearson and Spearman) of the predictions."""
    from hvd_bert.evaluation.glue import confusion, task_metrics

    if rec["task"] == REGRESSION:
        if np.ptp(gold) == 0:
            return {}
        return task_metrics(rec.get("glue_task") or "stsb", predictions=outputs[:, 0], gold=gold)
    cm = confusion(np.argmax(outputs, axis=-1), gold, n_labels)
    return task_metrics(rec.get("glue_task"), cm=cm)


def _write(out: Path, ids: list, outputs: np.ndarray, labels: list[str], regression: bool) -> None:
    """JSON lines, or a ``.tsv`` written by the csv module (a tab-separated dialect: a field
    holding a tab, a newline or a quote is quoted, so every row reads back whole)."""
    import csv
    import io

    tsv = out.suffix.lower() == ".tsv"
    keys = ("id", "value") if regression else ("id", "label", "score")
    buf = io.StringIO()
    table = csv.writer(buf, delimiter="\t", lineterminator="\n") if tsv else None
    if tsv:
        table.writerow(keys)
    for i, o in zip(ids, outputs):
        if regression:
            rec = {"id": i, "value": float(o[0])}
        else:
            p = _softmax(o)
            best = int(np.argmax(p))
            rec = {"id": i, "label": labels[best], "score": float(p[best]),
                   "scores": {name: float(v) for name, v in zip(labels, p)}}
        if tsv:
            table.writerow([rec[k] for k in keys])
        else:
            buf.write(json.dumps(rec) + "\n")
    atomic_write(out, lambda t: t.write_text(buf.getvalue(), newline=""))
