"""TFRecord files of ``tf.train.Example`` records, without TensorFlow, and their JSON sidecar.

Writing uses the ``tfrecord`` package's ``Example`` proto and CRC (files are interchangeable
with Google's and NVIDIA's) with deterministic serialization, so the same input and seed give
byte-identical files. Reading frames records itself and verifies both CRCs: a corrupt record or a
truncated file fails with the file name and the record's byte offset (``tfrecord``'s own
reader does not check CRCs). ``tfrecord`` and TensorFlow cannot share a process: the
TensorFlow reader (``hvd_bert.tf.data``) never imports this module's readers.

Format of a record: uint64 length, uint32 masked crc32c(length), data, uint32 masked
crc32c(data), little-endian.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from hvd_bert.common.checkpoint import atomic_write

__all__ = ["CorruptRecordError", "DatasetError", "write_examples", "iter_records", "decode_example",
           "SIDECAR", "write_sidecar", "read_sidecar", "file_sha256", "shard_name"]

SIDECAR = "dataset.json"
_MASK_DELTA = 0xA282EAD8


class CorruptRecordError(ValueError):
    """A record whose CRC does not match, or a file that ends inside a record."""


class DatasetError(ValueError):
    """A dataset folder that is missing, empty, or does not match what the reader expects."""


def _masked_crc(data: bytes) -> int:
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def shard_name(index: int, total: int, prefix: str = "part") -> str:
    return f"{prefix}-{index:05d}-of-{total:05d}.tfrecord"


def _serialize(ex: Mapping[str, tuple[Any, str]]) -> bytes:
    from tfrecord import example_pb2

    out = example_pb2.Example()
    for name, (values, kind) in ex.items():
        feat = out.features.feature[name]
        if kind == "int":
            feat.int64_list.value.extend(int(v) for v in values)
        elif kind == "float":
            feat.float_list.value.extend(float(v) for v in values)
        elif kind == "byte":
            feat.bytes_list.value.append(values.encode() if isinstance(values, str) else bytes(values))
        else:
            raise ValueError(f"feature {name!r}: kind must be int, float or byte, got {kind!r}")
    # Deterministic: `features` is a protobuf map, whose entry order otherwise varies by process.
    return out.SerializeToString(deterministic=True)


def write_examples(path: str | Path, examples: Iterable[Mapping[str, tuple[Any, str]]]) -> int:
    """Write ``{feature: (values, "int"|"float"|"byte")}`` examples as ``tf.train.Example``
    records (the ``tfrecord`` package's proto and CRC) to ``path`` atomically. Returns the
    number of records."""
    from tfrecord.writer import TFRecordWriter

    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "wb") as f:
            for ex in examples:
                data = _serialize(ex)
                length = struct.pack("<Q", len(data))
                f.write(length)
                f.write(TFRecordWriter.masked_crc(length))
                f.write(data)
                f.write(TFRecordWriter.masked_crc(data))
                count += 1

    atomic_write(path, write)
    return count


def iter_records(path: str | Path, verify: bool = True) -> Iterator[tuple[int, bytes]]:
    """``(byte offset, record)`` for every record of a TFRecord file, CRCs verified."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file; prepare the data again (hvd-bert prepare-bert)") from None
    with f:
        offset = 0
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise CorruptRecordError(
                    f"{path}: truncated at byte offset {offset} (record header has {len(header)} of "
                    f"12 bytes); the file was cut short: regenerate it")
            length, length_crc = struct.unpack("<QI", header)
            if verify and _masked_crc(header[:8]) != length_crc:
                raise CorruptRecordError(
                    f"{path}: record at byte offset {offset}: length CRC mismatch (corrupt file); "
                    f"regenerate it")
            data = f.read(length)
            footer = f.read(4)
            if len(data) < length or len(footer) < 4:
                raise CorruptRecordError(
                    f"{path}: truncated at byte offset {offset} (record of {length} bytes ends "
                    f"early); the file was cut short: regenerate it")
            if verify and _masked_crc(data) != struct.unpack("<I", footer)[0]:
                raise CorruptRecordError(
                    f"{path}: record at byte offset {offset}: data CRC mismatch (corrupt record); "
                    f"regenerate the file")
            yield offset, data
            offset += 16 + length


def decode_example(record: bytes, spec: Mapping[str, tuple[str, int]]) -> dict[str, np.ndarray]:
    """Decode one serialized ``tf.train.Example`` into arrays: ``spec`` maps feature name to
    ``("int"|"float", length)``; a missing feature or a wrong length is a DatasetError."""
    from tfrecord import example_pb2

    ex = example_pb2.Example()
    ex.ParseFromString(record)
    out = {}
    for name, (kind, length) in spec.items():
        if name not in ex.features.feature:
            raise DatasetError(f"record has no feature {name!r}; is this the right kind of data?")
        feat = ex.features.feature[name]
        if kind == "int":
            arr = np.asarray(feat.int64_list.value, dtype=np.int64)
        else:
            arr = np.asarray(feat.float_list.value, dtype=np.float32)
        if len(arr) != length:
            raise DatasetError(f"feature {name!r} has {len(arr)} values, expected {length}; the data "
                               f"was prepared with other settings (see {SIDECAR})")
        out[name] = arr
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_sidecar(folder: str | Path, meta: dict) -> Path:
    """Write ``folder/dataset.json`` atomically (written last: its presence marks the data
    complete)."""
    return atomic_write(Path(folder) / SIDECAR,
                        lambda tmp: tmp.write_text(json.dumps(meta, indent=1, sort_keys=True)))


def read_sidecar(folder: str | Path, kind: str, expect: Mapping[str, Any] | None = None) -> dict:
    """Read and check a dataset folder: the sidecar exists and is of ``kind``, every shard it
    lists exists, and each ``expect`` setting matches (e.g. ``max_seq_length``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"data folder {folder} does not exist; prepare it first "
                           f"(hvd-bert prepare-bert / prepare-ncf) or pass the right path")
    side = folder / SIDECAR
    if not side.is_file():
        raise DatasetError(f"{folder} has no {SIDECAR}: the data is incomplete (preparation was "
                           f"interrupted?) or not prepared by hvd_bert; prepare it again")
    try:
        meta = json.loads(side.read_text())
    except json.JSONDecodeError as e:
        raise DatasetError(f"{side} is not valid JSON ({e}); prepare the data again") from None
    if meta.get("kind") != kind:
        raise DatasetError(f"{folder} holds {meta.get('kind')!r} data, expected {kind!r}")
    for shard in meta.get("shards", []):
        if not (folder / shard["file"]).is_file():
            raise DatasetError(f"{folder / shard['file']} is listed in {SIDECAR} but missing; "
                               f"prepare the data again")
    if not meta.get("shards"):
        raise DatasetError(f"{folder} has no shards; the input was empty?")
    for key, want in (expect or {}).items():
        if key in meta and meta[key] != want:
            raise DatasetError(
                f"{folder} was prepared with {key}={meta[key]!r} but {want!r} is expected; prepare "
                f"the data again with {key}={want!r} or change the setting to {meta[key]!r}")
    return meta


def read_ordered(folder: str | Path, plan, shuffle_buffer: int, stream: int,
                 verify: bool = True) -> Iterator[bytes]:
    """One rank's records for one epoch in the toolkit's reading order (the reference that the
    TensorFlow reader reproduces): ``plan.files`` in order, every ``record_stride``-th record
    from ``record_offset``, then windows of ``shuffle_buffer`` sorted by
    ``sharding.shuffle_keys``."""
    from hvd_bert.common.sharding import window_order

    def stream_records():
        i = 0
        for name in plan.files:
            for _, rec in iter_records(Path(folder) / name, verify):
                if i % plan.record_stride == plan.record_offset:
                    yield rec
                i += 1

    if shuffle_buffer <= 1:
        yield from stream_records()
        return
    window: list[bytes] = []
    start = 0
    for rec in stream_records():
        window.append(rec)
        if len(window) == shuffle_buffer:
            for j in window_order(len(window), start, stream):
                yield window[j]
            start += len(window)
            window = []
    if window:
        for j in window_order(len(window), start, stream):
            yield window[j]
