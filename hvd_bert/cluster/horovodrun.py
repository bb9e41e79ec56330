"""Horovod's own ``horovodrun``, with its build check answered once per Horovod install.

    python -m hvd_bert.cluster.horovodrun -np 2 -H localhost:2 --gloo python train.py

Before it starts a single rank, Horovod 0.28.1's launcher asks whether Horovod was built with
Gloo (and with MPI): in a forked child it imports each framework's extension in the order
TensorFlow, PyTorch, MXNet, so every launch imports TensorFlow, 5 seconds of a core here and
8 lines of TensorFlow's start-up messages on the launcher's terminal, even for a PyTorch job.
A byte of a rank's output that is not UTF-8 is forwarded as U+FFFD (``_forward_any_bytes``).
A rank's non-zero exit status becomes the launch's own (Horovod raises it as a traceback and
exits 1: a job stopped by a signal, status 3, would read as a failure).
This module runs the same launcher (``horovod.runner.launch.run_commandline``: every option,
elastic mode and exit status as ``horovodrun``) with ``gloo_built``/``mpi_built`` answered from
a small file in the hvd_bert cache, keyed by the size and time of every installed Horovod
extension, and computed on the first launch by Horovod's own check, with PyTorch's extension
asked first (``hvd_bert.cluster.launch`` starts every Gloo launch through it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_ASKED_FIRST = ("torch", "tensorflow", "mxnet")


def _extensions() -> list[Path]:
    import horovod
    root = Path(horovod.__file__).parent
    return sorted(p for sub in _ASKED_FIRST for p in (root / sub).glob("mpi_lib*.so"))


def _cache_file() -> Path:
    import hashlib

    from hvd_bert.data.defaults import cache_dir
    key = "\0".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in _extensions())
    return cache_dir() / "horovod" / f"built-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _horovods_check(what: str) -> bool | None:
    """Horovod's own check (``horovod.common.util``), PyTorch's extension asked first."""
    from horovod.common import util
    for ext in _ASKED_FIRST:
        result = util._check_extension_lambda(ext, lambda m, w=what: getattr(m, w)(), f"built with {what}",
                                               False)
        if result is not None:
            return bool(result)
    return None


def built() -> dict[str, bool | None]:
    """``{"gloo_built": ..., "mpi_built": ...}`` for the installed Horovod (cached)."""
    path = _cache_file()
    try:
        got = json.loads(path.read_text())
        if set(got) == {"gloo_built", "mpi_built"}:
            return got
    except (OSError, ValueError, RecursionError):
        pass
    got = {w: _horovods_check(w) for w in ("gloo_built", "mpi_built")}
    if None not in got.values():  # only a definite answer is kept
        from hvd_bert.files import atomic_write
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(got)))
    return got


def _forward_any_bytes() -> None:
    """Horovod forwards each rank's output through a strict UTF-8 decoder
    (``safe_shell_exec.prefix_connection``): one byte that is not UTF-8 (a script's binary
    print) kills the thread that forwards that rank's stream, with a traceback, and the rest of
    its output is lost. Its module's decoder factory is given ``errors="replace"`` (a U+FFFD for
    each such byte, as ``hvd-bert launch`` reads its own pipe)."""
    import codecs
    import types

    from horovod.runner.common.util import safe_shell_exec

    def lenient(encoding):
        return lambda: codecs.getincrementaldecoder(encoding)(errors="replace")

    if getattr(safe_shell_exec, "codecs", None) is codecs:  # (the module 0.28.1 reads it from)
        safe_shell_exec.codecs = types.SimpleNamespace(getincrementaldecoder=lenient)


def main() -> None:
    from horovod.runner import launch
    _forward_any_bytes()
    answers = built()
    launch.gloo_built = lambda verbose=False: answers["gloo_built"]
    launch.mpi_built = lambda verbose=False: answers["mpi_built"]
    sys.argv[0] = "horovodrun"
    try:
        launch.run_commandline()
    except KeyboardInterrupt:  # (Ctrl-C: the ranks got it too and stop on their own)
        sys.exit(130)
    except RuntimeError as e:  # a rank's exit status is the launch's, without Horovod's traceback
        import re

        code = re.search(r"Exit code:\s*(-?\d+)", str(e))
        if code is None:
            raise
        print(str(e), file=sys.stderr, flush=True)
        status = int(code.group(1))
        sys.exit(status if 0 < status < 256 else 128 - status if status < 0 else 1)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
