"""Writing a prepared data folder safely, once, across ranks: refuse to overwrite without
``--overwrite``, agree on errors (every rank raises the first rank's), and commit new shards so
that a reader never sees new shards under an old sidecar."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from hvd_bert.data.records import DatasetError, shard_name, write_examples
from hvd_bert.data.sidecar import SIDECAR

__all__ = ["agree", "refuse_existing", "bcast", "commit_shards", "staged", "stage_folder",
           "commit_folder",
           "write_feature_shards"]


def agree(comm, err: str | None) -> None:
    """Raise the first rank's error on every rank (``comm`` None: this process's)."""
    if comm is not None:
        errs = [e for e in comm.allgather(err) if e]
        err = errs[0] if errs else None
    if err:
        raise DatasetError(err)


def refuse_existing(out: Path, overwrite: bool) -> None:
    from hvd_bert.files import kind_of

    if (out.exists() or out.is_symlink()) and not out.is_dir():  # (before any work: a folder goes there)
        raise DatasetError(f"{out} is {kind_of(out) or 'a file'} where the prepared data's folder goes; move "
                           f"it away or choose another output folder")
    blocked = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise DatasetError(f"{out}: {blocked} is a file, not a folder; choose an output folder whose parents "
                           f"are folders")
    model = _model_folder(out)
    if model:  # (its vocab.txt is the model's: replacing it would change what every export carries)
        raise DatasetError(f"{out} is {model}: prepared data never goes into it, --overwrite or not; "
                           f"choose another output folder")
    if (out / SIDECAR).exists() and not overwrite:
        raise DatasetError(f"{out} already holds prepared data; pass --overwrite to replace it or "
                           f"choose another output folder")





def _model_folder(out: Path) -> str | None:
    """What model ``out`` holds, by its files: a Hugging Face folder, a Google checkpoint, a run
    folder with checkpoints; None for anything else."""
    if not out.is_dir():
        return None
    if (out / "config.json").is_file() and any((out / n).is_file() for n in ("model.safetensors",
                                                                               "pytorch_model.bin")):
        return "a Hugging Face model folder"
    if (out / "bert_config.json").is_file() and any(out.glob("*.ckpt.index")):
        return "a Google BERT checkpoint"
    if any(out.glob("ckpt-*")) or (out / "best.npz").is_file():
        return "a training run's folder"
    return None


def bcast(comm, value):
    return comm.bcast(value, root=0) if comm is not None else value



def commit_shards(tmp: Path, out: Path, names: list[str]) -> None:
    """Move the new shards and vocab into ``out``: the old sidecar goes first (a reader never
    sees new shards under an old sidecar), then the old shards, then the new files."""
    out.mkdir(exist_ok=True)
    (out / SIDECAR).unlink(missing_ok=True)
    for old in out.glob("part-*-of-*.tfrecord"):
        old.unlink()
    for name in [*names, "vocab.txt"]:
        (tmp / name).replace(out / name)


def stage_folder(out: Path, overwrite: bool) -> Path:
    """A new folder beside ``out`` (the same file system) to write a prepared data set into."""
    refuse_existing(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.preparing-", dir=out.parent))


def commit_folder(tmp: Path, out: Path) -> None:
    """Move a staged data set into ``out``: the old sidecar goes first, then the old shards, then
    every new file, the new sidecar last (a reader never sees shards under another sidecar)."""
    out.mkdir(exist_ok=True)
    (out / SIDECAR).unlink(missing_ok=True)
    for old in out.glob("part-*-of-*.tfrecord"):
        old.unlink()
    for f in sorted(tmp.iterdir()):
        if f.name != SIDECAR:
            f.replace(out / f.name)
    if (tmp / SIDECAR).exists():
        (tmp / SIDECAR).replace(out / SIDECAR)


@contextlib.contextmanager
def staged(out: Path, overwrite: bool):
    """The folder a single-process preparation writes into (``stage_folder``), committed into
    ``out`` when the block ends (``commit_folder``) and removed whatever happens: a preparation
    that fails (a full disk, bad input found late, a signal) leaves ``out`` as it was."""
    tmp = stage_folder(out, overwrite)
    try:
        yield tmp
        commit_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_feature_shards(folder: Path, feats: list, num_shards: int) -> tuple[list[dict], int]:
    """``feats`` (encoded records) dealt round-robin into ``num_shards`` TFRecord shards in
    ``folder`` (fewer for small data: no empty shard); ``(sidecar shard entries, shard count)``."""
    num_shards = max(1, min(num_shards, len(feats)))
    shards = []
    for s in range(num_shards):
        name = shard_name(s, num_shards)
        shards.append({"file": name, "records": write_examples(folder / name, iter(feats[s::num_shards]))})
    return shards, num_shards
