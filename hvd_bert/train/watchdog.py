"""The stall watchdog: a rank that makes no progress ends the job with one line instead of
hanging it for good.

The loop tells the watchdog which phase it is in (its start: the resume and the broadcast of
the initial weights; reading a batch, the training step with its
allreduce, the step's bookkeeping: metrics, checkpoint, evaluation). A thread checks every
second; when a phase has lasted longer than ``timeout_s``, or ``FACTOR`` times the longest that
phase took so far if that is longer, the rank prints one line naming itself, the phase and the
step, and exits with status 5 (``hvd_bert.stop.EXIT_STALLED``); its launcher then ends the
other ranks. A phase that waits on other ranks (the step's allreduce, the bookkeeping's
collectives) gets ``WAIT_GRACE_S`` more (at most the timeout itself), so that a rank stuck on
its own (a data read that never returns) is the one that reports. The last complete checkpoint
is left as it is: a stalled rank cannot take part in the collectives a new one needs.

The watchdog measures the job's progress, not the wall clock: a job suspended as a whole
(SIGSTOP to every process, as SLURM's ``scontrol suspend`` does) and resumed is never a stall,
however long it was stopped. Every clock the kernel offers keeps running while a process is
stopped (``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` alike), and the process's CPU time also stands
still in a genuine stall (a rank blocked in a collective uses none), so neither tells the two
apart. What does is the checker thread itself: it asks to wake every ``interval`` seconds, and
a running process wakes it about on time. The watchdog's clock (:meth:`Watchdog.clock`) therefore
advances with the monotonic clock, but by at most ``interval + SUSPEND_SLACK_S`` from one wake
of the thread to the next: the rest of a longer gap is time in which the process did not run,
and is not counted. The cap holds between wakes too, so a phase that the loop enters right
after a resume, before the thread has woken, does not count the gap either. A gap also starts
the current phase's count afresh: after a resume the ranks do not continue at the same
instant (the signals reach them one after another, on a cluster from several hosts), and a
rank that waits in a collective for a peer that is not running yet is no more stalled than
before the suspension. The price: a thread that is late by more than ``SUSPEND_SLACK_S`` for
another reason (a machine so loaded that it cannot run for seconds) delays a stall's line
by as long; it never ends a healthy job. A rank stopped on its own (one process SIGSTOPped,
the others running) is still a stall: the ranks that run wait for it and see no gap.
"""

from __future__ import annotations

import os
import threading
import time

from hvd_bert.stop import EXIT_STALLED

__all__ = ["Watchdog", "PHASES", "watch_start", "end_start", "launcher_rank"]

FACTOR = 20.0
WAIT_GRACE_S = 10.0
START_FLOOR_S = 30.0  # the least a start-up is given (it has no earlier time to go by)
SUSPEND_SLACK_S = 2.0  # how late the checker thread may wake before the gap counts as a suspension
# phase -> (what the line says the rank was doing, whether it waits on other ranks)
PHASES = {"start": ("starting (joining the other ranks, building the model, receiving the initial weights or "
                     "resuming the checkpoint: a rank is stuck, or waits for one that is)", True),
          "data": ("reading its next batch (its data or file system is stuck)", False),
          "step": ("in the training step (forward, backward and the gradient allreduce: a rank is stuck, or "
                   "waits for one that is)", True),
          "bookkeeping": ("in the step's bookkeeping (the metrics allreduce, a checkpoint or an evaluation: "
                          "a rank is stuck, or waits for one that is)", True)}


class Watchdog:
    """``with dog.running(): ... dog.enter(phase) ...``; ``timeout_s`` 0 turns it off.
    ``monotonic``: the wall clock it reads (tests give their own)."""

    def __init__(self, command: str, rank: int, timeout_s: float, step=lambda: None, checkpoint=lambda: None,
                 monotonic=time.monotonic):
        self.command, self.rank, self.timeout = command, rank, float(timeout_s)
        self.step, self.checkpoint = step, checkpoint  # (callables: the step and last checkpoint now)
        self.interval = min(1.0, max(0.05, self.timeout / 10))  # how often the thread checks
        self.suspended_s = 0.0  # the gaps not counted so far (a suspended process)
        self._monotonic = monotonic
        self._max_gap = float("inf")  # (no cap while no thread ticks: running() sets it)
        self._tick = (0.0, monotonic())  # (the watchdog clock, the wall clock) at the thread's last wake
        self.longest: dict[str, float] = {}
        self.phase, self.since = None, self.clock()
        self._done = threading.Event()
        self._thread = None

    def clock(self) -> float:
        """Seconds the process ran (see the module docstring): the monotonic clock, advancing at
        most ``interval + SUSPEND_SLACK_S`` past the checker thread's last wake."""
        at, wall = self._tick  # (one tuple: read and written whole, by either thread)
        return at + min(max(self._monotonic() - wall, 0.0), self._max_gap)

    def enter(self, phase: str) -> None:
        now = self.clock()
        if self.phase is not None:
            self.longest[self.phase] = max(self.longest.get(self.phase, 0.0), now - self.since)
        self.phase, self.since = phase, now

    def limit(self, phase: str) -> float:
        floor = START_FLOOR_S if phase == "start" else 0.0
        base = max(self.timeout, FACTOR * self.longest.get(phase, 0.0), floor)
        return base + (min(WAIT_GRACE_S, self.timeout) if PHASES[phase][1] else 0.0)

    def running(self):
        dog = self

        class _Running:
            def __enter__(self):
                if dog.timeout > 0:
                    dog._done.clear()
                    dog._max_gap = dog.interval + SUSPEND_SLACK_S
                    dog._tick = (dog.clock(), dog._monotonic())
                    dog.since = dog.clock()
                    dog._thread = threading.Thread(target=dog._watch, name="hvd_bert-watchdog", daemon=True)
                    dog._thread.start()
                return dog

            def __exit__(self, *exc):
                dog._done.set()
                dog.phase = None
                dog._tick, dog._max_gap = (dog.clock(), dog._monotonic()), float("inf")  # (no thread ticks)
                return False
        return _Running()

    def _wake(self) -> None:
        """The thread woke: the clock takes in the time since its last wake, less a gap in which
        the process did not run; such a gap starts the current phase's count afresh."""
        at, wall = self._tick
        now = self._monotonic()
        gap = max(now - wall, 0.0)
        self._tick = (at + min(gap, self._max_gap), now)
        if gap > self._max_gap:
            self.suspended_s += gap - self._max_gap
            self.since = max(self.since, self._tick[0])  # (peers resume one after another)

    def _watch(self) -> None:
        while not self._done.wait(self.interval):
            self._wake()
            phase = self.phase
            if phase is None:
                continue
            waited = self.clock() - self.since
            if waited > self.limit(phase) and phase == self.phase:
                self._stalled(phase, waited)

    def _stalled(self, phase: str, waited: float) -> None:
        longest = self.longest.get("step")
        seen = f"; its slowest step so far took {longest:.2g} s" if longest else ""
        ckpt = self.checkpoint()
        kept = (f"the last complete checkpoint (step {ckpt}) is intact" if ckpt else
                "no checkpoint was written yet")
        line = (f"{self.command}: rank {self.rank} stalled: no progress for {waited:.0f} s "
                f"{PHASES[phase][0]} at step {self.step()}{seen}; the job stops (exit status "
                f"{EXIT_STALLED}); {kept}: run the same command again to resume, or raise "
                f"train.stall_timeout_s (now {self.timeout:g} s)")
        try:
            os.write(2, (line + "\n").encode())
        except OSError:
            pass
        os._exit(EXIT_STALLED)


_START: list = []  # (the start-up's watchdog's running context, while one runs)
_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as its launcher set it in the environment (before Horovod starts);
    0 when none did."""
    return next((int(v) for k in _RANK_VARS if (v := os.environ.get(k, "")).isdigit()), 0)


def watch_start(command: str, timeout_s: float) -> None:
    """A job's start-up is watched like its steps: from the job's start (before Horovod joins the
    ranks) until :func:`end_start` (the loop's own watchdog takes over, or an evaluation that is
    not watched begins), a rank that makes no progress for ``timeout_s`` ends the job with the
    same line. The rank is the launcher's (Horovod has not started yet)."""
    end_start()
    if timeout_s <= 0:
        return
    dog = Watchdog(command, launcher_rank(), timeout_s)
    watching = dog.running()
    watching.__enter__()
    dog.enter("start")
    _START.append(watching)


def end_start() -> None:
    """The start-up is over (or the job ended): its watchdog stops."""
    while _START:
        _START.pop().__exit__(None, None, None)
