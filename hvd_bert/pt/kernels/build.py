"""Small C kernels for the CPU, built once and loaded with :mod:`ctypes` (no PyTorch headers).

A :class:`CKernels` holds one C source: on first use it is compiled with the system C compiler
(``$CC``, default ``cc``; ``-O3 -march=native -fopenmp``, about a second) into
``$HVD_BERT_CACHE/kernels/<name>-<hash>.so``, the hash covering the source, the flags, the
compiler and the CPU model; the file is published atomically (ranks building at once each
publish a whole file). Without a compiler, or if the build fails, :meth:`CKernels.library`
returns None after one warning and the caller uses its PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable

from hvd_bert.data.defaults import cache_dir

__all__ = ["CKernels", "threads"]

CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-std=c11"]


def threads() -> int:
    """The OpenMP team size for a kernel call: PyTorch's intra-op thread count."""
    import torch
    return max(1, torch.get_num_threads())


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags."""
    info = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                info += line
                if line.startswith("flags"):
                    break
    except OSError:
        info = platform.processor()
    return info or platform.machine()


def _cache_dir() -> Path:
    return cache_dir() / "kernels"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CKernels:
    """``source`` compiled on first use; ``declare(lib)`` sets the functions' argtypes;
    ``what`` names the kernels and ``fallback`` the path used without them (in the warning)."""

    def __init__(self, name: str, source: str, declare: Callable[[ctypes.CDLL], None], what: str,
                 fallback: str):
        self.name, self.source, self.declare, self.what, self.fallback = name, source, declare, what, fallback
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._failed = False

    def _build(self) -> ctypes.CDLL:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise RuntimeError("no C compiler (set CC, or install gcc)")
        key = "\0".join([self.source, " ".join(CFLAGS), cc, _cpu_key()])
        key = hashlib.sha256(key.encode()).hexdigest()[:16]
        out = _cache_dir() / f"{self.name}-{key}.so"
        digest = out.with_name(out.name + ".sha256")  # (the library as built: a damaged one is rebuilt)
        if out.exists() and (not digest.is_file() or digest.read_text().strip() != _sha256(out)):
            out.unlink(missing_ok=True)
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                src = Path(tmp) / f"{self.name}.c"
                src.write_text(self.source)
                so = Path(tmp) / out.name
                res = subprocess.run([cc, *CFLAGS, str(src), "-o", str(so), "-lm"], capture_output=True,
                                     text=True)
                if res.returncode != 0:
                    raise RuntimeError(f"{cc} failed: {res.stderr.strip()[:300]}")
                sums = Path(tmp) / digest.name
                sums.write_text(_sha256(so) + "\n")
                os.replace(sums, digest)  # (first: a library in the cache always has its digest)
                os.replace(so, out)
        lib = ctypes.CDLL(str(out))
        self.declare(lib)
        return lib

    def library(self) -> ctypes.CDLL | None:
        """The loaded library, built on first use; None (after one warning) if it cannot be."""
        if self._lib is not None or self._failed:
            return self._lib
        with self._lock:
            if self._lib is None and not self._failed:
                try:
                    self._lib = self._build()
                except Exception as e:  # noqa: BLE001  (no compiler, unsupported platform: fall back)
                    self._failed = True
                    warnings.warn(f"hvd_bert: the {self.what} could not be built ({type(e).__name__}: "
                                  f"{str(e)[:300]}); using {self.fallback}", stacklevel=3)
        return self._lib
