"""The stall watchdog: a rank that makes no progress ends the job with one line instead of
hanging it for good.

The loop tells the watchdog which phase it is in (reading a batch, the training step with its
allreduce, the step's bookkeeping: metrics, checkpoint, evaluation). A thread checks every
second; when a phase has lasted longer than ``timeout_s``, or ``FACTOR`` times the longest that
phase took so far if that is longer, the rank prints one line naming itself, the phase and the
step, and exits with status 5 (``hvd_bert.stop.EXIT_STALLED``); its launcher then ends the
other ranks. A phase that waits on other ranks (the step's allreduce, the bookkeeping's
collectives) gets ``WAIT_GRACE_S`` more (at most the timeout itself), so that a rank stuck on
its own (a data read that never returns) is the one that reports. The last complete checkpoint
is left as it is: a stalled rank cannot take part in the collectives a new one needs.
"""

from __future__ import annotations

import os
import threading
import time

from hvd_bert.stop import EXIT_STALLED

__all__ = ["Watchdog", "PHASES"]

FACTOR = 20.0
WAIT_GRACE_S = 10.0
# phase -> (what the line says the rank was doing, whether it waits on other ranks)
PHASES = {"data": ("reading its next batch (its data or file system is stuck)", False),
          "step": ("in the training step (forward, backward and the gradient allreduce: a rank is stuck, or "
                   "waits for one that is)", True),
          "bookkeeping": ("in the step's bookkeeping (the metrics allreduce, a checkpoint or an evaluation)",
                          True)}


class Watchdog:
    """``with dog.running(): ... dog.enter(phase) ...``; ``timeout_s`` 0 turns it off."""

    def __init__(self, command: str, rank: int, timeout_s: float, step=lambda: None, checkpoint=lambda: None):
        self.command, self.rank, self.timeout = command, rank, float(timeout_s)
        self.step, self.checkpoint = step, checkpoint  # (callables: the step and last checkpoint now)
        self.longest: dict[str, float] = {}
        self.phase, self.since = None, time.monotonic()
        self._done = threading.Event()
        self._thread = None

    def enter(self, phase: str) -> None:
        now = time.monotonic()
        if self.phase is not None:
            self.longest[self.phase] = max(self.longest.get(self.phase, 0.0), now - self.since)
        self.phase, self.since = phase, now

    def limit(self, phase: str) -> float:
        base = max(self.timeout, FACTOR * self.longest.get(phase, 0.0))
        return base + (min(WAIT_GRACE_S, self.timeout) if PHASES[phase][1] else 0.0)

    def running(self):
        dog = self

        class _Running:
            def __enter__(self):
                if dog.timeout > 0:
                    dog._done.clear()
                    dog.since = time.monotonic()
                    dog._thread = threading.Thread(target=dog._watch, name="hvd_bert-watchdog", daemon=True)
                    dog._thread.start()
                return dog

            def __exit__(self, *exc):
                dog._done.set()
                dog.phase = None
                return False
        return _Running()

    def _watch(self) -> None:
        while not self._done.wait(min(1.0, max(0.05, self.timeout / 10))):
            phase = self.phase
            if phase is None:
                continue
            waited = time.monotonic() - self.since
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
