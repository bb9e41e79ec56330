"""`hvd-bert finetune` under real `horovodrun -np 2`, in both frameworks, from a pretrained
checkpoint (PyTorch's own, and the same converted for TensorFlow): on a small generated
sentence task the evaluation accuracy beats chance clearly, and every evaluation example is
scored exactly once across the ranks."""

import json
import random
import subprocess
import sys

import pytest
from bert_jobs import metrics_of

from hvd_bert.cluster import launch

POSITIVE, NEGATIVE = ["true", "open", "start", "first"], ["false", "close", "end", "error"]
FILLER = [
    "the",
    "file",
    "list",
    "value",
    "name",
    "object",
    "function",
    "return",
    "string",
    "default",
    "data",
    "class",
    "method",
    "module",
    "path",
    "time",
    "type",
    "new",
    "read",
    "write",
]


def write_task(path, n, seed):
    rng = random.Random(seed)
    rows = ["sentence\tlabel"]
    for _ in range(n):
        label = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(5, 12))
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        rows.append(f"{' '.join(words)}\t{'yes' if label else 'no'}")
    path.write_text("\n".join(rows) + "\n")


def prepare(table, out, vocab):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hvd_bert",
            "prepare-classification",
            str(table),
            "--output",
            str(out),
            "--vocab",
            str(vocab),
            "--text-a",
            "sentence",
            "--label",
            "label",
            "--labels",
            "no",
            "yes",
            "--max-seq-length",
            "32",
            "--num-shards",
            "2",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


@pytest.fixture(scope="module")
def task(bert_data, phase_one, tmp_path_factory):
    """The sentence task, prepared with the phase-1 run's vocab; ``p1``: that run (conftest's
    ``phase_one``, shared with test_pretrain), ``p1.npz``: its conversion."""
    root = tmp_path_factory.mktemp("finetune")
    write_task(root / "train.tsv", 640, 0)
    write_task(root / "dev.tsv", 201, 1)  # odd: the ranks score 101 and 100
    for split in ("train", "dev"):  # the same rows in CoLA's published layout (no header, 0/1)
        rows = (root / f"{split}.tsv").read_text().splitlines()[1:]
        (root / "cola").mkdir(exist_ok=True)
        (root / "cola" / f"{split}.tsv").write_text("".join(
            f"src{n}\t{int(r.endswith('yes'))}\t\t{r.rsplit(chr(9), 1)[0]}\n" for n, r in enumerate(rows)))
        subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-classification",
                        str(root / "cola" / f"{split}.tsv"), "--task", "cola",
                        "--output", str(root / f"cola-{split}"), "--vocab", str(bert_data / "vocab.txt"),
                        "--max-seq-length", "32"],
                       check=True, capture_output=True, timeout=120)
    return dict(
        train=prepare(root / "train.tsv", root / "train", bert_data / "vocab.txt"),
        dev=prepare(root / "dev.tsv", root / "dev", bert_data / "vocab.txt"),
        cola={"train": root / "cola-train", "dev": root / "cola-dev"},
        root=root,
        p1=phase_one / "p1",
        p1npz=phase_one / "p1.npz",
    )


def finetune(framework, task, init, out, *extra, env=None):
    res = launch.run(
        [
            "-m",
            "hvd_bert",
            "finetune",
            "--framework",
            framework,
            "--set",
            f"data={task['train']}",
            "--set",
            f"eval_data={task['dev']}",
            "--set",
            f"init_checkpoint={init}",
            "--set",
            f"train.output_dir={out}",
            "--set",
            "progress=false",
            "--set",
            "epochs=4",
            "--set",
            "train.optim.lr=1e-3",
            "--set",
            "train.batch.local_batch_size=16",
            "--set",
            "eval_batch_size=32",
            *extra,
        ],
        np=2,
        timeout=600,
        env=env,
    )
    assert res.ok, res.explain()
    return metrics_of(out), res.stdout


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_finetuning_beats_chance_and_evaluates_every_example_once(framework, task, tmp_path):
    import os

    init = task["p1"] if framework == "pt" else task["p1npz"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # (PyTorch's run is also recorded in MLflow)
    mlflow = ("--set", "train.report_to=[tensorboard,mlflow]") if framework == "pt" else ()
    metrics, stdout = finetune(framework, task, init, tmp_path / "ft", "--set", "eval_every=20", *mlflow,
                               env=dict(os.environ, MLFLOW_TRACKING_URI=store))
    assert "4 epochs = 80 steps" in stdout  # 640 examples / (16 x 2 ranks) = 20 steps an epoch
    evals = [m for m in metrics if "eval_accuracy" in m]
    assert [m["step"] for m in evals] == [20, 40, 60, 80]
    assert all(m["eval_examples"] == 201 for m in evals)
    assert evals[-1]["eval_accuracy"] > 0.8, evals  # chance: about 0.5
    assert 0.7 < evals[-1]["eval_f1"] <= 1 and "eval_mcc" not in evals[-1]  # two labels: F1 of "yes"
    assert (tmp_path / "ft" / "ckpt-00000080.shards" / "index.json").is_file()  # (2 ranks: sharded)
    # config.json records the resolved config: the steps the epochs came to, not the default
    cfg = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert cfg["train"]["schedule"]["total_steps"] == 80 and cfg["framework"] == framework
    assert "F1 of 'yes'" in stdout  # the class the F1 is of
    best = json.loads((tmp_path / "ft" / "best.json").read_text())  # the best evaluation's weights, kept
    assert best["metric"] == "eval_accuracy" and best["score"] == max(m["eval_accuracy"] for m in evals)
    assert (tmp_path / "ft" / "best.npz").is_file() and f"best eval_accuracy {best['score']:.4f}" in stdout
    assert json.loads((tmp_path / "ft" / "task.json").read_text())["labels"] == ["no", "yes"]
    if framework == "pt":
        an_mlflow_client_reads_the_run_back(tmp_path / "ft", store, metrics, best)
        what_the_model_predicts_travels_with_it(task, tmp_path)


def an_mlflow_client_reads_the_run_back(out, store, metrics, best):
    """train.report_to=[tensorboard,mlflow]: a real MLflow client finds the run's parameters,
    its per-step metrics and its best model as artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    run_id = (out / "mlflow_run.txt").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["train.optim.lr"] == "0.001"
    assert run.data.params["best_metric"] == ""  # (every setting, under the name --set takes)
    # (under metrics.jsonl's and best_metric's names: eval_accuracy, loss)
    history = {m.step: m.value for m in client.get_metric_history(run_id, "eval_accuracy")}
    assert history == pytest.approx({m["step"]: m["eval_accuracy"] for m in metrics if "eval_accuracy" in m})
    assert len(client.get_metric_history(run_id, "loss")) == 8  # (log_every 10 of 80 steps)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"best.npz", "best.json"}
    # beside the SQLite file (MLflow's own default is ./mlruns in the job's working folder)
    beside = (out.parent / "mlflow-artifacts").resolve().as_uri()  # (the store is tmp_path/mlflow.db)
    assert run.info.artifact_uri.startswith(beside), run.info.artifact_uri
    assert best["greater_is_better"] is True


def what_the_model_predicts_travels_with_it(task, tmp_path):
    """The fine-tuned run exported to Hugging Face names its labels and the class to load it
    with; a prediction-only run on a dev set prepared with the labels in another order is refused."""
    for src, dst, pick in ((tmp_path / "ft", "hf", "latest"),
                           (tmp_path / "ft" / "best.npz", "hf-best", "best")):
        res = subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(src), "--to", "hf",
                              "--output", str(tmp_path / dst), "--checkpoint", pick], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert pick == "best" or "(the newest checkpoint, " in res.stdout, res.stdout
        assert "transformers.BertForSequenceClassification.from_pretrained" in res.stdout
        assert json.loads((tmp_path / dst / "config.json").read_text())["id2label"] == {"0": "no", "1": "yes"}
    subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-classification", str(task["root"] / "dev.tsv"),
                    "--output", str(tmp_path / "dev-swapped"), "--vocab", str(task["train"] / "vocab.txt"),
                    "--text-a", "sentence", "--label", "label", "--labels", "yes", "no",
                    "--max-seq-length", "32"], check=True, capture_output=True, timeout=120)
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "finetune", "--set", "do_train=false",
                          "--set", f"eval_data={tmp_path / 'dev-swapped'}",
                          "--set", f"init_checkpoint={tmp_path / 'ft'}",
                          "--set", f"train.output_dir={tmp_path / 'p'}"],
                         capture_output=True, text=True, timeout=300)
    assert not (tmp_path / "p").exists()  # refused before anything was written
    assert res.returncode == 2, res.stdout + res.stderr
    assert "fine-tuned on ['no', 'yes'] (in that order)" in res.stderr and "--labels no yes" in res.stderr
    predictions_on_your_own_text(task, tmp_path)


def predictions_on_your_own_text(task, tmp_path):
    """hvd-bert predict: the raw dev.tsv, in one process and as JSON lines on two ranks (from the
    run's best.npz): the label names, in input order, each example once, as good as the evaluation."""
    dev = task["root"] / "dev.tsv"
    rows = [r.split("\t") for r in dev.read_text().splitlines()[1:]]
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "predict", str(tmp_path / "ft"), str(dev),
                          "--output", str(tmp_path / "preds.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    # a run folder: its best model by default, and the line says so (--checkpoint latest: the newest)
    assert f"predicting with the best model, {tmp_path / 'ft' / 'best.npz'} (eval_accuracy" in res.stdout
    one = [json.loads(x) for x in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert [p["id"] for p in one] == list(range(len(rows))) and {p["label"] for p in one} <= {"no", "yes"}
    assert sum(p["label"] == r[1] for p, r in zip(one, rows)) / len(rows) > 0.8  # the dev accuracy: > 0.8
    assert all(abs(sum(p["scores"].values()) - 1) < 1e-6 and p["score"] == p["scores"][p["label"]]
               for p in one)
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps({"key": f"k{n}", "text": r[0]}) + "\n"
                                                for n, r in enumerate(rows)))
    res = launch.run(["-m", "hvd_bert", "predict", str(tmp_path / "ft" / "best.npz"),
                      str(tmp_path / "dev.jsonl"), "--id", "key", "--output", str(tmp_path / "preds2.tsv")],
                     np=2, timeout=300)
    assert res.ok, res.explain()
    two = [x.split("\t") for x in (tmp_path / "preds2.tsv").read_text().splitlines()]
    assert two[0] == ["id", "label", "score"]
    assert [t[0] for t in two[1:]] == [f"k{n}" for n in range(len(rows))]
    best_step = json.loads((tmp_path / "ft" / "best.json").read_text())["step"]
    if best_step == 80:  # the best is the last checkpoint: the same model, the same labels
        assert [t[1] for t in two[1:]] == [p["label"] for p in one]


def test_a_dev_set_with_other_labels_is_refused(task, tmp_path):
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\nthe file\tmaybe\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hvd_bert",
            "prepare-classification",
            str(other),
            "--output",
            str(tmp_path / "other"),
            "--vocab",
            str(task["train"] / "vocab.txt"),
            "--text-a",
            "sentence",
            "--label",
            "label",
            "--max-seq-length",
            "32",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hvd_bert",
            "finetune",
            "--set",
            f"data={task['train']}",
            "--set",
            f"eval_data={tmp_path / 'other'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert "has labels ['maybe'], the training set ['no', 'yes']" in res.stderr
    assert "--labels no yes" in res.stderr


@pytest.fixture(scope="module")
def published(task):
    """The pretrained run exported as the ecosystem's formats: a Hugging Face folder (with the
    data's vocab.txt) and a Google TF1 checkpoint."""
    out = {}
    for fmt in ("hf", "google"):
        res = subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(task["p1"]), "--to",
                              fmt, "--output", str(task["root"] / fmt)], capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr
        out[fmt] = task["root"] / fmt
    assert (out["hf"] / "vocab.txt").is_file() and (out["google"] / "bert_model.ckpt.index").is_file()
    return out


# TensorFlow reads Hugging Face folders through the same common code (tests/tf/test_hf_tf.py
# checks its logits) and fine-tunes in test_finetuning_beats_chance...; PyTorch reads Google's
# checkpoints through a TensorFlow subprocess, which only this test runs end to end.
@pytest.mark.parametrize("framework,fmt", [("pt", "hf"), ("pt", "google")])
def test_finetuning_from_a_published_checkpoint_format(framework, fmt, task, published, tmp_path):
    metrics, stdout = finetune(framework, task, published[fmt], tmp_path / "ft")
    assert f"from {published[fmt]}" in stdout
    evals = [m for m in metrics if "eval_accuracy" in m]
    assert evals[-1]["eval_examples"] == 201 and evals[-1]["eval_accuracy"] > 0.8, evals


def test_data_prepared_with_another_vocab_of_the_same_size_is_refused(task, tmp_path):
    """Only the size used to be compared: a shuffled vocab.txt of the same size made token ids
    mean other words without a word of warning."""
    words = (task["train"] / "vocab.txt").read_text().splitlines()
    special, rest = words[:5], words[5:]
    random.Random(0).shuffle(rest)
    shuffled = tmp_path / "vocab.txt"
    shuffled.write_text("\n".join(special + rest) + "\n")
    other = prepare(task["root"] / "train.tsv", tmp_path / "other", shuffled)
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "finetune", "--set", f"data={other}",
                          "--set", f"init_checkpoint={task['p1']}",
                          "--set", f"train.output_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "prepared with another vocabulary of the same size" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()


def test_a_glue_task_in_its_published_layout_reports_its_metric(task, tmp_path):
    """The same rows as CoLA files (prepare-classification --task cola): the evaluation reports
    Matthews' correlation, from confusion counts summed over the 2 ranks."""
    metrics, stdout = finetune("pt", task["cola"], task["p1"], tmp_path / "cola")
    evals = [m for m in metrics if "eval_mcc" in m]
    assert evals and evals[-1]["eval_examples"] == 201 and evals[-1]["eval_mcc"] > 0.6, evals
    assert f"MCC {evals[-1]['eval_mcc']:.4f} on 201 examples" in stdout
