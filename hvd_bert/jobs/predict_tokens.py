"""``hvd-bert predict`` for a token classification (NER) model (see ``jobs.predict``): a tag
for every word of a CoNLL file (``word ... [tag]`` a line, a blank line between sentences).
When the file has tags, the predictions are scored (entity precision, recall and F1, as
``seqeval``; ``evaluation.token_classification``).

The output: ``.txt``/``.conll``: CoNLL's evaluation layout, ``word [gold] predicted`` a line (what
``conlleval`` reads); otherwise JSON lines, ``{"id", "words", "tags"}`` a sentence. Rank ``r``
tags the sentences ``r, r + P, ...``; rank 0 writes them in the input's order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hvd_bert.config import PredictConfig
from hvd_bert.data.masking import special_ids
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import SIDECAR
from hvd_bert.data.token_classification import encode_window, read_conll, word_windows
from hvd_bert.evaluation.token_classification import entity_counts, scores_of
from hvd_bert.core.text import plural
from hvd_bert.files import atomic_write
from hvd_bert.jobs.predict_model import load_scorer, output_path, tokenizer_of

__all__ = ["tag_words"]


def tag_words(cfg: PredictConfig, backend, rec: dict, rank: int, size: int) -> dict:
    source = Path(cfg.input).expanduser()
    out = output_path(cfg, ".predictions.jsonl")
    labels = rec["labels"]
    if (source / SIDECAR).is_file():  # (a prepared folder: another kind of input than this model tags)
        raise DatasetError(f"{source} is a prepared data folder; a token classification model tags words: "
                           f"give the CoNLL file (one word a line, a blank line between sentences)")
    kind = {".json": "a JSON", ".jsonl": "a JSON lines", ".tsv": "a TSV table", ".csv": "a CSV table"}.get(
        source.suffix.lower())
    if kind:  # (read as CoNLL, its lines would be named as bad tags)
        raise DatasetError(f"{source} is {kind} file by its name; a token classification model tags words: "
                           f"give the CoNLL file (one word a line, a blank line between sentences)")
    sentences = read_conll(source, tagged=False)
    unknown = sorted({t for _, tags in sentences for t in tags} - set(labels))
    if unknown and rank == 0:
        print(f"note: tags {unknown} of {source} are not among the model's {labels}: they count as missed",
              flush=True)
    build = lambda config, seq: backend.bert_token_classifier(config, len(labels), seq)  # noqa: E731
    score, seq = load_scorer(backend, cfg, cfg.max_seq_length or rec.get("max_seq_length") or 128, build)
    tok, _ = tokenizer_of(cfg.checkpoint, rec)
    cls, sep = (special_ids(tok)[k] for k in ("[CLS]", "[SEP]"))
    mine = list(range(rank, len(sentences), size))
    records = []  # (sentence, first-piece positions, features) of each window of this rank's sentences
    for i in mine:
        for ids, firsts in word_windows(tok, sentences[i][0], seq):
            records.append((i, firsts, encode_window(ids, firsts, None, seq, cls, sep)))
    tagged: dict[int, list[str]] = {i: [] for i in mine}
    for s in range(0, len(records), cfg.batch_size):
        chunk = records[s:s + cfg.batch_size]
        batch = {k: np.asarray([f[k] for _, _, f in chunk], np.int64)
                 for k in ("input_ids", "input_mask", "segment_ids")}
        logits = np.asarray(score(batch))
        for (i, firsts, _), row in zip(chunk, logits):
            best = row.argmax(-1)
            tagged[i] += [labels[best[p + 1]] if 0 <= p + 1 < len(best) else "O" for p in firsts]
    parts = backend.allgather_object(tagged, "hvd_bert.predict_tokens")
    preds = {i: tags for part in parts for i, tags in part.items()}
    gold = [tags for _, tags in sentences]
    metrics = scores_of(entity_counts(gold, [preds[i] for i in range(len(sentences))])) if all(gold) else {}
    if rank == 0:
        _write(out, sentences, preds)
        words = sum(len(w) for w, _ in sentences)
        print(f"wrote the tags of {plural(words, 'word')} in {plural(len(sentences), 'sentence')} (tags "
              f"{labels}) of "
              f"{cfg.checkpoint} on {source} to {out}", flush=True)
        if metrics:
            print("scored against the input's tags: " + ", ".join(
                f"{k.removeprefix('eval_')} {v:.4f}" for k, v in metrics.items()), flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")  # no rank exits before the file is written
    return {"stopped": False, "predictions": len(sentences), "output": str(out), **metrics}


def _write(out: Path, sentences: list, preds: dict) -> None:
    if out.suffix.lower() in (".txt", ".conll"):
        lines = []
        for i, (words, gold) in enumerate(sentences):
            lines += [" ".join([w, *([gold[j]] if gold else []), preds[i][j]]) for j, w in enumerate(words)]
            lines.append("")
        text = "\n".join(lines) + "\n"
    else:
        text = "".join(json.dumps({"id": i, "words": words, "tags": preds[i]}) + "\n"
                       for i, (words, _) in enumerate(sentences))
    atomic_write(out, lambda t: t.write_text(text))
