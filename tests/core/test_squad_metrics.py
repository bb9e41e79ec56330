"""SQuAD's official metrics: hand-computed values, and transformers' port of the official v2.0
script (transformers.data.metrics.squad_metrics) as an oracle on random data."""

import json
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hvd_bert.evaluation import squad as M
from hvd_bert.data.records import DatasetError


def squad(version, questions):
    """A SQuAD file: questions = [(id, [gold texts])] in one paragraph."""
    qas = [{"id": qid, "question": "q?", "answers": [{"text": t, "answer_start": 0} for t in golds],
            **({"is_impossible": not golds} if version == "v2.0" else {})} for qid, golds in questions]
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def test_normalisation_and_f1_by_hand():
    assert M.normalize_answer("The  Cat, sat!\tOn a mat.") == "cat sat on mat"
    assert M.normalize_answer("An apple-pie") == "applepie"  # punctuation goes before the split
    # pred tokens cat sat on mat, gold cat on mat: precision 3/4, recall 1
    assert M.f1_v1("the cat sat on the mat", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    assert M.f1_v1("dog", "cat") == 0.0 and M.exact_v1("The Cat.", "cat")
    assert M.f1_v1("", "") == 0.0            # v1.1: nothing in common scores 0 even when both are empty
    assert M.compute_f1("", "") == 1.0       # v2.0: an empty gold (no answer) and an empty prediction
    assert M.compute_f1("", "a") == 1.0      # "a" normalises to nothing
    assert M.compute_f1("cat", "") == 0.0
    # gold "a b b c" loses the article: b b c against b b b, 2 in common: precision = recall = 2/3
    assert M.compute_f1("a b b c", "b b b") == pytest.approx(2 / 3)
    assert M.compute_f1("x b b c", "b b b") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))


def test_v11_by_hand_with_a_missing_prediction():
    data = squad("1.1", [("q1", ["Denver Broncos", "the Broncos"]), ("q2", ["1990"]),
                         ("q3", ["blue whale"]), ("q4", ["x"])])
    preds = {"q1": "Broncos", "q2": "in 1990", "q3": "blue whale"}
    warned = []
    res = M.evaluate(data, preds, warn=warned.append)
    # q1: EM with "the Broncos" (-> "broncos"), q2: F1 2*(1/2)*1/(1.5) = 2/3, q3: EM, q4: missing -> 0
    assert res == pytest.approx({"exact_match": 100 * 2 / 4, "f1": 100 * (1 + 2 / 3 + 1) / 4})
    assert warned == ["Unanswered question q4 will receive score 0."]


def test_v20_by_hand_with_no_answer_probabilities():
    data = squad("v2.0", [("a1", ["Paris"]), ("a2", ["in 1066"]), ("n1", []), ("n2", [])])
    preds = {"a1": "Paris", "a2": "1066 battle", "n1": "", "n2": "London"}
    res = M.evaluate(data, preds)
    # a1 1/1, a2 F1 gold [in, 1066] pred [1066, battle]: 1/2 and 1/2 -> 0.5, n1 1/1, n2 0/0
    assert res == pytest.approx({"exact": 50.0, "f1": 62.5, "total": 4, "HasAns_exact": 50.0,
                                 "HasAns_f1": 75.0, "HasAns_total": 2, "NoAns_exact": 50.0,
                                 "NoAns_f1": 50.0, "NoAns_total": 2})
    na = {"a1": 0.1, "a2": 0.6, "n1": 0.2, "n2": 0.9}
    res = M.evaluate(data, preds, na)
    # best threshold: start at 2 (no-answers right), in order a1 +1, n1 0, a2 +0/+0.5, n2 -1
    assert res["best_exact"] == pytest.approx(75.0) and res["best_exact_thresh"] == 0.1
    assert res["best_f1"] == pytest.approx(100 * 3.5 / 4) and res["best_f1_thresh"] == 0.6
    # with a threshold below n2's probability n2 counts as "no answer" and scores 1
    assert M.evaluate_v2(data["data"], preds, na, na_prob_thresh=0.5)["exact"] == pytest.approx(
        100 * (1 + 1 + 1 + 0) / 4)  # a2 (0.6) is declared unanswerable: 0; n2 right: 1


def test_v20_equals_the_official_script_port_in_transformers_on_random_data():
    from transformers.data.metrics import squad_metrics as T

    rng = random.Random(0)
    words = ["the", "a", "cat", "Dog", "sat,", "on", "mat.", "1990", "blue", "whale", "an", "x"]

    def text(n):
        return " ".join(rng.choice(words) for _ in range(n))

    for trial in range(20):
        questions = [(f"q{i}", [text(rng.randint(1, 4)) for _ in range(rng.choice([0, 1, 1, 3]))])
                     for i in range(30)]
        data = squad("v2.0", questions)
        preds = {qid: (text(rng.randint(0, 4)) if rng.random() < 0.8 else "") for qid, _ in questions}
        na = {qid: round(rng.random(), 2) for qid in preds}
        ours = M.evaluate(data, preds, na)
        examples = [SimpleNamespace(qas_id=qid, answers=[{"text": t} for t in golds])
                    for qid, golds in questions]
        theirs = dict(T.squad_evaluate(examples, preds, na))
        assert ours.keys() == theirs.keys(), trial
        for k in ours:
            assert ours[k] == pytest.approx(theirs[k]), (trial, k)
        for g, p in zip([t for _, gs in questions for t in gs], preds.values()):
            assert M.compute_f1(g, p) == pytest.approx(T.compute_f1(g, p))
            assert M.compute_exact(g, p) == T.compute_exact(g, p)


def test_cli_prints_as_the_official_scripts_and_refuses_bad_files(tmp_path):
    v1 = tmp_path / "dev-v1.1.json"
    v1.write_text(json.dumps(squad("1.1", [("q1", ["Paris"]), ("q2", ["London"])])))
    (tmp_path / "p.json").write_text(json.dumps({"q1": "paris", "q2": "Rome"}))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "hvd_bert", "evaluate-squad", *map(str, args)],
                              capture_output=True, text=True, timeout=60)

    p = cli(v1, tmp_path / "p.json")
    assert p.returncode == 0 and p.stdout.strip() == '{"exact_match": 50.0, "f1": 50.0}', p.stderr
    v2 = tmp_path / "dev-v2.0.json"
    v2.write_text(json.dumps(squad("v2.0", [("q1", ["Paris"]), ("q2", [])])))
    (tmp_path / "na.json").write_text(json.dumps({"q1": 0.1, "q2": 0.8}))
    p = cli(v2, tmp_path / "p.json", "--na-prob", tmp_path / "na.json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and p.stdout.startswith('{\n  "exact": 50.0,'), p.stdout
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                         "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh",
                         "best_f1", "best_f1_thresh"]
    assert out["best_exact"] == 100.0 and out["best_exact_thresh"] == 0.1
    (tmp_path / "bad.json").write_text("{not json")
    for args, msg in [((tmp_path / "none.json", tmp_path / "p.json"), "does not exist"),
                      ((v1, tmp_path / "bad.json"), "bad.json is not a JSON file"),
                      ((v1, tmp_path / "p.json", "--na-prob", tmp_path / "na.json"),
                       "--na-prob is for SQuAD v2.0")]:
        p = cli(*args)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    with pytest.raises(DatasetError, match="version is '3'"):
        M.evaluate({"version": "3", "data": []}, {})
