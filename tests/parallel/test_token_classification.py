"""Token classification (NER), the fourth standard BERT fine-tuning task, through the command
line on CoNLL-2003's published layout (``ner_task`` writes an easy generated set):
``prepare-token-classification``, ``finetune`` on 2 ranks in both frameworks (entity F1 as
seqeval computes it), ``predict`` (a tag a word; scored when the file has tags), and the
export to ``transformers.BertForTokenClassification``, whose ``token-classification`` pipeline
finds the entities ``hvd-bert predict`` tagged. Bad CoNLL input is one line, status 2."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bert_jobs import metrics_of
from seqeval.metrics import f1_score

from hvd_bert.cluster import launch
from hvd_bert.evaluation.token_classification import entities

sys.path.insert(0, str(Path(__file__).parents[1]))
import ner_task  # noqa: E402

HVD_BERT = [sys.executable, "-m", "hvd_bert"]
VOCAB = Path(__file__).parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"


def cli(*argv, timeout=300):
    return subprocess.run([*HVD_BERT, *map(str, argv)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
    root = tmp_path_factory.mktemp("ner")
    train, dev = ner_task.write(root / "train.txt", 400, 0), ner_task.write(root / "dev.txt", 60, 1)
    for src, out, extra in ((train, "train", []), (dev, "dev", ["--labels", *ner_task.LABELS])):
        res = cli("prepare-token-classification", src, "--output", root / out, "--vocab", VOCAB,
                  "--max-seq-length", "32", *extra)
        assert res.returncode == 0 and "sentences" in res.stdout, res.stderr
    return root


@pytest.fixture(scope="module")
def tuned(ner):
    """A PyTorch model fine-tuned on 2 ranks (shared by the predict and export tests)."""
    return finetune("pt", ner, ner / "run-pt")


def finetune(framework, ner, out):
    res = launch.run(["-m", "hvd_bert", "finetune", "--framework", framework,
                      "--set", f"data={ner / 'train'}", "--set", f"eval_data={ner / 'dev'}",
                      "--set", f"train.output_dir={out}",
                      "--set", "progress=false", "--set", "train.optim.lr=2e-3", "--set", "epochs=20",
                      "--set", "train.batch.local_batch_size=16", "--set", "eval_batch_size=7"],
                     np=2, timeout=600)
    assert res.ok, res.explain()
    assert "token classifier" in res.stdout and "400 sentences" in res.stdout, res.stdout[-2000:]
    return out


def test_prepare_keeps_every_word_and_cuts_long_sentences_at_word_boundaries(ner, tmp_path):
    meta = json.loads((ner / "train" / "dataset.json").read_text())
    assert meta["kind"] == "bert-token-classification" and meta["labels"] == ner_task.LABELS
    words = sum(len(w) for w, _ in ner_task.sentences(400, 0))
    assert meta["words"] == words and meta["sentences"] == 400 == meta["total_records"]
    long = tmp_path / "long.txt"
    long.write_text("".join(f"{w} O\n" for w in ["the"] * 70) + "\npath B-PER\n")
    res = cli("prepare-token-classification", long, "--output", tmp_path / "long", "--vocab", VOCAB,
              "--max-seq-length", "32")
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "long" / "dataset.json").read_text())
    assert meta["sentences"] == 2 and meta["total_records"] == 4 and meta["words"] == 71  # 30 + 30 + 10, 1


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_finetuning_finds_the_entities_and_reports_seqevals_f1(framework, ner, tuned, tmp_path):
    out = tuned if framework == "pt" else finetune("tf", ner, tmp_path / "run-tf")
    final = [m for m in metrics_of(out) if "eval_f1" in m][-1]
    assert final["eval_f1"] > 0.9 and final["eval_examples"] == 60, final
    best = json.loads((out / "best.json").read_text())
    assert best["metric"] == "eval_f1" and (out / "task.json").is_file()
    # the model's own tags of the dev file, scored by seqeval, give the run's F1
    pred = tmp_path / "dev.pred.txt"
    res = cli("predict", out, ner / "dev.txt", "--output", pred)  # (the best model: the final one here)
    assert res.returncode == 0 and "scored against the input's tags" in res.stdout, res.stderr
    blocks = [b.split("\n") for b in pred.read_text().strip().split("\n\n")]
    gold = [[line.split()[1] for line in b] for b in blocks]
    tags = [[line.split()[2] for line in b] for b in blocks]
    assert gold == [t for _, t in ner_task.sentences(60, 1)]
    assert f1_score(gold, tags) == pytest.approx(final["eval_f1"], abs=1e-9)
    assert f"f1 {final['eval_f1']:.4f}" in res.stdout


def test_predict_on_two_ranks_tags_every_word_as_one_rank_does(ner, tuned, tmp_path):
    words_only = tmp_path / "words.txt"
    words_only.write_text("".join("\n".join(words) + "\n\n" for words, _ in ner_task.sentences(9, 5)))
    before = hashlib.sha256(words_only.read_bytes()).hexdigest()
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    res = cli("predict", tuned, words_only, "--output", one)
    assert res.returncode == 0 and "scored" not in res.stdout, res.stderr
    res2 = launch.run(["-m", "hvd_bert", "predict", str(tuned), str(words_only), "--output", str(two)], np=2,
                      timeout=300)
    assert res2.ok, res2.explain()
    assert one.read_text() == two.read_text()
    res = cli("predict", tuned, ner / "dev", "--output", tmp_path / "x.jsonl")  # (a prepared folder)
    assert res.returncode == 2 and "is a prepared data folder; a token classification model tags words" \
        in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    rows = [json.loads(line) for line in one.read_text().splitlines()]
    assert [r["words"] for r in rows] == [w for w, _ in ner_task.sentences(9, 5)]
    assert all(len(r["tags"]) == len(r["words"]) for r in rows)
    assert hashlib.sha256(words_only.read_bytes()).hexdigest() == before


def test_the_export_is_a_transformers_token_classifier_that_finds_the_same_entities(ner, tuned, tmp_path):
    pytest.importorskip("transformers")
    from transformers import pipeline

    hf = tmp_path / "hf"
    res = cli("convert", tuned, "--to", "hf", "--output", hf)
    assert res.returncode == 0 and "BertForTokenClassification" in res.stdout, res.stderr
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert list(config["id2label"].values()) == ner_task.LABELS and (hf / "vocab.txt").is_file()
    pred = tmp_path / "dev.jsonl"
    assert cli("predict", tuned, ner / "dev.txt", "--output", pred).returncode == 0
    nlp = pipeline("token-classification", model=str(hf), aggregation_strategy="first", device="cpu")
    for row in map(json.loads, pred.read_text().splitlines()):
        ours = [(kind, " ".join(row["words"][a:b + 1])) for kind, a, b in entities(row["tags"])]
        theirs = [(e["entity_group"], e["word"]) for e in nlp(" ".join(row["words"]))]
        assert ours == theirs, row


@pytest.mark.parametrize("text, says", [
    ("path B-PER\nnodes\n", "line 2: 'nodes' has no tag"),
    ("path NNP PER\n", "the tag 'PER' is not O or B-/I-/E-/S-"),
    ("-DOCSTART- -X- O\n\n", "holds no sentences"),
])
def test_bad_conll_is_one_line_with_status_2_and_writes_nothing(text, says, tmp_path):
    src = tmp_path / "bad.txt"
    src.write_text(text)
    res = cli("prepare-token-classification", src, "--output", tmp_path / "out", "--vocab", VOCAB)
    assert res.returncode == 2 and says in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "out").exists()


def test_a_dev_set_with_a_tag_the_training_set_lacks_is_refused(ner, tmp_path):
    dev = tmp_path / "dev.txt"
    dev.write_text("path B-PER\nnodes B-GPE\n")
    res = cli("prepare-token-classification", dev, "--output", tmp_path / "out", "--vocab", VOCAB, "--labels",
              *ner_task.LABELS)
    assert res.returncode == 2 and "['B-GPE'] are not in the label list" in res.stderr, res.stderr
