"""Sentence(-pair) classification and regression sets from TSV/CSV (or a GLUE task's published
files) -> TFRecord shards in Google's ``run_classifier`` feature layout."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import file_sha256, write_sidecar
from hvd_bert.data.glue import TASKS, read_task
from hvd_bert.data.masking import special_ids
from hvd_bert.data.kinds import KIND_CLASSIFY
from hvd_bert.data.output import staged, write_feature_shards
from hvd_bert.data.text_input import read_text
from hvd_bert.data.vocab import load_tokenizer
from hvd_bert.files import atomic_write

__all__ = ["prepare_classification", "encode_pairs", "read_table", "read_texts", "label_number"]


# The limits of a text a table cell or JSON field may hold (docs/data.md "Limits"), and how
# much of a text is tokenized: at most CHARS_PER_POSITION characters per position of the
# sequence, far more than WordPiece ever takes for one token (a word over 100 characters is one
# [UNK]), so the cut changes no feature, and a huge text costs no more than a long one.
MAX_FIELD_CHARS = 1 << 20
CHARS_PER_POSITION = 128


_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$", re.ASCII)


def label_number(text: str) -> float:
    """A regression label as a number: plain ASCII decimal notation only (Python's float() also
    takes ``1_000``, other scripts' digits, ``nan`` and ``inf``, none of which a table means)."""
    if not _NUMBER.match(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _read_rows(path: Path, delimiter: str | None) -> list[list[str]]:
    import io

    text = read_text(path, "table")
    delim = delimiter or ("\t" if path.suffix.lower() in (".tsv", ".tab") else ",")
    csv.field_size_limit(MAX_FIELD_CHARS)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delim,
                        quotechar=None if delim == "\t" else '"')
    try:
        return list(reader)
    except csv.Error as e:
        raise DatasetError(f"{path} line {reader.line_num}: {e}: a cell may hold at most {MAX_FIELD_CHARS:,} "
                           f"characters; shorten or split that text") from None


def read_table(path: Path, delimiter: str | None) -> tuple[list[str], list[list[str]]]:
    rows = _read_rows(path, delimiter)
    if len(rows) < 2:
        raise DatasetError(f"table {path} has no data rows (a header line and at least one row)")
    twice = sorted({c for c in rows[0] if rows[0].count(c) > 1})
    if twice:  # (which column a name means would be a guess)
        raise DatasetError(f"table {path}: the header names the column {twice[0]!r} more than once; "
                           f"give each column its own name")
    return rows[0], rows[1:]


def _encode_cut(tok, texts: Sequence[str], max_seq_length: int) -> list[list[int]]:
    """Each text's WordPiece ids, tokenizing at most ``CHARS_PER_POSITION`` characters per
    position; a cut text that then gives fewer ids than positions (words of hundreds of
    characters: one [UNK] each) is tokenized whole, so the cut never changes a feature."""
    cut = max_seq_length * CHARS_PER_POSITION
    out = [list(e.ids) for e in tok.encode_batch([t[:cut] for t in texts], add_special_tokens=False)]
    for n, t in enumerate(texts):
        if len(t) > cut and len(out[n]) < max_seq_length:
            out[n] = list(tok.encode(t, add_special_tokens=False).ids)
    return out


def encode_pairs(tok, texts_a: Sequence[str], texts_b: Sequence[str] | None, max_seq_length: int):
    """Google's ``run_classifier`` features of each text (or pair): ``(input_ids, input_mask,
    segment_ids)`` padded to ``max_seq_length``, the longer text cut first, from its end."""
    ids = special_ids(tok)
    enc_a = _encode_cut(tok, texts_a, max_seq_length)
    enc_b = _encode_cut(tok, texts_b, max_seq_length) if texts_b is not None else None
    for n in range(len(enc_a)):
        a = enc_a[n]
        b = enc_b[n] if enc_b is not None else []
        budget = max_seq_length - (3 if enc_b is not None else 2)
        while len(a) + len(b) > budget:  # longest first, from the end (Google's run_classifier)
            (a if len(a) > len(b) else b).pop()
        tokens = [ids["[CLS]"], *a, ids["[SEP]"]] + ([*b, ids["[SEP]"]] if enc_b is not None else [])
        segs = [0] * (len(a) + 2) + [1] * (len(tokens) - len(a) - 2)
        pad = max_seq_length - len(tokens)
        yield tokens + [0] * pad, [1] * len(tokens) + [0] * pad, segs + [0] * pad


def prepare_classification(table: str | Path, output_dir: str | Path, vocab_file: str | Path, *,
                           text_a: str | None = None, label: str | None = None, text_b: str | None = None,
                           max_seq_length: int = 128, num_shards: int = 2, do_lower_case: bool = True,
                           labels: Sequence[str] | None = None, delimiter: str | None = None,
                           overwrite: bool = False, task: str | None = None,
                           regression: bool = False) -> dict:
    """Sentence (or sentence-pair) classification rows into shards with ``input_ids``,
    ``input_mask``, ``segment_ids``, ``label_ids``: from a TSV/CSV with a header and the named
    columns, or from a GLUE task's published file (``task``: its layout and label order, see
    :mod:`hvd_bert.data.glue`). ``labels`` fixes the label order (pass the training set's to
    a dev set); by default the sorted distinct labels. A regression set (STS-B, or
    ``regression`` for a table) keeps its numeric labels as ``label_values``."""

    out = Path(output_dir)
    from hvd_bert.data.token_classification import MAX_SEQ

    if not 3 <= max_seq_length <= MAX_SEQ or not 1 <= num_shards <= 1 << 20:
        raise DatasetError(f"--max-seq-length {max_seq_length}, --num-shards {num_shards}: give 3 to "
                           f"{MAX_SEQ} tokens ([CLS], the text and [SEP]) and 1 to 1048576 shards")
    if task is not None:
        if task not in TASKS:
            raise DatasetError(f"unknown GLUE task {task!r}; choose one of {sorted(TASKS)}")
        texts_a, texts_b, ys = read_task(task, _read_rows(Path(table), "\t"), str(table))
        regression = TASKS[task].labels is None
        label_list = [] if regression else list(TASKS[task].labels)
        text_a, text_b, label = "text_a", ("text_b" if texts_b is not None else None), "label"
    else:
        if text_a is None or label is None:
            raise DatasetError("give the columns (--text-a, --label) of the table, or a GLUE --task")
        header, rows = read_table(Path(table), delimiter)
        for col in (text_a, label, text_b):
            if col is not None and col not in header:
                raise DatasetError(f"column {col!r} is not in {table} (columns: {header})")
        ia, il = header.index(text_a), header.index(label)
        ib = header.index(text_b) if text_b else None
        bad = [n + 2 for n, r in enumerate(rows) if len(r) != len(header)]
        if bad:
            raise DatasetError(f"{table}: rows {bad[:5]} have {len(rows[bad[0] - 2])} fields, the header "
                               f"has {len(header)}; check the delimiter and quoting")
        texts_a, ys = [r[ia] for r in rows], [r[il] for r in rows]
        texts_b = [r[ib] for r in rows] if ib is not None else None
        label_list = [] if regression else sorted(set(ys))
        for n, y in enumerate(ys if not regression else []):
            if not y.strip() or y != y.strip():  # (else an empty label, or "neg " beside "neg", is a class)
                raise DatasetError(f"{table}: example {n + 1} has the label {y!r}, "
                                   f"{'none' if not y.strip() else 'with spaces around it'}: give every "
                                   f"example its label, written as the other examples write it")
    if regression:
        if labels:
            raise DatasetError("--labels is for classification; a regression set's labels are numbers")
        values = []
        for n, y in enumerate(ys):
            try:
                values.append(label_number(y))
            except ValueError:
                raise DatasetError(f"{table}: example {n + 1} has the label {y!r}, not a number; a "
                                   f"regression set needs numeric labels") from None
            # (the shards hold float32: beyond its range a label would be stored as inf)
            if not abs(values[-1]) <= float(np.finfo(np.float32).max):  # (nan and inf fail it too)
                raise DatasetError(f"{table}: example {n + 1} has the label {y!r}; give finite numbers "
                                   f"within float32's range (about 3.4e38)")
    else:
        label_list = list(labels) if labels is not None else label_list
        if labels is not None:
            from hvd_bert.data.finetune import label_fault

            if label_fault(list(labels)):
                raise DatasetError(f"--labels: {label_fault(list(labels))}; give each label once")
        unknown = sorted(set(ys) - set(label_list))
        if unknown:
            raise DatasetError(f"{table}: labels {unknown} are not in the label list {label_list}")
    words = Path(vocab_file).read_bytes()  # (read before anything is written: it may live in out)
    with staged(out, overwrite) as tmp:  # (committed into out at the end; a failure leaves out as it was)
        vocab_path = tmp / "vocab.txt"
        atomic_write(vocab_path, lambda t: t.write_bytes(words))
        tok = load_tokenizer(vocab_path, do_lower_case)
        feats = []
        for n, (tokens, mask, segs) in enumerate(encode_pairs(tok, texts_a, texts_b, max_seq_length)):
            y = ys[n]
            feats.append({"input_ids": (tokens, "int"), "input_mask": (mask, "int"),
                          "segment_ids": (segs, "int"),
                          **({"label_values": ([values[n]], "float")} if regression else
                             {"label_ids": ([label_list.index(y)], "int")})})
        shards, num_shards = write_feature_shards(tmp, feats, num_shards)
        meta = {"kind": KIND_CLASSIFY, "format": 1, "vocab_file": "vocab.txt",
                "vocab_sha256": file_sha256(vocab_path), "vocab_size": tok.get_vocab_size(),
                "do_lower_case": do_lower_case, "max_seq_length": max_seq_length, "labels": label_list,
                "text_a": text_a, "text_b": text_b, "label": label, "num_shards": num_shards,
                "shards": shards, "total_records": len(feats), "source": Path(table).name, "task": task,
                "regression": regression}
        write_sidecar(tmp, meta)
        return meta


def read_texts(path: str | Path, text_a: str = "", text_b: str = "", id_field: str = "", label: str = ""):
    """``(ids, texts_a, texts_b or None, gold labels or None)`` of a TSV/CSV with a header or a
    JSON-lines file, for prediction: ``text_a`` names the text's column or field (default:
    ``sentence``, ``text``, or a table's first column), ``text_b`` a pair's second, ``id_field``
    the ids (default: the row number, from 0), ``label`` the gold labels (default: ``label``,
    when there is one; as text)."""
    import json

    p = Path(path)
    if p.is_dir():
        raise DatasetError(f"{p} is a folder without prepared data (no dataset.json): give a TSV/CSV with a "
                           f"header, a .jsonl file, or a folder from hvd-bert prepare-classification")
    if p.suffix.lower() in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(read_text(p, "input").splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except (ValueError, RecursionError) as e:
                    raise DatasetError(f"{p} line {n + 1} is not JSON ({e}); give one JSON object per "
                                       f"line") from None
        if not rows or not all(isinstance(r, dict) for r in rows):
            raise DatasetError(f"{p} holds no JSON objects; give one object per line, e.g. "
                               f"{{\"text\": \"...\"}}")
        header = list(rows[0])
        get = lambda r, k: r.get(k)  # noqa: E731
    else:
        header, table = read_table(p, None)
        rows = table
        get = lambda r, k: r[header.index(k)] if len(r) == len(header) else None  # noqa: E731
    squad = ({"question", "context"} <= set(header) or
             any(isinstance(r, dict) and isinstance(r.get("data"), list) for r in rows[:1]))
    if squad and not text_a:
        raise DatasetError(f"{p} holds SQuAD questions and contexts, and this model classifies texts: give a "
                           f"table or JSON lines of texts (or name the text with --text-a), or a SQuAD "
                           f"model's checkpoint")
    a = text_a or next((c for c in ("sentence", "text") if c in header), header[0] if header else "")
    for col, what in ((a, "--text-a"), (text_b, "--text-b"), (id_field, "--id"), (label, "--label")):
        if col and col not in header:
            raise DatasetError(f"{col!r} is not a column or field of {p} (it has {header}); name the text "
                               f"with {what}")
    texts_a = [get(r, a) for r in rows]
    texts_b = [get(r, text_b) for r in rows] if text_b else None
    bad = [n for n, t in enumerate(texts_a) if not isinstance(t, str)] + \
        [n for n, t in enumerate(texts_b or []) if not isinstance(t, str)]
    if bad:
        where = f"{a!r}" + (f" or {text_b!r}" if text_b else "")
        raise DatasetError(f"{p}: example {bad[0] + 1} has no text in {where} (a short row, or a missing "
                           f"field); fix it or leave it out")
    long = next((n for n, t in enumerate([*texts_a, *(texts_b or [])]) if len(t) > MAX_FIELD_CHARS), None)
    if long is not None:
        raise DatasetError(f"{p}: example {long % len(rows) + 1} holds a text of "
                           f"{len([*texts_a, *(texts_b or [])][long]):,} characters, over the limit of "
                           f"{MAX_FIELD_CHARS:,}; shorten or split it")
    ids = [get(r, id_field) for r in rows] if id_field else list(range(len(rows)))
    gold_field = label or ("label" if "label" in header and a != "label" else "")
    gold = None
    if gold_field:
        gold = [get(r, gold_field) for r in rows]
        missing = next((n for n, g in enumerate(gold) if g is None or (isinstance(g, str) and not g.strip())),
                       None)
        if missing is not None:
            raise DatasetError(f"{p}: example {missing + 1} has no label in {gold_field!r}; give every "
                               f"example its label, or leave the column out to predict without scoring")
        gold = [g if isinstance(g, str) else json_scalar(g) for g in gold]
    return ids, texts_a, texts_b, gold


def json_scalar(value) -> str:
    """A JSON label (a number or boolean) as the text a table would hold (``1``, ``0.5``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)

