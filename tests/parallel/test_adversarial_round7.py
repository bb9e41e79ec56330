"""The fourth adversarial round's seventh, eighth and ninth fresh passes, through the command line:
NCF evaluation of a trained run takes its run's settings and refuses the other framework's
checkpoints; a TensorFlow fine-tuning checkpoint keeps its head in convert and predict; a run
folder of the other framework is never started over; numbers past their type in published
configs, .npz headers, regression labels, settings and the environment; a v2.0 prediction
missing; TSV predictions that read back whole; a recipe that is not UTF-8; a full disk under one
rank's sharded shard; an evaluation without a fine-tuned head; Horovod's timeline over an input;
a damaged metrics line on resume; an export with another vocabulary. Every refusal is one line
with status 2 and leaves its inputs byte-identical."""

import csv
import json
import os
import shutil

import numpy as np
import pytest

from one_process import hvd, one_line, pretrain
from test_adversarial_round3 import digests
from test_adversarial_round4 import sharded_finetune, sharded_template  # noqa: F401  (fixtures)

NCF_MODEL = ("--set", "model.factors=8", "--set", "model.layers=[16, 8]")


@pytest.fixture(scope="module")
def ncf_runs(tmp_path_factory):
    """Tiny synthetic NCF data and a one-epoch run of it in each framework, with model settings
    other than the defaults (one process each)."""
    root = tmp_path_factory.mktemp("ncf7")
    assert hvd("prepare-ncf", "--synthetic", "ml-1m", "--scale", "0.02", "--output", root / "data",
               timeout=120).returncode == 0
    for fw in ("pt", "tf"):
        res = hvd("ncf", "--framework", fw, "--set", f"data={root / 'data'}", "--set",
                  f"train.output_dir={root / fw}", "--set", "epochs=1", "--set",
                  "train.batch.local_batch_size=512", "--set", "progress=false", *NCF_MODEL, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return root


def test_ncf_evaluation_takes_its_runs_settings_and_refuses_the_other_framework(ncf_runs):
    """Without the run's model settings (another size, another batch) the evaluation builds the
    model its run trained and scores what best.json recorded; a checkpoint of the other framework
    is refused in one line (PyTorch had scored a TensorFlow run's random initialisation)."""
    before = digests(ncf_runs)
    for fw in ("pt", "tf"):
        res = hvd("ncf", "--framework", fw, "--set", "do_train=false", "--set",
                  f"init_checkpoint={ncf_runs / fw}", "--set", "train.batch.local_batch_size=100000",
                  timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        best = json.loads((ncf_runs / fw / "best.json").read_text())["score"]
        assert f"HR@10 {best:.4f}" in res.stdout, (res.stdout, best)
        other = {"pt": "tf", "tf": "pt"}[fw]
        one_line(hvd("ncf", "--framework", other, "--set", "do_train=false", "--set",
                     f"init_checkpoint={ncf_runs / fw}", timeout=300),
                 f"is a {'PyTorch' if fw == 'pt' else 'TensorFlow'} checkpoint", f"--framework {fw}")
    assert digests(ncf_runs) == before


@pytest.mark.parametrize("tamper,words", [
    ("twice", "name an item twice"), ("rated", "hold an item it rated")])
def test_ncf_test_negatives_that_break_the_protocol_are_refused(ncf_runs, tmp_path, tamper, words):
    data = tmp_path / "data"
    shutil.copytree(ncf_runs / "data", data)
    with np.load(data / "ncf.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    neg = arrays["test_negatives"]
    if tamper == "twice":
        neg[0, 1] = neg[0, 0]
    else:
        user0 = arrays["train_items"][arrays["train_users"] == 0]
        neg[0, 0] = user0[0]
    with open(data / "ncf.npz", "wb") as f:  # (the same size: the sidecar records it)
        np.savez(f, **arrays)
    one_line(hvd("ncf", "--set", "do_train=false", "--set", f"data={data}", "--set",
                 f"init_checkpoint={ncf_runs / 'pt'}", timeout=300), "user 0's test negatives", words)


@pytest.fixture(scope="module")
def tf_finetune(sharded_finetune, tmp_path_factory):  # noqa: F811
    """A TensorFlow classifier fine-tuned with consolidated checkpoints (one process, 2 steps)."""
    run = tmp_path_factory.mktemp("tfft") / "run"
    data = sharded_finetune[0].parent / "cls"
    res = hvd("finetune", "--framework", "tf", "--set", f"data={data}", "--set", "model=tiny", "--set",
              "train.schedule.total_steps=2", "--set", "epochs=0", "--set", "train.batch.local_batch_size=8",
              "--set", "progress=false", "--set", f"train.output_dir={run}", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return run, sharded_finetune[1]


def test_a_tensorflow_fine_tuning_checkpoint_keeps_its_head(tf_finetune, tmp_path):
    """convert and predict read a TensorFlow run's checkpoint into the model its task record
    names (the classifier had been dropped: BertForPreTraining and "no trained head"); predict
    without --framework tf names it."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    run, table = tf_finetune
    res = hvd("convert", run, "--to", "hf", "--output", tmp_path / "hf", timeout=300)
    assert res.returncode == 0 and "BertForSequenceClassification" in res.stdout, res.stdout + res.stderr
    (ckpt,) = sorted(run.glob("ckpt-*.tf"))
    reader = tf.train.load_checkpoint(str(ckpt / "ckpt"))
    kernel = reader.get_tensor("model/classifier/kernel/.ATTRIBUTES/VARIABLE_VALUE")
    np.testing.assert_array_equal(load_file(tmp_path / "hf" / "model.safetensors")["classifier.weight"],
                                  kernel.T)
    res = hvd("predict", "--framework", "tf", run, table, "--output", tmp_path / "p.jsonl", timeout=300)
    assert res.returncode == 0 and "scored against the input's labels" in res.stdout, res.stderr[-2000:]
    one_line(hvd("predict", run, table, "--output", tmp_path / "q.jsonl", timeout=300),
             "is a TensorFlow checkpoint", "--framework tf")
    assert not (tmp_path / "q.jsonl").exists()


def test_predictions_as_tsv_read_back_whole(sharded_finetune, tmp_path):  # noqa: F811
    """Ids holding a tab, a newline and a quote are quoted as the csv module reads them."""
    table = tmp_path / "ids.csv"
    table.write_text('key,sentence\n"a\tb",good value\n"c\nd",bad value\n"say ""hi""",good\n')
    res = hvd("predict", sharded_finetune[0], table, "--id", "key", "--output", tmp_path / "p.tsv",
              timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.reader(open(tmp_path / "p.tsv", newline=""), delimiter="\t"))
    assert rows[0] == ["id", "label", "score"] and [r[0] for r in rows[1:]] == ["a\tb", "c\nd", 'say "hi"']
    assert all(len(r) == 3 for r in rows)


def test_a_run_folder_of_the_other_framework_is_never_started_over(finished_run):
    """Without its config.json, train.resume_unchecked=true had started a TensorFlow run from
    scratch in a PyTorch run's folder, over its metrics."""
    (finished_run / "config.json").unlink()
    before = digests(finished_run)
    one_line(hvd("pretrain", "--framework", "tf", "--set", "train.resume_unchecked=true", "--set",
                 f"train.output_dir={finished_run}", timeout=300),
             "holds PyTorch checkpoints", "--framework pt")
    assert digests(finished_run) == before


@pytest.mark.parametrize("key,value,words", [
    ("num_hidden_layers", "1e400", "num_hidden_layers is inf, not an integer"),
    ("hidden_size", "-Infinity", "hidden_size is -inf, not an integer"),
    ("initializer_range", "Infinity", "initializer_range is inf, not a finite number")])
def test_a_published_config_past_its_numbers_is_one_line(finished_run, tmp_path, key, value, words):
    folder = tmp_path / "hf"
    assert hvd("convert", finished_run, "--to", "hf", "--output", folder, timeout=300).returncode == 0
    text = (folder / "config.json").read_text()
    raw = json.loads(text)
    (folder / "config.json").write_text(text.replace(f'"{key}": {json.dumps(raw[key])}', f'"{key}": {value}'))
    before = digests(folder)
    one_line(hvd("convert", folder, "--output", tmp_path / "w.npz", timeout=300), "config.json", words)
    assert digests(folder) == before and not (tmp_path / "w.npz").exists()


def test_an_npz_header_claiming_more_than_its_bytes_is_named_before_any_allocation(finished_run, tmp_path):
    """A member's .npy header claiming 1e11 values (400 GB) had been allocated, then blamed on the
    batch size as an out-of-memory."""
    import io
    import zipfile

    good = tmp_path / "w.npz"
    assert hvd("convert", finished_run, "--output", good, timeout=300).returncode == 0
    bad = tmp_path / "bad.npz"
    name = "embeddings.LayerNorm.weight.npy"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == name:
                f = io.BytesIO(data)
                np.lib.format.read_magic(f)
                _, _, dtype = np.lib.format.read_array_header_1_0(f)
                head = io.BytesIO()
                np.lib.format.write_array_header_1_0(head, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                             "fortran_order": False, "shape": (10 ** 11,)})
                data = head.getvalue() + data[f.tell():]
            dst.writestr(info.filename, data)
    res = hvd("convert", bad, "--output", tmp_path / "c.npz", timeout=120)
    one_line(res, "bad.npz is damaged", f"{name} claims 400000000000 bytes")
    assert "out of memory" not in res.stderr and not (tmp_path / "c.npz").exists()


def test_numbers_past_float32_or_their_meaning_are_one_line(bert_data, tmp_path):
    table = tmp_path / "reg.tsv"
    table.write_text("sentence\tlabel\ngood\t1.5\nbad\t1e39\n")
    one_line(hvd("prepare-classification", table, "--output", tmp_path / "reg", "--vocab",
                 bert_data / "vocab.txt", "--text-a", "sentence", "--label", "label", "--regression"),
             "example 2 has the label '1e39'", "float32's range")
    assert not (tmp_path / "reg").exists()
    env = dict(os.environ, HVD_BERT_STOP_GRACE_S="abc")
    one_line(hvd("pretrain", "-np", "2", "--set", f"data={bert_data}", env=env, timeout=120),
             "HVD_BERT_STOP_GRACE_S='abc' is not a grace period")
    recipe = tmp_path / "latin.yaml"
    recipe.write_bytes(b"train:\n  seed: \xff\n")
    one_line(hvd("config", "--job", "pretrain", "--config", recipe), f"config file {recipe}", "UTF-8")
    one_line(hvd("config", "--job", "pretrain", "--config", tmp_path), "is a folder")


def test_a_v2_prediction_missing_scores_zero(tmp_path):
    """As the v1.1 script scores an unanswered question (the v2.0 one had no total for it, and
    this evaluation raised KeyError)."""
    ctx = "The note was written by Ada Lovelace in 1843."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [
        {"id": "q1", "question": "Who?", "answers": [{"text": "Ada Lovelace", "answer_start": 24}],
         "is_impossible": False},
        {"id": "q2", "question": "When?", "answers": [{"text": "1843", "answer_start": 40}],
         "is_impossible": False},
        {"id": "q3", "question": "Why?", "answers": [], "is_impossible": True}]}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(data))
    (tmp_path / "pred.json").write_text(json.dumps({"q1": "Ada Lovelace", "q3": ""}))
    res = hvd("evaluate-squad", tmp_path / "dev.json", tmp_path / "pred.json")
    assert res.returncode == 0 and "Missing prediction for q2" in res.stderr, res.stderr
    got = json.loads(res.stdout)
    assert got["total"] == 3 and got["exact"] == pytest.approx(200 / 3) and got["HasAns_exact"] == 50.0


def test_a_top_k_of_every_candidate_and_a_recommend_list_with_a_byte_order_mark(ncf_runs, tmp_path):
    """HR@101 over 101 candidates is 1.0 whatever the model: refused. A user list an editor
    saved with a byte-order mark reads as its ids."""
    one_line(hvd("ncf", "--set", "do_train=false", "--set", f"init_checkpoint={ncf_runs / 'pt'}", "--set",
                 "top_k=101", timeout=300), "top_k=101", "use top_k < 101")
    with np.load(ncf_runs / "data" / "ncf.npz", allow_pickle=False) as z:
        ids = z["user_ids"][:2] if "user_ids" in z.files else np.arange(2)
    users = tmp_path / "users.txt"
    users.write_bytes(b"\xef\xbb\xbf" + "".join(f"{int(u)}\n" for u in ids).encode())
    res = hvd("ncf", "--set", "do_train=false", "--set", f"init_checkpoint={ncf_runs / 'pt'}", "--set",
              f"recommend={users}", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "users.txt.recommendations.jsonl").read_text().splitlines()]
    assert [r["user"] for r in rows] == [int(u) for u in ids]


def test_prepared_data_never_goes_into_a_model_folder(finished_run, bert_data, tmp_path):
    """--overwrite had replaced a Hugging Face folder's vocab.txt with the data's (one token more
    than the model's rows) and put shards beside its weights."""
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\ngood\tpos\nbad\tneg\n")
    hf = tmp_path / "hf"
    assert hvd("convert", finished_run, "--to", "hf", "--output", hf, timeout=300).returncode == 0
    for model, what in ((hf, "a Hugging Face model folder"), (finished_run, "a run folder")):
        before = digests(model)
        one_line(hvd("prepare-classification", table, "--output", model, "--overwrite", "--vocab",
                     bert_data / "vocab.txt", "--text-a", "sentence", "--label", "label"), f"is {what}")
        assert digests(model) == before


@pytest.mark.parametrize("label", ["1_000", "\u0663", "nan", "0x10"])
def test_a_regression_label_is_a_plain_number(bert_data, tmp_path, label):
    """float() takes 1_000, an Arabic-Indic 3 and nan; a table's number is ASCII decimal."""
    table = tmp_path / "reg.tsv"
    table.write_text(f"sentence\tlabel\ngood\t1.5\nbad\t{label}\n", encoding="utf-8")
    one_line(hvd("prepare-classification", table, "--output", tmp_path / "reg", "--vocab",
                 bert_data / "vocab.txt", "--text-a", "sentence", "--label", "label", "--regression"),
             "example 2 has the label", "not a number")


def test_a_full_disk_under_one_ranks_shard_ends_the_job_at_once(bert_data, mount_point):
    """2 ranks, sharded by default: room for one rank's shard only. The rank that fails says so
    in the checkpoint's folder, so rank 0 stops waiting for its manifest (it had waited 600 s
    while the other rank spun in the next collective): one line, exit 2, in well under that."""
    import time

    disk = mount_point("-t", "tmpfs", "-o", "size=64m", "tmpfs")
    common = ("-np", "2", "--set", f"data={bert_data}", "--set", "max_seq_length=64", "--set",
              "max_predictions_per_seq=10", "--set", "train.batch.local_batch_size=8", "--set",
              "progress=false", "--set", "train.log_every=1", "--set", "train.checkpoint_every=2")
    res = hvd("pretrain", *common, "--set", "train.schedule.total_steps=2", "--set",
              f"train.output_dir={disk / 'first'}", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    shard = (disk / "first" / "ckpt-00000002.shards" / "rank-00001.safetensors").stat().st_size
    shutil.rmtree(disk / "first")
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * (free - shard * 3 // 2))  # one shard fits, not two
    t0 = time.monotonic()
    res = hvd("pretrain", *common, "--set", "train.schedule.total_steps=4", "--set",
              f"train.output_dir={disk / 'run'}", timeout=400)
    one_line(res, f"no space left on {disk}", "ckpt-00000002.shards")
    assert time.monotonic() - t0 < 300
    assert not (disk / "run" / "ckpt-00000002.shards" / "index.json").exists()


def test_evaluating_a_checkpoint_without_a_fine_tuned_head_is_refused(sharded_template, sharded_finetune,  # noqa: F811
                                                                      tmp_path):
    """do_train=false from a pretraining checkpoint had scored a fresh classifier (accuracy at
    chance, loss ln 2) and exited 0."""
    data = sharded_finetune[0].parent / "cls"
    (ckpt,) = sorted(sharded_template.glob("ckpt-*.shards"))
    one_line(hvd("finetune", "--set", "do_train=false", "--set", f"eval_data={data}", "--set",
                 f"init_checkpoint={ckpt}", "--set", f"train.output_dir={tmp_path / 'ev'}", timeout=300),
             "has no fine-tuned head (classifier.weight missing)", "do_train=true")
    assert not (tmp_path / "ev").exists()


def test_a_config_with_fewer_layers_than_its_weights_names_the_config(finished_run, tmp_path):
    hf = tmp_path / "hf"
    assert hvd("convert", finished_run, "--to", "hf", "--output", hf, timeout=300).returncode == 0
    config = json.loads((hf / "config.json").read_text())
    config["num_hidden_layers"] -= 1
    (hf / "config.json").write_text(json.dumps(config))
    one_line(hvd("convert", hf, "--output", tmp_path / "w.npz", timeout=300),
             "does not match config.json", f"the file has layers 0..{config['num_hidden_layers']}")


def test_the_ninth_rounds_cases(bert_data, finished_run, tmp_path):
    """HOROVOD_TIMELINE in the environment over the data's vocabulary (the setting was refused,
    the variable had written Chrome-trace JSON over it); a metrics.jsonl line whose step is not a
    number (a traceback on resume); a negative eval_every and a vocab size out of range; an
    export given another vocabulary of the same size (its tokens would map to other rows)."""
    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    before = digests(data)
    one_line(hvd("pretrain", "--set", f"data={data}", "--set", f"train.output_dir={tmp_path / 'tl'}",
                 env=dict(os.environ, HOROVOD_TIMELINE=str(data / "vocab.txt")), timeout=300),
             "HOROVOD_TIMELINE", "give HOROVOD_TIMELINE a path outside it")
    assert digests(data) == before and not (tmp_path / "tl").exists()
    with open(finished_run / "metrics.jsonl", "a") as f:
        f.write('{"step": [1]}\n{"step": "x"}\n')
    res = pretrain(bert_data, finished_run, steps=3, timeout=300)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-2000:]
    assert [json.loads(x)["step"] for x in (finished_run / "metrics.jsonl").read_text().splitlines()][-1] == 3
    one_line(hvd("config", "--job", "finetune", "--set", "eval_every=-3"), "eval_every >= 0")
    one_line(hvd("prepare-bert", "--output", tmp_path / "p", "--vocab-size", "-7"), "--vocab-size",
             "not a count from 100 to 1048576")
    tokens = (bert_data / "vocab.txt").read_text().splitlines()  # (the run's data's: convert takes it)
    (tmp_path / "rev.txt").write_text("\n".join(tokens[:5] + tokens[5:][::-1]) + "\n")
    one_line(hvd("convert", finished_run, "--to", "hf", "--output", tmp_path / "hf", "--vocab",
                 tmp_path / "rev.txt", timeout=300), "is not the vocabulary", "drop --vocab")
    assert not (tmp_path / "hf").exists()


def test_ncf_evaluation_on_other_data_names_the_data_not_the_checkpoint(ncf_runs, tmp_path):
    """A trained model evaluated on data of other sizes was blamed on its checkpoint ("delete it
    to resume from the one before"): the line names the data it was trained on."""
    other = tmp_path / "other"
    assert hvd("prepare-ncf", "--synthetic", "ml-1m", "--scale", "0.03", "--output", other,
               timeout=120).returncode == 0
    before = digests(ncf_runs / "pt")
    res = hvd("ncf", "--set", "do_train=false", "--set", f"init_checkpoint={ncf_runs / 'pt'}", "--set",
              f"data={other}", *NCF_MODEL, timeout=300)
    one_line(res, "was trained on other data", f"--set data={ncf_runs / 'data'}", "the checkpoint is intact")
    assert "delete" not in res.stderr and digests(ncf_runs / "pt") == before
