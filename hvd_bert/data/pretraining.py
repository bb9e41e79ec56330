"""BERT pretraining data, framework-free: text -> WordPiece -> pretraining instances (Google
BERT's ``create_pretraining_data.py`` algorithm, ``data.masking``) -> TFRecord shards in Google's
feature format.

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

import json
import random
import shutil
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hvd_bert.cluster.processes import rank_tag
from hvd_bert.data import text_input
from hvd_bert.data.records import DatasetError, shard_name, write_records
from hvd_bert.data.sidecar import SIDECAR, file_sha256, read_sidecar, write_sidecar
from hvd_bert.data.kinds import KIND_PRETRAIN
from hvd_bert.data.masking import PretrainingSettings, create_instances, masked_records, special_ids
from hvd_bert.data.output import agree, bcast, commit_shards, refuse_existing
from hvd_bert.data.vocab import encode_ids, load_tokenizer, train_vocab

__all__ = ["PretrainingSettings", "prepare_bert", "phase_one_data", "like_phase_one",
           "check_pretraining_data"]


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
    made: list[Path] = []  # (rank 0's scratch folder, once named)
    try:
        return _plan_and_prepare(Path(output_dir), input_files, input_format, unit_bytes, num_shards,
                                 overwrite, sentence_splitter, vocab_file, vocab_size, settings, rank,
                                 world_size, comm, log, progress, made)
    finally:  # (the scratch folder goes whatever ends the preparation: an error, or a signal at
        if rank == 0 and made:  # any moment after it was made, before or during the passes)
            shutil.rmtree(made[0], ignore_errors=True)


def _plan_and_prepare(out, input_files, input_format, unit_bytes, num_shards, overwrite, sentence_splitter,
                      vocab_file, vocab_size, settings, rank, world_size, comm, log, progress, made):
    import uuid

    plan, err = None, None
    if rank == 0:
        try:
            if sentence_splitter not in text_input.SPLITTERS:
                raise DatasetError(f"unknown sentence splitter {sentence_splitter!r}; choose "
                                   f"{' or '.join(text_input.SPLITTERS)}")
            if num_shards is not None and num_shards < 1:
                raise DatasetError(f"--num-shards must be >= 1, got {num_shards}")
            refuse_existing(out, overwrite)
            files = text_input.expand_inputs(input_files)
            srcs = text_input.sources(files, input_format)
            units = text_input.plan_units(srcs, unit_bytes)
            shards_n = num_shards or _auto_shards(srcs)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.parent / f".{out.name}.prepare-{uuid.uuid4().hex[:12]}"
            made.append(tmp)  # (before it exists: the caller removes it, however this ends)
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
    plan, err = bcast(comm, (plan, err))
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
    agree(comm, err)
    if rank == 0:
        log(f"{rank_tag(0)}read {stats['documents']} documents, {stats['raw_bytes'] / 2**20:.1f} MiB in "
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
    agree(comm, err)
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
    err = bcast(comm, err)
    if err:
        raise DatasetError(err)
    # 3. the shards
    vocab_path = tmp / "vocab.txt"
    tok = load_tokenizer(vocab_path, settings.do_lower_case)
    ids = special_ids(tok)
    vsize = tok.get_vocab_size()
    shards, err = [], None
    try:
        for shard in range(rank, num_shards, world_size):
            mine_docs = _shard_docs(tmp, shard)
            flat = [s for d in mine_docs for s in d]
            encoded = iter(encode_ids(tok, flat))
            tokenized = [[t for t in (next(encoded) for _ in d) if t] for d in mine_docs]
            rng = random.Random(f"{settings.seed}-{shard}")
            gen = np.random.default_rng([settings.seed % (1 << 63), shard])   # the masking's
            instances = create_instances(tokenized, settings, ids, vsize, rng)
            name = shard_name(shard, num_shards)
            n = write_records(tmp / name, masked_records(instances, settings, vsize, ids["[MASK]"], gen))
            shards.append({"file": name, "records": n, "documents": len(mine_docs)})
            log(f"{rank_tag(rank)}{name}: {n} instances from {len(mine_docs)} documents")
            del mine_docs, flat, tokenized, instances
    except OSError as e:
        err = (f"cannot write shards to {out}: {e.strerror or e} (check the folder's permissions "
               f"and free space)")
    agree(comm, err)
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
    err = bcast(comm, err)
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
    commit_shards(tmp, out, [s["file"] for s in shards])
    write_sidecar(out, meta)
    return meta



def phase_one_data(src: str | Path) -> tuple[Path, dict]:
    """``(folder, sidecar)`` of the pretraining data behind ``src``: a prepared folder, or a run
    folder (or one of its checkpoints) whose config.json names its data. Phase 2 is prepared
    from the same text, vocabulary and case (``prepare-bert --like``)."""
    from hvd_bert.files import read_json_object

    p = Path(src).expanduser()
    if p.name.startswith("ckpt-"):
        p = p.parent
    folder = p
    if not (p / SIDECAR).is_file():
        try:
            data = read_json_object(p / "config.json").get("data")
        except (OSError, ValueError):
            data = None
        if not isinstance(data, str) or not data:
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


def like_phase_one(like: str | Path, *, inputs: list[str], input_format: str, sentence_splitter: str | None,
                   vocab: str | None, lower_case: bool | None, say=print) -> dict:
    """``prepare-bert --like``: the text, input format, sentence splitter, vocabulary and case
    of phase-1 data (or of a run folder's data), for what the command line leaves out (given
    values win). Returns them as ``prepare_bert``'s arguments; ``say`` reports the choice."""
    folder, meta = phase_one_data(like)
    if not inputs:  # phase 1's files, read as phase 1 read them
        inputs = meta["input_paths"]
        formats = set(meta.get("input_formats", []))
        if input_format == "auto" and len(formats) == 1:
            input_format = formats.pop()
    vocab = vocab or str(folder / meta.get("vocab_file", "vocab.txt"))
    lower = bool(meta["do_lower_case"]) if lower_case is None else lower_case
    more = len(inputs) - 3
    shown = ", ".join(inputs[:3]) + (f" and {more} more" if more > 0 else "")
    say(f"as {folder}: text {shown}; vocab {vocab}; {'lower-cased' if lower else 'cased'} "
        f"(--input, --vocab, --cased/--uncased to change)")
    return dict(inputs=inputs, input_format=input_format,
                sentence_splitter=sentence_splitter or meta.get("sentence_splitter"), vocab=vocab,
                lower_case=lower)


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
