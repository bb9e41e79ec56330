"""How a job ends, through the command line: Ctrl-C is a stop like SIGTERM (a checkpoint, one
line, status 3), a second Ctrl-C or a rank that never stops ends it at once (130), a rank
killed by SIGKILL is named (4), a rank that stalls ends the job with one line naming it (5), and
a user's own script runs under ``hvd-bert launch`` with the same rules (hvd_bert.stop's table).
Every case is bounded in time; the job's last complete checkpoint resumes afterwards."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hvd_bert.cluster import launch

HVD_BERT = [sys.executable, "-m", "hvd_bert"]


def job_argv(bert_data, out, *extra, np=2):
    return [*HVD_BERT, "pretrain", *(["-np", str(np)] if np else []), "--set", f"data={bert_data}",
            "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1",
            "--set", "progress=false", "--set", "train.batch.local_batch_size=8",
            "--set", "train.schedule.total_steps=100000", "--set", f"train.output_dir={out}",
            "--set", "train.checkpoint_every=5", *extra]


def start(argv, env=None):
    """The command in a session of its own (its process group is what a terminal signals)."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launch.mpi_env(env or os.environ), start_new_session=True)


def wait_for_steps(proc, out: Path, steps: int, timeout=240) -> None:
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + timeout
    while not metrics.is_file() or len(metrics.read_text().splitlines()) < steps:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


def ranks(proc) -> list:
    """The job's rank processes (``python -m hvd_bert pretrain`` under the launcher)."""
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "pretrain" in cmd and "hvd_bert" in cmd and p.pid != proc.pid and "-np" not in cmd:
            out.append(p)
    return out


def finish(proc, timeout=180):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def clean(stdout: str, stderr: str) -> None:
    for noise in ("Traceback", "KeyboardInterrupt", "Primary job", "Process name", "<stderr>",
                  "mpirun noticed", "oneDNN custom operations", "Could not find cuda drivers"):
        assert noise not in stdout + stderr, (noise, stdout[-2000:] + stderr[-2000:])


def test_ctrl_c_saves_stops_with_status_3_and_the_rerun_resumes(bert_data, tmp_path):
    """SIGINT to a one-process job's process group, as a terminal sends it: it finishes its step,
    saves, and exits 3 with one line; no traceback (under hvd-bert launch: test_launcher.py)."""
    out = tmp_path / "run"
    argv = job_argv(bert_data, out, np=0)
    proc = start(argv)
    wait_for_steps(proc, out, 3)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = finish(proc)
    assert proc.returncode == 3, stdout[-3000:] + stderr[-3000:]
    clean(stdout, stderr)
    stopped = int(stdout.split("stopped by a signal at step ")[1].split(";")[0])
    assert (out / f"ckpt-{stopped:08d}.pt").is_file() and stderr.strip() == ""
    again = subprocess.run([*argv, "--set", f"train.schedule.total_steps={stopped + 1}"], capture_output=True,
                           text=True, timeout=300, env=launch.mpi_env(os.environ))
    assert again.returncode == 0 and f"resumed from step {stopped}" in again.stdout, again.stderr[-3000:]


@pytest.mark.parametrize("how", ["a second Ctrl-C", "the grace period"])
def test_a_job_that_does_not_stop_is_ended_at_once_and_its_last_checkpoint_resumes(how, bert_data, tmp_path):
    """A rank that cannot stop (here: SIGSTOPped, so the others wait for it): a second Ctrl-C,
    or the launcher's grace period (HVD_BERT_STOP_GRACE_S), kills the job with one line and
    status 130; the last complete checkpoint resumes."""
    out = tmp_path / "run"
    env = dict(os.environ, HVD_BERT_STOP_GRACE_S="3")
    proc = start(job_argv(bert_data, out), env=env if how == "the grace period" else None)
    wait_for_steps(proc, out, 6)
    stuck = ranks(proc)[-1]
    stuck.suspend()
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    if how == "a second Ctrl-C":
        time.sleep(1.5)
        os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = finish(proc, timeout=60)
    assert proc.returncode == 130 and time.monotonic() - t0 < 30, stdout[-2000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "the last complete checkpoint is intact" in lines[0], stderr[-3000:]
    assert ("interrupted again" if how == "a second Ctrl-C" else "did not stop within 3 s") in lines[0]
    clean(stdout, stderr)
    assert not psutil.pid_exists(stuck.pid) or stuck.status() == psutil.STATUS_ZOMBIE
    from hvd_bert.train.checkpoint import list_checkpoints

    last = list_checkpoints(out, "shards")[-1][0]  # (2 ranks: sharded; the complete ones)
    again = subprocess.run([*job_argv(bert_data, out), "--set", f"train.schedule.total_steps={last + 1}"],
                           capture_output=True, text=True, timeout=300, env=launch.mpi_env(os.environ))
    assert again.returncode == 0 and f"resumed from step {last}" in again.stdout, again.stderr[-3000:]


def test_a_second_signal_to_a_rank_ends_it_at_once_with_one_line(tmp_path):
    """The rank's side (hvd_bert.stop.STOP): the first SIGINT is a request; a second one more
    than a second later ends the process at once with 130; a repeat within the second (a
    terminal's Ctrl-C and a launcher's relay of it) is the same request."""
    code = ("import os, signal, time; from hvd_bert.stop import STOP; STOP.command = 'hvd-bert pretrain'; "
            "STOP.install(); os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGTERM); "
            "time.sleep(0.1); print('requested', STOP.requested, flush=True); time.sleep(1.2); "
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(30); print('not reached')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 130 and res.stdout.strip() == "requested True", res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "interrupted again" in res.stderr


def test_a_rank_killed_by_sigkill_is_named_with_status_4(bert_data, tmp_path):
    out = tmp_path / "run"
    proc = start(job_argv(bert_data, out))
    wait_for_steps(proc, out, 3)
    ranks(proc)[-1].kill()
    stdout, stderr = finish(proc, timeout=60)
    assert proc.returncode == 4, stdout[-2000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 1 was lost: it was killed by SIGKILL" in lines[0], stderr
    clean(stdout, stderr)


def test_a_stalled_rank_ends_the_job_with_one_line_and_status_5(bert_data, tmp_path):
    out = tmp_path / "run"
    proc = start(job_argv(bert_data, out, "--set", "train.stall_timeout_s=3"))
    wait_for_steps(proc, out, 6)
    ranks(proc)[-1].suspend()
    t0 = time.monotonic()
    stdout, stderr = finish(proc, timeout=90)
    assert proc.returncode == 5 and time.monotonic() - t0 < 60, stdout[-2000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and " stalled: no progress for " in lines[0], stderr
    import re

    kept = re.search(r"the last complete checkpoint \(step (\d+)\) is intact", lines[0])
    assert kept and (out / f"ckpt-{int(kept.group(1)):08d}.shards" / "index.json").is_file()
    assert "train.stall_timeout_s" in lines[0]
    clean(stdout, stderr)


SCRIPT = '''
import sys, time
import horovod.torch as hvd
import torch
import hvd_bert.pt.engine as E
from hvd_bert.config import TrainConfig, apply_overrides

cfg = apply_overrides(TrainConfig(), ["train.schedule.total_steps=40", "train.stall_timeout_s=3",
                                      f"train.output_dir={sys.argv[1]}", "train.log_every=1",
                                      "train.batch.local_batch_size=4", "train.optim.name=lamb"])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)


def loss_fn(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


engine = E.Engine.from_config(model, cfg, loss_fn=loss_fn)


def batches_from(micro_step):
    n = micro_step
    while True:
        if sys.argv[2] == "stall" and hvd.rank() == 1 and n == 10:
            time.sleep(3600)  # a data read that never returns
        n += 1
        yield torch.randn(4, 4), torch.randn(4, 1)


res = E.fit(engine, batches_from, progress=False)
print("script done", res.steps, flush=True)
'''


@pytest.mark.parametrize("case", ["runs", "stall"])
def test_a_users_script_runs_under_hvd_bert_launch(case, tmp_path):
    """``hvd-bert launch -np 2 -- python SCRIPT ARGS`` as ``torchrun`` takes any script: the
    ranks' lines with their prefix, the exit status and one line for a stall (the rank whose
    data read hangs names itself)."""
    script = tmp_path / "my_train.py"
    script.write_text(SCRIPT)
    res = subprocess.run([*HVD_BERT, "launch", "-np", "2", "--", "python", script, tmp_path / "run", case],
                         capture_output=True, text=True, timeout=240, env=launch.mpi_env(os.environ))
    clean(res.stdout, res.stderr)
    if case == "runs":
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        assert "[0] script done 40" in res.stdout and "[1] script done 40" in res.stdout
        assert (tmp_path / "run" / "ckpt-00000040.shards" / "index.json").is_file()  # (2 ranks: sharded)
    else:
        assert res.returncode == 5, res.stdout[-2000:] + res.stderr[-3000:]
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "rank 1 stalled" in lines[0], lines
        assert "reading its next batch" in lines[0], lines
