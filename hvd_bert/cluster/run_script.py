"""A user's script as one rank of ``hvd-bert launch -np N -- python SCRIPT ARGS`` (or
``python -m MODULE ARGS``): run as ``python SCRIPT`` would run it (``runpy``, ``sys.argv`` and
``__main__`` as usual), with its standard output and error line-buffered, so that each line
reaches the launcher in one piece (unbuffered, as under ``PYTHONUNBUFFERED=1``, ``print``
writes each argument apart, and ``mpirun --tag-output`` would cut the line at each write)."""

from __future__ import annotations

import os
import runpy
import sys

# set by hvd-bert launch: a folder where a rank whose script exits with a status of its own
# writes it (rank-<N>), so that sys.exit(137) is told from a SIGKILL, which launchers report alike
OWN_STATUS = "HVD_BERT_OWN_STATUS"


def _missing(argv: list[str]) -> str | None:
    """Why ``argv`` (``SCRIPT ...`` or ``-m MODULE ...``) names nothing to run, or None."""
    import importlib.util
    from pathlib import Path

    if argv[:1] == ["-m"]:
        if len(argv) < 2:
            return "-m needs a module: hvd-bert launch -np N -- python -m MODULE ARGS"
        try:
            found = importlib.util.find_spec(argv[1]) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else (f"no module named {argv[1]!r} for python -m on this rank's interpreter "
                                   f"({sys.executable}): check its name, or install it there")
    if not argv:
        return "no script to run: hvd-bert launch -np N -- python SCRIPT ARGS"
    if not Path(argv[0]).is_file():
        return f"the script {argv[0]} does not exist here: give its path (relative to {Path.cwd()})"
    return None


def main(argv: list[str]) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=False, line_buffering=True)  # (-u: each write went alone)
    problem = _missing(argv)
    if problem:  # (the same line on every rank: the launcher prints it once)
        print(f"hvd-bert: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    _adopt_orphans()
    try:
        if argv[:1] == ["-m"]:
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(__import__("pathlib").Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) and not isinstance(e.code, bool) and e.code % 256:
            _tell_status(e.code % 256)
        raise
    finally:
        _end_leftovers()


def _adopt_orphans() -> None:
    """Become the subreaper of the script's processes (Linux ``PR_SET_CHILD_SUBREAPER``): a process
    it starts and leaves running is re-parented here, not to init, so that it can be found."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _end_leftovers() -> None:
    """End what the script left running (SIGTERM, then SIGKILL after 5 s), with one line: such a
    process holds the rank's output open, and mpirun and horovodrun wait for it to close, so the
    launch would not end until it did (as torchrun, a launch's processes end with it)."""
    import psutil

    left = psutil.Process().children(recursive=True)
    if not left:
        return
    pids = ", ".join(str(p.pid) for p in left[:5]) + (" ..." if len(left) > 5 else "")
    print(f"hvd-bert: the script left {len(left)} process{'es' if len(left) > 1 else ''} running "
          f"(pid {pids}), ended now so that the launch can end: wait for what it starts", file=sys.stderr,
          flush=True)
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    for p in psutil.wait_procs(left, timeout=5)[1]:
        try:
            p.kill()
        except psutil.Error:
            pass


def _tell_status(code: int) -> None:
    """Write this rank's own exit status where the launcher reads it (nothing when not launched
    by hvd-bert launch, or on a host that lacks its folder)."""
    folder = os.environ.get(OWN_STATUS)
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK"))
    if not folder or rank is None or not os.path.isdir(folder):
        return
    try:
        with open(os.path.join(folder, f"rank-{int(rank)}"), "w") as f:
            f.write(str(code))
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
