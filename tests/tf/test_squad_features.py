"""SQuAD feature conversion against Google's own (bert-tensorflow's run_squad.py and
FullTokenizer, in tests/squad_oracle.py): the same features, field by field, for v1.1 and
v2.0, training and prediction, lower-cased and cased, on a generated file with accents,
punctuation inside words, odd whitespace, long contexts (several windows), long questions and
an answer that cannot be recovered; the gold answer comes back from its token span; 2 processes
under mpirun write the same bytes as 1."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_bert.cluster import launch
from hvd_bert.data.vocab import train_vocab
from hvd_bert.data.records import decode_example, iter_records
from hvd_bert.data.squad import prepare_squad

ORACLE = Path(__file__).parents[1] / "squad_oracle.py"
FILLER = ("the river flows through an old city where people gather near a bridge and a market to trade "
          "goods while merchants talk about weather prices ships and distant lands").split()


def _qa(qid, context, question, answer=None, occurrence=0, impossible=False):
    if impossible:
        return {"id": qid, "question": question, "answers": [], "is_impossible": True,
                "plausible_answers": [{"text": "x", "answer_start": 0}]}
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": start}],
            "is_impossible": False}


def squad_file(path: Path, version: str) -> Path:
    rng = random.Random(7)
    paragraphs = []
    c1 = "The leader was John Smith (1895-1943). He lived in Zürich,\ta café-filled city\u202fby the lake."
    paragraphs.append({"context": c1, "qas": [
        _qa("p1", c1, "What year was John Smith born?", "1895"),
        _qa("p2", c1, "Where did he live?", "Zürich"),
        _qa("p3", c1, "What kind of city?", "café-filled city"),
        {"id": "p4", "question": "Misplaced?",
         "answers": [{"text": "lake", "answer_start": c1.index("leader")}],
         "is_impossible": False},
    ]})  # the answer is not at its offset: training skips it, as Google's does
    c2 = "The Japanese electronics industry is the largest in the world.  Naïve résumé writers rejoice!"
    paragraphs.append({"context": c2, "qas": [
        _qa("j1", c2, "Which country exports electronics?", "Japan"),
        _qa("j2", c2, " ".join(FILLER[:20]) + " what do writers write?", "résumé")]})  # long question
    words = [rng.choice(FILLER) for _ in range(150)]
    words[10], words[75], words[140] = "Alpha", "Beta-gamma,", "Omega."
    c3 = " ".join(words)
    qas = [_qa("l1", c3, "first?", "Alpha"), _qa("l2", c3, "middle?", "gamma"),
           _qa("l3", c3, "last?", "Omega")]
    if version == "v2.0":
        qas.append(_qa("n1", c3, "Is there an answer?", impossible=True))
        paragraphs[0]["qas"].append(_qa("n2", c1, "Who won?", impossible=True))
    paragraphs.append({"context": c3, "qas": qas})
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("squadvocab")
    text = root / "text.txt"
    text.write_text("\n".join(FILLER) + "\nThe leader John Smith 1895 1943 Zürich café filled city lake "
                    "Japanese electronics industry largest world Naïve résumé writers rejoice Alpha Beta "
                    "gamma Omega\n")
    return {"lower": train_vocab([text], root / "lower", 400, True),
            "cased": train_vocab([text], root / "cased", 400, False)}


def oracle(squad, vocab, lower, v2, train, seq, stride, query, tmp_path, pred_dir=None):
    out = tmp_path / f"oracle-{lower}{v2}{train}.json"
    p = subprocess.run([sys.executable, str(ORACLE), str(squad), str(vocab), str(int(lower)), str(int(v2)),
                        str(int(train)), str(seq), str(stride), str(query), str(out),
                        *([str(pred_dir)] if pred_dir else [])],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def ours(folder: Path, train: bool, seq: int):
    meta = json.loads((folder / "dataset.json").read_text())
    spec = {"unique_ids": ("int", 1), "input_ids": ("int", seq), "input_mask": ("int", seq),
            "segment_ids": ("int", seq)}
    if train:
        spec.update(start_positions=("int", 1), end_positions=("int", 1), is_impossible=("int", 1))
    recs = {}
    for shard in meta["shards"]:
        for _, r in iter_records(folder / shard["file"]):
            e = decode_example(r, spec)
            recs[int(e["unique_ids"][0])] = e
    side = [json.loads(line) for line in (folder / "features.jsonl").read_text().splitlines()]
    return meta, recs, side


@pytest.mark.parametrize("version,train,lower", [("1.1", True, True), ("v2.0", True, True),
                                                 ("v2.0", False, True), ("1.1", True, False)])
def test_features_equal_googles_run_squad(tmp_path, vocab, version, train, lower):
    v2 = version == "v2.0"
    squad = squad_file(tmp_path / "squad.json", version)
    seq, stride, query = 64, 16, 12
    want = oracle(squad, vocab["lower" if lower else "cased"], lower, v2, train, seq, stride, query, tmp_path)
    meta = prepare_squad(squad, tmp_path / "out", vocab["lower" if lower else "cased"], do_lower_case=lower,
                         version_2=v2, is_training=train, max_seq_length=seq, doc_stride=stride,
                         max_query_length=query, num_shards=3, log=lambda *_: None)
    _, recs, side = ours(tmp_path / "out", train, seq)
    assert meta["examples"] == len(want["examples"]) and meta["skipped_examples"] == (1 if train else 0)
    assert len(side) == len(want["features"]) == meta["total_records"] > meta["examples"]  # several windows
    for mine, theirs in zip(side, want["features"]):
        rec = recs[mine["unique_id"]]
        assert mine["unique_id"] == theirs["unique_id"]
        for k in ("example_index", "doc_span_index", "tokens", "token_to_orig_map", "token_is_max_context"):
            assert mine[k] == theirs[k], (k, mine["unique_id"])
        for k in ("input_ids", "input_mask", "segment_ids"):
            assert rec[k].tolist() == theirs[k], (k, mine["unique_id"])
        if train:
            assert int(rec["start_positions"][0]) == theirs["start_position"]
            assert int(rec["end_positions"][0]) == theirs["end_position"]
            assert bool(rec["is_impossible"][0]) == theirs["is_impossible"]


def test_the_gold_answer_comes_back_from_its_token_span(tmp_path, vocab):
    from hvd_bert.data.vocab import load_tokenizer

    squad = squad_file(tmp_path / "squad.json", "v2.0")
    prepare_squad(squad, tmp_path / "out", vocab["lower"], version_2=True, max_seq_length=64, doc_stride=16,
                  max_query_length=12, num_shards=2, log=lambda *_: None)
    _, recs, side = ours(tmp_path / "out", True, 64)
    examples = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    tok = load_tokenizer(vocab["lower"])

    def detok(tokens):
        return " ".join(tokens).replace(" ##", "")

    found = set()
    for f in side:
        rec, ex = recs[f["unique_id"]], examples[f["example_index"]]
        s, e = int(rec["start_positions"][0]), int(rec["end_positions"][0])
        if not ex["answers"]:
            assert s == e == 0 and rec["is_impossible"][0] == 1
            continue
        if s == 0:
            continue  # this window misses the answer
        got, answer = detok(f["tokens"][s:e + 1]), ex["answers"][0]
        want = detok(tok.encode(answer, add_special_tokens=False).tokens)
        assert got == want or (answer == "Japan" and got == "japanese"), (ex["qas_id"], got, want)
        found.add(ex["qas_id"])
    assert found == {"p1", "p2", "p3", "j1", "j2", "l1", "l2", "l3"}  # p4 was skipped


def test_two_processes_write_the_same_bytes_as_one(tmp_path, vocab):
    squad = squad_file(tmp_path / "squad.json", "v2.0")
    args = ["-m", "hvd_bert", "prepare-squad", "--input", str(squad), "--vocab", str(vocab["lower"]),
            "--version-2-with-negative", "--max-seq-length", "64", "--doc-stride", "16",
            "--max-query-length", "12",
            "--num-shards", "3"]
    one = subprocess.run([sys.executable, *args, "--output", str(tmp_path / "one")], capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    two = subprocess.run(launch.command([*args, "--output", str(tmp_path / "two")], np=2, launcher="mpi"),
                         capture_output=True, text=True, timeout=300, env=launch.mpi_env())
    assert two.returncode == 0 and "2 process(es)" in two.stdout, two.stdout + two.stderr
    for f in sorted(os.listdir(tmp_path / "one")):
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "1.1", "data": [{"paragraphs": [{"context": "a b", "qas": [
        {"id": "q", "question": "?",
         "answers": [{"text": "a", "answer_start": 0}, {"text": "b", "answer_start": 2}]}
    ]}]}]}))
    p = subprocess.run(launch.command(["-m", "hvd_bert", "prepare-squad", "--input", str(bad), "--vocab",
                                       str(vocab["lower"]), "--output", str(tmp_path / "x")],
                                      np=2, launcher="mpi"),
                       capture_output=True, text=True, timeout=300, env=launch.mpi_env())
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("question q has 2 answers; for training each has exactly 1") == 2
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("version,lower", [("1.1", True), ("v2.0", True), ("v2.0", False)])
def test_predictions_equal_googles_write_predictions_from_the_same_logits(tmp_path, vocab, version, lower):
    """n-best, max_answer_length 30, the text projected back onto the context's words (accents,
    punctuation), v2.0's null score and threshold: the same files as Google's."""
    from hvd_bert.evaluation.squad_predictions import predictions, write_predictions

    v2 = version == "v2.0"
    squad = squad_file(tmp_path / "squad.json", version)
    v = vocab["lower" if lower else "cased"]
    want = oracle(squad, v, lower, v2, False, 64, 16, 12, tmp_path, tmp_path / "google")
    prepare_squad(squad, tmp_path / "out", v, do_lower_case=lower, version_2=v2, is_training=False,
                  max_seq_length=64, doc_stride=16, max_query_length=12, num_shards=2, log=lambda *_: None)
    examples = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    features = [json.loads(line) for line in (tmp_path / "out" / "features.jsonl").read_text().splitlines()]
    results = {int(k): tuple(v) for k, v in want["logits"].items()}
    assert sorted(results) == [f["unique_id"] for f in features]
    preds, nbest, odds = predictions(examples, features, results, do_lower_case=lower, version_2=v2)
    written = write_predictions(tmp_path / "ours", preds, nbest, odds if v2 else None)
    assert [p.name for p in written] == (["predictions.json", "nbest_predictions.json"] +
                                         (["null_odds.json"] if v2 else []))
    for p in written:
        assert p.read_text() == (tmp_path / "google" / p.name).read_text(), p.name
    assert any(t and t not in ("empty",) for t in preds.values())  # real spans, not only fallbacks
    assert any(any(c in t for c in "éü(-,") for n in nbest.values() for t in (e["text"] for e in n))
