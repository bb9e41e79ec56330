"""What a launch needs of this machine before MPI starts (standard library only): room in
MPI's scratch folders and enough open-file descriptors. Checked by ``hvd-bert launch`` before it
starts ``mpirun`` and by every rank before ``hvd.init()``."""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["scratch_folders", "scratch_problem", "descriptors_needed", "descriptor_problem",
           "MIN_SCRATCH_BYTES"]

# What a launch needs of this machine before MPI starts: MPI writes its session folder under
# TMPDIR (or orte_tmpdir_base), the shared-memory transport its segments under /dev/shm, and
# mpirun holds several descriptors per local rank. Short of these, MPI prints dozens of lines
# of its own and may stall; the launcher and each rank name the problem first.
MIN_SCRATCH_BYTES = 16 << 20


def scratch_folders(env: Mapping[str, str] | None = None) -> list[str]:
    """The folders MPI writes into: its session folder's base and ``/dev/shm``."""
    env = os.environ if env is None else env
    base = env.get("OMPI_MCA_orte_tmpdir_base") or env.get("TMPDIR") or "/tmp"
    return [base] + (["/dev/shm"] if os.path.isdir("/dev/shm") else [])


def scratch_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why MPI cannot start here (a full or unwritable TMPDIR or /dev/shm), or None."""
    for folder in scratch_folders(env):
        try:
            st = os.statvfs(folder)
        except OSError:
            return (f"{folder} (where MPI keeps its session files) does not exist: create it, or set TMPDIR "
                    f"to a writable folder")
        free = st.f_bavail * st.f_frsize
        if free < MIN_SCRATCH_BYTES or not os.access(folder, os.W_OK):
            what = f"has {free / 2**20:.1f} MiB free" if free < MIN_SCRATCH_BYTES else "is not writable"
            fix = ("free space there" if folder == "/dev/shm" else
                   "free space there, or set TMPDIR to a folder with room")
            return (f"{folder} {what}, and MPI keeps its session and shared-memory files there (at least "
                    f"{MIN_SCRATCH_BYTES >> 20} MiB needed): {fix}")
    return None


RANK_FLOOR_BYTES = 256 * 2**20  # what a rank holds before any model: Python, a framework, Horovod


def memory_problem(local_ranks: int) -> str | None:
    """Why ``local_ranks`` ranks cannot start on this host (their interpreters alone, at
    ``RANK_FLOOR_BYTES`` each, would not fit its available memory), or None: a thousand ranks on
    a laptop are refused in one line instead of swapping the machine to a halt."""
    from hvd_bert.core.text import size_text
    from hvd_bert.train.backend import host_available

    try:
        available, _ = host_available()
    except (OSError, StopIteration):  # (no /proc/meminfo: not Linux)
        return None
    need = local_ranks * RANK_FLOOR_BYTES
    if not available or need <= available:
        return None
    most = max(1, int(available // RANK_FLOOR_BYTES))
    return (f"{local_ranks} ranks on this machine need at least {size_text(need)} before any model "
            f"({size_text(RANK_FLOOR_BYTES)} each: the interpreter, a framework and Horovod), and it has "
            f"{size_text(available)} available: start at most {most} here (-np), or spread them over hosts "
            f"(-H)")


def descriptors_needed(local_ranks: int) -> int:
    """Open files ``mpirun`` and its ranks need for ``local_ranks`` ranks on this machine, with a
    margin: a Horovod allreduce under OpenMPI 4.1 here needed 40 for 2 ranks and 64 for 4 and 8
    (below that mpirun stalls or its ranks fail to start)."""
    return 40 + 8 * local_ranks


def descriptor_problem(local_ranks: int) -> str | None:
    """Why ``mpirun`` would stall here (too few open files: ``ulimit -n``), or None."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = descriptors_needed(local_ranks)
    if soft != resource.RLIM_INFINITY and soft < need:
        want = max(4096, 1 << (need - 1).bit_length())  # (a round number that covers the need)
        if hard != resource.RLIM_INFINITY and hard < need:
            fix = (f"the hard limit is {hard}, below that: start fewer ranks on this machine (at most "
                   f"{max(1, local_ranks * hard // need)}), or ask your admin to raise the hard limit to "
                   f"{want}")
        else:
            fix = f"raise it with `ulimit -n {want if hard == resource.RLIM_INFINITY else min(want, hard)}`"
        return (f"the open-files limit (ulimit -n) is {soft}, and {local_ranks} rank(s) on this machine need "
                f"at least {need}: {fix}")
    return None
