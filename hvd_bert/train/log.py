"""What a training job shows and records on rank 0, the same for every job and framework: a
progress bar, one log line every few steps, ``metrics.jsonl`` (one JSON object per logged
step, appended across resumed runs) and TensorBoard scalars.

TensorBoard gets every number of a record as a scalar (``train/loss``, ``train/lr``,
``train/grad_norm``, ``eval/accuracy``), written by :class:`ScalarWriter` the same way in both
frameworks. Other ranks get a RunLog that does nothing, so job code calls it unconditionally.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Iterable

from hvd_bert.files import open_append, own_folder

__all__ = ["RunLog", "ScalarWriter", "format_line", "DivergedError"]


class DivergedError(RuntimeError):
    """Too many optimizer steps in a row skipped for inf/NaN gradients."""


_FILES = itertools.count()  # (two writers of one process in one second: two files)


class ScalarWriter:
    """TensorBoard scalars without a framework: ``simple_value`` events (as PyTorch's
    ``SummaryWriter`` writes them) through TensorBoard's own event-file writer, the same bytes
    from a PyTorch and a TensorFlow job. TensorBoard's file layer falls back to its own stub
    when the marker module ``tensorboard.compat.notf`` exists (as in its no-TF builds), which
    keeps TensorFlow and its start-up noise out of a PyTorch job. The event file is opened at
    the first scalar: a run refused before it trained writes none."""

    def __init__(self, logdir: str | Path):
        import sys
        import types

        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event, self._summary = Event, Summary
        self._logdir, self._w = Path(logdir), None
        self._purge_step: int | None = None

    def purge_from(self, step: int) -> None:
        """Events of earlier runs of this folder at ``step`` or later are stale (a resume from
        ``step - 1``, or a start from scratch): the new event file begins with TensorBoard's
        purge marker (a ``SessionLog.START`` at ``step``, as ``SummaryWriter(purge_step=)``
        writes), so TensorBoard drops them."""
        self._purge_step = int(step)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self._w is None:
            import os
            import socket

            own_folder(self._logdir)  # (not through a link planted in the run folder)
            # (EventFileWriter's name: the reader orders a folder's files by it)
            self._w = self._logdir / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}." \
                                     f"{os.getpid()}.{next(_FILES)}"
            first = [self._event(wall_time=time.time(), file_version="brain.Event:2")]
            if self._purge_step is not None:
                from tensorboard.compat.proto.event_pb2 import SessionLog

                first.append(self._event(wall_time=time.time(), step=self._purge_step,
                                         session_log=SessionLog(status=SessionLog.START)))
            self._write(*first)
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self._write(self._event(wall_time=time.time(), step=int(step), summary=summary))

    def _write(self, *events) -> None:
        """Append events in TensorBoard's record framing (its RecordWriter: length, CRCs), in this
        thread, opening the file for each write: a folder deleted or replaced mid-run is an
        error here, named by the caller, not a background thread's traceback or writes lost
        into a deleted file."""
        import io

        from tensorboard.summary.writer.record_writer import RecordWriter

        buf = io.BytesIO()
        for e in events:
            RecordWriter(buf).write(e.SerializeToString())
        with open(self._w, "ab") as f:
            f.write(buf.getvalue())

    def close(self) -> None:
        """Nothing to do: no file is held open between writes."""


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


PROGRESS_EVERY_S = 30.0  # progress lines, when there is no terminal for a bar


def interactive() -> bool:
    """A terminal that a ``\r`` progress bar can redraw: stderr is a TTY and no launcher
    (horovodrun, mpirun, srun) prefixes or collects the output."""
    import os
    import sys

    launched = any(v in os.environ for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                             "SLURM_PROCID"))
    return sys.stderr.isatty() and not launched


def progress_line(step: int, total: int, done: int, seconds: float) -> str:
    """``progress 120/200 (60%) | 2.31 steps/s | ETA 35s``."""
    rate = done / seconds if seconds > 0 else 0.0
    eta = (total - step) / rate if rate > 0 else float("nan")
    if not math.isfinite(eta):
        eta_s = "?"
    else:
        h, rest = divmod(int(round(eta)), 3600)
        m, sec = divmod(rest, 60)
        eta_s = f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
    return f"progress {step}/{total} ({100 * step / max(total, 1):.0f}%) | {rate:.2f} steps/s | ETA {eta_s}"


class RunLog:
    """Rank 0's output of a run in ``out`` (see the module docstring)."""

    def __init__(self, out: str | Path | None, rank: int, *, total_steps: int, initial_step: int = 0,
                 progress: bool = True, writer: Any = None, line_keys: Iterable[str] = ("loss", "lr")):
        self.active = rank == 0
        self.out = Path(out) if out is not None else None
        self.line_keys = tuple(line_keys)
        self.writer = writer if self.active else None
        self.history: list[dict] = []
        self._bar = self._file = None
        self.total, self.step = total_steps, initial_step
        self._lines = progress and not interactive()  # a launcher or a file: lines, not a \r bar
        self._t0 = self._last = time.perf_counter()
        self._start_step = initial_step
        self.after_resume: list = []  # what waits until the checkpoint was resumed (config.json)
        if not self.active:
            return
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self._file = open_append(self.out / "metrics.jsonl")
        if progress and not self._lines:
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True,
                             mininterval=5.0)

    def set_rank(self, rank: int, make_writer=None) -> None:
        """Follow rank 0 after Horovod elastic renumbered the ranks: the process that is rank 0
        now appends to ``metrics.jsonl`` (and opens a TensorBoard writer with ``make_writer``),
        one that no longer is stops writing."""
        active = rank == 0
        if active == self.active:
            return
        self.active = active
        if not active:
            for f in (self._file, self.writer):
                if f is not None:
                    f.close()
            self._file = self.writer = None
            return
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self._file = open_append(self.out / "metrics.jsonl")
        self.writer = make_writer() if make_writer is not None else None

    def print(self, msg: str) -> None:
        if self.active:
            if self._bar is not None:
                self._bar.write(msg)
            else:
                print(msg, flush=True)

    def resumed(self) -> None:
        """The run's checkpoint (if any) was resumed: do what waited for it (rank 0's
        ``config.json``, written only once every check passed)."""
        pending, self.after_resume = self.after_resume, []
        for fn in pending:
            fn()

    def set_step(self, step: int) -> None:
        """Where the bar starts (after a resume); ``metrics.jsonl`` loses the records of steps
        after ``step`` (a crashed run logged them, the resumed run logs them again)."""
        if self._file is not None:
            self._truncate_after(step)
        if self.writer is not None and hasattr(self.writer, "purge_from"):
            self.writer.purge_from(step + 1)  # (TensorBoard drops an earlier run's points after it)
        self.step = self._start_step = step
        self._t0 = self._last = time.perf_counter()
        if self._bar is not None:
            self._bar.n = self._bar.last_print_n = step
            self._bar.refresh()

    def advance(self, n: int = 1) -> None:
        self.step += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._lines and self.active:
            now = time.perf_counter()
            if now - self._last >= PROGRESS_EVERY_S or self.step >= self.total:
                self._last = now
                self.print(progress_line(self.step, self.total, self.step - self._start_step, now - self._t0))

    def record(self, rec: dict, prefix: str = "train", show: bool = True) -> None:
        """Log one step's metrics (every rank may call it; only rank 0 writes); ``show``:
        also as a line of ``line_keys``."""
        self.history.append(rec)
        if not self.active:
            return
        if show:
            self.print(format_line(rec, self.line_keys))
        if self._file is not None:
            self._file.write(json.dumps(_finite(rec), allow_nan=False) + "\n")  # NaN/inf: null
            self._file.flush()
        if self.writer is not None:  # every number but the step and the clock, one level of tags
            for k, v in rec.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                        and math.isfinite(v):
                    name = k[len(prefix) + 1:] if k.startswith(prefix + "_") else k  # eval/accuracy
                    self.writer.add_scalar(f"{prefix}/{name}", v, rec["step"])

    def _truncate_after(self, step: int) -> None:
        from hvd_bert.files import atomic_write

        path = self.out / "metrics.jsonl"
        self._file.close()
        keep = []
        for raw in path.read_bytes().splitlines(keepends=True):
            try:
                line = raw.decode("utf-8")
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError, RecursionError):
                continue  # a line cut short by a crash, or damaged (a step that is not a number)
        atomic_write(path, lambda t: t.write_text("".join(keep)))
        self._file = open_append(path)

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


def _finite(rec: dict) -> dict:
    """The record with non-finite numbers as None (JSON has no NaN or Infinity)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
