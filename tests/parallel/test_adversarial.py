"""What a careless user or an attacker can put in hvd_bert's way, through the command line: links
planted in a run folder, full and read-only file systems, damaged logs, lying sidecars, crafted
weights and configs, ranks given different settings. Every case ends in one clear line and exit
status 2 (or, where the toolkit can go on safely, a correct run), writes nothing outside the run
folder, loses no checkpoint, and is bounded in time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HVD_BERT = [sys.executable, "-m", "hvd_bert"]
ROOT = os.geteuid() == 0


def pretrain(bert_data, out, *extra, steps=2, timeout=240):
    return subprocess.run([*HVD_BERT, "pretrain", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
                           "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1",
                           "--set", "progress=false", "--set", "train.batch.local_batch_size=8",
                           "--set", f"train.schedule.total_steps={steps}", "--set", f"train.output_dir={out}",
                           *extra], capture_output=True, text=True, timeout=timeout)


def one_line(res, *words):
    """Exit status 2, one line on stderr holding ``words``, no traceback."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stdout[-2000:] + res.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


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


@pytest.fixture
def finished_run(bert_data, tmp_path):
    run = tmp_path / "run"
    res = pretrain(bert_data, run)
    assert res.returncode == 0, res.stderr
    return run


def test_a_damaged_metrics_log_does_not_stop_a_resume(bert_data, finished_run):
    with open(finished_run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 3, "loss": \xff\xfe\n')  # not UTF-8, cut short
    res = pretrain(bert_data, finished_run, steps=4)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.fixture
def mount_point(tmp_path):
    if not ROOT:
        pytest.skip("mounting a tmpfs or a read-only bind needs root")
    made = []

    def mount(*args, where="mnt"):
        point = tmp_path / where
        point.mkdir(exist_ok=True)
        subprocess.run(["mount", *args, str(point)], check=True, timeout=30)
        made.append(point)
        return point
    yield mount
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], timeout=30)


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
