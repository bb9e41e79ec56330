"""Fault injection on a real 2-rank `hvd-bert pretrain` (PyTorch, a checkpoint every step, so
that kills often land inside a checkpoint write): kill -9 of one rank, of every rank, SIGTERM
to one rank, to every rank, and to the launcher, each at a random moment (seeded), one after
the other on the same run folder. After every fault: the job ends within the time limit (no
hang, no rank left running), every final-named checkpoint loads (weights only) and holds the
step its name says, `metrics.jsonl` is valid JSON with no step logged twice, and the next run
resumes from the newest checkpoint. A last run finishes the job and every step from 1 to the
end is logged exactly once. The figures are printed (`-s` shows them)."""

import json
import os
import random
import re
import signal
import subprocess
import time

import psutil
from bert_jobs import TINY

from hvd_bert.cluster import launch

FAULTS = ["kill -9 rank 1", "kill -9 every rank", "SIGTERM rank 1", "SIGTERM every rank", "SIGTERM launcher",
          "kill -9 rank 0 mid-checkpoint", "kill -9 rank 0"]
END_LIMIT_S = 120


def _ranks(proc):
    return [p for p in psutil.Process(proc.pid).children(recursive=True)
            if "pretrain" in " ".join(p.cmdline()) and "horovodrun" not in " ".join(p.cmdline())
            and os.path.basename(p.cmdline()[0]).startswith("python")]


def _rank_of(p) -> int:
    env = p.environ()
    return int(env.get("HOROVOD_RANK", env.get("OMPI_COMM_WORLD_RANK", "-1")))


def _strict_json(line: str):
    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")
    return json.loads(line, parse_constant=refuse)


def _check_folder(out):
    from hvd_bert.pt.checkpoint import load_checkpoint_file

    names = sorted(out.glob("ckpt-*.pt"))
    for ckpt in names:
        state = load_checkpoint_file(ckpt)
        assert json.loads(state["meta"])["step"] == int(ckpt.stem.split("-")[1]), ckpt
    steps = _logged_steps(out) if (out / "metrics.jsonl").exists() else []
    assert steps == sorted(set(steps)), f"a step logged twice or out of order: {steps}"
    return names, steps


def _logged_steps(out) -> list[int]:
    return [_strict_json(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _last_logged(out) -> int:
    """The newest complete metrics line's step while the job runs (0 before any)."""
    try:
        lines = (out / "metrics.jsonl").read_text().split("\n")[:-1]  # the last may be half-written
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError):
        return 0


def _start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=launch.mpi_env(os.environ), start_new_session=True)


def test_faults_at_random_moments_lose_nothing(bert_data, tmp_path):
    out = tmp_path / "run"
    rng = random.Random(2026)

    def job(total):
        return ["-m", "hvd_bert", "pretrain", "--set", f"data={bert_data}",
                "--set", f"train.output_dir={out}",
                *TINY, "--set", "train.log_every=1", "--set", "train.checkpoint_every=1",
                "--set", "train.keep_checkpoints=2", "--set", f"train.schedule.total_steps={total}",
                # (rank 0's one file and its temporaries; a sharded save killed mid-write:
                # test_sharded_checkpoints.py)
                "--set", "train.checkpoint_format=consolidated"]

    figures, verified, temporaries = [], 0, 0
    for fault in FAULTS:
        newest = sorted(out.glob("ckpt-*.pt"))
        started = time.time()
        proc = _start(launch.command(job(100000), np=2))
        try:
            deadline = time.monotonic() + 300
            while True:  # wait for training: a step logged by this run, past the newest checkpoint
                step = _last_logged(out)
                fresh = (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_mtime > started
                if fresh and step and (not newest or step > int(newest[-1].stem.split("-")[1])):
                    break
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
                time.sleep(0.2)
            ranks = sorted(_ranks(proc), key=_rank_of)
            if fault.endswith("mid-checkpoint"):  # rank 0 writes them: catch it with a .tmp- file open
                until = time.monotonic() + 30
                while not list(out.glob(".ckpt-*.tmp-*")) and time.monotonic() < until:
                    time.sleep(0.002)
            else:
                time.sleep(rng.uniform(0.0, 3.0))
            assert len(ranks) == 2, (fault, [p.cmdline() for p in ranks])
            sig = signal.SIGKILL if fault.startswith("kill -9") else signal.SIGTERM
            one = re.search(r"rank (\d)", fault)
            targets = ([psutil.Process(proc.pid)] if fault.endswith("launcher") else
                       ranks if fault.endswith("every rank") else [ranks[int(one.group(1))]])
            t0 = time.monotonic()
            for p in targets:
                p.send_signal(sig)
            try:
                output, _ = proc.communicate(timeout=END_LIMIT_S)
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
            gone = psutil.wait_procs(ranks, timeout=30)[1] == []
            ended = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert not hung and gone, f"{fault}: the job did not end within {END_LIMIT_S} s (no rank may hang)"
        if newest:
            want = int(newest[-1].stem.split("-")[1])
            found = re.search(r"resumed from step (\d+)", output)
            assert found and int(found.group(1)) >= want, f"{fault}: did not resume:\n{output[-3000:]}"
        names, steps = _check_folder(out)
        verified += len(names)
        temporaries += len(list(out.glob(".ckpt-*.tmp*")))  # a kill mid-write may leave one
        figures.append((fault, round(ended, 1), proc.returncode, steps[-1] if steps else 0, len(names)))

    # the last run: resumes, cleans up half-written temporaries, finishes; each step logged once
    last = int(sorted(out.glob("ckpt-*.pt"))[-1].stem.split("-")[1])
    res = launch.run(job(last + 3), np=2, timeout=300)
    assert res.ok and f"resumed from step {last}" in res.stdout, res.explain()
    names, steps = _check_folder(out)
    verified += len(names)
    assert steps == list(range(1, last + 4)), steps
    assert not list(out.glob(".ckpt-*.tmp*")) and not list(out.glob("*.tmp*"))
    print(f"\nfault injection: {len(figures)} faults, {verified} checkpoint loads verified, "
          f"{temporaries} half-written temporaries seen and removed on resume, {last + 3} steps each "
          f"logged once")
    for fault, ended, rc, step, n in figures:
        print(f"  {fault:20s} ended in {ended:5.1f} s (exit {rc}), logged up to step {step}, {n} checkpoints")


def test_kill_9_of_one_tensorflow_rank_ends_the_job_and_the_rerun_resumes(bert_data, tmp_path):
    """Without elastic training a lost rank must end the whole job in bounded time (the other
    rank is stuck in a collective; Horovod's launcher kills it), the newest checkpoint stays
    whole, and the same command resumes from it. (PyTorch: the test above.)"""
    from hvd_bert.train.checkpoint import list_checkpoints

    out = tmp_path / "run"
    job = ["-m", "hvd_bert", "pretrain", "--framework", "tf", "--set", f"data={bert_data}",
           "--set", f"train.output_dir={out}", *TINY, "--set", "train.log_every=1",
           "--set", "train.checkpoint_every=2", "--set", "train.schedule.total_steps=100000",
           "--set", "train.checkpoint_format=consolidated"]
    proc = _start(launch.command(job, np=2))
    try:
        deadline = time.monotonic() + 300
        ckpts = lambda: list_checkpoints(out, "tf")  # noqa: E731
        while not (ckpts() and _last_logged(out) > ckpts()[-1][0]):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.2)
        ranks = sorted(_ranks(proc), key=_rank_of)
        assert len(ranks) == 2, [p.cmdline() for p in ranks]
        t0 = time.monotonic()
        ranks[1].send_signal(signal.SIGKILL)
        try:
            proc.communicate(timeout=END_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {END_LIMIT_S} s of kill -9 of rank 1") \
                from None
        assert psutil.wait_procs(ranks, timeout=30)[1] == [], "a rank outlived the job"
        ended = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    newest = list_checkpoints(out, "tf")[-1][0]
    killed_at = _last_logged(out)
    rerun = [a if "total_steps" not in a else f"train.schedule.total_steps={newest + 2}" for a in job]
    res = launch.run(rerun, np=2, timeout=300)
    assert res.ok and f"resumed from step {newest}" in res.stdout, res.explain()
    steps = _logged_steps(out)
    assert steps == list(range(1, newest + 3)), steps  # every step logged once, none lost
    print(f"\nTensorFlow, kill -9 of rank 1 at step {killed_at}: the job ended in {ended:.1f} s "
          f"(exit {proc.returncode}); the rerun resumed from step {newest}")
