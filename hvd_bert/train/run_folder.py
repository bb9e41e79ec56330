"""The run folder's one owner: what every run does before it writes into ``train.output_dir``,
whether a job runs it (``jobs.run_folder.open_run``) or a script's own ``fit()``.

On rank 0, :func:`claim_run_folder`:

1. refuses an output folder that is, or lies inside, what the run reads (``files.refuse_clash``);
2. locks the folder for this process (``train.checkpoint.lock_run_folder``: a second job on it is
   refused, a crashed one leaves no stale lock);
3. refuses a link planted under a name the run appends to (``metrics.jsonl``, ``tensorboard``);
4. refuses checkpoints of a run with other settings (``train.identity.resume_mismatch``; the
   batch layout is the checkpoint's to check).

The outcome is a :class:`Claim` (``problem`` None when the folder is this run's); every rank then
raises the same error through :func:`raise_problem` once rank 0's outcome is shared.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from pathlib import Path

from hvd_bert.files import OutputClash, planted_link, refuse_clash
from hvd_bert.train.checkpoint import RunFolderBusy, lock_run_folder, release_run_folder
from hvd_bert.train.identity import resume_mismatch

__all__ = ["Claim", "claim_run_folder", "raise_problem", "RUN_FILES", "refuse_run_files"]

RUN_FILES = ("metrics.jsonl", "tensorboard")  # what a run appends to or writes into, by name
_HELD: dict[Path, object] = {}  # run folder -> its lock, held by this process


@dataclass
class Claim:
    """Rank 0's outcome: ``problem`` is None or ``(kind, message)``, kind ``busy`` (another job
    holds the folder), ``clash`` (an output over an input, a planted link) or ``resume``
    (checkpoints of a run with other settings)."""

    folder: Path
    problem: tuple[str, str] | None = None

    def release(self) -> None:
        """Let the folder go (a script's ``fit`` when it returns; a job holds it until it exits)."""
        lock = _HELD.pop(self.folder, None)
        if lock is not None:
            release_run_folder(lock)


def claim_run_folder(folder: str | Path, settings: dict, *, reads: dict | None = None,
                     hold_until_exit: bool = True, defaults: dict | None = None) -> Claim:
    """Rank 0's checks and lock on ``folder`` for a run with ``settings`` (the resolved config as
    a dict, what ``config.json`` records) reading ``reads`` (``{what: path}``); ``defaults``: the
    job's default config (settings an older version's ``config.json`` lacks take these). A folder this
    process already holds is not locked twice. ``hold_until_exit``: the lock is released when
    the process exits (a job); otherwise by :meth:`Claim.release`."""
    out = Path(folder)
    key = out.resolve()
    claim = Claim(key)
    took = key not in _HELD
    try:
        if reads:
            refuse_clash(out, reads, what="train.output_dir", run_folder=True)
        if took:
            lock = lock_run_folder(out)
            _HELD[key] = lock
            if hold_until_exit:  # a clean exit (0, 2 or 3) leaves no lock file
                atexit.register(claim.release)
    except RunFolderBusy as e:
        claim.problem = ("busy", str(e))
        return claim
    except OutputClash as e:
        claim.problem = ("clash", e.strerror)
        return claim
    link = planted_link(out, RUN_FILES)
    mismatch = None if link else resume_mismatch(out, settings, ("train.batch",), defaults)
    if link or mismatch:
        claim.problem = ("clash", link) if link else ("resume", mismatch)
        if took:
            claim.release()
    return claim


def raise_problem(problem: tuple[str, str] | None) -> None:
    """Raise rank 0's problem (shared with every rank) as the error its kind is: RunFolderBusy,
    ResumeError or ConfigError (each a user error: one line, exit status 2)."""
    if not problem:
        return
    from hvd_bert.config import ConfigError
    from hvd_bert.train.engine import ResumeError

    kind, message = problem
    raise {"busy": RunFolderBusy, "resume": ResumeError}.get(kind, ConfigError)(message)


_RUN_MARKS = ("metrics.jsonl", "best.npz")  # (with checkpoints: what only a run folder holds)


def _is_run_folder(p: Path) -> bool:
    from hvd_bert.train.checkpoint import ALL, list_checkpoints

    return p.is_dir() and (bool(list_checkpoints(p, ALL)) or any((p / f).exists() for f in _RUN_MARKS))


def refuse_run_files(output: str | Path, command: str) -> None:
    """No command but the run itself writes a run's files: an output (a file or a folder) that is
    a run folder, a checkpoint (``ckpt-*``), a path already in a run folder or a name the toolkit
    gives a run's files there is refused (OutputClash, one line). A new path of another name in a
    run folder is allowed (an export beside its run)."""
    import errno
    import os

    from hvd_bert.files import owned_name
    from hvd_bert.train.checkpoint import ALL, is_checkpoint_name

    out = Path(output).expanduser()
    absolute = Path(os.path.abspath(out))
    for p in (absolute, *absolute.parents):
        if p == absolute and (_is_run_folder(p) or any(is_checkpoint_name(p, kind) for kind in ALL)):
            what = "a run folder" if _is_run_folder(p) else "a checkpoint"
        elif p != absolute and _is_run_folder(p) and (os.path.lexists(absolute)
                                                      or owned_name(absolute.relative_to(p))):
            what = f"{'a file' if os.path.lexists(absolute) else 'a name'} of the run folder {p}"
        else:
            continue
        raise OutputClash(errno.EEXIST, f"--output {out} is {what}: {command} never writes over a run's "
                                        f"files (its checkpoints, metrics, vocabulary and settings), "
                                        f"--overwrite or not; give --output a path outside it", str(out))
