"""TensorFlow's checkpoints: ``folder/ckpt-<step>.tf/``, a ``tf.train.Checkpoint`` of the
engine's (or a Keras model's) trackables and a ``meta.json`` with each file's CRC-32C, written
atomically and checked before a restore (PyTorch's counterpart: ``hvd_bert.pt.checkpoint``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.files import clear_path
from hvd_bert.train.checkpoint import checkpoint_path, digest_damage, file_digests, list_checkpoints
from hvd_bert.train.engine import CheckpointError

__all__ = ["CKPT_SUFFIX", "save_checkpoint", "read_checkpoint_meta", "restore_checkpoint"]

CKPT_SUFFIX = "tf"


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")) + [folder]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(folder: str | Path, step: int, trackables: dict, keep: int = 3,
                    meta: dict | None = None) -> Path:
    """Write ``tf.train.Checkpoint(**trackables)`` and ``meta.json`` into a temporary folder,
    fsync it, then rename it to ``folder/ckpt-<step>.tf`` (atomic: no half-written checkpoint
    under a final name; an existing one of the same step is replaced only once the new one is
    complete). Keeps the newest ``keep``."""
    final = checkpoint_path(folder, step, CKPT_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    clear_path(tmp)  # a leftover, or a link planted under its name (removed, never written through)
    tmp.mkdir()
    try:
        tf.train.Checkpoint(**trackables).write(str(tmp / "ckpt"))  # (meta.json: each file's CRC-32C)
        (tmp / "meta.json").write_text(json.dumps({**(meta or {}), "files": file_digests(tmp)}))
        _fsync_tree(tmp)
        if final.exists():  # the same step again: move the old one aside, never lose both
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for _, stale in list_checkpoints(folder, CKPT_SUFFIX)[:-keep]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def read_checkpoint_meta(path: str | Path) -> dict:
    """The ``meta.json`` of a checkpoint written by :func:`save_checkpoint`."""
    meta_file = Path(path) / "meta.json"
    if not meta_file.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete (no meta.json); delete it to resume "
                              f"from the one before")
    try:
        return json.loads(meta_file.read_text())
    except (json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{meta_file} is not valid JSON ({e}); delete the checkpoint to resume "
                              f"from the one before") from None


def restore_checkpoint(path: str | Path, trackables: dict) -> dict:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns its meta."""
    path = Path(path)
    meta = read_checkpoint_meta(path)
    damage = digest_damage(path, meta.get("files"))
    if damage:
        raise CheckpointError(f"{damage}; delete the checkpoint to resume from the one before, or restore it "
                              f"from a copy")
    try:
        tf.train.Checkpoint(**trackables).read(str(path / "ckpt")).assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as e:
        raise CheckpointError(f"cannot restore checkpoint {path}: {e}; it was written for another "
                              f"model or optimizer, or is corrupt") from None
    return meta
