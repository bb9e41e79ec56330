"""BERT data preparation, framework-free: text -> WordPiece -> pretraining instances (Google
BERT's ``create_pretraining_data.py`` algorithm) -> TFRecord shards in Google's feature format,
plus sentence(-pair) classification data from TSV/CSV.

Input text: one sentence per line, a blank line between documents (Google BERT's format).
Documents are dealt to the N output shards round-robin (document d to shard d mod N) and each
shard is built with its own ``random.Random(f"{seed}-{shard}")``, so the output depends on the
input, the settings and the seed only, not on how many processes prepared it. Random next
sentences are drawn from documents of the same shard (as NVIDIA's sharded preparation does).
Under ``mpirun -np P`` shard j is prepared by rank j mod P.

Tokenization uses the ``tokenizers`` library (an existing ``vocab.txt``, or one trained on
the input); the vocabulary is copied into the output folder and recorded in the sidecar.
"""

from __future__ import annotations

import csv
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hvd_bert.common.records import (SIDECAR, DatasetError, file_sha256, read_sidecar, shard_name,
                                     write_examples, write_sidecar)

__all__ = ["PretrainingSettings", "pretraining_spec", "classification_spec", "read_documents",
           "load_tokenizer", "train_vocab", "create_instances", "prepare_bert", "prepare_classification",
           "phase_one_data",
           "check_pretraining_data", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
KIND_PRETRAIN = "bert-pretraining"
KIND_CLASSIFY = "bert-classification"
KIND_SQUAD = "bert-squad"


@dataclass(frozen=True)
class PretrainingSettings:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 5
    do_lower_case: bool = True
    seed: int = 12345

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be >= 8, got {self.max_seq_length}")
        if not 0 < self.masked_lm_prob < 1:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1 or self.dupe_factor < 1:
            raise ValueError("max_predictions_per_seq and dupe_factor must be >= 1")


def pretraining_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """Google BERT's pretraining features: name -> (kind, length)."""
    s, p = max_seq_length, max_predictions_per_seq
    return {"input_ids": ("int", s), "input_mask": ("int", s), "segment_ids": ("int", s),
            "masked_lm_positions": ("int", p), "masked_lm_ids": ("int", p),
            "masked_lm_weights": ("float", p), "next_sentence_labels": ("int", 1)}


def spec_for_meta(meta: dict) -> dict:
    """The feature spec (name -> (kind, length)) of a prepared folder, from its sidecar."""
    if meta["kind"] == KIND_PRETRAIN:
        return pretraining_spec(meta["max_seq_length"], meta["max_predictions_per_seq"])
    if meta["kind"] == KIND_CLASSIFY:
        return classification_spec(meta["max_seq_length"], bool(meta.get("regression")))
    if meta["kind"] == KIND_SQUAD:
        return squad_spec(meta["max_seq_length"], meta["is_training"])
    raise DatasetError(f"no reader for data of kind {meta['kind']!r}")


def classification_spec(max_seq_length: int, regression: bool = False) -> dict:
    """A classification record; a regression set (STS-B) has a float ``label_values`` instead
    of ``label_ids``."""
    s = max_seq_length
    return {"input_ids": ("int", s), "input_mask": ("int", s), "segment_ids": ("int", s),
            **({"label_values": ("float", 1)} if regression else {"label_ids": ("int", 1)})}


def squad_spec(max_seq_length: int, is_training: bool) -> dict:
    """A SQuAD feature (``hvd_bert.common.squad``): Google's names; training features add the
    answer span."""
    s = max_seq_length
    spec = {"unique_ids": ("int", 1), "input_ids": ("int", s), "input_mask": ("int", s),
            "segment_ids": ("int", s)}
    if is_training:
        spec.update(start_positions=("int", 1), end_positions=("int", 1), is_impossible=("int", 1))
    return spec


# ----------------------------------------------------------------------------- text, vocab
def read_text(path: str | Path, what: str = "input text file") -> str:
    """The UTF-8 text of ``path``, or a DatasetError naming the file, the problem and the fix
    (missing, a folder, binary, not UTF-8: nothing is replaced silently)."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{what} {p} does not exist: check the path")
    if not p.is_file():
        raise DatasetError(f"{what} {p} is not a file: give text files (a folder's files: {p}/*)")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read {what} {p}: {e.strerror}") from None
    nul = data.find(b"\x00", 0, 1 << 20)
    if nul >= 0:
        raise DatasetError(f"{what} {p} looks binary (a NUL byte at offset {nul}): give UTF-8 text, "
                           f"one sentence per line, a blank line between documents")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DatasetError(
            f"{what} {p} is not UTF-8 (byte 0x{data[e.start]:02x} at line {line}): convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {p} > {p.name}.utf8, and give that file") from None


def read_documents(files: Sequence[str | Path]) -> list[list[str]]:
    """Documents (lists of non-empty lines) from UTF-8 text files; a blank line ends a
    document."""
    if not files:
        raise DatasetError("no input text files given")
    docs: list[list[str]] = []
    for f in files:
        cur: list[str] = []
        for line in read_text(f).splitlines():
            line = line.strip()
            if line:
                cur.append(line)
            elif cur:
                docs.append(cur)
                cur = []
        if cur:
            docs.append(cur)
    if not docs:
        raise DatasetError(f"the input files {[str(f) for f in files]} hold no text: give text files, "
                           f"one sentence per line, a blank line between documents")
    return docs


def train_vocab(files: Sequence[str | Path], out_dir: str | Path, vocab_size: int = 8192,
                do_lower_case: bool = True) -> Path:
    """Train a WordPiece vocabulary on ``files`` with ``tokenizers``; writes ``vocab.txt``."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=do_lower_case)
    tok.train([str(f) for f in files], vocab_size=vocab_size, min_frequency=2,
              special_tokens=SPECIAL_TOKENS, show_progress=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))
    return out / "vocab.txt"


def load_tokenizer(vocab_file: str | Path, do_lower_case: bool = True):
    """A ``tokenizers`` WordPiece tokenizer for ``vocab_file`` (which must hold BERT's special
    tokens)."""
    from tokenizers import BertWordPieceTokenizer

    p = Path(vocab_file)
    if not p.is_file():
        raise DatasetError(f"vocab file {p} does not exist; pass an existing vocab.txt or leave it "
                           f"out to train one on the input")
    vocab = p.read_text(encoding="utf-8").splitlines()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise DatasetError(f"vocab file {p} lacks the special tokens {missing}; it is not a BERT vocab")
    return BertWordPieceTokenizer(str(p), lowercase=do_lower_case, strip_accents=do_lower_case)


# ----------------------------------------------------------------------------- instances
@dataclass
class Instance:
    tokens: list[int]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_labels: list[int]
    is_random_next: bool


def _truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_num_tokens:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _masked_lm(tokens: list[int], s: PretrainingSettings, vocab_size: int, special: set[int],
               mask_id: int, rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    cand = [i for i, t in enumerate(tokens) if t not in special]
    rng.shuffle(cand)
    out = list(tokens)
    num = min(s.max_predictions_per_seq, max(1, int(round(len(tokens) * s.masked_lm_prob))))
    picked = []
    for idx in cand:
        if len(picked) >= num:
            break
        if rng.random() < 0.8:
            new = mask_id                      # 80%: [MASK]
        elif rng.random() < 0.5:
            new = tokens[idx]                  # 10%: keep
        else:
            new = rng.randint(0, vocab_size - 1)  # 10%: a random token
        out[idx] = new
        picked.append((idx, tokens[idx]))
    picked.sort()
    return out, [i for i, _ in picked], [t for _, t in picked]


def _instances_from_document(docs: list[list[list[int]]], di: int, s: PretrainingSettings,
                             ids: dict, vocab_size: int, rng: random.Random) -> list[Instance]:
    document = docs[di]
    max_num_tokens = s.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < s.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    special = {ids["[CLS]"], ids["[SEP]"]}
    instances, chunk, length, i = [], [], 0, 0
    while i < len(document):
        seg = document[i]
        chunk.append(seg)
        length += len(seg)
        if i == len(document) - 1 or length >= target:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for c in chunk[:a_end] for t in c]
                b: list[int] = []
                random_next = False
                if len(chunk) == 1 or rng.random() < 0.5:
                    random_next = True
                    target_b = target - len(a)
                    rdi = di
                    for _ in range(10):
                        rdi = rng.randint(0, len(docs) - 1)
                        if rdi != di:
                            break
                    rdoc = docs[rdi]
                    start = rng.randint(0, len(rdoc) - 1)
                    for j in range(start, len(rdoc)):
                        b.extend(rdoc[j])
                        if len(b) >= target_b:
                            break
                    i -= len(chunk) - a_end  # put the unused segments back
                else:
                    for c in chunk[a_end:]:
                        b.extend(c)
                _truncate_seq_pair(a, b, max_num_tokens, rng)
                if a and b:
                    tokens = [ids["[CLS]"], *a, ids["[SEP]"], *b, ids["[SEP]"]]
                    segs = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                    out, pos, labels = _masked_lm(tokens, s, vocab_size, special, ids["[MASK]"], rng)
                    instances.append(Instance(out, segs, pos, labels, random_next))
            chunk, length = [], 0
        i += 1
    return instances


def create_instances(docs: list[list[list[int]]], s: PretrainingSettings, ids: dict, vocab_size: int,
                     rng: random.Random) -> list[Instance]:
    """Google's algorithm over tokenized documents: ``dupe_factor`` passes, shuffled."""
    docs = [d for d in docs if d]
    rng.shuffle(docs)
    instances = []
    for _ in range(s.dupe_factor):
        for di in range(len(docs)):
            instances.extend(_instances_from_document(docs, di, s, ids, vocab_size, rng))
    rng.shuffle(instances)
    return instances


def _feature(inst: Instance, s: PretrainingSettings) -> dict:
    pad = s.max_seq_length - len(inst.tokens)
    npred = len(inst.masked_lm_positions)
    ppad = s.max_predictions_per_seq - npred
    return {
        "input_ids": (inst.tokens + [0] * pad, "int"),
        "input_mask": ([1] * len(inst.tokens) + [0] * pad, "int"),
        "segment_ids": (inst.segment_ids + [0] * pad, "int"),
        "masked_lm_positions": (inst.masked_lm_positions + [0] * ppad, "int"),
        "masked_lm_ids": (inst.masked_lm_labels + [0] * ppad, "int"),
        "masked_lm_weights": ([1.0] * npred + [0.0] * ppad, "float"),
        "next_sentence_labels": ([1 if inst.is_random_next else 0], "int"),
    }


def _special_ids(tok) -> dict:
    vocab = tok.get_vocab()
    return {t: vocab[t] for t in SPECIAL_TOKENS}


def _agree(comm, err: str | None) -> None:
    """Raise the first rank's error on every rank (``comm`` None: this process's)."""
    if comm is not None:
        errs = [e for e in comm.allgather(err) if e]
        err = errs[0] if errs else None
    if err:
        raise DatasetError(err)


def _prepare_output(out: Path, overwrite: bool) -> None:
    if (out / SIDECAR).exists() and not overwrite:
        raise DatasetError(f"{out} already holds prepared data; pass --overwrite to replace it or "
                           f"choose another output folder")
    out.mkdir(parents=True, exist_ok=True)


def prepare_bert(input_files: Sequence[str | Path], output_dir: str | Path, *,
                 vocab_file: str | Path | None = None, vocab_size: int = 8192, num_shards: int = 8,
                 settings: PretrainingSettings = PretrainingSettings(), rank: int = 0,
                 world_size: int = 1, comm=None, overwrite: bool = False, log=print) -> dict | None:
    """Prepare pretraining shards in ``output_dir``. With ``comm`` (an mpi4py communicator),
    rank r prepares shards r, r+P, ...; rank 0 writes the sidecar. Returns the sidecar on
    rank 0."""
    out = Path(output_dir)
    files = sorted(str(f) for f in input_files)
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    # Every rank reads (and so checks) the input before anything is written.
    docs, err = None, None
    try:
        docs = read_documents(files)
    except DatasetError as e:
        err = str(e)
    _agree(comm, err)
    if rank == 0:
        try:
            _prepare_output(out, overwrite)
            if vocab_file is None:
                vocab_path = train_vocab(files, out, vocab_size, settings.do_lower_case)
            else:
                vocab_path = out / "vocab.txt"
                if Path(vocab_file).resolve() != vocab_path.resolve():
                    load_tokenizer(vocab_file, settings.do_lower_case)  # validates it
                    shutil.copyfile(vocab_file, vocab_path)
        except (DatasetError, ValueError, OSError) as e:
            err = str(e)
    if comm is not None:
        err = comm.bcast(err, root=0)
    if err:
        raise DatasetError(err)
    vocab_path = out / "vocab.txt"
    tok = load_tokenizer(vocab_path, settings.do_lower_case)
    ids = _special_ids(tok)
    vsize = tok.get_vocab_size()
    shards, err = [], None
    try:
        for shard in range(rank, num_shards, world_size):
            mine = docs[shard::num_shards]
            tokenized = [[e.ids for e in tok.encode_batch(d, add_special_tokens=False)] for d in mine]
            tokenized = [[s for s in d if s] for d in tokenized]
            rng = random.Random(f"{settings.seed}-{shard}")
            instances = create_instances(tokenized, settings, ids, vsize, rng)
            name = shard_name(shard, num_shards)
            n = write_examples(out / name, (_feature(i, settings) for i in instances))
            shards.append({"file": name, "records": n, "documents": len(mine)})
            log(f"[rank {rank}] {name}: {n} instances from {len(mine)} documents")
    except OSError as e:
        err = (f"cannot write shards to {out}: {e.strerror or e} (check the folder's permissions "
               f"and free space)")
    _agree(comm, err)
    if comm is not None:
        gathered = comm.gather(shards, root=0)
        shards = [s for part in (gathered or []) for s in part]
    err = None
    if rank == 0:
        shards.sort(key=lambda s: s["file"])
        empty = [s["file"] for s in shards if s["records"] == 0]
        if empty:
            err = (f"shards {empty} got no instances: too few documents ({len(docs)}) for "
                   f"{num_shards} shards; use fewer shards (--num-shards) or more text")
    if comm is not None:
        err = comm.bcast(err, root=0)
    if err:
        raise DatasetError(err)
    if rank != 0:
        return None
    meta = {"kind": KIND_PRETRAIN, "format": 1, "vocab_file": "vocab.txt",
            "vocab_sha256": file_sha256(vocab_path), "vocab_size": vsize,
            "do_lower_case": settings.do_lower_case, "max_seq_length": settings.max_seq_length,
            "max_predictions_per_seq": settings.max_predictions_per_seq,
            "masked_lm_prob": settings.masked_lm_prob, "short_seq_prob": settings.short_seq_prob,
            "dupe_factor": settings.dupe_factor, "seed": settings.seed, "num_shards": num_shards,
            "documents": len(docs), "input_files": [Path(f).name for f in files],
            "input_paths": [str(Path(f).resolve()) for f in files], "shards": shards,
            "total_records": sum(s["records"] for s in shards)}
    write_sidecar(out, meta)
    return meta


def phase_one_data(src: str | Path) -> tuple[Path, dict]:
    """``(folder, sidecar)`` of the pretraining data behind ``src``: a prepared folder, or a run
    folder (or one of its checkpoints) whose config.json names its data. Phase 2 is prepared
    from the same text, vocabulary and case (``prepare-bert --like``)."""
    import json

    p = Path(src).expanduser()
    if p.name.startswith("ckpt-"):
        p = p.parent
    folder = p
    if not (p / SIDECAR).is_file():
        try:
            data = json.loads((p / "config.json").read_text()).get("data")
        except (OSError, ValueError):
            data = None
        if not data:
            raise DatasetError(f"{src} is neither prepared pretraining data (no {SIDECAR}) nor a run folder "
                               f"whose config.json names its data: give the phase-1 data or run folder")
        folder = Path(data).expanduser()
    meta = read_sidecar(folder, KIND_PRETRAIN)
    paths = meta.get("input_paths")
    if not paths:
        raise DatasetError(f"{folder / SIDECAR} does not record where its text came from (prepared by an "
                           f"older hvd_bert): pass the text with --input")
    missing = [f for f in paths if not Path(f).is_file()]
    if missing:
        raise DatasetError(f"the text {folder} was prepared from is gone ({missing[0]}): pass it with "
                           f"--input")
    return folder, meta


def check_pretraining_data(folder: str | Path, max_seq_length: int | None = None,
                           max_predictions_per_seq: int | None = None,
                           vocab_file: str | Path | None = None) -> dict:
    """The sidecar of a pretraining folder, checked against the reader's settings."""
    expect = {}
    if max_seq_length is not None:
        expect["max_seq_length"] = max_seq_length
    if max_predictions_per_seq is not None:
        expect["max_predictions_per_seq"] = max_predictions_per_seq
    meta = read_sidecar(folder, KIND_PRETRAIN, expect)
    if vocab_file is not None and file_sha256(vocab_file) != meta["vocab_sha256"]:
        raise DatasetError(f"vocab {vocab_file} is not the vocab {folder} was prepared with "
                           f"({Path(folder) / meta['vocab_file']}); use that vocab or prepare the "
                           f"data again with this one")
    return meta


# ----------------------------------------------------------------------------- fine-tuning
def _read_rows(path: Path, delimiter: str | None) -> list[list[str]]:
    import io

    text = read_text(path, "table")
    delim = delimiter or ("\t" if path.suffix.lower() in (".tsv", ".tab") else ",")
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delim,
                           quotechar=None if delim == "\t" else '"'))


def _read_table(path: Path, delimiter: str | None) -> tuple[list[str], list[list[str]]]:
    rows = _read_rows(path, delimiter)
    if len(rows) < 2:
        raise DatasetError(f"table {path} has no data rows (a header line and at least one row)")
    return rows[0], rows[1:]


def prepare_classification(table: str | Path, output_dir: str | Path, vocab_file: str | Path, *,
                           text_a: str | None = None, label: str | None = None, text_b: str | None = None,
                           max_seq_length: int = 128, num_shards: int = 2, do_lower_case: bool = True,
                           labels: Sequence[str] | None = None, delimiter: str | None = None,
                           overwrite: bool = False, task: str | None = None,
                           regression: bool = False) -> dict:
    """Sentence (or sentence-pair) classification rows into shards with ``input_ids``,
    ``input_mask``, ``segment_ids``, ``label_ids``: from a TSV/CSV with a header and the named
    columns, or from a GLUE task's published file (``task``: its layout and label order, see
    :mod:`hvd_bert.common.glue`). ``labels`` fixes the label order (pass the training set's to
    a dev set); by default the sorted distinct labels. A regression set (STS-B, or
    ``regression`` for a table) keeps its numeric labels as ``label_values``."""
    from hvd_bert.common.glue import TASKS, read_task

    out = Path(output_dir)
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
        header, rows = _read_table(Path(table), delimiter)
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
    if regression:
        if labels:
            raise DatasetError("--labels is for classification; a regression set's labels are numbers")
        values = []
        for n, y in enumerate(ys):
            try:
                values.append(float(y))
            except ValueError:
                raise DatasetError(f"{table}: example {n + 1} has the label {y!r}, not a number; a "
                                   f"regression set needs numeric labels") from None
            if not np.isfinite(values[-1]):
                raise DatasetError(f"{table}: example {n + 1} has the label {y!r}; give finite numbers")
    else:
        label_list = list(labels) if labels is not None else label_list
        unknown = sorted(set(ys) - set(label_list))
        if unknown:
            raise DatasetError(f"{table}: labels {unknown} are not in the label list {label_list}")
    _prepare_output(out, overwrite)
    vocab_path = out / "vocab.txt"
    if Path(vocab_file).resolve() != vocab_path.resolve():
        shutil.copyfile(vocab_file, vocab_path)
    tok = load_tokenizer(vocab_path, do_lower_case)
    ids = _special_ids(tok)
    enc_a = tok.encode_batch(texts_a, add_special_tokens=False)
    enc_b = tok.encode_batch(texts_b, add_special_tokens=False) if texts_b is not None else None
    feats = []
    for n, y in enumerate(ys):
        a = list(enc_a[n].ids)
        b = list(enc_b[n].ids) if enc_b is not None else []
        budget = max_seq_length - (3 if enc_b is not None else 2)
        while len(a) + len(b) > budget:  # longest first, from the end (Google's run_classifier)
            (a if len(a) > len(b) else b).pop()
        tokens = [ids["[CLS]"], *a, ids["[SEP]"]] + ([*b, ids["[SEP]"]] if enc_b is not None else [])
        segs = [0] * (len(a) + 2) + [1] * (len(tokens) - len(a) - 2)
        pad = max_seq_length - len(tokens)
        feats.append({"input_ids": (tokens + [0] * pad, "int"),
                      "input_mask": ([1] * len(tokens) + [0] * pad, "int"),
                      "segment_ids": (segs + [0] * pad, "int"),
                      **({"label_values": ([values[n]], "float")} if regression else
                         {"label_ids": ([label_list.index(y)], "int")})})
    shards = []
    for s in range(num_shards):
        name = shard_name(s, num_shards)
        shards.append({"file": name, "records": write_examples(out / name, iter(feats[s::num_shards]))})
    meta = {"kind": KIND_CLASSIFY, "format": 1, "vocab_file": "vocab.txt",
            "vocab_sha256": file_sha256(vocab_path), "vocab_size": tok.get_vocab_size(),
            "do_lower_case": do_lower_case, "max_seq_length": max_seq_length, "labels": label_list,
            "text_a": text_a, "text_b": text_b, "label": label, "num_shards": num_shards,
            "shards": shards, "total_records": len(feats), "source": Path(table).name, "task": task,
            "regression": regression}
    write_sidecar(out, meta)
    return meta

