"""BERT data preparation and the record reader (no framework: tokenizers and hvd_bert's own
tf.train.Example codec)."""

import json
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from hvd_bert.data.classification import prepare_classification
from hvd_bert.data.kinds import pretraining_spec
from hvd_bert.data.masking import PretrainingSettings, create_instances
from hvd_bert.data.pretraining import check_pretraining_data, prepare_bert
from hvd_bert.data.text_input import read_documents
from hvd_bert.data.corpus import stdlib_documents, write_stdlib_corpus
from hvd_bert.data.records import CorruptRecordError, DatasetError, decode_example, iter_records
from hvd_bert.data.sidecar import read_sidecar

SMALL = PretrainingSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, seed=7)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_stdlib_corpus(tmp_path_factory.mktemp("corpus") / "c.txt", max_bytes=300_000)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert")
    meta = prepare_bert([corpus], out, vocab_size=2000, num_shards=3, settings=SMALL, log=lambda *_: None)
    return out, meta


def examples(folder, meta):
    spec = pretraining_spec(meta["max_seq_length"], meta["max_predictions_per_seq"])
    return [decode_example(r, spec) for s in meta["shards"] for _, r in iter_records(folder / s["file"])]


def test_corpus_is_stdlib_prose_in_bert_format(corpus):
    docs = read_documents([corpus])
    assert len(docs) > 20 and all(len(d) >= 2 for d in docs)
    assert stdlib_documents(max_bytes=300_000)[0] == docs[0]  # deterministic


def test_sidecar_records_settings_and_counts(prepared):
    folder, meta = prepared
    side = json.loads((folder / "dataset.json").read_text())
    assert side == meta
    assert meta["max_seq_length"] == 64 and meta["vocab_size"] <= 2000 and meta["num_shards"] == 3
    assert sum(s["records"] for s in meta["shards"]) == meta["total_records"] > 100


def test_instances_follow_googles_format(prepared):
    folder, meta = prepared
    vocab = (folder / "vocab.txt").read_text().splitlines()
    cls, sep, mask = vocab.index("[CLS]"), vocab.index("[SEP]"), vocab.index("[MASK]")
    exs = examples(folder, meta)
    n_masked = n_mask_token = n_kept = 0
    nsp = []
    for ex in exs:
        ids, m, seg = ex["input_ids"], ex["input_mask"], ex["segment_ids"]
        n = int(m.sum())
        assert ids[0] == cls and ids[n - 1] == sep and not ids[n:].any()
        # segment A ([CLS] a [SEP]) is all 0, segment B (b [SEP]) all 1; [SEP] ends each (a
        # random replacement may also draw the [SEP] id elsewhere, as in Google's script)
        end_a = int(np.flatnonzero(seg[:n] == 0)[-1])
        assert ids[end_a] == sep and seg[end_a + 1:n].all() and not seg[:end_a + 1].any()
        assert not seg[n:].any()
        w = ex["masked_lm_weights"]
        k = int(w.sum())
        pos, labels = ex["masked_lm_positions"][:k], ex["masked_lm_ids"][:k]
        assert 1 <= k <= 10 and list(pos) == sorted(pos) and (pos < n).all() and (pos > 0).all()
        assert k == min(10, max(1, round(n * 0.15)))
        assert not np.isin(labels, [cls, sep]).any()  # never [CLS]/[SEP]
        n_masked += k
        n_mask_token += int((ids[pos] == mask).sum())
        n_kept += int((ids[pos] == labels).sum())
        nsp.append(int(ex["next_sentence_labels"][0]))
    assert 0.77 < n_mask_token / n_masked < 0.83  # 80% [MASK]
    assert 0.08 < n_kept / n_masked < 0.12        # 10% kept (+ random draws of the same token)
    assert 0.40 < np.mean(nsp) < 0.65             # ~50% random next (more for 1-segment chunks)


def test_same_vocab_and_seed_give_identical_files(prepared, corpus, tmp_path):
    folder, meta = prepared
    again = prepare_bert([corpus], tmp_path, vocab_file=folder / "vocab.txt", num_shards=3, settings=SMALL,
                         log=lambda *_: None)
    for s in meta["shards"]:
        assert (folder / s["file"]).read_bytes() == (tmp_path / s["file"]).read_bytes()
    other = prepare_bert([corpus], tmp_path / "o", vocab_file=folder / "vocab.txt", num_shards=3,
                         settings=PretrainingSettings(max_seq_length=64, max_predictions_per_seq=10,
                                                      dupe_factor=2, seed=8), log=lambda *_: None)
    assert (tmp_path / "o" / meta["shards"][0]["file"]).read_bytes() != \
        (folder / meta["shards"][0]["file"]).read_bytes()
    assert again["total_records"] == meta["total_records"] and other["total_records"] > 0


def test_short_seq_prob_makes_short_sequences():
    rng = random.Random(0)
    doc = [[5 + (i % 50)] * 10 for i in range(40)]
    ids = {"[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    long = create_instances([doc, doc], PretrainingSettings(max_seq_length=64, short_seq_prob=0.0,
                                                            dupe_factor=1), ids, 100, rng)
    short = create_instances([doc, doc], PretrainingSettings(max_seq_length=64, short_seq_prob=1.0,
                                                             dupe_factor=1), ids, 100, rng)
    assert np.mean([len(i.tokens) for i in short]) < np.mean([len(i.tokens) for i in long])
    assert all(len(i.tokens) <= 64 for i in long + short)


def test_corrupt_record_names_file_and_offset(prepared, tmp_path):
    folder, meta = prepared
    name = meta["shards"][0]["file"]
    data = bytearray((folder / name).read_bytes())
    offsets = [o for o, _ in iter_records(folder / name)]
    data[offsets[3] + 40] ^= 0xFF  # inside the 4th record's data
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=rf"{name}: record at byte offset {offsets[3]}: data CRC"):
        list(iter_records(bad))
    bad.write_bytes(bytes(data[:offsets[5] + 20]))  # truncated inside record 6
    with pytest.raises(CorruptRecordError, match=rf"truncated at byte offset {offsets[5]}"):
        list(iter_records(bad, verify=False))


def test_bad_inputs_name_the_fix(prepared, corpus, tmp_path):
    folder, meta = prepared
    with pytest.raises(DatasetError, match="does not exist"):
        read_documents([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DatasetError, match="hold no documents"):
        read_documents([tmp_path / "empty.txt"])
    with pytest.raises(DatasetError, match="prepared with max_seq_length=64 but 128 is expected"):
        check_pretraining_data(folder, max_seq_length=128)
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    with pytest.raises(DatasetError, match="is not the vocab .* was prepared with"):
        check_pretraining_data(folder, vocab_file=other_vocab)
    with pytest.raises(DatasetError, match="has no dataset.json"):
        read_sidecar(tmp_path, "bert-pretraining")
    with pytest.raises(DatasetError, match="already holds prepared data; pass --overwrite"):
        prepare_bert([corpus], folder, num_shards=3, settings=SMALL)
    with pytest.raises(DatasetError, match="lacks the special tokens"):
        (tmp_path / "v2.txt").write_text("a\nb\n")
        prepare_bert([corpus], tmp_path / "x", vocab_file=tmp_path / "v2.txt")
    with pytest.raises(DatasetError, match="got no instances: too few documents"):
        tiny = tmp_path / "tiny.txt"
        tiny.write_text("one two three four.\nfive six seven eight.\n")
        prepare_bert([tiny], tmp_path / "y", vocab_file=folder / "vocab.txt", num_shards=4, settings=SMALL,
                     log=lambda *_: None)


def test_classification_from_tsv_and_csv(prepared, tmp_path):
    folder, _ = prepared
    tsv = tmp_path / "train.tsv"
    tsv.write_text("sentence\tother\tlabel\nthe file is read\tit is written\tpos\n"
                   "a socket is closed\tnothing\tneg\nthe module imports a name\tit does\tpos\n")
    meta = prepare_classification(tsv, tmp_path / "cls", folder / "vocab.txt", text_a="sentence",
                                  text_b="other", label="label", max_seq_length=16, num_shards=1)
    assert meta["labels"] == ["neg", "pos"] and meta["total_records"] == 3
    from hvd_bert.data.kinds import classification_spec
    exs = [decode_example(r, classification_spec(16))
           for _, r in iter_records(tmp_path / "cls" / meta["shards"][0]["file"])]
    assert [int(e["label_ids"][0]) for e in exs] == [1, 0, 1]
    assert all(e["segment_ids"].max() == 1 for e in exs)  # pairs
    with pytest.raises(DatasetError, match="column 'text' is not in"):
        prepare_classification(tsv, tmp_path / "c2", folder / "vocab.txt", text_a="text", label="label")
    csv_file = tmp_path / "dev.csv"
    csv_file.write_text('text,label\n"a, b, c",pos\n"unknown label",maybe\n')
    with pytest.raises(DatasetError, match=r"labels \['maybe'\] are not in the label list"):
        prepare_classification(csv_file, tmp_path / "c3", folder / "vocab.txt", text_a="text",
                               label="label", labels=["neg", "pos"])


def test_decode_batch_equals_decoding_each_record():
    import numpy as np

    from hvd_bert.data.records import decode_batch, decode_example
    from hvd_bert.data.example_proto import serialize_example as _serialize

    rng = np.random.default_rng(5)
    spec = {"ids": ("int", 130), "w": ("float", 3), "y": ("int", 1)}
    recs = [_serialize({"ids": (rng.integers(0, 2**35, 130), "int"), "w": (rng.random(3), "float"),
                        "y": ([int(rng.integers(0, 2))], "int")}) for _ in range(7)]
    got = decode_batch(recs, spec)
    for k in spec:
        want = np.stack([decode_example(r, spec)[k] for r in recs])
        assert got[k].dtype == want.dtype and np.array_equal(got[k], want)
    with pytest.raises(Exception, match="feature 'ids' has 129 values, expected 130"):
        decode_batch(recs[:1] + [_serialize({"ids": (np.zeros(129, int), "int"), "w": (np.zeros(3), "float"),
                                            "y": ([0], "int")})], spec)


@pytest.mark.parametrize("kind", ["missing", "folder", "binary", "latin1", "empty"])
def test_bad_input_text_is_one_clear_error_and_writes_nothing(tmp_path, kind):
    src = tmp_path / "in.txt"
    if kind == "folder":
        src.mkdir()
    elif kind == "binary":
        src.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)) * 4)
    elif kind == "latin1":
        src.write_bytes("Un café au lait.\nDeuxième phrase.\n".encode("latin-1"))
    elif kind == "empty":
        src.write_text("\n\n  \n")
    expect = {"missing": r"in.txt does not exist: check the path",
              "folder": r"input folder \S*in.txt holds no files",
              "binary": r"in.txt looks binary \(a NUL byte at offset 7\)",
              "latin1": r"in.txt is not UTF-8 \(byte 0xe9 at line 1\): convert it, e.g. iconv -f latin1",
              "empty": r"hold no documents"}[kind]
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=expect):
        prepare_bert([src], out, vocab_size=100, num_shards=1, settings=SMALL, log=lambda *_: None)
    assert not out.exists()
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", str(src), "--output",
                        str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert re.search(expect, p.stderr) and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists()


def test_accented_utf8_text_keeps_its_accents_when_cased(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Un café au lait.\nDeuxième phrase ici.\n\nÉté à Paris.\nNaïve façade.\n",
                   encoding="utf-8")
    assert read_documents([src]) == [["Un café au lait.", "Deuxième phrase ici."],
                                     ["Été à Paris.", "Naïve façade."]]


def test_glue_tasks_in_their_published_layouts(prepared, tmp_path):
    """CoLA without a header (sentence in column 4), MRPC's pair columns, MNLI's matched dev
    file with gold_label last; labels in the task's order whatever the file holds."""
    from hvd_bert.data.kinds import classification_spec

    folder, _ = prepared
    vocab = folder / "vocab.txt"
    (tmp_path / "cola").mkdir()
    (tmp_path / "cola" / "dev.tsv").write_text('gj04\t1\t\tThe file is "read".\n'
                                               'gj04\t0\t*\tfile the read is.\n')
    meta = prepare_classification(tmp_path / "cola" / "dev.tsv", tmp_path / "c", vocab, task="cola",
                                  max_seq_length=16, num_shards=1)
    assert meta["labels"] == ["0", "1"] and meta["task"] == "cola" and meta["total_records"] == 2
    exs = [decode_example(r, classification_spec(16))
           for _, r in iter_records(tmp_path / "c" / meta["shards"][0]["file"])]
    assert [int(e["label_ids"][0]) for e in exs] == [1, 0] and all(e["segment_ids"].max() == 0 for e in exs)
    mrpc = tmp_path / "msr.tsv"
    mrpc.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tthe file is read\tit is read\n")
    meta = prepare_classification(mrpc, tmp_path / "m", vocab, task="mrpc", max_seq_length=16, num_shards=1)
    exs = [decode_example(r, classification_spec(16))
           for _, r in iter_records(tmp_path / "m" / meta["shards"][0]["file"])]
    assert exs[0]["segment_ids"].max() == 1 and meta["text_b"] == "text_b"
    mnli = tmp_path / "dev_matched.tsv"
    cols = ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p", "sentence1", "sentence2",
            "label1", "gold_label"]
    mnli.write_text("\t".join(cols) + "\n" + "\t".join(["0", "1", "2", "g", "(", "(", "(", "(", "a file",
                                                         "a name", "neutral", "neutral"]) + "\n")
    meta = prepare_classification(mnli, tmp_path / "n", vocab, task="mnli", max_seq_length=16, num_shards=1)
    assert meta["labels"] == ["contradiction", "entailment", "neutral"]
    exs = [decode_example(r, classification_spec(16))
           for _, r in iter_records(tmp_path / "n" / meta["shards"][0]["file"])]
    assert int(exs[0]["label_ids"][0]) == 2
    stsb = tmp_path / "sts.tsv"
    stsb.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
                    "0\tmain\tf\t2012\t1\tnone\tnone\tthe file\tthe name\t3.800\n")
    meta = prepare_classification(stsb, tmp_path / "s", vocab, task="stsb", max_seq_length=16, num_shards=1)
    assert meta["regression"] and meta["labels"] == []
    exs = [decode_example(r, classification_spec(16, regression=True))
           for _, r in iter_records(tmp_path / "s" / meta["shards"][0]["file"])]
    assert exs[0]["label_values"][0] == pytest.approx(3.8) and "label_ids" not in exs[0]
    with pytest.raises(DatasetError, match="a stsb score is not a number"):
        prepare_classification(mnli, tmp_path / "s2", vocab, task="stsb")
    table = tmp_path / "scores.csv"
    table.write_text("text,score\nthe file,1.5\nthe name,high\n")
    with pytest.raises(DatasetError, match="example 2 has the label 'high', not a number"):
        prepare_classification(table, tmp_path / "s3", vocab, text_a="text", label="score", regression=True)
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()
    with pytest.raises(DatasetError, match=r"line 2 has 5 columns; the mnli layout needs 10"):
        prepare_classification(mrpc, tmp_path / "x", vocab, task="mnli")
    assert not (tmp_path / "x").exists()


def test_evaluation_reports_the_tasks_metric_from_summed_confusion_counts():
    import numpy as np
    from sklearn.metrics import f1_score, matthews_corrcoef

    from hvd_bert.evaluation.finetune import evaluate_classification

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(50, 2))
    labels = rng.integers(0, 2, 50)
    batches = [{"label_ids": labels[i:i + 8], "logits": logits[i:i + 8]} for i in range(0, 50, 8)]
    pred = logits.argmax(axis=1)
    res = evaluate_classification(lambda b: b["logits"], iter(batches), lambda t: t, 2, "cola")
    assert res["eval_mcc"] == pytest.approx(matthews_corrcoef(labels, pred)) and res["eval_examples"] == 50
    assert res["eval_accuracy"] == pytest.approx((pred == labels).mean())
    res = evaluate_classification(lambda b: b["logits"], iter(batches), lambda t: t, 2, "mrpc")
    assert res["eval_f1"] == pytest.approx(f1_score(labels, pred)) and "eval_mcc" not in res
    # a rank without batches still joins the allreduce with zeros of the right size
    sent = []
    res = evaluate_classification(lambda b: b["logits"], iter([]), lambda t: sent.append(t) or t, 3, "mnli")
    assert sent[0].shape == (2 + 9,) and res["eval_examples"] == 0


def test_held_out_pretraining_evaluation_by_hand():
    import numpy as np

    from hvd_bert.evaluation.pretraining import evaluate_pretraining

    rng = np.random.default_rng(0)
    B, P, V = 5, 3, 7
    mlm, nsp = rng.normal(size=(B, P, V)), rng.normal(size=(B, 2))
    ids, w = rng.integers(0, V, (B, P)), (rng.random((B, P)) < 0.7).astype(np.float32)
    labels = rng.integers(0, 2, (B, 1))
    batches = [{"masked_lm_ids": ids[i:i + 2], "masked_lm_weights": w[i:i + 2],
                "next_sentence_labels": labels[i:i + 2], "i": np.arange(i, min(i + 2, B))}
               for i in range(0, B, 2)]
    res = evaluate_pretraining(lambda b: (mlm[b["i"]], nsp[b["i"]]), iter(batches), lambda s: s)
    logp = mlm - np.log(np.exp(mlm).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, ids[..., None], -1)[..., 0]
    assert res["eval_mlm_loss"] == pytest.approx((nll * w).sum() / w.sum())
    assert res["eval_mlm_accuracy"] == pytest.approx(((mlm.argmax(-1) == ids) * w).sum() / w.sum())
    assert res["eval_nsp_accuracy"] == pytest.approx((nsp.argmax(-1) == labels[:, 0]).mean())
    assert res["eval_examples"] == B


def test_a_trained_vocab_is_named_for_reuse_and_reusing_it_gives_the_same_shards(tmp_path):
    """A vocab trained by tokenizers is not bit-reproducible (tokenizers#1794: frequency ties fall
    in hash order); prepare-bert says so and names the vocab to pass, and with it the shards are
    bit-identical from run to run."""
    import hashlib

    from hvd_bert.data.corpus import write_stdlib_corpus
    text = write_stdlib_corpus(tmp_path / "c.txt", max_bytes=30_000)

    def prepare(out, *extra):
        p = subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", str(text),
                            "--output", str(out), "--num-shards", "2", "--max-seq-length", "32",
                            "--max-predictions-per-seq", "5", *extra],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout, {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(out.iterdir())}

    said, first = prepare(tmp_path / "a", "--vocab-size", "400")
    assert f"pass --vocab {tmp_path / 'a' / 'vocab.txt'}" in said
    again, second = prepare(tmp_path / "b", "--vocab", str(tmp_path / "a" / "vocab.txt"))
    assert "not bit-reproducible" not in again
    _, third = prepare(tmp_path / "c", "--vocab", str(tmp_path / "a" / "vocab.txt"))
    shards = [n for n in first if n.endswith(".tfrecord")]
    assert len(shards) == 2 and all(first[n] == second[n] == third[n] for n in [*shards, "vocab.txt"])
