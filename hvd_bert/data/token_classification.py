"""Token classification (NER) sets from CoNLL-2003's published format -> TFRecord shards.

The format: one word a line, its columns separated by spaces or tabs, the word first and its
tag last (CoNLL-2003: ``word POS chunk NER``; a two-column ``word tag`` file is the same); a
blank line ends a sentence; ``-DOCSTART-`` lines are skipped. Tags are ``O`` or
``<B|I|E|S>-<TYPE>`` (IOB1, IOB2 or IOBES), so that entities are read as ``seqeval`` and
``conlleval`` read them (:mod:`hvd_bert.evaluation.token_classification`).

Each word is tokenized on its own (WordPiece over the word, as Hugging Face's
``is_split_into_words``); its tag goes to its first piece, and the other pieces, ``[CLS]``,
``[SEP]`` and padding get ``-1`` (not scored, not trained). A sentence longer than
``max_seq_length - 2`` pieces is cut at word boundaries into several records, so every word
gets a prediction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hvd_bert.data.finetune import label_fault, tag_fault
from hvd_bert.data.kinds import KIND_TOKENS
from hvd_bert.data.masking import special_ids
from hvd_bert.data.output import staged, write_feature_shards
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import file_sha256, write_sidecar
from hvd_bert.data.text_input import read_text
from hvd_bert.data.vocab import load_tokenizer
from hvd_bert.files import atomic_write

__all__ = ["read_conll", "word_windows", "prepare_token_classification", "IGNORE"]

MAX_SEQ = 1 << 16
IGNORE = -1  # the label of a position that is not a word's first piece
MAX_WORD_CHARS = 100  # WordPiece makes a longer word one [UNK]: the rest is not tokenized


def read_conll(path: str | Path, tagged: bool = True) -> list[tuple[list[str], list[str]]]:
    """``[(words, tags), ...]``, a sentence each. ``tagged=False``: a file whose lines may be
    the word alone (then ``tags`` is empty: words to predict)."""
    p = Path(path).expanduser()
    text = read_text(p, "CoNLL file")
    sentences, words, tags, untagged = [], [], [], 0
    for n, line in enumerate(text.splitlines(), 1):
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        if len(cols) == 1:
            if tagged:
                raise DatasetError(f"{p} line {n}: {line.strip()!r} has no tag: a CoNLL line is the word, "
                                   f"then its columns, the tag last (e.g. 'Paris NNP I-NP B-LOC')")
            untagged += 1
        else:
            fault = tag_fault(cols[-1])
            if fault:
                raise DatasetError(f"{p} line {n}: {fault}; the tag is the last column")
            tags.append(cols[-1])
        words.append(cols[0])
    if words:
        sentences.append((words, tags))
    if not sentences:
        raise DatasetError(f"{p} holds no sentences (one word a line, a blank line between sentences)")
    if untagged and untagged != sum(len(w) for w, _ in sentences):
        raise DatasetError(f"{p}: {untagged} lines have no tag and the others do: tag every word, or none")
    return [(w, t if t else []) for w, t in sentences]


def word_windows(tok, words: Sequence[str], max_seq_length: int) -> list[tuple[list[int], list[int]]]:
    """The records of one sentence: ``[(piece ids, first-piece positions), ...]``, each window
    at most ``max_seq_length - 2`` pieces, cut at word boundaries (``[CLS]``/``[SEP]`` not yet
    added; a position is into the window's pieces). A word with no piece (a control character)
    has position -1."""
    room = max_seq_length - 2
    pieces = [list(e.ids)[:room] for e in tok.encode_batch([w[:MAX_WORD_CHARS * 4] for w in words],
                                                            add_special_tokens=False)]
    out, ids, firsts = [], [], []
    for p in pieces:
        if ids and len(ids) + len(p) > room:
            out.append((ids, firsts))
            ids, firsts = [], []
        firsts.append(len(ids) if p else -1)
        ids += p
    out.append((ids, firsts))
    return out


def encode_window(ids: list[int], firsts: list[int], label_ids: list[int] | None, max_seq_length: int,
                  cls: int, sep: int) -> dict:
    """One record's features (``label_ids`` of the window's words, or None: all ``IGNORE``)."""
    tokens = [cls, *ids, sep]
    pad = max_seq_length - len(tokens)
    labels = [IGNORE] * max_seq_length
    for j, pos in enumerate(firsts):
        if pos >= 0 and label_ids is not None:
            labels[pos + 1] = label_ids[j]
    return {"input_ids": tokens + [0] * pad, "input_mask": [1] * len(tokens) + [0] * pad,
            "segment_ids": [0] * max_seq_length, "label_ids": labels}


def prepare_token_classification(conll: str | Path, output_dir: str | Path, vocab_file: str | Path, *,
                                 max_seq_length: int = 128, num_shards: int = 2, do_lower_case: bool = True,
                                 labels: Sequence[str] | None = None, overwrite: bool = False) -> dict:
    """A CoNLL file into shards with ``input_ids``, ``input_mask``, ``segment_ids`` and
    ``label_ids`` (one a position). ``labels`` fixes the tag order (pass the training set's to a
    dev set); by default the sorted distinct tags."""
    out = Path(output_dir)
    if not 3 <= max_seq_length <= MAX_SEQ:
        raise DatasetError(f"--max-seq-length {max_seq_length}: give 3 to {MAX_SEQ} ([CLS], the pieces and "
                           f"[SEP])")
    sentences = read_conll(conll)
    seen = sorted({t for _, tags in sentences for t in tags})
    if labels is not None:
        labels = list(labels)
        fault = label_fault(labels) or next((tag_fault(t) for t in labels if tag_fault(t)), None)
        if fault:
            raise DatasetError(f"--labels: {fault}")
        unknown = sorted(set(seen) - set(labels))
        if unknown:
            raise DatasetError(f"{conll}: tags {unknown} are not in the label list {labels}; give the "
                               f"training set's --labels with them, or prepare the training set with them")
    label_list = labels if labels is not None else seen
    words = Path(vocab_file).read_bytes()  # (read before anything is written: it may live in out)
    with staged(out, overwrite) as tmp:  # (committed into out at the end; a failure leaves out as it was)
        vocab_path = tmp / "vocab.txt"
        atomic_write(vocab_path, lambda t: t.write_bytes(words))
        tok = load_tokenizer(vocab_path, do_lower_case)
        cls, sep = (special_ids(tok)[k] for k in ("[CLS]", "[SEP]"))
        index = {t: i for i, t in enumerate(label_list)}
        feats, windows = [], 0
        for words, tags in sentences:
            at = 0
            for ids, firsts in word_windows(tok, words, max_seq_length):
                f = encode_window(ids, firsts, [index[t] for t in tags[at:at + len(firsts)]], max_seq_length,
                                  cls, sep)
                feats.append({k: (v, "int") for k, v in f.items()})
                at += len(firsts)
                windows += 1
        shards, num_shards = write_feature_shards(tmp, feats, num_shards)
        meta = {"kind": KIND_TOKENS, "format": 1, "vocab_file": "vocab.txt",
                "vocab_sha256": file_sha256(vocab_path), "vocab_size": tok.get_vocab_size(),
                "do_lower_case": do_lower_case, "max_seq_length": max_seq_length, "labels": label_list,
                "num_shards": num_shards, "shards": shards, "total_records": len(feats),
                "sentences": len(sentences), "words": sum(len(w) for w, _ in sentences),
                "source": Path(conll).name}
        write_sidecar(tmp, meta)
        return meta
