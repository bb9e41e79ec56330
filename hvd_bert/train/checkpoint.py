"""Checkpoint files, framework-free: atomic writes, names by step, the newest, retention.

A checkpoint is written to a temporary name in the same folder, flushed to disk, then
renamed over its final name (``hvd_bert.files.atomic_write``; ``os.replace`` is atomic on
POSIX): a run killed mid-write leaves the previous checkpoints intact and never a
half-written file under a final name.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

__all__ = ["zip_damage", "file_digests", "file_crc", "checkpoint_folder",
           "digest_damage", "pick_checkpoint", "run_folder_of", "checkpoint_step",
           "release_run_folder", "checkpoint_path", "is_checkpoint_name", "list_checkpoints",
           "latest_checkpoint", "has_index", "prune", "SHARDED", "SHARDED_INDEX", "checkpoint_format",
           "remove_stale_temporaries", "RunFolderBusy", "lock_run_folder"]

_NAME = re.compile(r"^ckpt-(\d{8,})\.(\w+)$")


def zip_damage(path: str | Path) -> str | None:
    """Why a zip-based checkpoint (PyTorch's ``ckpt-*.pt``, a ``.npz``) is damaged: a member whose
    bytes fail the CRC-32 recorded when it was written, or a broken archive; None when intact.
    Reads the whole file once."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"cannot read checkpoint {path}: it is truncated or not a complete zip archive ({e})"
    if bad is not None:
        return f"{path} is damaged: the CRC-32 of its part {bad!r} no longer matches what was written"
    return None


def file_digests(folder: str | Path, skip: tuple[str, ...] = ("meta.json",)) -> dict[str, str]:
    """``{relative name: CRC-32C}`` of every file under ``folder`` (a checkpoint folder), written
    into its metadata at save time and checked at load time."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_crc(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in skip}


def file_crc(path: str | Path) -> str:
    """The CRC-32C of a file's bytes (8 hex digits), read in blocks."""
    import crc32c

    value = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            value = crc32c.crc32c(block, value)
    return f"{value:08x}"


def digest_damage(folder: str | Path, recorded: dict | None) -> str | None:
    """Why a checkpoint folder no longer holds what its metadata recorded (``file_digests``), or
    None (also for a checkpoint written before digests were recorded)."""
    if not isinstance(recorded, dict):
        return None
    now = file_digests(folder)
    for name, value in recorded.items():
        if name not in now:
            return f"{Path(folder) / name} is missing"
        if now[name] != value:
            return f"{Path(folder) / name} is damaged: its CRC-32C no longer matches what was written"
    return None


def checkpoint_folder(path: str | Path) -> Path:
    """The folder whose files describe a checkpoint (``config.json``, ``task.json``,
    ``bert_config.json``, ``vocab.txt``): a run or model folder itself; for a checkpoint in one (a
    ``ckpt-*`` file or ``ckpt-*.shards`` / ``ckpt-*.tf`` folder, ``best.npz``, any file) the folder it
    sits in. Every reader of a checkpoint's companions asks this, so none takes a checkpoint
    folder for the run folder."""
    p = Path(path).expanduser()
    m = _NAME.match(p.name)
    return p if p.is_dir() and not (m and m.group(2) in ALL) else p.parent


def run_folder_of(path: str | Path) -> Path | None:
    """The folder a checkpoint belongs to: ``path`` itself when it is a run folder, the folder a
    checkpoint (a file, or a ``ckpt-*.shards`` / ``ckpt-*.tf`` folder) sits in when that is a run
    folder (checkpoints, ``best.npz``, ``config.json`` or ``task.json`` beside it); None for a file
    on its own (a ``.npz`` in the working folder)."""
    p = Path(path).expanduser()
    folder = checkpoint_folder(p)
    if folder == p:  # (a checkpoint folder belongs to its run folder)
        return p
    marks = ("best.npz", "config.json", "task.json", "bert_config.json")
    if list_checkpoints(folder, ALL) or any((folder / m).exists() for m in marks):
        return folder
    return None


def pick_checkpoint(path: str | Path, pick: str = "best") -> tuple[Path, str]:
    """``(file, what it is)`` to read a model from ``path``: a run folder's best evaluated model
    (``best.npz``, as Trainer's ``load_best_model_at_end``) when ``pick`` is ``best`` and it has
    one, else its newest checkpoint; any other path is itself (``what``: empty)."""
    import json

    p = Path(path).expanduser()
    has_best = (p / "best.npz").is_file()
    if not p.is_dir() or not (list_checkpoints(p, ALL) or has_best):
        return p, ""
    latest = latest_checkpoint(p, ("pt", SHARDED)) or latest_checkpoint(p, "tf")
    if pick == "best" and (p / "best.npz").is_file():
        try:
            rec = json.loads((p / "best.json").read_text())
            why = f" ({rec['metric']} {float(rec['score']):.4f} at step {rec['step']})"  # (as the log has it)
            if rec.get("crc32c") and rec["crc32c"] != file_crc(p / "best.npz"):  # (replaced since)
                why = (" (not the one best.json scores: best.npz was replaced after the run wrote it, so "
                       "its score is unknown)")
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            why = ""
        other = "; --checkpoint latest for the newest checkpoint" if latest else ""
        return p / "best.npz", f"the best model, {p / 'best.npz'}{why}{other}"
    if latest is None:
        return p / "best.npz", f"the best model, {p / 'best.npz'} (the run folder has no checkpoint)"
    best = "; --checkpoint best for the best model" if (p / "best.npz").is_file() else ""
    return latest, f"the newest checkpoint, {latest}{best}"


def checkpoint_path(folder: str | Path, step: int, suffix: str) -> Path:
    """``folder/ckpt-<step, 8 digits>.<suffix>``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return Path(folder) / f"ckpt-{step:08d}.{suffix}"


def checkpoint_step(path: str | Path) -> int | None:
    """The step a checkpoint's name says (``ckpt-<step>.<suffix>``), or None."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_checkpoint_name(path: str | Path, suffix: str) -> bool:
    """Whether ``path``'s name is a checkpoint's (``ckpt-<step>.<suffix>``), not, say, a run
    folder a user called ``ckpt-0``."""
    m = _NAME.match(Path(path).name)
    return m is not None and m.group(2) == suffix


SHARDED = "shards"      # a sharded checkpoint's suffix (hvd_bert.train.sharded_checkpoint)
SHARDED_INDEX = "index.json"  # what makes it complete, written last
ALL = ("pt", "tf", SHARDED)  # every kind of checkpoint a run folder holds


def checkpoint_format(setting: str, world_size: int, elastic: bool = False) -> str:
    """The format ``train.checkpoint_format`` names for a job of ``world_size`` ranks: ``auto``
    is ``sharded`` wherever there is more than one rank, and under Horovod elastic (whose world
    may grow from one), so that no rank gathers the state and rank 0 does not write it alone;
    ``consolidated`` on one rank (one file, as before)."""
    if setting != "auto":
        return setting
    return "sharded" if world_size > 1 or elastic else "consolidated"


def has_index(folder: str | Path) -> bool:
    """Whether a sharded checkpoint's index is there: written last, its absence means the writing
    was cut short. Anything at its name counts (a pipe, a dangling link): that is damage for the
    reader to name, never an incomplete checkpoint to delete or pass over."""
    return os.path.lexists(Path(folder) / SHARDED_INDEX)


def list_checkpoints(folder: str | Path, suffix: str | tuple[str, ...]) -> list[tuple[int, Path]]:
    """``(step, path)`` of the complete checkpoints in ``folder`` with any of the suffixes, oldest
    first (a sharded checkpoint is complete once its index is written)."""
    folder = Path(folder)
    suffixes = (suffix,) if isinstance(suffix, str) else tuple(suffix)
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if not m or m.group(2) not in suffixes:
            continue
        if m.group(2) == SHARDED and not has_index(p):
            continue  # (incomplete: never resumed from, never counted by prune)
        if p.is_file() or p.is_dir():  # TF: a folder
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(folder: str | Path, suffix: str | tuple[str, ...]) -> Path | None:
    found = list_checkpoints(folder, suffix)
    return found[-1][1] if found else None


def prune(folder: str | Path, suffix: str, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints; returns the deleted paths."""
    import shutil

    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    old = [p for _, p in list_checkpoints(folder, suffix)[:-keep]]
    for p in old:
        if p.is_dir() and not p.is_symlink():
            if suffix == SHARDED:  # the index first: a half-deleted folder is never complete
                (p / SHARDED_INDEX).unlink(missing_ok=True)
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return old


_TMP = re.compile(r"^\.(ckpt-\d{8,}\.\w+)\.(tmp|old)-(\d+)$")


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files and folders a killed writer left behind (``.ckpt-*.tmp-<pid>``
    of a process that no longer runs, a sharded checkpoint without its index); returns what was
    removed."""
    import shutil

    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():  # a sharded checkpoint whose writing was cut short (the folder's owner
        m = _NAME.match(p.name)  # runs the resume: nobody writes into it now)
        if m and m.group(2) == SHARDED and p.is_dir() and not p.is_symlink() and not has_index(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for p in folder.iterdir():
        m = _TMP.match(p.name)
        if not m or _alive(int(m.group(3))):
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunFolderBusy(RuntimeError):
    """Another job holds the run folder."""


LOCK_NAME = ".hvd_bert.lock"


def lock_run_folder(folder: str | Path):
    """Take an exclusive lock on a run folder for this process's lifetime (``flock``: the kernel
    releases it when the process ends, crash or not, so a stale lock cannot block a rerun).
    Returns the open lock file (keep it); raises :class:`RunFolderBusy` naming the holder."""
    import fcntl
    import socket

    from hvd_bert.files import UnsafePath

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        try:  # (never through a link planted under the lock's name)
            f = open(folder / LOCK_NAME, "r+", opener=lambda p, flags: os.open(
                p, flags | os.O_CREAT | os.O_NOFOLLOW, 0o666))
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise UnsafePath(errno.ELOOP, f"{folder / LOCK_NAME} is a symbolic link; hvd_bert does not write "
                                          f"through one: remove it", str(folder / LOCK_NAME)) from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunFolderBusy(f"{folder} is in use by another job ({holder}); wait for it to finish, or "
                                f"give this run another train.output_dir") from None
        try:  # a holder that just finished removed the file: lock the one now there instead
            if os.stat(folder / LOCK_NAME).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def release_run_folder(lock) -> None:
    """Remove the lock file and release the lock (a process that ends without this, by a crash or
    a kill, still releases the lock; the file then stays, empty of meaning). A folder that became
    read-only or full keeps the file: the lock is released all the same, and the run's own line
    has said what happened."""
    try:
        os.unlink(lock.name)
    except OSError:  # (gone already, or the folder can no longer be written: the flock still goes)
        pass
    try:
        lock.close()
    except OSError:
        pass
