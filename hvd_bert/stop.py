"""How a run ends, framework-free: the exit statuses every command and the launcher use, and
this process's stop request (SIGTERM, SIGINT, SIGUSR1).

The exit statuses (docs/jobs.md "Exit statuses"), each with one line on stderr:

====  =========================================================================================
0     finished
1     an internal error (a bug: its traceback is printed)
2     a user error: bad settings, data, checkpoint or paths (one line naming the fix)
3     stopped by a signal (SIGTERM, Ctrl-C) after saving a checkpoint: rerun to resume
4     a rank was lost: killed (SIGKILL, the out-of-memory killer) or it died without a line
5     stalled: no rank completed a step or a collective within ``train.stall_timeout_s``
130   interrupted at once (a second Ctrl-C, or the ranks did not stop within the launcher's
      grace period): no new checkpoint; the last complete one is intact
====  =========================================================================================

A training job's first SIGTERM or SIGINT is a stop request (``STOP.requested``): the loop
finishes the step, every rank saves and the run exits 3. A second request ends the process at
once (130) with one line. A terminal's Ctrl-C reaches a whole process group, and launchers pass
a signal on again, so a repeat within ``REPEAT_S`` is the same request. A command that is not
a training loop (predict, prepare-*, convert) stops at once on the first signal with one line
(130); its writes are atomic, so nothing it wrote is left half done.
"""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["EXIT_OK", "EXIT_BUG", "EXIT_USER", "EXIT_STOPPED", "EXIT_LOST_RANK", "EXIT_STALLED",
           "EXIT_INTERRUPTED", "STATUSES", "STOP_SIGNALS", "StopSignal", "STOP", "Interrupted",
           "interrupt_at_once", "interrupted_line"]

EXIT_OK, EXIT_BUG, EXIT_USER, EXIT_STOPPED, EXIT_LOST_RANK, EXIT_STALLED = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
STATUSES = {EXIT_OK: "finished", EXIT_BUG: "an internal error (its traceback is printed)",
            EXIT_USER: "a user error (one line naming the fix)",
            EXIT_STOPPED: "stopped by a signal after saving a checkpoint: rerun to resume",
            EXIT_LOST_RANK: "a rank was lost (killed, or it died without a line)",
            EXIT_STALLED: "stalled: no progress within train.stall_timeout_s",
            EXIT_INTERRUPTED: "interrupted at once: no new checkpoint, the last complete one is intact"}

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Interrupted(BaseException):
    """A signal to a command that stops at once (not a training loop)."""


def _say(line: str) -> None:
    try:  # one write, safe in a signal handler (print could be interrupted mid-line)
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


class StopSignal:
    """This process's stop request: ``install()`` turns SIGTERM (what SLURM sends before a time
    limit), SIGINT (Ctrl-C) and SIGUSR1 into ``requested = True``; the engines combine the ranks'
    flags with an allreduce (``should_stop``) so that every rank stops after the same step. A
    second SIGTERM or SIGINT more than ``REPEAT_S`` after the first ends the process at once."""

    REPEAT_S = 1.0

    def __init__(self):
        self.requested = False
        self.first_at: float | None = None
        self.command = "hvd-bert"

    def consumed(self) -> None:
        """The run this request stopped has ended (saved): a later run in this process starts
        without it (a script that trains twice, a test worker)."""
        self.requested, self.first_at = False, None

    def install(self, signals=STOP_SIGNALS) -> None:
        for s in signals:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested, self.first_at = True, now
            return
        if signum == signal.SIGUSR1 or now - (self.first_at or now) < self.REPEAT_S:
            return  # the same request delivered twice (a process group's Ctrl-C, a launcher's relay)
        _say(f"{self.command}: interrupted again: stopped at once without a new checkpoint; the last "
             f"complete checkpoint is intact (run the same command again to resume from it)")
        os._exit(EXIT_INTERRUPTED)


STOP = StopSignal()  # the process's one stop request (the engines' should_stop reads it)


def interrupt_at_once(command: str) -> None:
    """For a command that is not a training loop: the first SIGTERM or SIGINT raises
    ``Interrupted`` (its ``finally`` blocks remove temporary files), which ``cli.main`` turns into
    one line and status 130."""
    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)


def interrupted_line(command: str, e: Interrupted) -> int:
    _say(f"hvd-bert {command}: interrupted ({e}): stopped; nothing was left half written (writes are atomic)")
    sys.stderr.flush()
    return EXIT_INTERRUPTED
