"""A user's script as one rank of ``hvd-bert launch -np N -- python SCRIPT ARGS`` (or
``python -m MODULE ARGS``): run as ``python SCRIPT`` would run it (``runpy``, ``sys.argv`` and
``__main__`` as usual), with its standard output and error line-buffered, so that each line
reaches the launcher in one piece (unbuffered, as under ``PYTHONUNBUFFERED=1``, ``print``
writes each argument apart, and ``mpirun --tag-output`` would cut the line at each write)."""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=False, line_buffering=True)  # (-u: each write went alone)
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(__import__("pathlib").Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
