"""The background writer of sharded checkpoints (:mod:`hvd_bert.train.sharded_checkpoint`'s
format): one save in flight at a time, its outcome gathered from every rank at the next save (or
the end), and abandoned when a Horovod elastic reset changes the world under it. Framework-free:
the framework gives its allgather and barrier."""

from __future__ import annotations

import threading
from pathlib import Path

from hvd_bert.train.checkpoint import prune
from hvd_bert.train.engine import CheckpointError
from hvd_bert.train.sharded_checkpoint import SUFFIX, is_complete, mark_failed, write_index, write_rank

__all__ = ["Writer", "BackgroundSaves", "fresh_folder"]


class Writer:
    """One background checkpoint write at a time: a thread, joined before the next save and at
    the end of the run. ``allgather_object(obj, name)`` is the framework's (Horovod's)."""

    def __init__(self, allgather_object):
        self.allgather_object = allgather_object
        self.path: Path | None = None  # (the checkpoint being written: what a failure names)
        self.thread = None
        self.error: BaseException | None = None
        self.abandoned = threading.Event()  # (set: rank 0 stops waiting for the others' manifests)

    def submit(self, write) -> None:
        self.abandoned.clear()

        def run():
            try:
                write()
            except BaseException as e:  # noqa: BLE001  (raised by wait(), on the main thread)
                self.error = e
        self.thread = threading.Thread(target=run, name="hvd_bert-checkpoint-writer")
        self.thread.start()

    def save(self, path: Path, folder: Path, rank: int, world: int, pieces: list, meta: dict,
             keep: int) -> Path:
        """Write a checkpoint in the background: this rank's ``pieces`` into ``path``; on rank 0,
        then the index once all ``world`` ranks' pieces are on disk, then the pruning of the
        older checkpoints in ``folder`` (the newest ``keep`` stay). Returns ``path``."""
        main = threading.main_thread()  # (its end stops rank 0 waiting for the others' manifests)
        self.path = path

        def write():
            try:
                write_rank(path, rank, pieces)
            except BaseException:
                mark_failed(path, rank)  # (rank 0's index stops waiting for this shard)
                raise
            if rank == 0:
                write_index(path, world, meta, alive=lambda: main.is_alive() and not self.abandoned.is_set())
                prune(folder, SUFFIX, keep)
        self.submit(write)
        return path

    def abandon(self) -> Path | None:
        """The world changed under the save in flight (a Horovod elastic reset: a rank was lost or
        added). Not a collective of the old world: rank 0 stops waiting for the manifests of ranks
        that may be gone, and every rank joins its thread and drops its outcome. Then an allgather
        of the new world (every rank of it calls this at the same point) says whether any rank's
        save was cut short. Returns that checkpoint's path (incomplete: no index, never resumed
        from; the next start removes it), None when there was none or it completed."""
        if self.thread is not None:
            self.abandoned.set()
            self.thread.join()
            self.thread = None
        path, self.path, self.error = self.path, None, None
        mine = str(path) if path is not None and not is_complete(path) else None
        cut = [p for p in self.allgather_object(mine, "hvd_bert.save.abandoned") if p is not None]
        return Path(cut[0]) if cut else None

    def wait(self) -> None:
        """Wait for the save in flight, then raise the first failing rank's error on every rank
        (a collective: every rank calls it at the same point; a full disk stays a NoSpace)."""
        from hvd_bert.files import NoSpace, os_error_line

        if self.thread is not None:
            self.thread.join()
            self.thread = None
        e, self.error = self.error, None
        mine = None if e is None else (type(e).__name__, str(e), getattr(e, "filename", None),
                                        getattr(e, "written", 0))
        failed = [(r, f) for r, f in enumerate(self.allgather_object(mine, "hvd_bert.save.outcome"))
                  if f is not None]
        if not failed:
            return
        # (every rank raises the same kind: a full disk anywhere is a NoSpace, whichever rank saw it
        # first and however its writer worded it; a resource error of this rank's as itself)
        full = [f for _, f in failed if f[0] == "NoSpace" or "No space left" in f[1]]
        if full:
            raise NoSpace(full[0][2] or str(self.path or "a checkpoint shard"), full[0][3] or 0)
        rank, (kind, text, filename, written) = failed[0]
        if isinstance(e, OSError) and mine == failed[0][1] and os_error_line(e):
            raise e
        raise CheckpointError(f"rank {rank} could not write its checkpoint shard ({kind}: {text}); the "
                              f"checkpoint before it is intact: fix the cause and run again to resume")


class BackgroundSaves:
    """The Engine protocol's ``wait_for_save`` and ``abandon_save`` over an engine's ``writer``
    (a :class:`Writer`), one for both frameworks' engines (a base class of each)."""

    writer: Writer

    def wait_for_save(self) -> None:
        """Wait for a background save to be on disk; its error raised on every rank (a collective)."""
        self.writer.wait()

    def abandon_save(self) -> Path | None:
        """After the world changed (Horovod elastic): a background save cut short by it, else None
        (a collective of the new world)."""
        return self.writer.abandon()


def fresh_folder(path: Path, rank: int, barrier) -> Path:
    """The folder of a new checkpoint, empty on every rank: rank 0 removes what is there (an older
    checkpoint of the same step, or a link planted under its name: the link itself, never what it
    points to), ``barrier()`` (the framework's collective), then every rank makes it."""
    from hvd_bert.files import clear_path, own_folder

    if rank == 0:
        clear_path(path)
    barrier()
    return own_folder(path)
