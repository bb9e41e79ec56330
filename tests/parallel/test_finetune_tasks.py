"""`hvd-bert finetune` on SQuAD (v1.1 and v2.0) and STS-B under real `horovodrun -np 2`: a tiny
BERT from scratch reaches a high official score on an easy generated task (``squad_task``) in
both frameworks; the predictions files are the official layout (``evaluate-squad`` scores them
the same); prediction scores every feature once, so 2 ranks give the predictions of 1; ``hvd-bert
predict`` answers a SQuAD file, your own questions and a prepared set as the run did."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bert_jobs import metrics_of

from hvd_bert.cluster import launch

sys.path.insert(0, str(Path(__file__).parents[1]))
import squad_task  # noqa: E402

HVD_BERT = [sys.executable, "-m", "hvd_bert"]
SHAPE = ["--max-seq-length", "64", "--doc-stride", "32", "--max-query-length", "16", "--num-shards", "2"]


def prepare_squad(src, out, vocab, *extra):
    res = subprocess.run([*HVD_BERT, "prepare-squad", "--input", str(src), "--output", str(out), "--vocab",
                          str(vocab), *SHAPE, *extra], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def squad(bert_data, tmp_path_factory):
    root, vocab = tmp_path_factory.mktemp("squad"), bert_data / "vocab.txt"
    sets = {}
    for v2 in (False, True):
        tag = "v2" if v2 else "v1"
        train = squad_task.write(root / f"train-{tag}.json", 500, 0, version_2=v2)
        dev = squad_task.write(root / f"dev-{tag}.json", 61, 1, version_2=v2)
        extra = ["--version-2-with-negative"] if v2 else []
        sets[tag] = {"train": prepare_squad(train, root / f"train-{tag}", vocab, *extra),
                     "dev": prepare_squad(dev, root / f"dev-{tag}", vocab, "--split", "dev", *extra),
                     "dev_json": dev}
    return sets


def finetune(framework, out, *sets, np=2):
    res = launch.run(["-m", "hvd_bert", "finetune", "--framework", framework,
                      "--set", f"train.output_dir={out}", "--set", "progress=false",
                      "--set", "train.optim.lr=1e-3", "--set", "train.batch.local_batch_size=16",
                      "--set", "eval_batch_size=9", *sets],
                     np=np, timeout=600)
    assert res.ok, res.explain()
    return [m for m in metrics_of(out) if "eval_f1" in m], res.stdout


def official(data_json, folder, *extra):
    res = subprocess.run([*HVD_BERT, "evaluate-squad", str(data_json), str(folder / "predictions.json"),
                          *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_squad_v1_reaches_a_high_official_score(framework, squad, tmp_path):
    s = squad["v1"]
    evals, stdout = finetune(framework, tmp_path / "run", "--task", "squad", "--set", f"data={s['train']}",
                             "--set", f"eval_data={s['dev']}", "--set", "epochs=2")
    assert "SQuAD span head" in stdout and "EM " in stdout
    assert evals[-1]["eval_examples"] == 61 and evals[-1]["eval_exact_match"] > 90, evals
    # the predictions file is the official layout: the official scores agree with the job's
    got = official(s["dev_json"], tmp_path / "run")
    assert got == pytest.approx({"exact_match": evals[-1]["eval_exact_match"], "f1": evals[-1]["eval_f1"]})
    nbest = json.loads((tmp_path / "run" / "nbest_predictions.json").read_text())
    assert len(nbest) == 61 and all(1 <= len(v) <= 20 for v in nbest.values())
    assert not (tmp_path / "run" / "null_odds.json").exists()
    if framework == "pt":  # prediction alone, from the fine-tuned run: 1 rank and 2 ranks agree
        preds = {}
        for np_ in (1, 2):
            evals1, out = finetune("pt", tmp_path / f"pred{np_}", "--set", "do_train=false", "--set",
                                   f"eval_data={s['dev']}", "--set", f"init_checkpoint={tmp_path / 'run'}",
                                   np=np_)
            assert f"predictions in {tmp_path / f'pred{np_}'}" in out
            assert evals1[-1]["eval_exact_match"] == evals[-1]["eval_exact_match"]
            preds[np_] = (tmp_path / f"pred{np_}" / "predictions.json").read_bytes()
        assert preds[1] == preds[2] == (tmp_path / "run" / "predictions.json").read_bytes()
        predict_answers_as_the_run(tmp_path / "run", s, evals[-1], tmp_path)


def predict(*args):
    return subprocess.run([*HVD_BERT, "predict", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def predict_answers_as_the_run(run, s, last_eval, tmp_path):
    """`hvd-bert predict` answers the SQuAD file, JSON lines of questions and contexts, and the
    prepared dev set as the fine-tuning run did, in both frameworks and on 2 ranks."""
    expected = json.loads((run / "predictions.json").read_text())
    res = predict(run, s["dev_json"], "--output", tmp_path / "p.json", "-np", "2")  # the official file
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p.json").read_bytes() == (run / "predictions.json").read_bytes()
    em, f1 = (last_eval["eval_exact_match"], last_eval["eval_f1"])  # the gold answers in the file, scored
    assert f"against the answers in {Path(s['dev_json']).name}: EM {em:.2f} F1 {f1:.2f}" in res.stdout
    data = json.loads(Path(s["dev_json"]).read_text())
    with open(tmp_path / "q.jsonl", "w") as f:  # your own questions: no ids, no answers
        questions = [(qa["id"], qa["question"], par["context"]) for art in data["data"]
                     for par in art["paragraphs"] for qa in par["qas"]][:7]
        f.writelines(json.dumps({"question": q, "context": c}) + "\n" for _, q, c in questions)
    res = predict(run / "best.npz", tmp_path / "q.jsonl", "--framework", "tf", "--output", tmp_path / "q.tsv")
    assert res.returncode == 0, res.stderr
    rows = [line.split("\t") for line in (tmp_path / "q.tsv").read_text().splitlines()]
    assert rows[0] == ["id", "answer", "probability"]
    assert [r[1] for r in rows[1:]] == [expected[q] for q, _, _ in questions]
    assert all(0 < float(r[2]) <= 1 for r in rows[1:])
    res = predict(run, s["dev"], "--output", tmp_path / "p.jsonl")
    assert res.returncode == 0, res.stderr
    got = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert {g["id"]: g["answer"] for g in got} == expected and len(got) == 61
    res = predict(run, s["train"], "--output", tmp_path / "t.json")
    assert res.returncode == 2 and "prepare-squad --split dev" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.json").exists()
    table = tmp_path / "reviews.tsv"  # (a classifier's input, given to a SQuAD model)
    table.write_text("sentence\tlabel\na fine film\t1\n")
    res = predict(run, table, "--output", tmp_path / "r.json")
    assert res.returncode == 2 and "a table of texts is for a classification model" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()


def test_squad_v2_predicts_no_answer_and_writes_null_odds(squad, tmp_path):
    s = squad["v2"]
    evals, stdout = finetune("pt", tmp_path / "run", "--set", f"data={s['train']}", "--set",
                             f"eval_data={s['dev']}", "--set", "epochs=3")
    last = evals[-1]
    assert last["eval_exact"] > 80 and last["eval_HasAns_exact"] > 70 and last["eval_NoAns_exact"] > 70, last
    odds = json.loads((tmp_path / "run" / "null_odds.json").read_text())
    assert len(odds) == 61
    got = official(s["dev_json"], tmp_path / "run", "--na-prob", str(tmp_path / "run" / "null_odds.json"))
    assert got["exact"] == pytest.approx(last["eval_exact"]) and got["f1"] == pytest.approx(last["eval_f1"])
    assert got["best_f1"] == pytest.approx(last["eval_best_f1"])
    # v2.0: each answer's null odds too
    res = predict(tmp_path / "run", s["dev_json"], "--output", tmp_path / "p.jsonl")
    assert res.returncode == 0, res.stderr
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines())}
    preds = json.loads((tmp_path / "run" / "predictions.json").read_text())
    assert {q: r["answer"] for q, r in rows.items()} == preds and "" in preds.values()
    # the same framework scores each feature with the same arithmetic whatever the batch (measured:
    # batch sizes 1 to 64 give identical odds), so the odds are the run's exactly
    assert {q: r["null_odds"] for q, r in rows.items()} == odds


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_stsb_regression_reports_pearson_and_spearman(framework, bert_data, tmp_path):
    for split, n, seed in (("train", 640, 0), ("dev", 101, 1)):
        squad_task.stsb_tsv(tmp_path / f"{split}.tsv", n, seed)
        subprocess.run([*HVD_BERT, "prepare-classification", str(tmp_path / f"{split}.tsv"), "--task", "stsb",
                        "--output", str(tmp_path / split), "--vocab", str(bert_data / "vocab.txt"),
                        "--max-seq-length", "32"], check=True, capture_output=True, timeout=120)
    res = launch.run(["-m", "hvd_bert", "finetune", "--framework", framework, "--task", "stsb",
                      "--set", f"data={tmp_path / 'train'}", "--set", f"eval_data={tmp_path / 'dev'}",
                      "--set", f"train.output_dir={tmp_path / 'run'}", "--set", "progress=false",
                      "--set", "epochs=6", "--set", "train.optim.lr=1e-3",
                      "--set", "train.batch.local_batch_size=16"], np=2, timeout=600)
    assert res.ok, res.explain()
    assert "regression head" in res.stdout and "Pearson" in res.stdout
    last = [m for m in metrics_of(tmp_path / "run") if "eval_pearson" in m][-1]
    assert last["eval_examples"] == 101  # 51 + 50 on the two ranks, each once
    assert last["eval_pearson"] > 0.8 and last["eval_spearman"] > 0.8, last
    # predict reads the run's task record (a regression's has no labels) and scores the prepared
    # dev set as the fine-tuning evaluation did
    res = subprocess.run([*HVD_BERT, "predict", str(tmp_path / "run"), str(tmp_path / "dev"), "--output",
                          str(tmp_path / "p.jsonl")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "eval_pearson" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


def test_the_task_must_match_the_data(squad, tmp_path):
    s = squad["v1"]
    res = subprocess.run([*HVD_BERT, "finetune", "--task", "mrpc", "--set", f"data={s['train']}",
                          "--set", f"train.output_dir={tmp_path / 'a'}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "task 'mrpc'" in res.stderr, res.stderr
    assert "holds squad data" in res.stderr
    res = subprocess.run([*HVD_BERT, "finetune", "--set", f"data={s['train']}",
                          "--set", f"eval_data={s['train']}", "--set", f"train.output_dir={tmp_path / 'b'}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "--split dev" in res.stderr, res.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
