"""What a training job shows and records on rank 0, the same for every job and framework: a
progress bar, one log line every few steps, ``metrics.jsonl`` (one JSON object per logged
step, appended across resumed runs) and TensorBoard scalars.

The frontends pass a TensorBoard writer (``add_scalar(tag, value, step)``, ``close()``):
PyTorch's ``SummaryWriter`` or a ``tf.summary`` one. Other ranks get a RunLog that does
nothing, so job code calls it unconditionally.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

__all__ = ["RunLog", "MetricWindow", "format_line"]


def format_line(rec: dict, keys: Iterable[str]) -> str:
    parts = [f"step {rec['step']:>6}"]
    for k in keys:
        v = rec.get(k)
        if v is None:
            continue
        if k == "lr":
            parts.append(f"lr {v:.2e}")
        elif k.endswith("_per_s"):
            parts.append(f"{v:,.1f} {k[:-6].replace('_', ' ')}/s")
        elif isinstance(v, float):
            parts.append(f"{k.replace('_', ' ')} {v:.4f}")
        else:
            parts.append(f"{k.replace('_', ' ')} {v}")
    return " | ".join(parts)


class RunLog:
    """Rank 0's output of a run in ``out`` (see the module docstring)."""

    def __init__(self, out: str | Path | None, rank: int, *, total_steps: int, initial_step: int = 0,
                 progress: bool = True, writer: Any = None, line_keys: Iterable[str] = ("loss", "lr"),
                 scalar_keys: Iterable[str] | None = None):
        self.active = rank == 0
        self.out = Path(out) if out is not None else None
        self.line_keys = tuple(line_keys)
        self.scalar_keys = tuple(scalar_keys) if scalar_keys is not None else self.line_keys
        self.writer = writer if self.active else None
        self.history: list[dict] = []
        self._bar = self._file = None
        if not self.active:
            return
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self._file = open(self.out / "metrics.jsonl", "a")
        if progress:
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True,
                             mininterval=5.0)

    def print(self, msg: str) -> None:
        if self.active:
            if self._bar is not None:
                self._bar.write(msg)
            else:
                print(msg, flush=True)

    def set_step(self, step: int) -> None:
        """Where the bar starts (after a resume)."""
        if self._bar is not None:
            self._bar.n = self._bar.last_print_n = step
            self._bar.refresh()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def record(self, rec: dict, prefix: str = "train", show: bool = True) -> None:
        """Log one step's metrics (every rank may call it; only rank 0 writes); ``show``:
        also as a line of ``line_keys``."""
        self.history.append(rec)
        if not self.active:
            return
        if show:
            self.print(format_line(rec, self.line_keys))
        if self._file is not None:
            self._file.write(json.dumps(rec) + "\n")
            self._file.flush()
        if self.writer is not None:
            for k in (self.scalar_keys if prefix == "train" else rec):
                v = rec.get(k)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(f"{prefix}/{k}", v, rec["step"])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MetricWindow:
    """Sums of per-micro-batch metrics over an optimizer step's ``k`` micro-batches; ``take()``
    gives their means as floats (one host sync per optimizer step) and starts over."""

    def __init__(self, k: int):
        self.k = k
        self.sums: dict[str, Any] = {}

    def add(self, metrics: dict) -> None:
        for name, v in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + v / self.k

    def take(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.sums.items()}
        self.sums = {}
        return out
