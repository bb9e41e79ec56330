"""`hvd-bert pretrain --framework tf` under real `horovodrun -np 2`: the loss falls, metrics,
TensorBoard and checkpoints are written, a second run resumes; SIGTERM to the ranks (what
SLURM sends) saves a checkpoint and the next run resumes from it; phase 2 starts from a
PyTorch phase-1 checkpoint converted with `hvd-bert convert`; 2 ranks x k match 1 rank."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from bert_jobs import TINY, metrics_of
from bert_jobs import pretrain as run_job

from hvd_bert import launch


def pretrain(data, out, *extra, np=2):
    return run_job("tf", data, out, *extra, np=np)


def test_loss_falls_and_outputs_are_written(bert_data, tmp_path):
    out = tmp_path / "run"
    metrics, stdout = pretrain(bert_data, out, "--set", "train.schedule.total_steps=40",
                               "--set", "train.checkpoint_every=20")
    assert "global batch 32 = local batch 8 x backward_passes_per_step 2 x world size 2" in stdout
    assert [m["step"] for m in metrics] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    assert metrics[-1]["mlm_accuracy"] > metrics[0]["mlm_accuracy"]
    assert sorted(p.name for p in out.glob("ckpt-*.tf")) == ["ckpt-00000020.tf", "ckpt-00000040.tf"]
    assert list((out / "tensorboard").iterdir()) and (out / "bert_config.json").is_file()
    metrics2, stdout2 = pretrain(bert_data, out, "--set", "train.schedule.total_steps=50",
                                 "--set", "train.checkpoint_every=20")
    assert "resumed from step 40" in stdout2
    assert [m["step"] for m in metrics2][-2:] == [45, 50]


def test_sigterm_saves_a_checkpoint_and_the_next_run_resumes(bert_data, tmp_path):
    out = tmp_path / "run"
    cmd = launch.command(["-m", "hvd_bert", "pretrain", "--framework", "tf", "--set", f"data={bert_data}",
                          "--set", f"train.output_dir={out}", *TINY, "--set", "train.log_every=1",
                          "--set", "train.schedule.total_steps=100000"], np=2)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=launch.mpi_env(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ((out / "metrics.jsonl").is_file() and len(metrics_of(out)) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.5)
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "pretrain" in " ".join(p.cmdline()) and "horovodrun" not in " ".join(p.cmdline())
                 and os.path.basename(p.cmdline()[0]).startswith("python")]
        assert len(ranks) == 2, [p.cmdline() for p in ranks]
        for p in ranks:  # SLURM signals every task of the step
            p.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-4000:]
    stopped = int(output.split("stopped by a signal at step ")[1].split(";")[0])
    assert stopped >= 3
    assert (out / f"ckpt-{stopped:08d}.tf").is_dir()
    _, stdout = pretrain(bert_data, out, "--set", f"train.schedule.total_steps={stopped + 2}",
                         "--set", "train.log_every=1")
    assert f"resumed from step {stopped}" in stdout
    assert metrics_of(out)[-1]["step"] == stopped + 2


def test_phase_two_from_a_converted_pytorch_checkpoint(bert_data, tmp_path):
    p1 = tmp_path / "p1"
    run_job("pt", bert_data, p1, "--set", "train.schedule.total_steps=20")
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(p1), "--output",
                          str(tmp_path / "p1.npz")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    p2, fresh = tmp_path / "p2", tmp_path / "fresh"
    metrics, stdout = pretrain(bert_data, p2, "--set", "train.schedule.total_steps=10",
                               "--set", f"init_checkpoint={tmp_path / 'p1.npz'}")
    assert "resumed" not in stdout and [m["step"] for m in metrics] == [5, 10]  # optimizer reset
    base, _ = pretrain(bert_data, fresh, "--set", "train.schedule.total_steps=10")
    assert metrics[0]["loss"] < base[0]["loss"] - 0.3  # it started from the trained weights


def test_two_ranks_with_accumulation_match_one_rank_on_the_global_batch(bert_data, tmp_path):
    """As for PyTorch (tests/parallel/test_pt_pretrain.py): the same 32 records per step."""
    common = ["--set", "train.schedule.total_steps=6", "--set", "shuffle_buffer=0", "--set", "dropout=0.0",
              "--set", "record_striding=true", "--set", "train.log_every=1"]
    two, _ = pretrain(bert_data, tmp_path / "two", *common, "--set", "train.batch.backward_passes_per_step=2")
    one, _ = pretrain(bert_data, tmp_path / "one", *common, "--set", "train.batch.backward_passes_per_step=4",
                      np=1)
    assert [m["step"] for m in two] == [m["step"] for m in one] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(two, one):
        assert a["loss"] == pytest.approx(b["loss"], rel=5e-4)
    assert two[-1]["loss"] < two[0]["loss"]
