"""The stall watchdog (hvd_bert.train.watchdog) measures the job's progress, not the wall clock:
a process suspended as a whole (SIGSTOP, as SLURM's suspend sends it) and resumed is never a
stall, however long it was stopped; a phase that makes no progress while the process runs
still is. The clock a test gives it jumps forward as a suspension does (every kernel clock
keeps running while a process is stopped); the last test stops a real process."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hvd_bert.train.watchdog import SUSPEND_SLACK_S, Watchdog


class JumpingClock:
    """The monotonic clock, plus the seconds of the suspensions so far."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def suspend(self, seconds: float) -> None:
        self.offset += seconds


class Recorded(Watchdog):
    """A Watchdog that records the stall it would end the process for."""

    def __init__(self, timeout_s: float, clock):
        super().__init__("hvd-bert pretrain", 0, timeout_s, monotonic=clock)
        self.stalls: list[tuple[str, float]] = []
        self.seen = threading.Event()

    def _stalled(self, phase: str, waited: float) -> None:
        self.stalls.append((phase, waited))
        self.seen.set()
        self.enter(phase)  # (counted afresh, as if the process had gone on; only the first matters)


@pytest.mark.parametrize("phase", ["data", "step", "bookkeeping"])
def test_a_suspension_longer_than_the_timeout_is_not_a_stall(phase):
    clock = JumpingClock()
    dog = Recorded(1.0, clock)
    with dog.running():
        dog.enter(phase)
        time.sleep(0.3)
        clock.suspend(100.0)  # stopped for 100 s in the middle of the phase
        time.sleep(0.5)
        dog.enter("data")
        time.sleep(0.3)
    assert dog.stalls == []
    assert 100.0 - dog.interval - SUSPEND_SLACK_S <= dog.suspended_s <= 100.0


def test_a_phase_entered_right_after_the_resume_does_not_count_the_gap():
    """The loop may move on before the watchdog's thread has woken and seen the gap: the
    clock counts at most ``interval + SUSPEND_SLACK_S`` of it even then."""
    clock = JumpingClock()
    dog = Recorded(100.0, clock)  # (its thread wakes every second)
    with dog.running():
        dog.enter("data")
        clock.suspend(1000.0)
        dog.enter("step")  # before the thread woke
        assert dog.longest["data"] <= dog.interval + SUSPEND_SLACK_S + 0.5
    assert dog.stalls == []


def test_after_a_resume_the_phase_counts_afresh_while_peers_resume():
    """A rank resumed first waits for a peer still stopped: 1.2 s before the suspension and
    1.2 s after it are more than the 2 s timeout together, yet no stall."""
    clock = JumpingClock()
    dog = Recorded(2.0, clock)
    with dog.running():
        dog.enter("data")  # (no grace for waiting on peers: the timeout alone)
        time.sleep(1.2)
        clock.suspend(30.0)
        time.sleep(1.2)
        dog.enter("step")
    assert dog.stalls == []


def test_a_phase_without_progress_while_the_process_runs_is_still_a_stall():
    clock = JumpingClock()
    dog = Recorded(1.0, clock)
    t0 = time.monotonic()
    with dog.running():
        dog.enter("data")
        clock.suspend(50.0)  # a suspension first, then a data read that never returns
        assert dog.seen.wait(10)
    assert time.monotonic() - t0 < 3
    assert dog.stalls[0][0] == "data" and 1.0 < dog.stalls[0][1] < 2.5, dog.stalls


def test_the_clock_never_goes_back_and_counts_running_time():
    clock = JumpingClock()
    dog = Recorded(1.0, clock)
    seen = [dog.clock()]
    with dog.running():
        for i in range(12):
            time.sleep(0.05)
            if i in (3, 7):
                clock.suspend(20.0)
            seen.append(dog.clock())
    assert seen == sorted(seen)
    ran = seen[-1] - seen[0]
    assert 0.5 < ran < 0.6 + 2 * (dog.interval + SUSPEND_SLACK_S), ran


LOOP = textwrap.dedent("""
    import sys
    from hvd_bert.train.watchdog import Watchdog

    dog = Watchdog("hvd-bert pretrain", 0, 1.0)
    with dog.running():
        print("running", flush=True)
        while sys.stdin.readline():  # (a line: the peers' side of the step's collective)
            dog.enter("bookkeeping")
            dog.enter("step")
    print("done", flush=True)
""")


def test_a_real_process_stopped_and_continued_is_not_a_stall():
    """A process that waits on its peers (lines from the test) is SIGSTOPped for 2.5 s, longer
    than its 1 s timeout and the 1 s grace of a phase that waits on peers, then SIGCONTed,
    three times; each time the peers answer half a second after it continues. It goes on and
    ends normally (before the fix, exit status 5 at the first resume)."""
    proc = subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def peers_answer():
        try:
            proc.stdin.write("step\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # (it ended: its status and its line say why, below)

    try:
        assert proc.stdout.readline().strip() == "running"
        for _ in range(3):
            for _ in range(5):
                peers_answer()
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(2.5)
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.5)  # (the peers resume a little later)
            peers_answer()
        stdout, stderr = proc.communicate(timeout=30)  # (closes its input: the loop ends)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and stdout.strip() == "done", stderr
    assert stderr == ""


def test_a_start_up_that_makes_no_progress_ends_the_process_with_one_line():
    """The job's start-up (Horovod joining the ranks, the model, the initial broadcast) is watched
    too, from ``watch_start`` until ``end_start``: a rank that waits there for good (a peer that
    never joins) ends with the stall line and status 5; one that ends its start-up in time runs on."""
    code = textwrap.dedent("""
        import sys, time
        import hvd_bert.train.watchdog as w
        w.START_FLOOR_S = 0.0
        w.watch_start("hvd-bert pretrain", 0.3)
        if sys.argv[1] == "ends":
            w.end_start(); time.sleep(2); print("ran on")
        else:
            time.sleep(20); print("not reached")
    """)
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="1")

    def run(how):
        return subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=60,
                              env=env)

    stuck = run("stuck")
    assert stuck.returncode == 5 and stuck.stdout == "", stuck.stdout + stuck.stderr
    line = stuck.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("hvd-bert pretrain: rank 1 stalled"), line
    assert "starting (joining the other ranks" in line, line
    ran = run("ends")
    assert ran.returncode == 0 and ran.stdout.strip() == "ran on", ran.stdout + ran.stderr
