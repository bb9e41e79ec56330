"""What a careless user or an attacker can put in hvd_bert's way, through the command line: links
planted in a run folder, full and read-only file systems, damaged logs, lying sidecars, crafted
weights and configs, ranks given different settings. Every case ends in one clear line and exit
status 2 (or, where the toolkit can go on safely, a correct run), writes nothing outside the run
folder, loses no checkpoint, and is bounded in time."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from one_process import HVD_BERT, one_line, pretrain

ROOT = os.geteuid() == 0


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("name", [".hvd_bert.lock", "metrics.jsonl", "tensorboard"])
@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_planted_in_the_run_folder_is_never_written_through(name, dangling, bert_data, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("missing" if dangling else "victim")
    if not dangling:
        if name == "tensorboard":
            victim.mkdir()
        else:
            victim.write_text("keep\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)
    before = tree(outside)
    res = pretrain(bert_data, run)
    one_line(res, f"{run / name} is a symbolic link", "remove it")
    assert tree(outside) == before  # nothing written or created outside the run folder
    assert sorted(p.name for p in run.iterdir()) == [name]  # and nothing in it: the check came first


def test_a_damaged_metrics_log_does_not_stop_a_resume(bert_data, finished_run):
    with open(finished_run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "loss": \xff\xfe\n')  # not UTF-8, cut short
    res = pretrain(bert_data, finished_run, steps=4)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_a_full_disk_is_named_and_the_older_checkpoints_stay(bert_data, mount_point):
    disk = mount_point("-t", "tmpfs", "-o", "size=48m", "tmpfs")
    run = disk / "run"
    assert pretrain(bert_data, run).returncode == 0
    first = sorted(p.name for p in run.glob("ckpt-*"))
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))  # 64 KiB left: no room for a checkpoint
    res = pretrain(bert_data, run, steps=4)
    line = one_line(res, f"no space left on {disk} while writing {run / 'ckpt-00000004.pt'}",
                    "the checkpoints already there are intact")
    assert "free at least" in line and "MB" in line
    assert sorted(p.name for p in run.glob("ckpt-*")) == first and not list(run.glob(".*tmp*"))
    (disk / "filler").unlink()
    res = pretrain(bert_data, run, steps=4)  # the older checkpoint resumes once there is room
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]


def test_a_read_only_run_folder_is_named(bert_data, finished_run, mount_point):
    ro = mount_point("--bind", "-o", "ro", str(finished_run), where="ro")
    before = tree(finished_run)
    one_line(pretrain(bert_data, ro, steps=4), "read-only file system while writing",
             "writable train.output_dir")
    one_line(pretrain(bert_data, ro / "sub"), "read-only file system while writing")
    assert tree(finished_run) == before


@pytest.mark.parametrize("damage", ["missing", "not JSON"])  # (more damage: tests/core/test_run_identity.py)
def test_a_run_folder_without_its_settings_is_refused_until_the_user_says_so(damage, bert_data, finished_run):
    """Checkpoints whose config.json is missing or damaged cannot be checked against this run's
    settings: refused with the fix, the folder untouched; the flag the message names resumes."""
    config = finished_run / "config.json"
    if damage == "missing":
        config.unlink()
    else:
        damaged = {"not JSON": b'{"train": {', "a list": b"[1, 2]", "not UTF-8": b"\xff\xfe{}"}
        config.write_bytes(damaged[damage])
    before = tree(finished_run)
    res = pretrain(bert_data, finished_run, "--set", "train.optim.lr=0.5", steps=4)
    one_line(res, "holds checkpoints, but its config.json is " + ("missing" if damage == "missing" else
                                                                  "damaged"),
             "--set train.resume_unchecked=true")
    assert tree(finished_run) == before
    res = pretrain(bert_data, finished_run, "--set", "train.resume_unchecked=true", steps=4)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]
    assert json.loads(config.read_text())["train"]["schedule"]["total_steps"] == 4  # recorded again


def test_another_optimizers_checkpoint_is_refused_and_a_refused_resume_writes_nothing(bert_data,
                                                                                     finished_run):
    """A resume refused by the checkpoint's own checks leaves config.json as it was; the
    checkpoint names its optimizer, so LARS cannot take over NVLAMB's state even when the
    settings check was waived (config.json lost)."""
    before = tree(finished_run)
    res = pretrain(bert_data, finished_run, "--set", "train.batch.global_batch_size=32", steps=4)
    one_line(res, "was written with a global batch of 16, this run has 32")
    assert tree(finished_run) == before
    (finished_run / "config.json").unlink()
    res = pretrain(bert_data, finished_run, "--set", "train.optim.name=lars", "--set",
                   "train.resume_unchecked=true", steps=4)
    one_line(res, "holds the state of optimizer nvlamb, this run uses lars", "train.optim.name=nvlamb")
    assert not (finished_run / "config.json").exists()


def test_a_resize_keeps_the_checkpoints_global_batch_or_names_the_fix(bert_data, tmp_path):
    """A 2-rank run resumed on 1 rank: the checkpoint's global batch of 32 is kept (k derived)
    and the resume line says how the layout changed; a global batch given that differs is
    refused, naming the one to give, and giving it resumes."""
    run = tmp_path / "run"
    res = pretrain(bert_data, run, "-np", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    res = pretrain(bert_data, run, "--set", "train.batch.global_batch_size=16", steps=4)
    line = one_line(res, "was written with a global batch of 32, this run has 16")
    fix = line.split("; ")[1].split(" make it")[0].split()  # (settings that make it on this run's ranks)
    assert fix == ["--set", "train.batch.global_batch_size=32", "--set", "train.batch.local_batch_size=8"], \
        line
    assert "(8 x backward_passes_per_step 4 x 1 data-parallel rank)" in line, line
    res = pretrain(bert_data, run, steps=4)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]
    assert "the layout changed from 2 data-parallel replicas x k=2 to 1 x k=4, the global batch of 32 kept" \
        in res.stdout, res.stdout[-3000:]


@pytest.mark.parametrize("rank1,key,launcher", [
    (["--set", "train.optim.lr=0.5"], "train.optim.lr is 0.005 on rank 0 but 0.5 on rank 1", "mpi"),
    (["--set", "train.schedule.total_steps=3"], "train.schedule.total_steps is 2 on rank 0 but 3 on rank 1",
     "gloo"),
    (["--set", "model=mini"], "model is 'tiny' on rank 0 but 'mini' on rank 1", "gloo"),
])
def test_ranks_given_different_settings_stop_together_with_one_line(rank1, key, launcher, bert_data,
                                                                    tmp_path):
    """Before any rank builds a model, the ranks compare their resolved settings: a difference
    (another learning rate trained silently, another horizon hung rank 0, another model gave
    Horovod's broadcast traceback) is one line naming the keys and ranks, exit 2, no hang."""
    from hvd_bert.cluster import launch

    run = tmp_path / "run"
    res = launch.run([str(Path(__file__).parent / "workers" / "per_rank_args.py"), json.dumps({"1": rank1}),
                      "pretrain", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
                      "--set", "max_predictions_per_seq=10", "--set", "train.schedule.total_steps=2",
                      "--set", f"train.output_dir={run}", "--set", "progress=false",
                      "--set", "train.batch.local_batch_size=8"], np=2, launcher=launcher, timeout=180)
    out = res.stdout + res.stderr
    assert not res.ok and not res.timed_out, res.explain()
    line = "the ranks were given different settings: " + key
    assert out.count(line) == 2, out[-3000:]  # every rank says it (hvd-bert launch prints it once)
    # (horovodrun adds its own traceback for a rank that exits non-zero; the ranks print none)
    assert "<stderr>:Traceback" not in out and (launcher == "gloo" or "Traceback" not in out), out[-3000:]
    assert not run.exists()


@pytest.fixture(scope="module")
def exported(bert_data, tmp_path_factory):
    """A 2-step run's weights as a Hugging Face folder and a portable .npz (real exports)."""
    root = tmp_path_factory.mktemp("exported")
    assert pretrain(bert_data, root / "run").returncode == 0
    for fmt, out in (("hf", root / "hf"), ("npz", root / "w.npz")):
        res = subprocess.run([*HVD_BERT, "convert", str(root / "run"), "--to", fmt, "--output", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
    return root


def damaged_copy(exported, tmp_path, name):
    import shutil

    src = exported / name
    dst = tmp_path / name
    (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
    return dst


def convert(src, tmp_path):
    out = tmp_path / "out.npz"
    res = subprocess.run([*HVD_BERT, "convert", str(src), "--output", str(out)], capture_output=True,
                         text=True, timeout=60)
    assert not out.exists() or res.returncode == 0
    return res


def set_safetensors_dtype(path: Path, tensor: str, dtype: str) -> None:
    """Rewrite one tensor's dtype in a safetensors header (same byte size: the data stays)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header[tensor]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    path.write_bytes(raw[:8] + text + raw[8 + n:])


@pytest.mark.parametrize("damage,words", [
    ("I32 data", ["bert.embeddings.word_embeddings.weight is stored as int32", "floating point"]),
    ("hidden_size", ["does not match config.json", "hidden size 64"]),
    ("num_hidden_layers=10**6", ["num_layers must be an integer in [1, 1000], got 1000000"]),
    ("num_hidden_layers=3", ["does not match config.json (3 layers", "the file has layers 0..1"]),
    ("num_attention_heads=0", ["num_heads must be an integer in [1, 4096], got 0"]),
    ("NaN weights", ["holds NaN or infinite values"]),
    ("num_hidden_layers=None", ["num_hidden_layers is None, not an integer"]),
    ("hidden_size='768'", ["hidden_size is '768', not an integer"]),
])
def test_a_hugging_face_folder_that_lies_is_refused(damage, words, exported, tmp_path):
    """The weights are checked against their declared dtype and values and against the config,
    before anything is written (a config 10**9 layers deep used to hang)."""
    hf = damaged_copy(exported, tmp_path, "hf")
    cfg = json.loads((hf / "config.json").read_text())
    if damage == "I32 data":
        set_safetensors_dtype(hf / "model.safetensors", "bert.embeddings.word_embeddings.weight", "I32")
    elif damage == "NaN weights":
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(hf / "model.safetensors"))
        tensors["bert.encoder.layer.0.output.dense.weight"][:] = float("nan")
        save_file(tensors, str(hf / "model.safetensors"), metadata={"format": "pt"})
    elif damage == "hidden_size":
        cfg.update(hidden_size=64, intermediate_size=256)
    else:
        key, value = damage.split("=")
        cfg[key] = eval(value)  # noqa: S307  (the test's own literal)
    (hf / "config.json").write_text(json.dumps(cfg))
    one_line(convert(hf, tmp_path), *words)


@pytest.mark.parametrize("damage,words", [
    ("bad JSON", ["BERT config is damaged"]),
    ("unknown key", ["BERT config has a key hvd_bert does not know"]),
    ("int weights", ["is stored as int64"]),
])
def test_a_portable_weights_file_that_lies_is_refused(damage, words, exported, tmp_path):
    import numpy as np

    with np.load(exported / "w.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    raw = json.loads(arrays["__bert_config__"].tobytes())
    if damage == "bad JSON":
        arrays["__bert_config__"] = np.frombuffer(b'{"vocab_size": 1', np.uint8)
    elif damage == "unknown key":
        arrays["__bert_config__"] = np.frombuffer(json.dumps({**raw, "rope": True}).encode(), np.uint8)
    else:
        arrays["pooler.bias"] = arrays["pooler.bias"].astype(np.int64)
    np.savez(tmp_path / "w.npz", **arrays)
    one_line(convert(tmp_path / "w.npz", tmp_path), *words)


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_a_sidecar_that_claims_more_records_than_the_shards_hold_is_named(framework, bert_data, tmp_path):
    """PyTorch raised ``generator raised StopIteration``, TensorFlow trained on silently."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    meta = json.loads((data / "dataset.json").read_text())
    shard = meta["shards"][0]
    held = shard["records"]
    shard["records"] += 1000
    meta["total_records"] += 1000
    (data / "dataset.json").write_text(json.dumps(meta))
    res = pretrain(data, tmp_path / "run", "--framework", framework, steps=200)
    one_line(res, f"{data / shard['file']} holds {held} records, but {data / 'dataset.json'} says "
                  f"{held + 1000}", "prepare the data again")


def hvd_bert(*args, timeout=120):
    return subprocess.run([*HVD_BERT, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("damage,words", [
    ("a token twice", ["has the token 'the' twice (lines", "each token once"]),
    ("tokenizer.json without its vocab", ["WordPiece model has no vocab of token -> id"]),
    ("tokenizer.json whose model is a list", ["model is a JSON list, not an object"]),
    ("a NUL byte in the table", ["looks binary (a NUL byte at offset", "UTF-16"]),
])
def test_a_bad_vocabulary_or_table_is_one_line_and_nothing_is_written(damage, words, bert_data, tmp_path):
    vocab = bert_data / "vocab.txt"
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\nhello world\t1\nbye now\t0\n")
    if damage == "a token twice":
        vocab = tmp_path / "vocab.txt"
        vocab.write_text((bert_data / "vocab.txt").read_text() + "the\n")
    elif damage.startswith("tokenizer.json"):
        vocab = tmp_path / "tokenizer.json"
        model = [1, 2] if "list" in damage else {"type": "WordPiece", "unk_token": "[UNK]"}
        vocab.write_text(json.dumps({"model": model}))
    else:
        table.write_bytes(b"sentence\tlabel\nhello\x00world\t1\nbye now\t0\n")
    res = hvd_bert("prepare-classification", table, "--output", tmp_path / "out", "--vocab", vocab,
                   "--text-a", "sentence", "--label", "label")
    line = one_line(res, *words)
    assert "documents" not in line and not (tmp_path / "out").exists()


def test_a_sidecar_of_the_wrong_shape_and_a_batch_no_rank_can_fill_are_one_line(bert_data, tmp_path):
    import shutil

    run = tmp_path / "run"
    one_line(pretrain(bert_data, run, "--set", "train.batch.local_batch_size=1000000000000"),
             "fewer than one local batch of 1000000000000")
    assert not run.exists()  # refused before the run folder was touched
    data = tmp_path / "data"
    shutil.copytree(bert_data, data)
    meta = json.loads((data / "dataset.json").read_text())
    for damage, words in (({"shards": {"a": 1}}, "'shards' is dict, not a list"),
                          ({"shards": [{"file": "../dataset.json", "records": 1}]},
                           "shard 0's file '../dataset.json' is not a file name"),
                          ({"max_seq_length": "64"}, "'max_seq_length' is '64', not a count")):
        (data / "dataset.json").write_text(json.dumps({**meta, **damage}))
        one_line(pretrain(data, run), f"{data / 'dataset.json'} is damaged: {words}",
                 "prepare the data again")
    assert not run.exists()


def test_ncf_data_whose_ids_exceed_its_counts_is_refused(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    (tmp_path / "ratings.dat").write_text("".join(
        f"{u}::{i}::4::{t}\n" for t, (u, i) in enumerate({(int(u), int(i)) for u, i in zip(
            rng.integers(1, 60, 4000), rng.integers(1, 400, 4000))})))
    res = hvd_bert("prepare-ncf", "--movielens", tmp_path / "ratings.dat", "--output", tmp_path / "ncf")
    assert res.returncode == 0, res.stderr
    npz = tmp_path / "ncf" / "ncf.npz"
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n_items = json.loads((tmp_path / "ncf" / "dataset.json").read_text())["n_items"]
    arrays["train_items"][0] = n_items + 5
    with open(npz, "wb") as f:  # (keeps its size: the sidecar records it)
        np.savez(f, **arrays)
    res = hvd_bert("ncf", "--set", f"data={tmp_path / 'ncf'}", "--set",
                   f"train.output_dir={tmp_path / 'run'}")
    one_line(res, f"train_items holds id {n_items + 5}, outside the {n_items}")
    assert not (tmp_path / "run").exists()


def test_a_batch_that_does_not_fit_in_memory_is_named_with_the_fix(bert_data, tmp_path):
    """Under an address-space limit (prlimit), BERT-Mini's batch of 800 cannot be allocated."""
    import shutil

    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    res = subprocess.run(["prlimit", "--as=5000000000", *HVD_BERT, "pretrain", "--set", f"data={bert_data}",
                          "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10",
                          "--set", "train.schedule.total_steps=2",
                          "--set", f"train.output_dir={tmp_path}/run",
                          "--set", "progress=false", "--set", "train.batch.local_batch_size=800",
                          "--set", "model=mini"], capture_output=True, text=True, timeout=240)
    one_line(res, "out of memory for this batch (an allocation of", "MB failed)",
             "lower train.batch.local_batch_size")


def test_a_prepared_folder_with_a_planted_vocab_link_is_written_beside_it_not_through_it(bert_data, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "vocab.txt").symlink_to(victim)
    table = tmp_path / "t.tsv"
    table.write_text("sentence\tlabel\nhello world\t1\nbye now\t0\n")
    res = hvd_bert("prepare-classification", table, "--output", out, "--vocab", bert_data / "vocab.txt",
                   "--text-a", "sentence", "--label", "label")
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "keep\n" and not (out / "vocab.txt").is_symlink()
    assert (out / "vocab.txt").read_bytes() == (bert_data / "vocab.txt").read_bytes()


@pytest.mark.parametrize("task", [
    '{"task": "squad", "labels": 5}', '["classification"]', '{"task": "poetry"}',
    '{"task": "classification", "labels": ["a", "b"], "max_seq_length": "128"}'])
def test_a_damaged_task_record_is_named(task, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "task.json").write_text(task)
    (tmp_path / "in.tsv").write_text("sentence\nhello\n")
    one_line(hvd_bert("predict", run, tmp_path / "in.tsv"), f"{run / 'task.json'} is damaged (")
    assert not (tmp_path / "in.tsv.predictions.jsonl").exists()


def test_a_damaged_best_record_stops_the_resume_with_the_fix(bert_data, tmp_path):
    rows = "".join(f"{w} {w} film\t{'pos' if i % 2 else 'neg'}\n" for i, w in enumerate(["good", "bad"] * 40))
    (tmp_path / "t.tsv").write_text("sentence\tlabel\n" + rows)
    assert hvd_bert("prepare-classification", tmp_path / "t.tsv", "--output", tmp_path / "cls", "--vocab",
                    bert_data / "vocab.txt", "--text-a", "sentence", "--label", "label",
                    "--max-seq-length", "16").returncode == 0

    def finetune(steps):
        return hvd_bert("finetune", "--set", f"data={tmp_path / 'cls'}",
                        "--set", f"eval_data={tmp_path / 'cls'}",
                        "--set", f"train.output_dir={tmp_path / 'run'}", "--set", "eval_every=2",
                        "--set", f"train.schedule.total_steps={steps}", "--set", "progress=false",
                        "--set", "train.batch.local_batch_size=8", timeout=240)
    assert finetune(2).returncode == 0
    (tmp_path / "run" / "best.json").write_text('{"metric": "eval_accuracy", "score": "high"}')
    one_line(finetune(4), f"{tmp_path / 'run' / 'best.json'} is damaged", "delete it to resume")
