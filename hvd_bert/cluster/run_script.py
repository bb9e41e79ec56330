"""A user's script as one rank of ``hvd-bert launch -np N -- python SCRIPT ARGS`` (or
``python -m MODULE ARGS``): run as ``python SCRIPT`` would run it (``runpy``, ``sys.argv`` and
``__main__`` as usual), with its standard output and error line-buffered, so that each line
reaches the launcher in one piece (unbuffered, as under ``PYTHONUNBUFFERED=1``, ``print``
writes each argument apart, and ``mpirun --tag-output`` would cut the line at each write)."""

from __future__ import annotations

import runpy
import sys


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
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(__import__("pathlib").Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
