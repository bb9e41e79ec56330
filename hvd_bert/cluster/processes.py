"""The processes of a command: the MPI world of a data preparation started by ``mpirun`` (or
``srun --mpi=pmix``), and how the ranks of a Horovod job stop together when one of them fails
(one line on each, not a traceback from every rank left waiting in a collective)."""

from __future__ import annotations

import sys
import time

from hvd_bert.cluster.horovod import mpi_launched

__all__ = ["mpi_world", "let_peers_report", "peer_failed", "rank_tag", "TAGGED"]

TAGGED = "HVD_BERT_TAGGED"  # set by hvd-bert launch for its ranks: it tags each line with the rank


def rank_tag(rank: int) -> str:
    """``[rank r] `` before a rank's own line, unless ``hvd-bert launch`` tags its lines already."""
    import os

    return "" if os.environ.get(TAGGED) == "1" else f"[rank {rank}] "


def mpi_world():
    """``(rank, size, comm)`` under an MPI launch (``cluster.horovod.mpi_launched``), else
    ``(0, 1, None)``."""
    if not mpi_launched():
        return 0, 1, None
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size(), comm


def let_peers_report(grace_s: float = 2.0) -> None:
    """After a user error on a rank of a Horovod job: shut Horovod down now (the ranks waiting
    in a collective then raise at once and print their own line) and wait a moment before
    exiting, since a launcher kills the remaining ranks as soon as one exits."""
    for name in ("horovod.torch", "horovod.tensorflow"):
        hvd = sys.modules.get(name)
        try:
            if hvd is not None and hvd.is_initialized() and hvd.size() > 1:
                hvd.shutdown()
                time.sleep(grace_s)
                return
        except Exception:  # noqa: BLE001 - only a courtesy to the other ranks
            return


def peer_failed(e: BaseException | None) -> bool:
    """Whether ``e`` (or an exception it came from) is Horovod's "has been shut down" error,
    which every framework raises in the ranks left waiting when one rank ends."""
    seen = 0
    while e is not None and seen < 10:
        if "Horovod has been shut down" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False
