"""BERT data preparation, framework-free: text -> WordPiece -> pretraining instances (Google
BERT's ``create_pretraining_data.py`` algorithm) -> TFRecord shards in Google's feature format,
plus sentence(-pair) classification data from TSV/CSV.

Input text: any of ``text_input``'s formats (Wikipedia XML dumps, Google's sentence-per-line
format, one document per line, prose; compressed or not; files, folders, globs). The documents
of the whole input, in order, are dealt to the N output shards round-robin (document d to
shard d mod N) and each shard is built with its own ``random.Random(f"{seed}-{shard}")``, so
the output depends on the input, the settings and the seed only, not on how many processes
prepared it, nor on the input's format: the same text as a dump, in Google's format or one
document per line gives the same shards. Random next sentences are drawn from documents of the
same shard (as NVIDIA's sharded preparation does). Under ``mpirun -np P`` the input's units
(files, or byte ranges of a large file) are read by rank u mod P and shard j is built by
rank j mod P; memory holds one shard at a time, not the corpus.

Tokenization uses the ``tokenizers`` library (an existing ``vocab.txt``, or one trained on
the input); the vocabulary is copied into the output folder and recorded in the sidecar.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from hvd_bert.data import text_input
from hvd_bert.data.records import (SIDECAR, DatasetError, file_sha256, read_sidecar, serialize_rows,
                                     shard_name, write_examples, write_records, write_sidecar)

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
    """A SQuAD feature (``hvd_bert.data.squad``): Google's names; training features add the
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


def read_documents(inputs: Sequence[str | Path], input_format: str = "auto") -> list[list[str]]:
    """Every document (a list of sentences) of ``inputs`` in memory, in order (small inputs;
    ``prepare_bert`` streams)."""
    srcs = text_input.sources(text_input.expand_inputs(inputs), input_format)
    docs = [sents for u in text_input.plan_units(srcs)
            for _, sents in text_input.read_unit(srcs[u.source], u)]
    if not docs:
        raise DatasetError(f"the inputs {[Path(s.path).name for s in srcs][:5]} hold no documents: "
                           f"give text files or a pages-articles dump")
    return docs


def train_vocab(files: Sequence[str | Path], out_dir: str | Path, vocab_size: int = 8192,
                do_lower_case: bool = True, sentences: Iterable[str] | None = None) -> Path:
    """Train a WordPiece vocabulary with ``tokenizers`` on text files, or on ``sentences`` when
    given; writes ``vocab.txt``."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=do_lower_case, strip_accents=do_lower_case)
    if sentences is not None:
        tok.train_from_iterator(sentences, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=SPECIAL_TOKENS, show_progress=False)
    else:
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
    """[CLS] a [SEP] b [SEP] before masking (``_records`` masks a chunk of them at once)."""
    tokens: list[int]
    len_a: int
    is_random_next: bool


def _truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Google's truncation (the longer side loses a token at its front or back, at random,
    until the pair fits), counted first and cut once."""
    a0, a1, b0, b1 = 0, len(a), 0, len(b)
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        if a1 - a0 > b1 - b0:
            if rng.random() < 0.5:
                a0 += 1
            else:
                a1 -= 1
        elif rng.random() < 0.5:
            b0 += 1
        else:
            b1 -= 1
    a[:] = a[a0:a1]
    b[:] = b[b0:b1]


def _instances_from_document(docs: list[list[list[int]]], di: int, s: PretrainingSettings,
                             ids: dict, vocab_size: int, rng: random.Random) -> list[Instance]:
    document = docs[di]
    max_num_tokens = s.max_seq_length - 3
    target = max_num_tokens
    if rng.random() < s.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
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
                    instances.append(Instance([ids["[CLS]"], *a, ids["[SEP]"], *b, ids["[SEP]"]], len(a),
                                              random_next))
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


def _records(instances: list[Instance], s: PretrainingSettings, vocab_size: int, mask_id: int,
             gen: np.random.Generator, chunk: int = 2048) -> Iterator[bytes]:
    """The instances, masked, as ``tf.train.Example`` records in Google's features (padded
    with zeros), a chunk at a time.

    Google's masking, drawn with numpy for a chunk at once: ``num = min(max_predictions,
    max(1, round(len * masked_lm_prob)))`` positions uniformly among the tokens that are not
    [CLS] or [SEP] (Google shuffles them and takes the first ``num``: the same distribution),
    each replaced by [MASK] (80%), kept (10%) or a random token (10%)."""
    seq, pred = s.max_seq_length, s.max_predictions_per_seq
    col = np.arange(seq)[None, :]
    for c in range(0, len(instances), chunk):
        part = instances[c:c + chunk]
        n = len(part)
        ids = np.zeros((n, seq), np.int64)
        for r, inst in enumerate(part):
            ids[r, :len(inst.tokens)] = inst.tokens
        t = np.array([len(i.tokens) for i in part])[:, None]
        la = np.array([i.len_a for i in part])[:, None]
        real = col < t
        segs = ((col >= la + 2) & real).astype(np.int64)
        cand = ((col >= 1) & (col <= la)) | ((col >= la + 2) & (col <= t - 2))
        want = np.maximum(1, np.round(t[:, 0] * s.masked_lm_prob).astype(np.int64))
        num = np.minimum(np.minimum(pred, want), cand.sum(axis=1))
        keys = np.where(cand, gen.random((n, seq)), 2.0)
        first = np.argsort(keys, axis=1, kind="stable")[:, :pred]
        valid = np.arange(pred)[None, :] < num[:, None]
        pos = np.sort(np.where(valid, first, seq), axis=1)   # chosen positions, ascending, then pads
        pos = np.where(valid, pos, 0)
        rows = np.arange(n)[:, None]
        labels = np.where(valid, ids[rows, pos], 0)
        r1, r2 = gen.random((n, pred)), gen.random((n, pred))
        new = np.where(r1 < 0.8, mask_id, np.where(r2 < 0.5, labels, gen.integers(0, vocab_size, (n, pred))))
        masked = ids.copy()
        masked[np.broadcast_to(rows, pos.shape)[valid], pos[valid]] = new[valid]
        nsp = np.array([[i.is_random_next] for i in part], np.int64)
        yield from serialize_rows({"input_ids": (masked, "int"), "input_mask": (real.astype(np.int64), "int"),
                                   "segment_ids": (segs, "int"), "masked_lm_positions": (pos, "int"),
                                   "masked_lm_ids": (labels, "int"),
                                   "masked_lm_weights": (valid.astype(np.float32), "float"),
                                   "next_sentence_labels": (nsp, "int")})


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


def _refuse_existing(out: Path, overwrite: bool) -> None:
    if (out / SIDECAR).exists() and not overwrite:
        raise DatasetError(f"{out} already holds prepared data; pass --overwrite to replace it or "
                           f"choose another output folder")


def _prepare_output(out: Path, overwrite: bool) -> None:
    _refuse_existing(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)


SHARD_TEXT_BYTES = 32 << 20   # auto num_shards: about this much input text per shard
_SPILL_BYTES = 32 << 20       # documents buffered per rank before they are appended to the spills


def _auto_shards(srcs: Sequence[text_input.Source]) -> int:
    """At least 8 shards, more for a large input (about SHARD_TEXT_BYTES of text each), so that
    preparing one shard (which holds its documents and instances in memory, as Google's
    algorithm does) takes memory bounded by the shard, not by the corpus."""
    text = sum(s.size * (4 if s.compression else 1) * (0.3 if s.kind == "wiki" else 1) for s in srcs)
    return max(8, -(-int(text) // SHARD_TEXT_BYTES))


class _Progress:
    """Rank 0's reading progress on a terminal: one line, redrawn twice a second, with the
    bytes read, MiB/s, documents and documents/s."""

    def __init__(self, total: int, enabled: bool):
        import sys
        import time

        self.total, self.docs, self.done = total, 0, 0
        self.out = sys.stderr if enabled and sys.stderr.isatty() else None
        self.t0 = self.shown = time.perf_counter()

    def unit(self, base: int):
        def at(nbytes: int) -> None:
            self.done = base + nbytes
            if self.out is not None:
                import time

                now = time.perf_counter()
                if now - self.shown >= 0.5:
                    self.shown = now
                    self._draw(now)
        return at

    def _draw(self, now: float) -> None:
        dt = max(now - self.t0, 1e-9)
        mib, total = self.done / 2**20, self.total / 2**20
        self.out.write(f"\rreading {mib:.1f}/{total:.1f} MiB ({100 * self.done / max(self.total, 1):.0f}%), "
                       f"{mib / dt:.1f} MiB/s, {self.docs} documents, {self.docs / dt:.0f} documents/s ")
        self.out.flush()

    def close(self) -> None:
        if self.out is not None:
            import time

            self._draw(time.perf_counter())
            self.out.write("\n")
            self.out.flush()


def _spill_units(units: list[tuple[int, text_input.Unit]], srcs, tmp: Path, progress: _Progress,
                 counts: text_input.WikiCounts, splitter: str) -> dict:
    """Read this rank's units; write each unit's documents, as JSON lines ``[unit, index,
    sentences]``, to ``tmp/u<unit>.jsonl``. Returns each unit's number of documents and the
    bytes read."""
    per_unit, raw = {}, 0
    for ui, u in units:
        src = srcs[u.source]
        n = 0
        with open(tmp / f"u{ui:06d}.jsonl", "w", encoding="utf-8") as f:
            docs = text_input.read_unit(src, u, counts, progress.unit(raw), splitter)
            for i, (_, sentences) in enumerate(docs):
                f.write(json.dumps([ui, i, sentences], ensure_ascii=False) + "\n")
                n += 1
                progress.docs += 1
        per_unit[ui] = n
        raw += _unit_bytes(src, u)
    return {"units": per_unit, "documents": sum(per_unit.values()), "raw_bytes": raw}


def _unit_bytes(src: text_input.Source, u: text_input.Unit) -> int:
    if src.compression is not None:
        return src.size
    return (u.end if u.end is not None else src.size) - u.start


def _route(units: list[int], first: dict[int, int], num_shards: int, tmp: Path, rank: int) -> None:
    """Deal the documents of this rank's unit spills to the shards round-robin by their index
    in the whole input (document d to shard d mod N), appending to ``tmp/s<shard>-r<rank>.jsonl``."""
    buf: dict[int, list[str]] = {}
    held = 0

    def flush():
        for shard, lines in buf.items():
            with open(tmp / f"s{shard:05d}-r{rank:05d}.jsonl", "a", encoding="utf-8") as f:
                f.write("".join(lines))
        buf.clear()

    for ui in units:
        spill = tmp / f"u{ui:06d}.jsonl"
        with open(spill, encoding="utf-8") as f:
            for i, line in enumerate(f):
                buf.setdefault((first[ui] + i) % num_shards, []).append(line)
                held += len(line)
                if held > _SPILL_BYTES:
                    flush()
                    held = 0
        flush()
        held = 0
        spill.unlink()


def _shard_docs(tmp: Path, shard: int) -> list[list[str]]:
    """Shard ``shard``'s documents from every rank's spill, in input order."""
    rows = []
    for f in sorted(tmp.glob(f"s{shard:05d}-r*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh)
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows]


def _all_sentences(tmp: Path, num_shards: int) -> Iterator[str]:
    for shard in range(num_shards):
        for doc in _shard_docs(tmp, shard):
            yield from doc


def _bcast(comm, value):
    return comm.bcast(value, root=0) if comm is not None else value


def prepare_bert(input_files: Sequence[str | Path], output_dir: str | Path, *,
                 vocab_file: str | Path | None = None, vocab_size: int = 8192, num_shards: int | None = None,
                 settings: PretrainingSettings = PretrainingSettings(), rank: int = 0,
                 world_size: int = 1, comm=None, overwrite: bool = False, log=print,
                 input_format: str = "auto", unit_bytes: int = text_input.UNIT_BYTES,
                 progress: bool = False, sentence_splitter: str = "syntok") -> dict | None:
    """Prepare pretraining shards in ``output_dir`` from text in any of ``text_input``'s
    formats (files, folders, globs; compressed or not).

    Three passes, each split across the ranks of ``comm`` (an mpi4py communicator): the input
    is cut into units (files, or byte ranges of a large file) and each rank reads its own,
    dealing each unit's documents round-robin to the shards (spilled as JSON lines to a
    temporary folder beside ``output_dir``); rank 0 trains or copies the vocab; rank r builds shards
    r, r+P, ... from their documents in input order, each with its own seeded RNG. The output
    is byte-identical for any number of ranks. Nothing is moved into ``output_dir`` until every
    shard is written; a failure leaves it as it was. Returns the sidecar on rank 0."""
    import uuid

    out = Path(output_dir)
    plan, err = None, None
    if rank == 0:
        try:
            if sentence_splitter not in text_input.SPLITTERS:
                raise DatasetError(f"unknown sentence splitter {sentence_splitter!r}; choose "
                                   f"{' or '.join(text_input.SPLITTERS)}")
            if num_shards is not None and num_shards < 1:
                raise DatasetError(f"--num-shards must be >= 1, got {num_shards}")
            _refuse_existing(out, overwrite)
            files = text_input.expand_inputs(input_files)
            srcs = text_input.sources(files, input_format)
            units = text_input.plan_units(srcs, unit_bytes)
            shards_n = num_shards or _auto_shards(srcs)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.parent / f".{out.name}.prepare-{uuid.uuid4().hex[:12]}"
            tmp.mkdir()
            plan = (srcs, units, shards_n, str(tmp))
            kinds: dict[str, int] = {}
            for s in srcs:
                name = text_input.KIND_NAMES[s.kind] + (f", {s.compression}" if s.compression else "")
                kinds[name] = kinds.get(name, 0) + 1
            log(f"input: {len(srcs)} file(s) ({'; '.join(f'{n} {k}' for k, n in kinds.items())}) in "
                f"{len(units)} unit(s) over {world_size} process(es); {shards_n} shards")
        except (DatasetError, OSError) as e:
            err = str(e)
    plan, err = _bcast(comm, (plan, err))
    if err:
        raise DatasetError(err)
    srcs, units, num_shards, tmp = plan
    tmp = Path(tmp)
    try:
        return _prepare(srcs, units, num_shards, tmp, out, vocab_file, vocab_size, settings, rank,
                        world_size, comm, log, progress, sentence_splitter)
    finally:
        if comm is not None:
            comm.Barrier()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def _prepare(srcs, units, num_shards, tmp, out, vocab_file, vocab_size, settings, rank, world_size,
             comm, log, progress, splitter) -> dict | None:
    import time

    # 1. read: each rank its units
    mine = [(ui, u) for ui, u in enumerate(units) if ui % world_size == rank]
    total = sum(((u.end if u.end is not None else srcs[u.source].size) - u.start)
                if srcs[u.source].compression is None else srcs[u.source].size for _, u in mine)
    counts, stats, err = text_input.WikiCounts(), {}, None
    bar = _Progress(total, progress and rank == 0)
    t0 = time.perf_counter()
    try:
        stats = _spill_units(mine, srcs, tmp, bar, counts, splitter)
    except (DatasetError, OSError) as e:
        err = str(e) if isinstance(e, DatasetError) else f"cannot spill documents to {tmp}: {e}"
    finally:
        bar.close()
    dt = time.perf_counter() - t0
    _agree(comm, err)
    if rank == 0:
        log(f"[rank 0] read {stats['documents']} documents, {stats['raw_bytes'] / 2**20:.1f} MiB in "
            f"{dt:.1f} s ({stats['documents'] / max(dt, 1e-9):.0f} documents/s, "
            f"{stats['raw_bytes'] / 2**20 / max(dt, 1e-9):.1f} MiB/s)")
    every = comm.allgather((stats, counts)) if comm is not None else [(stats, counts)]
    per_unit = {ui: n for s, _ in every for ui, n in s["units"].items()}
    first, docs = {}, 0
    for ui in range(len(units)):
        first[ui] = docs
        docs += per_unit[ui]
    wiki = text_input.WikiCounts()
    for _, c in every:
        wiki.add(c)
    if docs == 0:
        dropped = ""
        if wiki.pages:
            dropped = (f" ({wiki.pages} Wikipedia pages: {wiki.disambiguation} disambiguation and "
                       f"{wiki.pages - wiki.articles - wiki.disambiguation} redirects, other "
                       f"namespaces or empty articles dropped)")
        raise DatasetError(f"the inputs {[Path(s.path).name for s in srcs][:5]} hold no documents"
                           f"{dropped}: give text files (a sentence per line, a blank line between "
                           f"documents; one document per line; prose) or a pages-articles dump")
    err = None
    try:
        _route([ui for ui, _ in mine], first, num_shards, tmp, rank)
    except OSError as e:
        err = f"cannot spill documents to {tmp}: {e}"
    _agree(comm, err)
    # 2. the vocab, on rank 0
    err = None
    if rank == 0:
        try:
            if vocab_file is None:
                train_vocab([], tmp, vocab_size, settings.do_lower_case,
                            sentences=_all_sentences(tmp, num_shards))
            else:
                load_tokenizer(vocab_file, settings.do_lower_case)  # validates it
                shutil.copyfile(vocab_file, tmp / "vocab.txt")
        except (DatasetError, OSError) as e:
            err = str(e)
    err = _bcast(comm, err)
    if err:
        raise DatasetError(err)
    # 3. the shards
    vocab_path = tmp / "vocab.txt"
    tok = load_tokenizer(vocab_path, settings.do_lower_case)
    ids = _special_ids(tok)
    vsize = tok.get_vocab_size()
    shards, err = [], None
    try:
        for shard in range(rank, num_shards, world_size):
            mine_docs = _shard_docs(tmp, shard)
            flat = [s for d in mine_docs for s in d]
            fast = getattr(tok._tokenizer, "encode_batch_fast", tok._tokenizer.encode_batch)  # no offsets
            encoded = iter(e.ids for e in fast(flat, add_special_tokens=False))
            tokenized = [[t for t in (next(encoded) for _ in d) if t] for d in mine_docs]
            rng = random.Random(f"{settings.seed}-{shard}")
            gen = np.random.default_rng([settings.seed % (1 << 63), shard])   # the masking's
            instances = create_instances(tokenized, settings, ids, vsize, rng)
            name = shard_name(shard, num_shards)
            n = write_records(tmp / name, _records(instances, settings, vsize, ids["[MASK]"], gen))
            shards.append({"file": name, "records": n, "documents": len(mine_docs)})
            log(f"[rank {rank}] {name}: {n} instances from {len(mine_docs)} documents")
            del mine_docs, flat, tokenized, instances
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
            err = (f"shards {empty} got no instances: too few documents ({docs}) for "
                   f"{num_shards} shards; use fewer shards (--num-shards) or more text")
    err = _bcast(comm, err)
    if err:
        raise DatasetError(err)
    if rank != 0:
        return None
    files = [s.path for s in srcs]
    meta = {"kind": KIND_PRETRAIN, "format": 1, "vocab_file": "vocab.txt",
            "vocab_sha256": file_sha256(vocab_path), "vocab_size": vsize,
            "do_lower_case": settings.do_lower_case, "max_seq_length": settings.max_seq_length,
            "max_predictions_per_seq": settings.max_predictions_per_seq,
            "masked_lm_prob": settings.masked_lm_prob, "short_seq_prob": settings.short_seq_prob,
            "dupe_factor": settings.dupe_factor, "seed": settings.seed, "num_shards": num_shards,
            "documents": docs, "input_files": [Path(f).name for f in files],
            "input_paths": [str(Path(f).resolve()) for f in files],
            "input_formats": [s.kind for s in srcs], "shards": shards,
            **({"sentence_splitter": splitter} if {s.kind for s in srcs} - {"google"} else {}),
            "total_records": sum(s["records"] for s in shards)}
    if wiki.pages:
        meta["wikipedia"] = {"pages": wiki.pages, "articles": wiki.articles,
                             "disambiguation": wiki.disambiguation}
    _commit(tmp, out, [s["file"] for s in shards])
    write_sidecar(out, meta)
    return meta


def _commit(tmp: Path, out: Path, names: list[str]) -> None:
    """Move the new shards and vocab into ``out``: the old sidecar goes first (a reader never
    sees new shards under an old sidecar), then the old shards, then the new files."""
    out.mkdir(exist_ok=True)
    (out / SIDECAR).unlink(missing_ok=True)
    for old in out.glob("part-*-of-*.tfrecord"):
        old.unlink()
    for name in [*names, "vocab.txt"]:
        (tmp / name).replace(out / name)


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
    :mod:`hvd_bert.data.glue`). ``labels`` fixes the label order (pass the training set's to
    a dev set); by default the sorted distinct labels. A regression set (STS-B, or
    ``regression`` for a table) keeps its numeric labels as ``label_values``."""
    from hvd_bert.data.glue import TASKS, read_task

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

