"""Sharded checkpoints, framework-free: each rank writes what it owns, one index makes it whole.

A sharded checkpoint is a folder ``ckpt-<step>.shards/``:

    rank-00000.safetensors   the pieces rank 0 wrote (safetensors: a JSON header, raw bytes)
    rank-00000.json          what they are: per key, the tensor, its slice, dtype and CRC-32C
    ...                      one pair per rank that wrote
    index.json               written last, atomically, by rank 0 once every rank's pair is on
                             disk: the checkpoint is complete only when it exists

Every tensor is named by what it is in the whole model (``model/<parameter>``,
``optim/<buffer>/<parameter>``) with its whole shape. A piece is a flat range of one share of
it: ``split = (dim, parts, index)`` says which of ``parts`` equal slices along ``dim`` (a
tensor-parallel share; None: the whole tensor), ``flat = (start, stop)`` which elements of that
share in its row-major order (a ZeRO partition's piece of it). So a checkpoint written under
one layout (world size, ZeRO stage, tensor parallelism) is read under any other:
:meth:`Reader.read` assembles any share's flat range from the pieces that overlap it, reading
only their byte ranges (``safetensors.safe_open``'s lazy slices), in memory bounded by one share
of one tensor. PyTorch and TensorFlow runs write and read the same files.

Why not ``torch.distributed.checkpoint``: it needs a torch process group (this project's ranks
talk through Horovod), its metadata file is a pickle (never unpickled from a user here), and
TensorFlow could not read it. The layout follows its ideas (per-rank files, a coordinator's
metadata written last, load-time resharding) and Megatron's (a piece is saved by one replica).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvd_bert.files import atomic_write
from hvd_bert.train.checkpoint import SHARDED as SUFFIX, SHARDED_INDEX as INDEX, has_index
from hvd_bert.train.engine import CheckpointError
from hvd_bert.train.sharded_index import (DTYPES, FIX, MAX_INDEX_BYTES, header_entry_fault, norm_split,
                                          share_shape, validate)

__all__ = ["SUFFIX", "INDEX", "FORMAT", "validate", "MAX_INDEX_BYTES", "Piece", "share_bounds", "write_rank",
           "write_index", "mark_failed", "FAILED", "Reader", "is_complete", "rank_pieces", "LazyTensors",
           "read_on_every_rank", "is_sharded", "model_weights"]

FORMAT = "hvd_bert.sharded/1"
_BLOCK = 16 * 2**20  # bytes read (and CRC-checked) at a time


@dataclass(frozen=True)
class Piece:
    """Elements ``flat`` (start, stop) of one share (``split``: (dim, parts, index), or None for
    the whole) of the tensor ``name`` whose whole shape is ``shape``."""

    name: str
    shape: tuple
    split: tuple | None = None
    flat: tuple | None = None  # None: the whole share

    def share_shape(self) -> tuple:
        return share_shape(self.shape, self.split)

    def span(self) -> tuple[int, int]:
        return tuple(self.flat) if self.flat is not None else (0, math.prod(self.share_shape()))


def share_bounds(shape, split) -> tuple[int, int, int]:
    """``(dim, start, stop)`` of a share along its split dimension (dim 0, the whole: None)."""
    if split is None:
        return 0, 0, int(shape[0]) if len(shape) else 1
    dim, parts, index = split
    n = int(shape[dim]) // parts
    return dim, index * n, (index + 1) * n


def rank_pieces(tensors: list[tuple[str, tuple, tuple | None]], parts: int, index: int,
                replica: bool = True) -> list[tuple[int, Piece]]:
    """``(position, piece)`` of the ``tensors`` (name, whole shape, this rank's split or None) that
    writer ``index`` of ``parts`` owns: a contiguous 1/parts of their shares flattened one after
    another (the ZeRO partition, :func:`hvd_bert.core.zero.partition`, so that a ZeRO rank writes
    the pieces it updated). ``replica`` False (a tensor-parallel rank other than its group's
    first): the tensors held whole on every rank of the group are left to the first."""
    from hvd_bert.core.zero import partition

    sizes = [math.prod(share_shape(shape, split)) for _, shape, split in tensors]
    out = []
    for i, off, _, n in partition(sizes, parts).pieces(index):
        name, shape, split = tensors[i]
        if replica or norm_split(split) is not None:
            out.append((i, Piece(name, tuple(shape), norm_split(split), (off, off + n))))
    return out


# ---------------------------------------------------------------------- writing
def _crc(a: np.ndarray) -> str:
    import crc32c

    return f"{crc32c.crc32c(np.ascontiguousarray(a).reshape(-1).view(np.uint8)):08x}"


def write_rank(folder: str | Path, rank: int, pieces: list[tuple[Piece, np.ndarray]]) -> None:
    """This rank's pieces as ``rank-<r>.safetensors`` and its manifest ``rank-<r>.json``, each
    written atomically and fsynced, the manifest last (what the index waits for)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    arrays, entries = {}, {}
    for j, (piece, data) in enumerate(pieces):
        key = f"{j}"
        data = np.ascontiguousarray(data).reshape(-1)
        arrays[key] = data
        entries[key] = {"name": piece.name, "shape": list(piece.shape),
                        "split": list(piece.split) if piece.split is not None else None,
                        "flat": list(piece.span()), "dtype": str(data.dtype), "crc32c": _crc(data)}
        if data.size != piece.span()[1] - piece.span()[0]:
            raise ValueError(f"{piece.name}: {data.size} values for the range {piece.span()}")
    data_file = folder / f"rank-{rank:05d}.safetensors"
    atomic_write(data_file, lambda tmp: save_file(arrays, str(tmp)),
                 size=sum(a.nbytes for a in arrays.values()))
    manifest = {"file": data_file.name, "bytes": data_file.stat().st_size, "pieces": entries}
    atomic_write(folder / f"rank-{rank:05d}.json", lambda tmp: tmp.write_text(json.dumps(manifest)))


FAILED = ".failed"  # rank-<r>.failed: that writer's shard could not be written (what the index stops on)


def mark_failed(folder: str | Path, rank: int) -> None:
    """Say that this rank's shard could not be written (an empty file: it needs no data block, so
    a full disk takes it), so that rank 0 stops waiting for it at once; best effort."""
    try:
        (Path(folder) / f"rank-{rank:05d}{FAILED}").touch()
    except OSError:
        pass  # (rank 0 then waits out its timeout, or its end when the run ends)


def write_index(folder: str | Path, writers: int, meta: dict, *, timeout_s: float = 600.0,
                alive=lambda: True) -> Path:
    """Rank 0, once every writer's manifest is on disk (polled: the writers may be other hosts on
    a shared file system): ``index.json``, atomically, which makes the checkpoint complete.
    ``alive()`` False or ``timeout_s`` passing without every manifest raises CheckpointError."""
    folder = Path(folder)
    names = [folder / f"rank-{r:05d}.json" for r in range(writers)]
    deadline = time.monotonic() + timeout_s
    while not all(p.is_file() for p in names):
        failed = sorted(p.name for p in folder.glob(f"rank-*{FAILED}"))
        if failed:  # (a writer that failed says so: waiting out the timeout would stall every rank)
            raise CheckpointError(f"{folder}: {', '.join(failed[:4])}: a rank could not write its shard; the "
                                  f"checkpoint stays incomplete (no {INDEX})")
        if time.monotonic() > deadline or not alive():
            missing = [p.name for p in names if not p.is_file()]
            raise CheckpointError(f"{folder}: the shards {', '.join(missing[:4])} were not written within "
                                  f"{timeout_s:.0f} s; the checkpoint stays incomplete (no {INDEX})")
        time.sleep(0.02)
    files = {}
    for p in names:
        m = json.loads(p.read_text())
        files[m["file"]] = {"bytes": m["bytes"], "pieces": m["pieces"]}
    index = {"format": FORMAT, "meta": meta, "files": files}
    path = folder / INDEX
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(index)))
    return path


def read_on_every_rank(read, folder: str | Path, allgather_object) -> dict:
    """``read(Reader(folder))`` on every rank (each reads its own pieces); a CheckpointError on
    any rank is raised on every rank (a collective). Returns what ``read`` returned."""
    error, got = None, None
    try:
        got = read(Reader(folder))
    except CheckpointError as e:
        error = str(e)
    except (KeyError, TypeError, ValueError) as e:  # what validation did not foresee: still one line
        error = (f"{Path(folder) / INDEX} is damaged: its metadata cannot be taken ({type(e).__name__}: "
                 f"{e}); "
                 f"{FIX}")
    errors = [e for e in allgather_object(error, "hvd_bert.resume.shards") if e]
    if errors:
        raise CheckpointError(errors[0])
    return got


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` names a sharded checkpoint (``ckpt-<step>.shards``)."""
    return Path(path).suffix == f".{SUFFIX}"


def is_complete(folder: str | Path) -> bool:
    return has_index(folder)


# ---------------------------------------------------------------------- reading
class Reader:
    """A complete sharded checkpoint, opened for reading any share of any tensor. A checkpoint is
    untrusted input: opening it validates the index and every shard's header completely before
    anything is allocated or read (:func:`validate`), and every byte read is checked against its
    piece's CRC-32C, however the read is split. Any fault is a CheckpointError naming the file."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / INDEX
        if not has_index(self.folder):
            raise CheckpointError(f"{self.folder} is an incomplete checkpoint (no {INDEX}: its writing was "
                                  f"interrupted); {FIX}")
        if not path.is_file():  # (a pipe would block, a device never ends: never opened)
            raise CheckpointError(f"{path} is not a regular file (a pipe, a device, a folder or a dangling "
                                  f"link where the index was written); {FIX}")
        size = path.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise CheckpointError(f"{path} is damaged: {size / 2**20:.0f} MiB, more than any index of "
                                  f"{MAX_INDEX_BYTES / 2**20:.0f} MiB this format writes; {FIX}")
        try:
            index = json.loads(path.read_bytes().decode("utf-8"))
            ok = (isinstance(index, dict) and index.get("format") == FORMAT
                  and isinstance(index.get("files"), dict))
        except (OSError, ValueError, RecursionError):  # (JSON nested past the parser's depth too)
            ok = False
        if not ok:
            raise CheckpointError(f"{path} is not an index of hvd_bert's sharded checkpoints ({FORMAT}); "
                                  f"{FIX}")
        self._open: dict[str, tuple[int, dict]] = {}
        self.meta, self.chunks = validate(self.folder, index, lambda file: self._header(file)[1])

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.chunks if n.startswith(prefix))

    def shape(self, name: str) -> tuple:
        return tuple(self._chunks(name)[0]["shape"])

    def _chunks(self, name: str) -> list[dict]:
        if name not in self.chunks:
            raise CheckpointError(f"{self.folder} holds no tensor {name!r}: it was written by another model "
                                  f"or optimizer; resume it with the settings it was written with")
        return self.chunks[name]

    def _header(self, file: str) -> tuple[int, dict]:
        """A shard's safetensors header (8 bytes of length, then JSON: each key's dtype, shape and
        byte range after the header): read once, and checked against the file's real size."""
        if file not in self._open:
            path = self.folder / file
            try:
                size = path.stat().st_size
                with open(path, "rb") as f:
                    n = int.from_bytes(f.read(8), "little")
                    if not 0 < n <= size - 8:
                        raise ValueError(f"a header of {n} bytes in a file of {size}")
                    header = json.loads(f.read(n))
                if not isinstance(header, dict):
                    raise ValueError("its header is not a JSON object")
            except (OSError, ValueError, RecursionError) as e:
                raise CheckpointError(f"{path} cannot be read as safetensors ({e or 'nested too deeply'}); "
                                      f"{FIX}") from None
            body = size - 8 - n
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                bad = header_entry_fault(entry, body)
                if bad:
                    raise CheckpointError(f"{path} is damaged: its header's tensor {key!r} {bad}; {FIX}")
            self._open[file] = (8 + n, header)
        return self._open[file]

    def _slice(self, c: dict, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of chunk ``c`` (flat positions of its share). The whole piece's bytes
        pass through its CRC-32C (positioned reads in blocks of ``_BLOCK``, no mapping of the file),
        and only [lo, hi) is kept: memory holds the range asked for and one block."""
        import crc32c

        start, header = self._header(c["file"])
        entry = header[c["key"]]
        dtype = np.dtype(DTYPES[entry["dtype"]])
        a, b = c["flat"]
        first = start + entry["data_offsets"][0]
        out = np.empty(hi - lo, dtype)
        view, want = memoryview(out).cast("B"), ((lo - a) * dtype.itemsize, (hi - a) * dtype.itemsize)
        crc, pos, total = 0, 0, (b - a) * dtype.itemsize
        path = self.folder / c["file"]
        with open(path, "rb") as f:
            f.seek(first)
            while pos < total:
                block = f.read(min(_BLOCK, total - pos))
                if not block:
                    raise CheckpointError(f"{path} is truncated: {c['name']} ends past its end; {FIX}")
                crc = crc32c.crc32c(block, crc)
                s0, s1 = max(pos, want[0]), min(pos + len(block), want[1])
                if s0 < s1:
                    view[s0 - want[0]:s1 - want[0]] = block[s0 - pos:s1 - pos]
                pos += len(block)
        if f"{crc:08x}" != c["crc32c"]:
            raise CheckpointError(f"{path} is damaged: the CRC-32C of {c['name']} no longer matches what was "
                                  f"written; {FIX}")
        return out

    def read(self, name: str, split=None, flat=None, dtype=np.float32, shape=None) -> np.ndarray:
        """Elements ``flat`` of share ``split`` of ``name`` (see :class:`Piece`), flat, from the
        pieces that overlap it, whatever layout wrote them. ``shape``: the whole shape this model
        has for it (another is refused: the checkpoint is another model's)."""
        chunks = self._chunks(name)
        if shape is not None and tuple(int(d) for d in shape) != tuple(chunks[0]["shape"]):
            raise CheckpointError(f"{self.folder} holds {name} of shape {tuple(chunks[0]['shape'])}, this "
                                  f"model's is {tuple(int(d) for d in shape)}: it was written by another "
                                  f"model; resume "
                                  f"it with the model settings it was written with, or give another "
                                  f"train.output_dir")
        if split is not None:
            try:
                share_shape(chunks[0]["shape"], split)
            except ValueError as e:
                raise CheckpointError(f"{self.folder}: {name} cannot be read as this model splits it ({e}); "
                                      f"resume it with the model settings it was written with") from None
        want = Piece(name, tuple(chunks[0]["shape"]), tuple(split) if split is not None else None,
                     tuple(flat) if flat is not None else None)
        lo, hi = want.span()
        out = np.empty(hi - lo, dtype=dtype)
        filled = np.zeros(hi - lo, dtype=bool)
        same = [c for c in chunks if norm_split(c["split"]) == norm_split(want.split)]
        if same:  # the layout that wrote it: flat ranges of this very share
            for c in same:
                a, b = max(lo, c["flat"][0]), min(hi, c["flat"][1])
                if a < b:
                    out[a - lo:b - lo] = self._slice(c, a, b)
                    filled[a - lo:b - lo] = True
        else:  # another split: place each overlapping share's pieces in this share's coordinates
            share = np.empty(want.share_shape(), dtype=dtype)
            have = np.zeros(want.share_shape(), dtype=bool)
            for c in chunks:
                _place(self, c, want, share, have)
            out[:] = share.reshape(-1)[lo:hi]
            filled[:] = have.reshape(-1)[lo:hi]
        if not filled.all():
            raise CheckpointError(f"{self.folder} does not hold all of {name} ({int((~filled).sum())} values "
                                  f"missing): a shard of it is missing from {INDEX}; {FIX}")
        return out






class LazyTensors(Mapping):
    """The whole tensors under ``prefix`` of a checkpoint, each read when it is asked for (and
    not kept): what ``convert`` streams, in memory bounded by the largest tensor."""

    def __init__(self, reader: Reader, prefix: str):
        self.reader, self.prefix = reader, prefix
        self.names = [n[len(prefix):] for n in reader.names(prefix)]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.names:
            raise KeyError(name)
        return self.reader.read(self.prefix + name).reshape(self.shape_of(name))

    def shape_of(self, name: str) -> tuple:
        return self.reader.shape(self.prefix + name)

    def read_share(self, name: str, dim: int, parts: int, index: int) -> np.ndarray:
        """Share ``index`` of ``parts`` along ``dim`` alone (a tensor-parallel rank's, from the
        pieces that hold it: ``weights.lazy``)."""
        split = (dim, parts, index)
        flat = self.reader.read(self.prefix + name, split=split)
        return flat.reshape(share_shape(self.shape_of(name), split))

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def model_weights(folder: str | Path):
    """``(weights, bert config)`` of a sharded checkpoint for either framework's reader: its
    model's tensors under their portable names, each read when it is used (``LazyTensors``; the
    optimizer state is left unread), and the ``bert_config.json`` of its run folder. A damaged
    checkpoint is a WeightsError (one line)."""
    from hvd_bert.weights.portable import WeightsError, read_run_bert_config

    from hvd_bert.train.checkpoint import checkpoint_step

    try:
        reader = Reader(folder)
    except CheckpointError as e:
        raise WeightsError(str(e)) from None
    named, says = checkpoint_step(folder), reader.meta.get("step")
    if named is not None and says is not None and named != says:  # (as a resume checks it)
        raise WeightsError(f"{Path(folder) / INDEX} is damaged: it says step {says}, its folder's name step "
                           f"{named}; {FIX}")
    return LazyTensors(reader, "model/"), read_run_bert_config(Path(folder).parent)


def _place(reader: Reader, c: dict, want: Piece, share: np.ndarray, have: np.ndarray) -> None:
    """Copy what chunk ``c`` (a flat range of one share) holds of share ``want`` into it."""
    shape = tuple(c["shape"])
    src_split, want_split = norm_split(c["split"]), norm_split(want.split)
    dims = {s[0] for s in (src_split, want_split) if s is not None}
    if len(dims) > 1:
        raise CheckpointError(f"{reader.folder}: {want.name} is split along another dimension than this "
                              f"model splits it; {FIX}")
    dim = dims.pop() if dims else 0
    _, s0, s1 = share_bounds(shape, src_split) if src_split is not None else (dim, 0, shape[dim])
    _, w0, w1 = share_bounds(shape, want_split) if want_split is not None else (dim, 0, shape[dim])
    a, b = max(s0, w0), min(s1, w1)
    if a >= b:
        return
    src_shape = share_shape(shape, src_split)
    buf = np.empty(src_shape, dtype=share.dtype)
    got = np.zeros(src_shape, dtype=bool)
    lo, hi = c["flat"]
    buf.reshape(-1)[lo:hi] = reader._slice(c, lo, hi)
    got.reshape(-1)[lo:hi] = True
    src = [slice(None)] * len(shape)
    dst = [slice(None)] * len(shape)
    src[dim], dst[dim] = slice(a - s0, b - s0), slice(a - w0, b - w0)
    mask = got[tuple(src)]
    share[tuple(dst)][mask] = buf[tuple(src)][mask]
    have[tuple(dst)] |= mask
