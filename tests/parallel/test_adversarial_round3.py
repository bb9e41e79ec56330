"""The third adversarial round, through the command line: no output over an input, bounded
parsing, integrity of what is read, a model that is what its files say, and the launch-time
resources named first. Every case ends in one line and exit status 2 (or a correct run), is
bounded in time, and leaves every input byte-identical (digests before and after)."""

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hvd_bert.cluster import launch
from one_process import HVD_BERT, hvd, one_line, pretrain

VOCAB = Path(__file__).parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"


def digests(*roots) -> dict:
    """Every file under ``roots`` (files or folders) by its SHA-256."""
    out = {}
    for root in map(Path, roots):
        for p in ([root] if root.is_file() else sorted(root.rglob("*"))):
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def run(finished_run):
    """A finished 2-step PyTorch pretraining run, a copy of its own per test (conftest)."""
    return finished_run


# ---------------------------------------------------------------- no output over an input

def test_no_command_writes_its_output_over_what_it_reads(bert_data, run, tmp_path):
    """predict, convert, prepare-* and a training job compare their outputs with every path they
    read or own (resolved, and by inode: a hard link) and refuse a clash before writing."""
    table = tmp_path / "in.tsv"
    table.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    os.link(table, tmp_path / "hard.tsv")
    (tmp_path / "alias").symlink_to(run)
    ckpt = run / "ckpt-00000002.pt"
    cases = [
        (("predict", ckpt, table, "--output", ckpt), "is the checkpoint"),
        (("predict", run, table, "--output", table), "is the input"),
        (("predict", run, table, "--output", tmp_path / "hard.tsv"), "is the input"),
        (("predict", run, table, "--output", tmp_path / "alias" / "config.json"), "would replace a file of"),
        (("convert", run, "--output", ckpt), "would replace a file of the checkpoint"),
        (("convert", run, "--to", "hf", "--output", run), "is the checkpoint"),
        (("prepare-classification", table, "--output", tmp_path, "--vocab", VOCAB, "--text-a", "sentence",
          "--label", "label", "--overwrite"), "holds the table"),
        (("prepare-bert", "--input", bert_data / "vocab.txt", "--output", bert_data, "--overwrite",
          "--vocab", VOCAB), "holds the input"),
    ]
    before = digests(run, table, bert_data)
    for args, words in cases:
        line = one_line(hvd(*args), words, "give")
        assert "which this command reads" in line
    one_line(pretrain(bert_data, bert_data), "train.output_dir", "is data")
    one_line(pretrain(bert_data, tmp_path / "p2", "--set", f"init_checkpoint={ckpt}", "--set",
                      f"train.output_dir={run}"), "train.output_dir", "init_checkpoint")
    assert digests(run, table, bert_data) == before


# ---------------------------------------------------------------- bounded parsing

def test_a_yaml_alias_bomb_is_refused_in_a_moment(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("train:\n  seed: 1\nmodel:\n" + "\n".join("  " + x for x in lines) + "\n")
    for args in (("config", "--job", "pretrain", "--config", bomb), ("pretrain", "--config", bomb),
                 ("pretrain", "--set", "model=" + "{" + ", ".join(lines[:3]) + "}")):
        t0 = time.monotonic()
        line = one_line(hvd(*args, timeout=60))
        assert time.monotonic() - t0 < 30 and len(line) < 600, line
        assert "expands to more than" in line or "expected one of" in line, line
    one_line(hvd("config", "--set", "train.seed=&a [*a]", timeout=60), "alias inside its own anchor")


def classifier(run: Path, folder: Path) -> Path:
    """A Hugging Face BertForSequenceClassification folder: ``run``'s encoder and a 2-label head."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    assert hvd("convert", run, "--to", "hf", "--output", folder).returncode == 0
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    rng = np.random.default_rng(0)
    tensors["classifier.weight"] = rng.normal(0, 0.02, (2, config["hidden_size"])).astype(np.float32)
    tensors["classifier.bias"] = np.zeros(2, np.float32)
    save_file(tensors, folder / "model.safetensors")
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "neg", "1": "pos"},
                  label2id={"neg": 0, "pos": 1})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_fields_past_their_limit_are_one_line_and_long_texts_cost_little(run, tmp_path):
    big = tmp_path / "big.tsv"
    big.write_text("sentence\tlabel\n" + "a" * 1_100_000 + "\t1\nshort\t0\n")
    one_line(hvd("prepare-classification", big, "--output", tmp_path / "out", "--vocab", VOCAB, "--text-a",
                 "sentence", "--label", "label"), f"{big} line 2", "at most 1,048,576 characters")
    assert not (tmp_path / "out").exists()
    ok = tmp_path / "ok.tsv"  # 200 KB in a cell (the csv module's own limit is 128 KiB): within the limit
    ok.write_text("sentence\tlabel\n" + "word " * 40_000 + "\t1\nshort\t0\n")
    res = hvd("prepare-classification", ok, "--output", tmp_path / "ok", "--vocab", VOCAB, "--text-a",
              "sentence", "--label", "label")
    assert res.returncode == 0, res.stderr
    model = classifier(run, tmp_path / "clf")
    jl = tmp_path / "long.jsonl"
    jl.write_text(json.dumps({"text": "w" * 1_100_000}) + "\n")
    one_line(hvd("predict", model, jl), "over the limit of 1,048,576")
    jl.write_text(json.dumps({"text": "word " * 200_000}) + "\n" + json.dumps({"text": "good"}) + "\n")
    res = subprocess.run(["/usr/bin/time", "-f", "%M", *HVD_BERT, "predict", model, jl], capture_output=True,
                         text=True, timeout=240)  # 1 MB of text: cut before tokenizing
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stderr.strip().splitlines()[-1]) < 1_500_000, res.stderr  # peak KiB: under 1.5 GB
    assert len((tmp_path / "long.jsonl.predictions.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("data, place", [
    ({"version": "1.1", "data": [{"title": "x", "paragraphs": "abc"}]}, "data[0].paragraphs is a string"),
    ({"version": "1.1", "data": [{"paragraphs": [{"context": "abc", "qas": "q"}]}]},
     "data[0].paragraphs[0].qas is a string"),
    ({"version": "1.1", "data": ["a", "b"]}, "data[0] is a string"),
    ({"version": "1.1", "data": [{"paragraphs": [{"context": 5, "qas": []}]}]}, "context is a number"),
    ({"version": "1.1", "data": [{"paragraphs": [{"context": "c", "qas": [{"id": "1", "question": "q",
                                                                          "answers": [{"text": 3}]}]}]}]},
     "answers[0].text is a number")])
def test_a_squad_file_of_the_wrong_structure_is_named_where_it_is_read(data, place, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    for args in (("prepare-squad", "--input", bad, "--output", tmp_path / "out", "--vocab", VOCAB),
                 ("evaluate-squad", bad, bad)):
        one_line(hvd(*args), place, "give a SQuAD v1.1 or v2.0 file")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- integrity

@pytest.mark.parametrize("damage", ["bytes flipped", "a tensor changed"])
def test_a_damaged_checkpoint_is_refused_with_the_fix(damage, bert_data, run):
    """4 KB flipped in the middle of a checkpoint fails its zip CRC-32; a tensor changed and the
    file written again (its CRCs then hold) fails the digest its metadata recorded."""
    import torch

    ckpt = run / "ckpt-00000002.pt"
    if damage == "bytes flipped":
        with open(ckpt, "r+b") as f:
            f.seek(ckpt.stat().st_size // 2)
            f.write(bytes(range(256)) * 16)
    else:
        state = torch.load(ckpt, weights_only=True)
        name = next(iter(state["model"]))
        state["model"][name].view(-1)[0] += 1
        torch.save(state, ckpt)
    before = digests(run)
    words = "CRC-32 of its part" if damage == "bytes flipped" else "no longer match the digest"
    one_line(pretrain(bert_data, run, steps=4), f"{ckpt} is damaged", words, "delete it to resume")
    one_line(hvd("convert", ckpt, "--output", run.parent / "w.npz"), "is damaged")
    assert digests(run) == before and not (run.parent / "w.npz").exists()


def test_data_prepared_again_at_the_same_path_is_not_resumed_onto(bert_data, run, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    fresh = tmp_path / "fresh"
    assert pretrain(data, fresh).returncode == 0
    side = json.loads((data / "dataset.json").read_text())
    side["shards"] = side["shards"][:-1]  # the same path, other data (a shard fewer)
    side["total_records"] = sum(s["records"] for s in side["shards"])
    side["num_shards"] = len(side["shards"])
    (data / "dataset.json").write_text(json.dumps(side))
    before = digests(fresh)
    one_line(pretrain(data, fresh, steps=4), "holds other data than this run's checkpoints were trained on",
             "another train.output_dir")
    assert digests(fresh) == before


def test_data_prepared_again_under_a_running_job_is_noticed(bert_data, tmp_path):
    """``prepare-bert --overwrite`` into the folder a running job reads: the job stops at its next
    shard with the line that says so, instead of training on a mix."""
    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    out = tmp_path / "run"
    argv = [*HVD_BERT, "pretrain", "--set", f"data={data}", "--set", "max_seq_length=64",
            "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1", "--set", "progress=false",
            "--set", "train.batch.local_batch_size=8", "--set", "train.schedule.total_steps=100000",
            "--set", f"train.output_dir={out}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = out / "metrics.jsonl"
        while not metrics.is_file() or len(metrics.read_text().splitlines()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        side = json.loads((data / "dataset.json").read_text())
        side["seed_note"] = "prepared again"
        (data / "dataset.json").write_text(json.dumps(side))  # what prepare-bert --overwrite does last
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, stderr[-3000:]
    assert "changed while this job was reading" in lines[0] and "new run" in lines[0]


# ---------------------------------------------------------------- a model is what its files say

def test_a_head_that_the_config_names_but_the_weights_lack_is_refused(run, tmp_path):
    hf = tmp_path / "hf"
    assert hvd("convert", run, "--to", "hf", "--output", hf).returncode == 0
    config = json.loads((hf / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], id2label={"0": "neg", "1": "pos"},
                  label2id={"neg": 0, "pos": 1})
    (hf / "config.json").write_text(json.dumps(config))
    table = tmp_path / "t.tsv"
    table.write_text("sentence\ngood\nbad\n")
    one_line(hvd("predict", hf, table), "has no trained head", "classifier.weight missing",
             "Fine-tune it first")
    assert not (tmp_path / "t.tsv.predictions.jsonl").exists()


def test_pretrain_takes_init_checkpoints_architecture(run, bert_data, tmp_path):
    """A Hugging Face folder with another activation and LayerNorm epsilon than the preset: the
    phase-2 model is the folder's (its hidden_act and layer_norm_eps in the run's bert_config.json)."""
    hf = tmp_path / "hf"
    assert hvd("convert", run, "--to", "hf", "--output", hf).returncode == 0
    config = json.loads((hf / "config.json").read_text())
    config.update(hidden_act="gelu_new", layer_norm_eps=1e-6)
    (hf / "config.json").write_text(json.dumps(config))
    out = tmp_path / "p2"
    res = pretrain(bert_data, out, "--set", f"init_checkpoint={hf}", "--set", "model=base")
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads((out / "bert_config.json").read_text())
    assert got["gelu"] == "tanh" and got["layer_norm_eps"] == 1e-6
    assert got["hidden_size"] == config["hidden_size"]
    assert f"model: BERT from {hf}" in res.stdout


# ---------------------------------------------------------------- launch-time resources

def test_a_full_tmp_is_named_before_mpi_speaks(bert_data, mount_point, tmp_path):
    disk = mount_point("-t", "tmpfs", "-o", "size=4m", "tmpfs")
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * free)
    env = dict(os.environ, TMPDIR=str(disk))
    out = tmp_path / "run"
    one_line(pretrain(bert_data, out, env=env), f"{disk} has 0.0 MiB free", "TMPDIR")
    res = pretrain(bert_data, out, "-np", "2", env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "hvd-bert launch: " in lines[0], res.stderr[-2000:]
    assert not out.exists()


def test_too_few_open_files_are_named_instead_of_a_stalled_mpirun(bert_data, tmp_path):
    res = subprocess.run(["bash", "-c", 'ulimit -n 24 && exec "$@"', "_", *HVD_BERT, "pretrain", "-np", "2",
                          "--set", f"data={bert_data}"], capture_output=True, text=True, timeout=60,
                         env=launch.mpi_env(os.environ))
    one_line(res, "the open-files limit (ulimit -n) is 24", "need at least")


@pytest.mark.parametrize("args, words", [
    (("pretrain", "-np", "-2"), "-np must be at least 1, got -2"),
    (("launch", "-np", "2", "--", "pretrian"), "is neither a job"),
    (("pretrain", "-np", "3", "--set", "train.tensor_parallel=2"), "does not divide the 3 ranks")])
def test_launch_arguments_that_cannot_work_are_one_line(args, words, bert_data):
    extra = ("--set", f"data={bert_data}", "--set", "max_seq_length=64",
             "--set", "max_predictions_per_seq=10")
    res = hvd(*args, *(extra if args[0] == "pretrain" else ()), env=launch.mpi_env(os.environ))
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("hvd-bert launch: warning: ")]
    if "3" in args:  # 3 ranks on this machine's 2 cores: the oversubscription warning first
        assert len(os.sched_getaffinity(0)) >= 3 or "oversubscribed" in warned[0], res.stderr
    res.stderr = "\n".join(ln for ln in res.stderr.splitlines() if ln not in warned)
    one_line(res, words)
