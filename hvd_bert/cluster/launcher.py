"""``hvd-bert launch``: the toolkit's own launcher, as ``torchrun`` or ``deepspeed`` users expect.

    hvd-bert launch -np 4 -H node1:2,node2:2 -- pretrain --config recipes/bert-large-phase1.yaml

It runs the job under ``mpirun`` (the measured default on CPUs, BENCHMARKS.md "2-rank
training step") or ``horovodrun --gloo`` (``--gloo``; also the fallback without ``mpirun``),
through ``cluster.launch.command`` (so no TensorFlow is imported by the launcher itself), and
passes the ranks' output through, each line once with a ``[rank]`` prefix. What the launchers
add is left out: horovodrun's own traceback when a rank exits non-zero, mpirun's banners, and
the "stopped because another rank failed" lines of the ranks that only waited. A user error
(the job's one line, the same on every rank) is printed once, on stderr. The exit status is
the job's: 2 for a user error, 3 for a run stopped by a signal (rerun to resume), else the
launcher's. ``horovodrun``, ``mpirun`` and ``srun`` keep working as they do.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from typing import Sequence

from hvd_bert.cluster import launch

__all__ = ["launch_job", "default_launcher"]

# a rank's line as horovodrun ("[1]<stdout>:text") and mpirun --tag-output ("[1,1]<stdout>:text") tag it
_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
_USER_ERROR = re.compile(r"^hvd-bert [a-z-]+: ")
_WAITED = "stopped because another rank failed"
# what horovodrun and mpirun print about a rank's exit status
_EXIT = (re.compile(r"Process \d+ exit with status code (\d+)"), re.compile(r"Exit code:\s+(\d+)"))
# the launchers' own report of a rank that exited non-zero (the job's line says it better)
_LAUNCHER_NOISE = re.compile(r"^-{20,}$|^Traceback|^  File |^    |^\S+Error: |Primary job|Per user-direction|"
                             r"mpirun (detected|noticed|has exited)|the job to be terminated|Process name:|"
                             r"Exit code:|exit with status code|Horovod detected that|"
                             r"Terminating remaining workers")


def default_launcher() -> str:
    """``mpi`` where ``mpirun`` is installed (faster on CPUs), else ``gloo``."""
    return "mpi" if shutil.which("mpirun") or _venv_mpirun() else "gloo"


def _venv_mpirun() -> bool:
    try:
        launch.tool_path("mpirun")
        return True
    except (FileNotFoundError, RuntimeError):
        return False


def launch_job(job: Sequence[str], np: int = 2, *, hosts: str | None = None, launcher: str | None = None,
               nic: str | None = None, out=sys.stdout, err=sys.stderr) -> int:
    """Run ``hvd-bert JOB...`` on ``np`` ranks; the job's exit status (see the module docstring)."""
    launcher = launcher or default_launcher()
    cmd = launch.command(["-m", "hvd_bert", *job], np=np, launcher=launcher, hosts=hosts, nic=nic)
    if launcher == "mpi":
        cmd.insert(cmd.index("-np"), "--tag-output")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=launch.mpi_env(), stdin=subprocess.DEVNULL)
    errors_seen: set[str] = set()
    in_error: set[str] = set()  # ranks whose error message goes on over more lines
    codes: list[int] = []
    import psutil  # noqa: F401  (here, not in the handler: a second signal during the import
    # would find psutil half-imported, the handler would raise, and the job would never hear)
    forward = lambda sig, _frame: _stop(proc, sig)  # noqa: E731  (the job saves and stops: status 3)
    before = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for line, tag in _pieces(proc.stdout):
            if tag is None:  # the launcher's own line
                found = [int(x.group(1)) for p in _EXIT if (x := p.search(line))]
                codes += found
                if not found and not _LAUNCHER_NOISE.search(line) and line.strip():
                    print(line, file=out, flush=True)
                continue
            (rank, stream), text = tag, line
            if _USER_ERROR.match(text) or (rank in in_error and text[:1].isspace()):
                in_error.add(rank)
                if _WAITED in text or text in errors_seen:
                    continue  # the rank that failed says why; the same error (and its hint) once
                errors_seen.add(text)
                print(text, file=err, flush=True)
                continue
            in_error.discard(rank)
            if text.strip():
                print(f"[{rank}] {text}", file=err if stream == "stderr" else out, flush=True)
    finally:
        rc = proc.wait()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if 2 in codes or (rc != 0 and errors_seen):
        return 2
    if 3 in codes:
        return 3
    return rc if rc in (0, 2, 3) else (codes[0] if codes and codes[0] else rc)


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """A signal to the launcher goes to the job's ranks on this machine, as SLURM and torchrun
    deliver it: each saves a checkpoint and the ranks stop together (status 3). mpirun would
    kill them a second after passing it on (odls_base_sigkill_timeout), before a large model's
    checkpoint is written. Ranks only on other hosts: the launcher passes it on."""
    import psutil

    ranks = []
    try:  # (a handler must not raise: the exception would end the launcher's reading of the job)
        job = [p for p in psutil.Process(proc.pid).children(recursive=True) if _is_rank(p)]
        pids = {p.pid for p in job}
        ranks = [p for p in job if p.ppid() not in pids]  # (a rank's forked workers: the rank's to stop)
    except psutil.Error:
        pass
    for p in ranks:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass
    if not ranks and proc.poll() is None:
        proc.send_signal(sig)


def _is_rank(p) -> bool:
    try:
        cmd = p.cmdline()
    except Exception:  # (psutil.Error: gone, or not ours to read)
        return False
    return "hvd_bert" in cmd and "hvd_bert.cluster.horovodrun" not in cmd and any(
        "python" in part.rsplit("/", 1)[-1] for part in cmd[:1])


def _pieces(stream):
    """``(text, (rank, stream) or None)`` of each line; a line that holds several ranks' pieces
    (a rank's line written in two parts, another's in between) is cut at each tag."""
    for raw in stream:
        line = raw.rstrip("\n")
        tags = list(_TAG.finditer(line))
        if not tags:
            yield line, None
            continue
        if tags[0].start() > 0:
            yield line[:tags[0].start()], None
        for m, nxt in zip(tags, tags[1:] + [None]):
            yield line[m.end():nxt.start() if nxt else len(line)], (m.group(1), m.group(2))

