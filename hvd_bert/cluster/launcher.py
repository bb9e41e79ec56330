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

import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Sequence

from hvd_bert.cluster import launch
from hvd_bert.cluster.resources import descriptor_problem, memory_problem, scratch_problem
from hvd_bert.jobs import JOBS
from hvd_bert.stop import (EXIT_INTERRUPTED, EXIT_LOST_RANK, EXIT_STALLED, EXIT_STOPPED, EXIT_USER, STOP,
                           StopSignal)

__all__ = ["launch_job", "default_launcher", "MPI_COMMANDS"]

# commands whose ranks share their work through MPI itself (mpi4py), not Horovod: mpirun only
MPI_COMMANDS = ("prepare-bert", "prepare-squad")

# a rank's line as horovodrun ("[1]<stdout>:text") and mpirun --tag-output ("[1,1]<stdout>:text") tag it
_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
_USER_ERROR = re.compile(r"^hvd-bert( [a-z-]+)?: ")  # (a user's script under the toolkit: "hvd-bert: ")
_WAITED = "stopped because another rank failed"
_SHELL_REPORTS = ("Terminated", "Killed")  # what a shell prints of a child ended by SIGTERM / SIGKILL
_SAVED = "stopped by a signal at step"  # (rank 0's last line: its checkpoint is complete; jobs.run_folder)
_STALL_SEEN = "stalled:"  # (a rank's stall line: the first one printed is the one that says who)
# mpirun's report of a rank that died by a signal
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
# what horovodrun and mpirun print about a rank's exit status
_EXIT = (re.compile(r"Process (\d+) exit with status code (\d+)"), re.compile(r"Exit code:\s+(\d+)"))
_MPI_RANK = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]")  # (mpirun's, before its "Exit code:")
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
    """Run ``hvd-bert JOB...`` (or a user's ``python SCRIPT ARGS...``) on ``np`` ranks; the exit
    status (``hvd_bert.stop``'s table; see the module docstring)."""
    if np < 1:
        return _fail(err, f"-np must be at least 1, got {np}")
    if job and job[0] in MPI_COMMANDS:
        if launcher == "gloo" or (launcher is None and default_launcher() != "mpi"):
            return _fail(err, f"{job[0]}'s ranks share the work through MPI: it runs under mpirun (--mpi); "
                              f"install OpenMPI (mpirun) if it is missing")
        launcher = "mpi"
    launcher = launcher or default_launcher()
    if hosts is None and launcher == "mpi":
        try:
            hosts = launch.hosts_from_env()
        except ValueError as e:
            return _fail(err, str(e))
    local = np if not hosts else _local_slots(hosts, np)
    problem = (_grace_problem() or scratch_problem() or memory_problem(local)
               or (descriptor_problem(local) if launcher == "mpi" else None))
    if problem:
        return _fail(err, problem)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if local > cores:  # (said, not refused: a test of a 4-rank layout on a laptop is legitimate)
        print(f"hvd-bert launch: warning: {local} ranks on this machine's {cores} cores are oversubscribed: "
              f"each rank gets less than a core, so a step is slower than with {cores}; the global batch is "
              f"local batch x backward_passes_per_step x {np} ranks (set train.batch.global_batch_size to "
              f"keep it)", file=err, flush=True)
    python, argv = rank_command(job)
    if STOP.requested:  # (a signal while this launcher started: hvd_bert.cli installs STOP first)
        return _fail(err, "stopped by a signal before the job started: nothing ran, nothing to save; run the "
                          "same command again to start it", EXIT_STOPPED)
    import tempfile

    statuses = tempfile.mkdtemp(prefix="hvd-bert-status-")  # (a user script's own exit statuses)
    try:
        return _run(argv, np, launcher, hosts, nic, python, job, statuses, out, err)
    finally:
        shutil.rmtree(statuses, ignore_errors=True)


def _own_statuses(folder: str) -> dict[str, int]:
    """``{rank: status}`` of the ranks whose script exited with a status of its own
    (:mod:`hvd_bert.cluster.run_script` writes them)."""
    found = {}
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name)) as f:
                found[name.removeprefix("rank-")] = int(f.read())
        except (OSError, ValueError):
            pass
    return found


def _run(argv, np, launcher, hosts, nic, python, job, statuses, out, err) -> int:
    from hvd_bert.cluster.processes import TAGGED
    from hvd_bert.cluster.run_script import OWN_STATUS

    cmd = launch.command(argv, np=np, launcher=launcher, hosts=hosts, nic=nic, python=python,
                         extra_env=(TAGGED, OWN_STATUS))  # (each line tagged here: the ranks add none)
    if launcher == "mpi":
        cmd.insert(cmd.index("-np"), "--tag-output")
    # The job in a session of its own: a terminal's Ctrl-C reaches this launcher alone, which passes
    # it to each rank once (mpirun, given it, would kill the ranks a second later); if this
    # launcher dies, the child launcher gets SIGTERM and passes it on.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
                            env={**launch.mpi_env(), TAGGED: "1", OWN_STATUS: statuses},
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=_die_with_parent)
    # lines end at "\n" only: a "\r" (a progress bar's redraw) stays inside its line (_last_frame)
    output = _lines_until_exit(proc)
    state = _Stop(proc, argv, _grace_s())
    errors_seen: set[str] = set()
    in_error: set[str] = set()  # ranks whose error message goes on over more lines
    codes: list[int] = []
    lost: list[tuple[str, int]] = []  # (rank, signal) of ranks that died by a signal
    exits: list[tuple[str | None, int]] = []  # (rank, status) of ranks that exited non-zero themselves
    mpi_rank = None
    import psutil  # noqa: F401  (here, not in the handler: a second signal during the import
    # would find psutil half-imported, the handler would raise, and the job would never hear)
    before = {sig: signal.signal(sig, state.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    if STOP.requested:  # (one came between the start of the job and these handlers: relay it now)
        state.handle(signal.SIGTERM, None)
    try:
        for line, tag in _pieces(output):
            if tag is None:  # the launcher's own line
                hits = [x for p in _EXIT if (x := p.search(line))]
                found = [int(x.group(x.re.groups)) for x in hits]
                if (named := _MPI_RANK.search(line)) is not None:
                    mpi_rank = named.group(1)  # (mpirun names the rank, then its exit code)
                exits += [(x.group(1) if x.re.groups == 2 else mpi_rank, int(x.group(x.re.groups)))
                          for x in hits if int(x.group(x.re.groups)) not in (0, 130, 143)]
                codes += found
                if (died := _SIGNALLED.search(line)) is not None:
                    lost.append((died.group(1), int(died.group(2))))
                if not found and not died and not _LAUNCHER_NOISE.search(line) and line.strip():
                    print(line, file=out, flush=True)
                continue
            (rank, stream), text = tag, _last_frame(line)
            if _USER_ERROR.match(text) or (rank in in_error and text[:1].isspace()):
                in_error.add(rank)
                if _WAITED in text or text in errors_seen or (_STALL_SEEN in text and errors_seen):
                    continue  # the rank that failed says why; the same error (and its hint) once
                errors_seen.add(text)
                print(text, file=err, flush=True)
                continue
            in_error.discard(rank)
            if text.strip() in _SHELL_REPORTS and (errors_seen or codes):
                continue  # (horovodrun's shell on a rank it ended: the job's own line says why)
            if text.startswith(_SAVED):
                state.saved = True  # (a second signal from now on kills ranks that already saved)
            if text.strip():
                print(f"[{rank}] {text}", file=err if stream == "stderr" else out, flush=True)
    finally:
        rc = proc.wait()
        state.cancel()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    # (a user's script's text never decides the status: only its ranks' exit statuses do)
    toolkit = bool(job) and (job[0] in JOBS or job[0] in MPI_COMMANDS)
    return _status(rc, codes, lost, errors_seen if toolkit else set(), state, err, exits,
                   _own_statuses(statuses))


def _status(rc: int, codes: list[int], lost: list, errors_seen: set, state, err, exits=(),
            own_status: dict | None = None) -> int:
    """The launch's exit status from the child launcher's, the ranks' and what was seen: a rank
    that exited with a status of its own (a user's script's ``sys.exit(7)``) is named with it, and
    the launch exits with it; the ranks the launcher then ended are not "lost"."""
    if state.killed:  # (ranks that had said their checkpoint was complete: stopped with it, status 3)
        return _fail(err, state.killed, EXIT_STOPPED if state.saved else EXIT_INTERRUPTED)
    said = own_status or {}  # (a status a script gave itself, as 137, is not a signal)
    if said and not state.signalled:  # (a user's script's status is its own, whatever the toolkit's 2-5 mean)
        rank = min(said, key=lambda r: int(r) if r.isdigit() else 0)
        return _fail(err, f"rank {rank} exited with status {said[rank]} (its own output above says why), so "
                          f"the job stopped; the launch exits with the same status", said[rank])
    if EXIT_STALLED in codes or rc == EXIT_STALLED or _stall(errors_seen):
        return EXIT_STALLED
    if EXIT_INTERRUPTED in codes or rc == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED
    if EXIT_USER in codes or (rc != 0 and errors_seen):
        return EXIT_USER
    if EXIT_STOPPED in codes or rc == EXIT_STOPPED or (state.signalled and rc in (143, 130, -15, -2)):
        if EXIT_STOPPED not in codes and rc != EXIT_STOPPED:  # (stopped before its loop could save)
            _fail(err, "stopped by a signal during start-up, before training began: nothing to save; run the "
                       "same command again to start (exit status 3)")
        return EXIT_STOPPED
    own = [(r, c) for r, c in exits if 0 < c < 256 and (_signal_of(c) is None or said.get(r) == c)
           and c not in (EXIT_USER, EXIT_STOPPED)]
    if own and not state.signalled:
        rank, code = own[0]
        if code not in (EXIT_LOST_RANK, EXIT_STALLED):
            who = f"rank {rank}" if rank is not None else "a rank"
            return _fail(err, f"{who} exited with status {code} (its own output above says why), so the job "
                              f"stopped; the launch exits with the same status", code)
    gone = [(r, s) for r, s in lost if s != signal.SIGTERM or not state.signalled]
    dead = [c for c in codes if _signal_of(c) is not None and c not in said.values()]
    if gone or (dead and not state.signalled):
        rank, sig = gone[0] if gone else (None, _signal_of(dead[0]))
        name = signal.Signals(sig).name if sig in {s.value for s in signal.Signals} else f"signal {sig}"
        why = " (kill -9, or the out-of-memory killer: see dmesg)" if sig == signal.SIGKILL else ""
        who = f"rank {rank}" if rank is not None else "a rank"
        return _fail(err, f"{who} was lost: it was killed by {name}{why}, so the job stopped; the last "
                          f"complete checkpoint is intact: run the same command again to resume from it",
                     EXIT_LOST_RANK)
    if rc in (0, 2, 3):
        return rc
    return codes[0] if codes and codes[0] else rc


def _signal_of(code: int) -> int | None:
    """The signal an exit status reports (a launcher's -N, or a shell's 128 + N for the 64 signals
    Linux has), or None for a status a process gave itself (``sys.exit(255)`` is not a signal)."""
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + 64 else None


def _stall(errors_seen: set) -> bool:
    return any(_STALL_SEEN in e for e in errors_seen)


def _fail(err, line: str, status: int = EXIT_USER) -> int:
    print(f"hvd-bert launch: {line}", file=err, flush=True)
    return status


def rank_command(job: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(interpreter, argv)`` a rank runs: a built-in job as ``python -m hvd_bert JOB ...``, a
    user's ``python SCRIPT ...`` (or ``SCRIPT.py ...``) with this interpreter, or with the one a
    path names (``/opt/py/bin/python3 SCRIPT``)."""
    job = list(job)
    if job and (job[0] in JOBS or job[0] in MPI_COMMANDS):
        return None, ["-m", "hvd_bert", *job]
    if job and re.fullmatch(r"python[0-9.]*", job[0].rsplit("/", 1)[-1]):
        # a bare python: this interpreter (the one hvd_bert is installed in), as torchrun does
        bare = "/" not in job[0]
        python, job = (sys.executable if bare else shutil.which(job[0]) or job[0]), job[1:]
    else:
        python = sys.executable
    if job[:1] == ["-c"]:
        return python, job
    return python, ["-m", "hvd_bert.cluster.run_script", *job]  # (its lines whole: run_script)


def _local_slots(hosts: str, np: int) -> int:
    import socket

    here = {"localhost", "127.0.0.1", socket.gethostname()}
    slots = [h.rsplit(":", 1) for h in hosts.split(",") if h]
    # (none here: a launcher of its own, as the MPI Operator's launcher pod)
    return min(np, sum(int(s[1]) if len(s) > 1 and s[1].isdigit() else 1 for s in slots if s[0] in here))


def _grace_s() -> float:
    """Seconds the ranks get to save and stop after a signal (HVD_BERT_STOP_GRACE_S, default 600;
    checked before the job starts: :func:`_grace_problem`)."""
    return float(os.environ.get("HVD_BERT_STOP_GRACE_S", "600"))


def _grace_problem() -> str | None:
    """Why HVD_BERT_STOP_GRACE_S cannot be the grace period: not a number of seconds from 1 to a
    week (a typo would otherwise leave a stuck job 600 s, or kill a saving one after 1 s)."""
    text = os.environ.get("HVD_BERT_STOP_GRACE_S")
    if text is None:
        return None
    try:
        ok = 1 <= float(text) <= 7 * 86400
    except ValueError:
        ok = False
    return None if ok else (f"HVD_BERT_STOP_GRACE_S={text!r} is not a grace period: give the seconds the "
                            f"ranks get to save and stop after a signal, from 1 to 604800 (default 600)")


def _die_with_parent() -> None:
    """(In the child launcher, before exec) SIGTERM when this launcher dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the job then outlives a killed launcher
        pass


class _Stop:
    """The launcher's stop: the first SIGTERM or SIGINT goes to the ranks (they save and stop,
    status 3); if they have not stopped after ``grace`` seconds, or a second signal comes (later
    than ``StopSignal.REPEAT_S``), the whole job is killed (status 130)."""

    def __init__(self, proc: subprocess.Popen, argv: list[str], grace: float):
        self.proc, self.argv, self.grace = proc, argv, grace
        self.signalled, self.killed, self.first_at, self.timer = False, "", 0.0, None
        self.saved = False  # (the ranks said their checkpoint is complete: they are on their way out)
        self.victims: list = []  # (the ranks killed: the launcher returns once they are gone)

    def handle(self, sig, _frame) -> None:
        import threading
        import time

        now = time.monotonic()
        if not self.signalled:
            self.signalled, self.first_at = True, now
            _stop(self.proc, sig, self.argv)
            why = (f"the ranks did not stop within {self.grace:g} s of the signal (HVD_BERT_STOP_GRACE_S): "
                   f"killed")
            self.timer = threading.Timer(self.grace, self.kill, (why,))
            self.timer.daemon = True
            self.timer.start()
        elif now - self.first_at >= StopSignal.REPEAT_S:
            self.kill("interrupted again while the ranks were exiting after their checkpoint (the stop line "
                      "above, exit status 3): they were killed at once" if self.saved else
                      "interrupted again: the job was killed at once, without a new checkpoint")

    def kill(self, why: str) -> None:
        if self.proc.poll() is not None:
            return
        self.killed = (f"{why}; the last complete checkpoint is intact: run the same command again to resume "
                       f"from it")
        self.victims = _ranks(self.proc, self.argv)
        for p in self.victims:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - (psutil.Error: already gone)
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def cancel(self) -> None:
        """(At the end) no more kills; the killed ranks are gone before the launcher says so (a
        stopped process, or one on a busy machine, takes a moment to die after SIGKILL)."""
        import psutil

        if self.timer is not None:
            self.timer.cancel()
        psutil.wait_procs(self.victims, timeout=30)


def _ranks(proc: subprocess.Popen, argv: list[str]) -> list:
    """The job's ranks on this machine: the launcher's descendants running ``argv`` (a rank's
    forked workers left out: they are the rank's to stop)."""
    import psutil

    try:
        job = [p for p in psutil.Process(proc.pid).children(recursive=True) if _is_rank(p, argv)]
    except psutil.Error:
        return []
    pids = {p.pid for p in job}
    out = []
    for p in job:
        try:
            if p.ppid() not in pids:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _stop(proc: subprocess.Popen, sig: int, argv: list[str]) -> None:
    """A signal to the launcher goes to the job's ranks on this machine, as SLURM and torchrun
    deliver it: each saves a checkpoint and the ranks stop together (status 3). mpirun would
    kill them a second after passing it on (odls_base_sigkill_timeout), before a large model's
    checkpoint is written. Ranks only on other hosts: the launcher passes it on."""
    ranks = _ranks(proc, argv)  # (a handler must not raise: it would end the launcher's reading of the job)
    for p in ranks:
        try:
            p.send_signal(sig)
        except Exception:  # noqa: BLE001 - (psutil.Error: gone)
            pass
    if not ranks and proc.poll() is None:
        proc.send_signal(sig)


def _is_rank(p, argv: list[str]) -> bool:
    try:
        cmd = p.cmdline()
    except Exception:  # noqa: BLE001 - (psutil.Error: gone, or not ours to read)
        return False
    return cmd[1:1 + len(argv)] == argv and "hvd_bert.cluster.horovodrun" not in cmd


def _last_frame(text: str) -> str:
    """What a terminal would show of a line that redraws itself (a progress bar such as Keras'
    writes ``\\b`` and ``\\r`` between its frames, and a newline only at the end): its last frame."""
    if "\r" not in text and "\b" not in text:
        return text
    frames = [f for f in text.replace("\b", "").split("\r") if f.strip()]
    return frames[-1] if frames else ""


def _lines_until_exit(proc, quiet_s: float = 2.0):
    """The child launcher's output as lines ending at ``"\n"`` (decoded as UTF-8, a byte that is
    not replaced), until its pipe ends, or until the launcher has exited and ``quiet_s`` seconds
    pass without output: a process a rank started and left running (``subprocess.Popen`` without
    a wait) keeps the pipe open, and the launch must not wait for it."""
    import codecs
    import select
    import time

    fd, decoder = proc.stdout.fileno(), codecs.getincrementaldecoder("utf-8")("replace")
    pending, quiet_since = "", None
    while True:
        ready, _, _ = select.select([fd], [], [], 0.25)
        chunk = os.read(fd, 65536) if ready else None
        if chunk == b"":
            break
        if chunk:
            quiet_since = None
            pending += decoder.decode(chunk)
            *lines, pending = pending.split("\n")
            yield from (line + "\n" for line in lines)
        elif proc.poll() is not None:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > quiet_s:
                break
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


def _pieces(stream):
    """``(text, (rank, stream) or None)`` of each line. Only the launcher's tag (the first on the
    line) says whose a line is: a later tag of the same rank and stream (mpirun tags each write,
    and a line may come in two) is dropped, and any other is that rank's own text, so a rank's
    output cannot pass for another rank's (the ranks write whole lines: ``hvd_bert.cli`` and
    ``cluster.run_script`` make their output line-buffered)."""
    for raw in stream:
        line = raw.rstrip("\n")
        m = _TAG.search(line)
        if m is None:
            yield line, None
            continue
        if m.start() > 0:
            yield line[:m.start()], None
        yield line[m.end():].replace(m.group(0), ""), (m.group(1), m.group(2))

