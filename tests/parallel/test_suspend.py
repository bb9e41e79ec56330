"""A job suspended as a whole and resumed is not a stall (hvd_bert.train.watchdog): every
process of a 2-rank job (the launcher, mpirun or horovodrun, the ranks) SIGSTOPped, as SLURM's
``scontrol suspend`` stops a job, for longer than ``train.stall_timeout_s`` and its grace for
waiting on peers, then SIGCONTed, three times: the job finishes with status 0 and its last
checkpoint. (A rank stopped on its own is still a stall: test_stops.py.)"""

import signal
import time

import psutil
import pytest
from test_stops import clean, finish, job_argv, start, wait_for_steps

TIMEOUT_S = 3  # train.stall_timeout_s: the watchdog's limit is 3 s, 6 s for a phase that waits on peers
STOPPED_S = 9  # longer than either, and than 20 x a step of this job


def whole_job(proc) -> list:
    """The launcher and every process under it (SLURM signals a job's whole cgroup)."""
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


@pytest.mark.parametrize("launcher", ["--mpi", "--gloo"])
def test_a_job_suspended_and_resumed_as_a_whole_finishes(launcher, bert_data, tmp_path):
    out = tmp_path / "run"
    argv = job_argv(bert_data, out, launcher, "--set", f"train.stall_timeout_s={TIMEOUT_S}",
                    "--set", "train.schedule.total_steps=24")
    proc = start(argv)
    try:
        for at in (3, 8, 13):
            wait_for_steps(proc, out, at)
            job = whole_job(proc)
            assert len(job) >= 3, job  # (the launcher and two ranks, at least)
            for p in job:
                p.send_signal(signal.SIGSTOP)
            time.sleep(STOPPED_S)
            for p in job:
                p.send_signal(signal.SIGCONT)
    finally:
        stdout, stderr = finish(proc, timeout=180)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    clean(stdout, stderr)
    assert "stalled" not in stderr and "finished step 24" in stdout, stdout[-2000:] + stderr[-3000:]
    assert (out / "ckpt-00000024.shards" / "index.json").is_file()  # (2 ranks: sharded)
