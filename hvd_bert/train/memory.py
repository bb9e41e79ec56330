"""What a rank's memory is and was: the start-of-run line from an engine's ``memory()``, the
process's peak, and which phase of a run reached it. Framework-free."""

from __future__ import annotations

from typing import Callable

__all__ = ["memory_line", "peak_host_bytes", "MemoryPhases"]


def peak_host_bytes() -> int:
    """This process's peak resident memory so far (Linux reports it in KiB)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_line(m: dict) -> str:
    """One start-of-run line from an engine's ``memory()``: what a rank holds, and its peak."""
    from hvd_bert.core.text import size_text as gib

    stage, n = m.get("zero_stage", 0), m.get("world_size", 1)
    grads = f" (1/{n}, between backward passes)" if stage == 2 else ""
    state = f" (1/{n} replicas: ZeRO stage {stage})" if stage else ""
    t = m.get("tensor_parallel", 1)
    tp = f" (this rank's share of layers split {t} ways)" if t > 1 else ""
    return (f"memory per rank: parameters {gib(m['parameters'])}{tp}, "
            f"gradients {gib(m['gradients'])}{grads}, "
            f"optimizer state {gib(m['optimizer_state'])}{state}; peak so far {gib(m['peak'])} "
            f"({m.get('peak_of', 'host resident')})")


class MemoryPhases:
    """Which phase of a run reached this rank's peak memory: ``mark(phase)`` at the end of each
    stretch of building, resuming, steps, saves and elastic commits reads the peak so far
    (``peak()``: the engine's, monotone); the phase of a mark that raised it holds the new peak."""

    PHASES = {"build": "building", "resume": "resuming", "steps": "the steps", "save": "saving",
              "commit": "elastic commits", "eval": "the final evaluation"}

    def __init__(self, peak: Callable[[], float]):
        self.peak, self.last, self.reached = peak, 0.0, {}

    def mark(self, phase: str) -> None:
        value = float(self.peak())
        if value > self.last or phase not in self.reached:
            self.reached[phase] = max(value, self.reached.get(phase, 0.0))
        self.last = max(self.last, value)

    def line(self) -> str:
        """One line: the peak, the phase that reached it, and the peak so far after each phase."""
        if not self.reached:
            return ""
        top = max(self.reached, key=lambda p: (self.reached[p], -list(self.reached).index(p)))
        after = ", ".join(f"{p} {v / 2 ** 30:.2f}" for p, v in self.reached.items())
        return (f"peak memory of rank 0: {self.last / 2 ** 30:.2f} GiB, reached by "
                f"{self.PHASES.get(top, top)} (the peak so far after each phase, GiB: {after})")
