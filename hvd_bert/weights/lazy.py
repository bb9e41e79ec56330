"""Weights read when they are used, and in slices where a rank holds only a share.

A checkpoint's tensors can be a plain ``{name: array}`` or a lazy mapping: its ``__getitem__``
reads one tensor, ``shape_of(name)`` says its shape without reading it, and ``read_share(name,
dim, parts, index)`` reads only share ``index`` of ``parts`` equal slices along ``dim`` (what a
tensor-parallel rank keeps). Such mappings are a Hugging Face ``model.safetensors``
(:class:`SafetensorsTensors`: ``safetensors``' lazy slices read only the share's bytes), a sharded
checkpoint's tensors (``train.sharded_checkpoint.LazyTensors``) and the views below over either.
So loading a published BERT-Large under tensor parallelism holds one share at a time, never the
whole file (figures: BENCHMARKS.md, "Published checkpoints by slices").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

__all__ = ["shape_of", "read_share", "share_bounds", "SafetensorsTensors", "View"]


def shape_of(arrays: Mapping, name: str) -> tuple:
    """A tensor's shape without reading it (a lazy mapping's ``shape_of``), or the array's."""
    lazy = getattr(arrays, "shape_of", None)
    return tuple(lazy(name)) if lazy is not None else tuple(np.shape(arrays[name]))


def share_bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of share ``index`` of ``parts`` equal slices of ``length`` (as
    ``torch.chunk`` cuts a dimension that ``parts`` divides)."""
    if parts < 1 or not 0 <= index < parts or length % parts:
        raise ValueError(f"{length} does not split into {parts} equal shares (share {index})")
    n = length // parts
    return index * n, (index + 1) * n


def read_share(arrays: Mapping, name: str, dim: int | None, parts: int = 1, index: int = 0) -> np.ndarray:
    """Share ``index`` of ``parts`` along ``dim`` of ``arrays[name]`` (None: the whole), read alone
    where the mapping can (its ``read_share``), else cut from the whole tensor."""
    if dim is None or parts == 1:
        return np.asarray(arrays[name])
    lazy = getattr(arrays, "read_share", None)  # (an optional part of the lazy mapping's protocol)
    if lazy is not None:
        return lazy(name, dim, parts, index)
    a = np.asarray(arrays[name])
    start, stop = share_bounds(a.shape[dim], parts, index)
    return a[(slice(None),) * dim + (slice(start, stop),)]


class SafetensorsTensors(Mapping):
    """The tensors of a safetensors file, each read when asked for, or a share of one: positioned
    reads of only its bytes (a column share one row's run at a time), never a mapping of the file,
    so that memory holds what was asked for and no page of the rest. The header is validated by
    ``safetensors`` itself at construction (``SafetensorError``: truncated, overlapping, not
    covering the file). The file is kept open: it stays readable while this mapping lives."""

    _NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "i1", "U8": "u1", "BOOL": "?"}

    def __init__(self, path: str | Path):
        import json

        from safetensors import safe_open

        self.path = Path(path)
        with safe_open(str(self.path), framework="numpy"):  # (its checks of the header and the file)
            pass
        self.fd = os.open(self.path, os.O_RDONLY)
        n = int.from_bytes(os.pread(self.fd, 8, 0), "little")
        header = json.loads(os.pread(self.fd, n, 8))
        self.start = 8 + n
        self.entries = {k: v for k, v in header.items() if k != "__metadata__"}

    def unreadable(self) -> list[str]:
        """The tensors stored in a dtype numpy cannot hold (bfloat16, float8)."""
        return [k for k, e in self.entries.items() if e["dtype"] not in self._NUMPY]

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)

    def _dtype(self, name: str) -> np.dtype:
        kind = self.entries[name]["dtype"]
        if kind not in self._NUMPY:
            raise ValueError(f"{self.path}: {name} is stored as {kind}, which numpy cannot hold; save the "
                             f"weights as float32")
        return np.dtype(self._NUMPY[kind])

    def _pread(self, offset: int, size: int) -> bytearray:
        out = bytearray(size)
        view, done = memoryview(out), 0
        while done < size:
            got = os.preadv(self.fd, [view[done:]], self.start + offset + done)
            if got <= 0:
                raise OSError(f"{self.path} ended before its header's byte range")
            done += got
        return out

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.entries:
            raise KeyError(name)
        lo, hi = self.entries[name]["data_offsets"]
        return np.frombuffer(self._pread(lo, hi - lo), self._dtype(name)).reshape(self.shape_of(name))

    def shape_of(self, name: str) -> tuple:
        return tuple(self.entries[name]["shape"])

    def read_share(self, name: str, dim: int, parts: int, index: int) -> np.ndarray:
        shape, dtype = self.shape_of(name), self._dtype(name)
        start, stop = share_bounds(shape[dim], parts, index)
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:]) * dtype.itemsize
        run = (stop - start) * inner  # (the share's bytes of one index of the dimensions before dim)
        base = self.entries[name]["data_offsets"][0]
        out = bytearray(outer * run)
        for i in range(outer):
            out[i * run:(i + 1) * run] = self._pread(base + (i * shape[dim] + start) * inner, run)
        share = (*shape[:dim], stop - start, *shape[dim + 1:])
        return np.frombuffer(out, dtype).reshape(share)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


class View(Mapping):
    """``{name: source name}`` over a (lazy) ``source``: each tensor read when asked for and passed
    through ``fix(name, array)`` (a check, a dtype, padding), shapes through ``shape(name, source
    shape)``. A share of a tensor is read alone from the source (along the other dimension of one
    ``fix`` transposes), but for those ``whole_only`` lists (``fix`` changes their length)."""

    def __init__(self, source: Mapping, names: dict[str, str], fix: Callable[[str, np.ndarray], np.ndarray],
                 shape: Callable[[str, tuple], tuple] = lambda name, s: s, whole_only: tuple = (),
                 transposed: frozenset = frozenset()):
        self.source, self.names, self.fix, self.shape, self.whole_only = source, names, fix, shape, whole_only
        self.transposed = transposed  # (2-D tensors ``fix`` transposes: a share is cut along the other dim)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fix(name, np.asarray(self.source[self.names[name]]))

    def shape_of(self, name: str) -> tuple:
        return tuple(self.shape(name, shape_of(self.source, self.names[name])))

    def read_share(self, name: str, dim: int, parts: int, index: int) -> np.ndarray:
        if name in self.whole_only:
            return read_share({name: self[name]}, name, dim, parts, index)
        along = 1 - dim if name in self.transposed else dim
        return self.fix(name, read_share(self.source, self.names[name], along, parts, index))

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
