"""Pretraining text in the formats users bring, read as a stream of documents.

Inputs are files, folders (every file below them, hidden ones skipped) or globs, in any mix
of formats, each told apart by its content (``input_format="auto"``) or named:

* ``wiki``: a Wikipedia ``pages-articles`` XML dump. Pages are read and their wikitext turned
  into text by the ``wikiextractor`` library (templates, tables, references, links, markup
  and section headings dropped, as its ``--no-templates`` run does); only articles are kept:
  redirects, disambiguation pages and other namespaces (talk, templates, files...) are
  dropped. One document per article.
* ``google``: Google BERT's format, a sentence per line and a blank line between documents.
* ``doc-per-line``: one document per line (NVIDIA's format), split into sentences.
* ``prose``: paragraphs of plain text, one document per file, split into sentences.

Any file may be compressed with gzip, bzip2 or xz (told apart by its first bytes, not its
name). Sentences are split by ``syntok`` (or ``blingfire``: BENCHMARKS.md has the comparison
with pysbd that chose them).

The work is cut into :class:`Unit` s: a whole file, or, for an uncompressed file larger than
``unit_bytes`` (not prose), byte ranges cut at document boundaries, so one large dump is read
once across ranks rather than once per rank. Each document is named by ``(file, byte offset
of its start in the decompressed text)``, so a document is the same whichever unit or rank
reads it.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import lzma
import re
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from hvd_bert.data.records import DatasetError

__all__ = ["INPUT_FORMATS", "SPLITTERS", "Source", "Unit", "expand_inputs", "sources", "plan_units",
           "read_unit", "split_sentences", "WikiCounts"]

INPUT_FORMATS = ("auto", "wiki", "google", "doc-per-line", "prose")
KIND_NAMES = {"wiki": "Wikipedia XML dump", "google": "Google format (a sentence per line)",
              "doc-per-line": "one document per line", "prose": "prose (one document per file)"}
UNIT_BYTES = 64 << 20
_SNIFF = 1 << 16
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
# a sentence end inside a line: "...end. Next" (for telling sentence-per-line from prose)
_BOUNDARY = re.compile(r"[a-z0-9)\]\"'’”][.!?][\"'’”)\]]?\s+[\"'‘“(\[]?[A-Z]")
_TERMINAL = tuple(".!?:;\"')]’”")
# disambiguation pages: the templates Wikipedia puts on them, the magic word, the title
_DISAMBIG = re.compile(r"\{\{\s*(disambiguation|disambig|disamb|dab|hndis|geodis|numberdis|"
                       r"letter-numbercombdisambig|mathdab|schooldis|shipindex|surname|given name)"
                       r"\s*[|}]|__DISAMBIG__", re.IGNORECASE)


@dataclass(frozen=True)
class Source:
    path: str
    kind: str
    compression: str | None
    size: int                     # bytes on disk


@dataclass(frozen=True)
class Unit:
    source: int                   # index into the sources
    start: int                    # byte offset in the decompressed text
    end: int | None               # None: to the end of the file


@dataclass
class WikiCounts:
    pages: int = 0
    articles: int = 0
    disambiguation: int = 0

    def add(self, other: WikiCounts) -> None:
        self.pages += other.pages
        self.articles += other.articles
        self.disambiguation += other.disambiguation


# ----------------------------------------------------------------------------- files
def expand_inputs(specs: Sequence[str | Path]) -> list[str]:
    """The input files named by ``specs`` (files, folders, globs), sorted, each once."""
    if not specs:
        raise DatasetError("no input text files given")
    files: set[str] = set()
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            found = [f for f in p.rglob("*") if f.is_file()
                     and not any(part.startswith(".") for part in f.relative_to(p).parts)]
            if not found:
                raise DatasetError(f"input folder {p} holds no files: give text files or dumps")
        elif p.is_file():
            found = [p]
        elif glob.has_magic(str(spec)):
            found = [Path(f) for f in glob.glob(str(spec), recursive=True) if Path(f).is_file()]
            if not found:
                raise DatasetError(f"input pattern {spec} matches no files: check the pattern "
                                   f"(quote it so the shell leaves it to hvd-bert)")
        elif p.exists():
            raise DatasetError(f"input {p} is not a file or folder")
        else:
            raise DatasetError(f"input text file {p} does not exist: check the path")
        files.update(str(f) for f in found)
    return sorted(files)


def _compression(path: str) -> str | None:
    with open(path, "rb") as f:
        head = f.read(6)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


@contextmanager
def _reading(path: str, compression: str | None):
    """The decompressed binary stream of ``path`` and its raw file (for progress); a truncated
    or corrupt compressed file becomes one DatasetError naming it."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise DatasetError(f"cannot read input {path}: {e.strerror}") from None
    with raw:
        stream = {"gzip": lambda: gzip.GzipFile(fileobj=raw), "bzip2": lambda: bz2.BZ2File(raw),
                  "xz": lambda: lzma.LZMAFile(raw), None: lambda: raw}[compression]()
        try:
            yield stream, raw
        except EOFError:
            raise DatasetError(f"input {path} is truncated: its {compression} stream ends early (after "
                               f"{raw.tell()} of {Path(path).stat().st_size} bytes); download or "
                               f"copy it again") from None
        except (OSError, lzma.LZMAError, zlib.error) as e:
            if compression is None:
                raise DatasetError(f"cannot read input {path}: {e}") from None
            raise DatasetError(f"input {path} is not a valid {compression} file ({e}): download or "
                               f"copy it again") from None


def _decode(data: bytes, path: str, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(
            f"input {path} is not UTF-8 (byte 0x{data[e.start]:02x} at {where}): convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {path} > {Path(path).name}.utf8, and give that file") from None


def _sniff(path: str, compression: str | None, forced: str) -> str:
    with _reading(path, compression) as (stream, _):
        head = stream.read(_SNIFF)
    nul = head.find(b"\x00")
    if nul >= 0:
        raise DatasetError(f"input {path} looks binary (a NUL byte at offset {nul}): give UTF-8 text "
                           f"or a Wikipedia XML dump, compressed or not")
    partial = len(head) == _SNIFF
    dec = codecs.getincrementaldecoder("utf-8")()
    try:
        text = dec.decode(head, final=not partial)
    except UnicodeDecodeError as e:
        line = head.count(b"\n", 0, e.start) + 1
        _decode(head[:e.end], path, f"line {line}")
        raise
    text = text.lstrip("\ufeff")
    start = text.lstrip()[:4096]
    is_wiki = start.startswith("<mediawiki") or (start.startswith("<?xml") and "<mediawiki" in start)
    if forced != "auto":
        if (forced == "wiki") != is_wiki:
            what = "is not" if forced == "wiki" else "is"
            raise DatasetError(f"input {path} {what} a MediaWiki XML dump but --input-format {forced} "
                               f"was given: leave --input-format out (auto) or give the right files")
        return forced
    name = Path(path).name.lower()
    if is_wiki:
        return "wiki"
    if ".xml" in name or start.startswith("<?xml"):
        raise DatasetError(f"input {path} is not a MediaWiki XML dump (it starts with {start[:40]!r}): "
                           f"give a pages-articles .xml or .xml.bz2 file from dumps.wikimedia.org")
    if not text.strip():
        return "google"   # empty: holds no documents whatever its format
    lines = text.split("\n")
    if partial or not lines[-1]:
        lines = lines[:-1]   # a line cut by the sniff, or the empty rest after the last newline
    return _text_kind([line.strip() for line in lines])


def _text_kind(lines: list[str]) -> str:
    nonblank = [line for line in lines if line]
    if len(nonblank) <= 1:
        return "prose"
    multi = sum(bool(_BOUNDARY.search(line)) for line in nonblank) / len(nonblank)
    ends = sum(line.endswith(_TERMINAL) for line in nonblank) / len(nonblank)
    if len(nonblank) == len(lines):          # no blank line at all
        return "doc-per-line" if multi >= 0.35 else "google"
    return "google" if ends >= 0.6 and multi < 0.35 else "prose"


def sources(files: Sequence[str], input_format: str = "auto") -> list[Source]:
    """Each file's format and compression (see the module docstring)."""
    if input_format not in INPUT_FORMATS:
        raise DatasetError(f"unknown input format {input_format!r}; choose one of {', '.join(INPUT_FORMATS)}")
    out = []
    for f in files:
        comp = _compression(f)
        out.append(Source(f, _sniff(f, comp, input_format), comp, Path(f).stat().st_size))
    return out


# ----------------------------------------------------------------------------- units
def _boundary(f, pos: int, kind: str) -> int | None:
    """The first document start at or after ``pos`` in an uncompressed file (None: none)."""
    f.seek(pos - 1)
    f.readline()                       # to the first line start >= pos
    at = f.tell()
    seen_blank = False
    for line in f:
        blank = not line.strip()
        if kind == "doc-per-line" and not blank:
            return at
        if kind == "google":
            if blank:
                seen_blank = True
            elif seen_blank:
                return at
        if kind == "wiki" and line.strip() == b"<page>":
            return at
        at += len(line)
    return None


def plan_units(srcs: Sequence[Source], unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """The work, cut into units (deterministic: the same for any number of ranks)."""
    units = []
    for i, s in enumerate(srcs):
        if s.compression is not None or s.kind == "prose" or s.size <= unit_bytes:
            units.append(Unit(i, 0, None))
            continue
        cuts = [0]
        with open(s.path, "rb") as f:
            for k in range(1, -(-s.size // unit_bytes)):
                b = _boundary(f, max(k * unit_bytes, cuts[-1] + 1), s.kind)
                if b is None:
                    break
                if b > cuts[-1]:
                    cuts.append(b)
        units.extend(Unit(i, a, b) for a, b in zip(cuts, cuts[1:] + [None]))
    return units


# ----------------------------------------------------------------------------- documents
_TOKENIZER = None


def _syntok(text: str) -> list[str]:
    global _TOKENIZER
    from syntok import segmenter
    from syntok.tokenizer import Tokenizer

    if _TOKENIZER is None:
        _TOKENIZER = Tokenizer()
    out = []
    for sent in segmenter.split(_TOKENIZER.tokenize(text)):
        s = text[sent[0].offset:sent[-1].offset + len(sent[-1].value)].strip()
        if s:
            out.append(s)
    return out


def _blingfire(text: str) -> list[str]:
    try:
        import blingfire
    except ImportError:
        raise DatasetError("--sentence-splitter blingfire needs the blingfire package: pip install "
                           "blingfire==0.1.8, or use syntok (the default)") from None
    return [s.strip() for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]


SPLITTERS = {"syntok": _syntok, "blingfire": _blingfire}


def split_sentences(text: str, splitter: str = "syntok") -> list[str]:
    """The sentences of a paragraph: by ``syntok`` (the default: right after titles such as
    "Dr." in running text), or ``blingfire`` (about 27x faster, but it ends a sentence after
    such a title; BENCHMARKS.md)."""
    return SPLITTERS[splitter](text)


def _lines(stream, path: str, unit: Unit) -> Iterator[tuple[int, str]]:
    """(byte offset, decoded line) of the unit's lines."""
    if unit.start:
        stream.seek(unit.start)
    pos, n = unit.start, 0
    for raw in stream:
        if unit.end is not None and pos >= unit.end:
            return
        n += 1
        where = f"line {n}" if unit.start == 0 else f"byte offset {pos}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = _decode(raw, path, where)
        if "\x00" in line:
            raise DatasetError(f"input {path} looks binary (a NUL byte at {where}): give UTF-8 text")
        yield pos, line
        pos += len(raw)


def _google(lines) -> Iterator[tuple[int, list[str]]]:
    cur, at = [], 0
    for off, line in lines:
        s = line.strip()
        if s:
            if not cur:
                at = off
            cur.append(s)
        elif cur:
            yield at, cur
            cur = []
    if cur:
        yield at, cur


def _doc_per_line(lines, split) -> Iterator[tuple[int, list[str]]]:
    for off, line in lines:
        s = line.strip()
        if s:
            yield off, split(s)


def _prose(lines, split) -> Iterator[tuple[int, list[str]]]:
    sentences, para = [], []
    for _, line in lines:
        s = line.strip()
        if s:
            para.append(s)
        elif para:
            sentences.extend(split(" ".join(para)))
            para = []
    if para:
        sentences.extend(split(" ".join(para)))
    if sentences:
        yield 0, sentences


def _wiki(lines, path: str, unit: Unit, counts: WikiCounts, split) -> Iterator[tuple[int, list[str]]]:
    import wikiextractor.WikiExtractor as wx
    from wikiextractor.extract import Extractor

    # collect_pages keeps ns 0 pages that are not redirects and whose title does not start
    # with the template namespace, a module global that its own dump reader sets from
    # <siteinfo>; the <ns> element already excludes templates, so no title is excluded here.
    wx.templateNamespace = "\x00"
    state = {"at": 0, "open": False, "closed": False}

    def tracked():
        for off, line in lines:
            s = line.strip()
            if s == "<page>":
                state["at"], state["open"] = off, True
                counts.pages += 1
            elif s == "</page>":
                state["open"] = False
            elif s.startswith("</mediawiki"):
                state["closed"] = True
            yield line

    for pid, revid, title, page in wx.collect_pages(tracked()):
        wikitext = "".join(page)
        if _DISAMBIG.search(wikitext) or title.endswith("(disambiguation)"):
            counts.disambiguation += 1
            continue
        ex = Extractor(pid, revid, "", title, page, keepSections=False)
        paragraphs = ex.clean_text(wikitext, expand_templates=False, html_safe=False)
        sentences = [s for p in paragraphs for s in split(p)]
        if sentences:
            counts.articles += 1
            yield state["at"], sentences
    if unit.end is None and (state["open"] or not state["closed"]):
        raise DatasetError(f"input {path} ends before its </mediawiki> (inside a page: "
                           f"{state['open']}): the dump is truncated; download or copy it again")


def read_unit(src: Source, unit: Unit, counts: WikiCounts | None = None,
              progress: Callable[[int], None] | None = None,
              splitter: str = "syntok") -> Iterator[tuple[int, list[str]]]:
    """The unit's documents as ``(byte offset, sentences)``; ``progress(raw bytes so far)`` is
    called as the file is read; ``splitter``: see ``split_sentences``."""
    counts = counts if counts is not None else WikiCounts()
    split = SPLITTERS[splitter]
    with _reading(src.path, src.compression) as (stream, raw):
        lines = _lines(stream, src.path, unit)
        if src.kind == "google":
            docs = _google(lines)
        elif src.kind == "doc-per-line":
            docs = _doc_per_line(lines, split)
        elif src.kind == "prose":
            docs = _prose(lines, split)
        else:
            docs = _wiki(lines, src.path, unit, counts, split)
        for doc in docs:
            if progress is not None:
                progress(raw.tell() - (unit.start if src.compression is None else 0))
            yield doc
        if progress is not None:
            progress(raw.tell() - (unit.start if src.compression is None else 0))


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
        raise DatasetError(f"{what} {p} looks binary (a NUL byte at offset {nul}): give UTF-8 text (a "
                           f"UTF-16 file has NUL bytes too: convert it with iconv -f utf-16 -t utf-8)")
    try:
        return data.decode("utf-8-sig")  # (a byte-order mark some editors write first is not text)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DatasetError(
            f"{what} {p} is not UTF-8 (byte 0x{data[e.start]:02x} at line {line}): convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {p} > {p.name}.utf8, and give that file") from None


def read_documents(inputs: Sequence[str | Path], input_format: str = "auto") -> list[list[str]]:
    """Every document (a list of sentences) of ``inputs`` in memory, in order (small inputs;
    ``prepare_bert`` streams)."""
    srcs = sources(expand_inputs(inputs), input_format)
    docs = [sents for u in plan_units(srcs)
            for _, sents in read_unit(srcs[u.source], u)]
    if not docs:
        raise DatasetError(f"the inputs {[Path(s.path).name for s in srcs][:5]} hold no documents: "
                           f"give text files or a pages-articles dump")
    return docs

