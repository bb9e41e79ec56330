"""Data across processes: preparation under mpirun equals one process byte for byte; the
PyTorch and TensorFlow readers yield the same examples in the same order; files written by
TensorFlow's own writer are read by the PyTorch reader."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_bert.cluster import launch

WORKERS = Path(__file__).parent / "workers"
HVD_BERT = [sys.executable, "-m", "hvd_bert"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    text = root / "corpus.txt"
    from hvd_bert.data.corpus import write_stdlib_corpus
    write_stdlib_corpus(text, max_bytes=200_000)
    one = root / "one"
    subprocess.run([*HVD_BERT, "prepare-bert", "--input", str(text), "--output", str(one),
                    "--num-shards", "5", "--vocab-size", "2000", "--max-seq-length", "64",
                    "--max-predictions-per-seq", "10", "--dupe-factor", "2"],
                   check=True, timeout=300, capture_output=True)
    return root, text, one


def test_prepare_under_mpirun_equals_one_process(data):
    root, text, one = data
    two = root / "two"
    cmd = launch.command(["-m", "hvd_bert", "prepare-bert", "--input", str(text), "--output", str(two),
                          "--num-shards", "5", "--vocab", str(one / "vocab.txt"), "--max-seq-length", "64",
                          "--max-predictions-per-seq", "10", "--dupe-factor", "2"], np=2, launcher="mpi")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=launch.mpi_env())
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[rank 1]" in p.stdout and "2 process(es)" in p.stdout
    for f in sorted(os.listdir(one)):
        if f.endswith(".tfrecord") or f == "vocab.txt":
            assert (one / f).read_bytes() == (two / f).read_bytes(), f
    a, b = (json.loads((d / "dataset.json").read_text()) for d in (one, two))
    assert a == b


def read(fw, folder, rank, world, stride=False, seed=3, epoch=1, batch=8, buffer=64, grouping=None):
    more = [str(grouping), "bert-classification"] if grouping is not None else []
    p = subprocess.run([sys.executable, str(WORKERS / "read_batches.py"), fw, str(folder), str(rank),
                        str(world), "1" if stride else "0", str(seed), str(epoch), str(batch), str(buffer),
                        *more], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("rank,world,stride,buffer", [(0, 1, False, 64), (1, 2, False, 64), (2, 3, False, 1),
                                                      (3, 7, True, 50)])
def test_pytorch_and_tensorflow_readers_agree(data, rank, world, stride, buffer):
    _, _, one = data
    pt = read("pt", one, rank, world, stride, buffer=buffer)
    tf = read("tf", one, rank, world, stride, buffer=buffer)
    assert pt == tf and pt["batches"] > 0


@pytest.fixture(scope="module")
def sentences(data, tmp_path_factory):
    """A classification set of the corpus' lines (1 to 40 words: real lengths), seq 64."""
    root, text, one = data
    lines = [ln for ln in text.read_text().splitlines() if ln.strip()][:600]
    table = tmp_path_factory.mktemp("cls") / "t.tsv"
    table.write_text("sentence\tlabel\n" + "".join(
        f"{' '.join(ln.replace(chr(9), ' ').split()[:40])}\t{n % 2}\n" for n, ln in enumerate(lines)))
    out = table.parent / "cls"
    subprocess.run([*HVD_BERT, "prepare-classification", str(table), "--output", str(out), "--vocab",
                    str(one / "vocab.txt"), "--text-a", "sentence", "--label", "label", "--max-seq-length",
                    "64", "--num-shards", "4"], check=True, timeout=300, capture_output=True)
    return out


@pytest.mark.parametrize("rank,world,grouping", [(0, 1, 8), (1, 2, 1)])
def test_length_grouped_batches_agree_between_the_frameworks_and_keep_the_step_count(sentences, rank, world,
                                                                                      grouping):
    """Padded to their longest sequence after sorting groups of batches by length: the same
    batches in both frameworks, as many as with fixed padding, and narrower."""
    pt = read("pt", sentences, rank, world, grouping=grouping, epoch=0)
    tf = read("tf", sentences, rank, world, grouping=grouping, epoch=0)
    fixed = read("pt", sentences, rank, world, grouping=0, epoch=0)
    assert pt == tf and pt["batches"] == fixed["batches"] > 0
    assert set(fixed["widths"]) == {64} and max(pt["widths"]) <= 64 and min(pt["widths"]) < 64
    assert all(w % 8 == 0 for w in pt["widths"])
    if grouping > 1:  # sorting within groups pads less than trimming alone
        assert sum(pt["widths"]) < sum(read("pt", sentences, rank, world, grouping=1, epoch=0)["widths"])


def test_ranks_get_the_same_number_of_batches_and_different_data(data):
    _, _, one = data
    r0, r1 = read("pt", one, 0, 2), read("pt", one, 1, 2)
    assert r0["batches"] == r1["batches"] and r0["sha"] != r1["sha"]
    assert read("pt", one, 0, 2, epoch=2)["sha"] != r0["sha"]  # reshuffled per epoch


def test_too_few_shards_for_the_ranks_is_a_clear_error(data):
    _, _, one = data
    p = subprocess.run([sys.executable, str(WORKERS / "read_batches.py"), "pt", str(one), "0", "8", "0",
                        "0", "0", "8", "64"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "5 shard file(s) for 8 ranks" in p.stderr and "--num-shards 32" in p.stderr


def test_shards_written_by_tensorflow_are_read_by_the_pytorch_reader(tmp_path):
    subprocess.run([sys.executable, str(WORKERS / "tf_write_google_shard.py"), str(tmp_path)], check=True,
                   timeout=120, capture_output=True)
    code = ("from hvd_bert.pt.data import ShardedDataset\n"
            f"ds = ShardedDataset({str(tmp_path)!r}, 'bert-pretraining', 0, 1, 5, shuffle_buffer=0)\n"
            "b = next(iter(ds))\n"
            "print(b['input_ids'][:, 1].tolist(), b['masked_lm_weights'][0].tolist(), "
            "b['next_sentence_labels'][:, 0].tolist())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[10, 11, 12, 13, 14] [1.0, 1.0, 0.0] [0, 1, 0, 1, 0]"


def test_bad_input_under_mpirun_is_the_same_line_on_every_rank_and_writes_nothing(tmp_path):
    src = tmp_path / "latin.txt"
    src.write_bytes("Un café au lait.\n".encode("latin-1"))
    out = tmp_path / "out"
    cmd = launch.command(["-m", "hvd_bert", "prepare-bert", "--input", str(src), "--output", str(out)],
                         np=2, launcher="mpi")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=launch.mpi_env())
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("latin.txt is not UTF-8 (byte 0xe9 at line 1)") == 2, p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


def test_mixed_inputs_split_across_ranks_equal_one_process(tmp_path):
    """A Wikipedia dump (bz2), a large Google-format file read in byte ranges and a
    one-document-per-line file: 1 process and mpirun -np 2 write the same bytes."""
    from tests.core.test_text_input import google_text, make_docs
    from tests.wiki_dump import article_pages, write_dump

    docs = make_docs(120, seed=5)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "books.txt").write_text(google_text(docs[:70]))
    (tmp_path / "in" / "web.txt").write_text("".join(" ".join(d) + "\n" for d in docs[70:95]))
    write_dump(tmp_path / "in" / "enwiki-pages-articles1.xml.bz2", article_pages(docs[95:]))
    args = ["prepare-bert", "--input", str(tmp_path / "in" / "*"), "--num-shards", "3", "--vocab-size", "300",
            "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "2",
            "--split-mb", "0.004"]
    one = subprocess.run([*HVD_BERT, *args, "--output", str(tmp_path / "one")], capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert ("3 file(s) (1 Google format (a sentence per line); 1 Wikipedia XML dump, bzip2; 1 one document "
            "per line)") in one.stdout, one.stdout
    units = int(one.stdout.split(" unit(s)")[0].rsplit(" ", 1)[1])
    assert units > 4, one.stdout   # books.txt was cut into byte ranges
    cmd = launch.command(["-m", "hvd_bert", *args, "--output", str(tmp_path / "two"), "--vocab",
                          str(tmp_path / "one" / "vocab.txt")], np=2, launcher="mpi")
    two = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=launch.mpi_env())
    assert two.returncode == 0, two.stdout + two.stderr
    assert "[rank 1]" in two.stdout and "2 process(es)" in two.stdout
    names = sorted(os.listdir(tmp_path / "one"))
    assert names == sorted(os.listdir(tmp_path / "two")) and len(names) == 5
    for f in names:
        if f != "dataset.json":
            assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    a, b = (json.loads((tmp_path / d / "dataset.json").read_text()) for d in ("one", "two"))
    assert a == b and a["documents"] == 120 and a["wikipedia"] == {"pages": 25, "articles": 25,
                                                                    "disambiguation": 0}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no spill left
