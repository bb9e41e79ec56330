"""prepare-bert's inputs: Wikipedia dumps through wikiextractor, Google's format, one document
per line, prose; compression; byte-range units; every format giving the same shards as the
same text in Google's format; bad input."""

from __future__ import annotations

import bz2
import json
import gzip
import lzma
import random
import re
import subprocess
import sys

import pytest

from hvd_bert.data import text_input
from hvd_bert.data.masking import PretrainingSettings
from hvd_bert.data.pretraining import prepare_bert
from hvd_bert.data.text_input import read_documents
from hvd_bert.data.vocab import train_vocab
from hvd_bert.data.records import DatasetError
from tests.wiki_dump import SAMPLE_DOCS, article_pages, write_dump

SMALL = PretrainingSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2)
WORDS = ("river mill stone garden winter harbour valley market bridge tower lantern village "
         "forest meadow castle orchard kettle window letter station").split()


def make_docs(n: int, seed: int = 0) -> list[list[str]]:
    """Plain sentences with no abbreviation or number a splitter could stumble on."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        doc = []
        for _ in range(rng.randint(3, 9)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
            doc.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "!", "?"]))
        docs.append(doc)
    return docs


def google_text(docs) -> str:
    return "\n\n".join("\n".join(d) for d in docs) + "\n"


def wrap(text: str, width: int = 50) -> str:
    lines, cur = [], ""
    for w in text.split(" "):
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return "\n".join([*lines, cur])


def test_wikipedia_dump_gives_articles_only(tmp_path):
    dump = write_dump(tmp_path / "enwiki-20240101-pages-articles.xml")
    assert read_documents([dump]) == SAMPLE_DOCS
    src, = text_input.sources([str(dump)])
    assert src.kind == "wiki" and src.compression is None
    counts = text_input.WikiCounts()
    list(text_input.read_unit(src, text_input.Unit(0, 0, None), counts))
    assert (counts.pages, counts.articles, counts.disambiguation) == (7, 2, 2)


@pytest.mark.parametrize("suffix", [".bz2", ".gz", ".xz"])
def test_compressed_inputs_are_told_by_their_bytes(tmp_path, suffix):
    dump = write_dump(tmp_path / f"wiki.xml{suffix}")
    assert read_documents([dump]) == SAMPLE_DOCS
    # a compressed Google-format file under a name that says nothing
    docs = make_docs(5)
    opener = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}[suffix]
    with opener(tmp_path / "corpus.data", "wt", encoding="utf-8") as f:
        f.write(google_text(docs))
    src, = text_input.sources([str(tmp_path / "corpus.data")])
    assert src.kind == "google" and src.compression == {".bz2": "bzip2", ".gz": "gzip", ".xz": "xz"}[suffix]
    assert read_documents([tmp_path / "corpus.data"]) == docs


def test_formats_are_detected_by_content(tmp_path):
    docs = make_docs(12)
    (tmp_path / "g.txt").write_text(google_text(docs))
    (tmp_path / "d.txt").write_text("".join(" ".join(d) + "\n" for d in docs))
    (tmp_path / "p.txt").write_text("\n\n".join(wrap(" ".join(d)) for d in docs) + "\n")
    (tmp_path / "q.txt").write_text("\n\n".join(" ".join(d) for d in docs) + "\n")  # a paragraph a line
    kinds = {s.path.rsplit("/", 1)[1]: s.kind for s in
             text_input.sources([str(tmp_path / n) for n in ("g.txt", "d.txt", "p.txt", "q.txt")])}
    assert kinds == {"g.txt": "google", "d.txt": "doc-per-line", "p.txt": "prose", "q.txt": "prose"}
    assert read_documents([tmp_path / "d.txt"]) == docs
    assert read_documents([tmp_path / "p.txt"]) == [[s for d in docs for s in d]]  # one file, one document
    assert read_documents([tmp_path / "g.txt"], input_format="doc-per-line") == [[s] for d in docs for s in d]


def test_folders_and_globs(tmp_path):
    docs = make_docs(6)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "1.txt").write_text(google_text(docs[:3]))
    (tmp_path / "a" / "b" / "2.txt").write_text(google_text(docs[3:]))
    (tmp_path / "a" / ".hidden").write_text("Not this one.\n")
    assert read_documents([tmp_path / "a"]) == docs
    assert read_documents([str(tmp_path / "a" / "**" / "*.txt")]) == docs
    assert read_documents([tmp_path / "a", tmp_path / "a" / "1.txt"]) == docs  # each file once
    with pytest.raises(DatasetError, match=r"input pattern \S+/nothing\*.txt matches no files"):
        read_documents([str(tmp_path / "nothing*.txt")])


@pytest.mark.parametrize("kind", ["google", "doc-per-line", "wiki"])
def test_byte_ranges_give_the_same_documents(tmp_path, kind):
    docs = make_docs(80, seed=3)
    path = tmp_path / "big"
    if kind == "google":
        path.write_text(google_text(docs))
    elif kind == "doc-per-line":
        path.write_text("".join(" ".join(d) + "\n" for d in docs))
    else:
        write_dump(path, article_pages(docs))
    src, = text_input.sources([str(path)])
    assert src.kind == kind
    whole = text_input.plan_units([src])
    cut = text_input.plan_units([src], unit_bytes=997)
    assert len(whole) == 1 and len(cut) > 5
    assert all(a.end == b.start for a, b in zip(cut, cut[1:])) and cut[-1].end is None
    got = [d for u in cut for d in text_input.read_unit(src, u)]
    assert got == list(text_input.read_unit(src, whole[0]))
    assert [d for _, d in got] == docs


def test_every_format_gives_the_same_shards_as_google_format(tmp_path):
    docs = make_docs(60, seed=1)
    google = tmp_path / "google.txt"
    google.write_text(google_text(docs))
    vocab = train_vocab([google], tmp_path / "v", vocab_size=200)
    (tmp_path / "dpl.txt").write_text("".join(" ".join(d) + "\n" for d in docs))
    (tmp_path / "prose").mkdir()
    for i, d in enumerate(docs):  # one document a file, two hard-wrapped paragraphs
        half = max(1, len(d) // 2)
        (tmp_path / "prose" / f"doc-{i:03d}.txt").write_text(
            wrap(" ".join(d[:half])) + "\n\n" + wrap(" ".join(d[half:])) + "\n")
    write_dump(tmp_path / "wiki.xml.bz2", article_pages(docs))
    outs = {}
    # (a file of one short paragraph a line looks like Google's format: prose is named here)
    for name, inp, fmt in [("google", google, "auto"), ("dpl", tmp_path / "dpl.txt", "auto"),
                           ("prose", tmp_path / "prose", "prose"),
                           ("wiki", tmp_path / "wiki.xml.bz2", "auto")]:
        meta = prepare_bert([inp], tmp_path / f"out-{name}", vocab_file=vocab, num_shards=3, settings=SMALL,
                            input_format=fmt, log=lambda *_: None)
        assert meta["documents"] == len(docs)
        outs[name] = {p.name: p.read_bytes() for p in (tmp_path / f"out-{name}").glob("*.tfrecord")}
    assert len(outs["google"]) == 3
    for name in ("dpl", "prose", "wiki"):
        assert outs[name] == outs["google"], name


def test_split_units_give_the_same_shards(tmp_path):
    docs = make_docs(70, seed=2)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(google_text(docs[:30]))
    (tmp_path / "in" / "b.txt").write_text("".join(" ".join(d) + "\n" for d in docs[30:50]))
    write_dump(tmp_path / "in" / "c.xml", article_pages(docs[50:]))
    vocab = train_vocab([tmp_path / "in" / "a.txt"], tmp_path / "v", vocab_size=200)
    a = prepare_bert([tmp_path / "in"], tmp_path / "whole", vocab_file=vocab, num_shards=4, settings=SMALL,
                     log=lambda *_: None)
    b = prepare_bert([tmp_path / "in"], tmp_path / "cut", vocab_file=vocab, num_shards=4, settings=SMALL,
                     unit_bytes=1500, log=lambda *_: None)
    assert a["input_formats"] == ["google", "doc-per-line", "wiki"] and a["documents"] == 70
    assert a == b
    for f in (tmp_path / "whole").iterdir():
        assert f.read_bytes() == (tmp_path / "cut" / f.name).read_bytes(), f.name


def test_auto_shards_grow_with_the_input(tmp_path):
    small = text_input.Source("x", "google", None, 1000)
    big = text_input.Source("y", "google", None, 20 << 30)
    dump = text_input.Source("z", "wiki", "bzip2", 20 << 30)
    from hvd_bert.data.pretraining import _auto_shards
    assert _auto_shards([small]) == 8
    assert _auto_shards([big]) == 640
    assert _auto_shards([dump]) > 640


def _truncated_bz2(tmp_path):
    data = bz2.compress(write_dump(tmp_path / "full.xml").read_bytes())
    (tmp_path / "in.xml.bz2").write_bytes(data[: len(data) // 2])


def _cut_xml(tmp_path):
    text = write_dump(tmp_path / "full.xml").read_text()
    (tmp_path / "in.xml").write_text(text[: text.index("<title>Albedo")])


@pytest.mark.parametrize("case, write, expect", [
    ("not xml", lambda p: (p / "in.xml").write_text("just some text\n"),
     r"in.xml is not a MediaWiki XML dump \(it starts with 'just some text"),
    ("other xml", lambda p: (p / "in.txt").write_text('<?xml version="1.0"?>\n<rss></rss>\n'),
     r"in.txt is not a MediaWiki XML dump"),
    ("truncated bz2", _truncated_bz2, r"in.xml.bz2 is truncated: its bzip2 stream ends early"),
    ("cut xml", _cut_xml, r"in.xml ends before its </mediawiki>"),
    ("only redirects", lambda p: write_dump(p / "in.xml", [
        {"title": "A", "ns": 0, "id": 1, "redirect": "B", "text": "#REDIRECT [[B]]"},
        {"title": "Talk:B", "ns": 1, "id": 2, "text": "Talk."}]),
     r"hold no documents \(2 Wikipedia pages: 0 disambiguation and 2 redirects"),
    ("latin1", lambda p: (p / "in.txt").write_bytes("Un café.\n\nDeux.\n".encode("latin-1")),
     r"in.txt is not UTF-8 \(byte 0xe9 at line 1\)"),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, case, write, expect):
    (tmp_path / "src").mkdir()
    write(tmp_path / "src")
    inp = [str(p) for p in (tmp_path / "src").iterdir() if p.name != "full.xml"]
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=expect):
        prepare_bert(inp, out, vocab_size=100, num_shards=1, settings=SMALL, log=lambda *_: None)
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", *inp,
                        "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert re.search(expect, p.stderr) and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["src"]  # no output, no spill left


def test_a_failed_overwrite_keeps_the_old_data(tmp_path):
    docs = make_docs(30)
    (tmp_path / "in.txt").write_text(google_text(docs))
    out = tmp_path / "out"
    meta = prepare_bert([tmp_path / "in.txt"], out, vocab_size=200, num_shards=2, settings=SMALL,
                        log=lambda *_: None)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "bad.xml").write_text("no dump\n")
    with pytest.raises(DatasetError, match="is not a MediaWiki XML dump"):
        prepare_bert([tmp_path / "in.txt", tmp_path / "bad.xml"], out, vocab_size=200, num_shards=3,
                     settings=SMALL, overwrite=True, log=lambda *_: None)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    again = prepare_bert([tmp_path / "in.txt"], out, vocab_file=out / "vocab.txt", num_shards=3,
                         settings=SMALL, overwrite=True, log=lambda *_: None)
    assert sorted(p.name for p in out.glob("*.tfrecord")) == [s["file"] for s in again["shards"]]
    assert meta["documents"] == again["documents"] == 30


def test_the_sentence_splitters(tmp_path):
    text = "It seeks to abolish coercion. Dr. Smith wrote about it in 1890. Was it read? Yes!"
    first = "It seeks to abolish coercion."
    assert text_input.split_sentences(text) == [first, "Dr. Smith wrote about it in 1890.", "Was it read?",
                                                "Yes!"]
    assert text_input.split_sentences(text, "blingfire") == [first, "Dr.", "Smith wrote about it in 1890.",
                                                             "Was it read?", "Yes!"]
    docs = make_docs(20, seed=4)
    (tmp_path / "d.txt").write_text("".join(" ".join(d) + "\n" for d in docs))
    a = prepare_bert([tmp_path / "d.txt"], tmp_path / "a", vocab_size=200, num_shards=2, settings=SMALL,
                     log=lambda *_: None)
    b = prepare_bert([tmp_path / "d.txt"], tmp_path / "b", vocab_file=tmp_path / "a" / "vocab.txt",
                     num_shards=2, settings=SMALL, sentence_splitter="blingfire", log=lambda *_: None)
    assert (a["sentence_splitter"], b["sentence_splitter"]) == ("syntok", "blingfire")
    assert a["documents"] == b["documents"] == 20   # plain sentences: the same split by both


def test_like_reads_phase_one_files_as_phase_one_did(tmp_path):
    """prepare-bert --like: phase 1's forced input format and sentence splitter carry over."""
    docs = make_docs(24, seed=6)
    (tmp_path / "g.txt").write_text(google_text(docs))   # Google's format, read as a document per line
    common = ["--num-shards", "2", "--max-seq-length", "32", "--max-predictions-per-seq", "5",
              "--dupe-factor", "1"]
    p1 = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", str(tmp_path / "g.txt"),
                         "--input-format", "doc-per-line", "--sentence-splitter", "blingfire", "--vocab-size",
                         "200", "--output", str(tmp_path / "p1"), *common], capture_output=True, text=True,
                        timeout=120)
    assert p1.returncode == 0, p1.stderr
    p2 = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--like", str(tmp_path / "p1"),
                         "--output", str(tmp_path / "p2"), *common, "--max-seq-length", "64"],
                        capture_output=True, text=True, timeout=120)
    assert p2.returncode == 0, p2.stderr
    a, b = (json.loads((tmp_path / d / "dataset.json").read_text()) for d in ("p1", "p2"))
    assert a["documents"] == b["documents"] == sum(len(d) for d in docs)  # a sentence a document
    assert b["input_formats"] == ["doc-per-line"] and b["sentence_splitter"] == "blingfire"
