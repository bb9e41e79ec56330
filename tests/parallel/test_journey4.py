"""The user's journey, round 4, through the command line: the batch arithmetic derives what the
user did not give, settings are found from --help and a misspelt key, parallel data preparation
runs under the toolkit's launcher with one tag per line, and sizes read in their unit."""

import json
import re

from one_process import hvd, pretrain
from test_adversarial_round3 import digests


def test_the_global_batch_alone_is_reached_on_two_ranks(bert_data, tmp_path):
    """``global_batch_size=32`` on 2 ranks: 16 a rank, one micro-batch, from the start (no
    refusal about 32 x 2 ranks)."""
    res = hvd("pretrain", "-np", "2", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
              "--set", "max_predictions_per_seq=10", "--set", "progress=false", "--set",
              "train.batch.global_batch_size=32", "--set", "train.schedule.total_steps=1", "--set",
              f"train.output_dir={tmp_path / 'r'}", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    line = next(x for x in res.stdout.splitlines() if "global batch" in x)
    assert "16" in line and "32" in line, line
    assert not re.search(r"\b0\.000 GiB", res.stdout), res.stdout


def test_a_setting_in_another_section_is_suggested(tmp_path):
    res = hvd("pretrain", "--set", "train.lr=1e-3", timeout=60)
    assert res.returncode == 2 and "did you mean 'train.optim.lr'?" in res.stderr, res.stderr
    res = hvd("pretrain", "--help", timeout=60)
    assert "hvd-bert config --job pretrain --explain" in " ".join(res.stdout.split())


def test_parallel_data_preparation_under_the_launcher(bert_data, tmp_path):
    """``hvd-bert launch -np 2 -- prepare-bert``: mpirun (as root too), each rank's line tagged
    once, the same shards as one process writes; --gloo is refused in one line."""
    vocab = bert_data / "vocab.txt"
    text = tmp_path / "in.txt"
    from hvd_bert.data.corpus import stdlib_documents
    docs = stdlib_documents(max_bytes=60_000)
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    before = digests(text, vocab)
    res = hvd("launch", "-np", "2", "--", "prepare-bert", "--input", text, "--vocab", vocab, "--output",
              tmp_path / "two", "--num-shards", "4", "--max-seq-length", "64", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert not re.search(r"\[\d\] \[rank \d\]", res.stdout + res.stderr), res.stdout
    one = hvd("prepare-bert", "--input", text, "--vocab", vocab, "--output", tmp_path / "one",
              "--num-shards", "4", "--max-seq-length", "64", timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two_meta = json.loads((tmp_path / "two" / "dataset.json").read_text())
    one_meta = json.loads((tmp_path / "one" / "dataset.json").read_text())
    assert two_meta["total_records"] == one_meta["total_records"]
    for shard in one_meta["shards"]:
        name = shard["file"]
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    res = hvd("launch", "-np", "2", "--gloo", "--", "prepare-bert", "--output", tmp_path / "g", timeout=120)
    assert res.returncode == 2 and "runs under mpirun" in res.stderr and not (tmp_path / "g").exists()
    assert digests(text, vocab) == before


def test_a_stop_names_only_logs_that_exist(bert_data, tmp_path):
    """A finished run names its metrics and TensorBoard logs; the line never names a folder that
    is not there."""
    res = pretrain(bert_data, tmp_path / "r")
    assert res.returncode == 0, res.stderr[-2000:]
    last = [x for x in res.stdout.splitlines() if x.startswith("finished step")][-1]
    for path in re.findall(r"(?:metrics: |--logdir )([^\s;]+)", last):
        assert (tmp_path / "r").joinpath(path.rsplit("/", 1)[-1]).exists(), last
    peak = [i for i, x in enumerate(res.stdout.splitlines()) if x.startswith("peak memory of rank 0")]
    assert "eval " not in res.stdout.splitlines()[peak[-1]], res.stdout  # (no evaluation ran: no eval phase)
    done = [i for i, x in enumerate(res.stdout.splitlines()) if x.startswith("finished step")]
    assert peak and done and peak[-1] < done[-1], res.stdout[-2000:]


def test_a_progress_bar_under_the_launcher_shows_its_last_frame(tmp_path):
    """A rank's bar that redraws itself with \\r and \\b (Keras' Progbar off a terminal) comes out
    as one line per bar, its last frame, tagged with the rank."""
    script = tmp_path / "bar.py"
    script.write_text("import sys\nfor i in range(1, 5):\n"
                      "    sys.stdout.write('\\b' * 20 + '\\r' + f'{i}/4 [' + '=' * i + ']')\n"
                      "    sys.stdout.flush()\nsys.stdout.write(' - done\\n')\n")
    res = hvd("launch", "-np", "2", "--", "python", script, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [x for x in res.stdout.splitlines() if "/4 [" in x]
    assert sorted(lines) == ["[0] 4/4 [====] - done", "[1] 4/4 [====] - done"], res.stdout


def test_predict_scores_an_input_that_has_labels(finished_run, tmp_path):
    """A table with a label column, or a prepared set with labels: the predictions are written and
    scored as the fine-tuning evaluation scores them (accuracy and F1 for two labels), equal to
    scikit-learn's on the written predictions; a label the model lacks, asked for with --label,
    is one line."""
    from sklearn.metrics import accuracy_score, f1_score

    from test_adversarial_round3 import classifier

    model = classifier(finished_run, tmp_path / "clf")
    rows = [("a good film", "pos"), ("bad and dull", "neg"), ("fine work", "pos"), ("awful", "neg"),
            ("great fun", "pos"), ("boring", "neg")]
    table = tmp_path / "in.tsv"
    table.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    res = hvd("predict", model, table, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    preds = [json.loads(x)["label"] for x in (tmp_path / "in.tsv.predictions.jsonl").read_text().splitlines()]
    gold = [y for _, y in rows]
    line = next(x for x in res.stdout.splitlines() if x.startswith("scored against the input's labels"))
    got = dict(re.findall(r"(eval_\w+) ([\d.]+)", line))
    assert float(got["eval_accuracy"]) == round(accuracy_score(gold, preds), 4), line
    assert float(got["eval_f1"]) == round(f1_score(gold, preds, pos_label="pos", zero_division=0), 4), line
    # the same table prepared (the set finetune's eval_data reads): scored alike, from its records
    assert hvd("prepare-classification", table, "--output", tmp_path / "dev", "--vocab", model, "--text-a",
               "sentence", "--label", "label", "--labels", "neg", "pos").returncode == 0
    res = hvd("predict", model, tmp_path / "dev", "--output", tmp_path / "dev.jsonl", timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert next(x for x in res.stdout.splitlines() if x.startswith("scored against")) == line, res.stdout
    table.write_text("sentence\tgrade\nnice\tA\n")
    res = hvd("predict", model, table, "--label", "grade", "--output", tmp_path / "g.jsonl", timeout=240)
    assert res.returncode == 2 and "not among the model's ['neg', 'pos']" in res.stderr, res.stderr
    assert not (tmp_path / "g.jsonl").exists()


def test_ncf_evaluates_a_trained_model_and_recommends(tmp_path):
    """``ncf --set do_train=false``: init_checkpoint's HR@K over all users on 2 ranks, on the data
    its run trained on unless data is given, equals the one its run recorded for its best model,
    and recommend= writes each listed user's top_k unrated items (the ratings file's own ids),
    best first; an unknown user is one line."""
    import numpy as np

    data, run = tmp_path / "data", tmp_path / "run"
    assert hvd("prepare-ncf", "--synthetic", "ml-1m", "--scale", "0.03", "--output", data).returncode == 0
    res = hvd("ncf", "--set", f"data={data}", "--set", "epochs=1", "--set",
              "train.batch.local_batch_size=4096", "--set", f"train.output_dir={run}", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "steps an epoch is few" in res.stdout and "train.batch.local_batch_size=" in res.stdout, res.stdout
    best = json.loads((run / "best.json").read_text())
    z = np.load(data / "ncf.npz")
    users = [int(z["user_ids"][u]) for u in (0, 3, 7)]
    (tmp_path / "users.txt").write_text("".join(f"{u}\n" for u in users))
    # (no data given: the evaluation takes the data its run trained on, from the run's config.json)
    res = hvd("ncf", "-np", "2", "--set", "do_train=false", "--set",
              f"init_checkpoint={run}", "--set", f"recommend={tmp_path / 'users.txt'}", timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"on {data}" in res.stdout, res.stdout
    hr = float(re.search(r"HR@10 ([\d.]+)", res.stdout).group(1))
    assert hr == round(best["score"], 4), (res.stdout, best)
    rows = [json.loads(x) for x in (tmp_path / "users.txt.recommendations.jsonl").read_text().splitlines()]
    assert [r["user"] for r in rows] == users
    item_of = {int(raw): i for i, raw in enumerate(z["item_ids"])}
    for r, u in zip(rows, (0, 3, 7)):
        rated = set(z["train_items"][z["train_users"] == u].tolist()) | {int(z["test_items"][u])}
        assert len(r["items"]) == 10 and not {item_of[i] for i in r["items"]} & rated, r
        assert r["scores"] == sorted(r["scores"], reverse=True), r
    (tmp_path / "users.txt").write_text("999999\n")
    res = hvd("ncf", "--set", f"data={data}", "--set", "do_train=false", "--set", f"init_checkpoint={run}",
              "--set", f"recommend={tmp_path / 'users.txt'}", timeout=300)
    assert res.returncode == 2 and "the user '999999' is not in" in res.stderr, res.stderr[-2000:]
