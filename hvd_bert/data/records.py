"""TFRecord files of ``tf.train.Example`` records, without TensorFlow (their sidecar: ``data.sidecar``).

The ``tf.train.Example`` protobuf is encoded and decoded here, by hand (five small messages), so
this module needs neither TensorFlow nor a compiled proto: files are interchangeable with
Google's and NVIDIA's, written as protobuf's deterministic serialization writes them (the same
input and seed give byte-identical files), and CRCs come from the ``crc32c`` extension. Reading
frames records itself and verifies both CRCs: a corrupt record or a truncated file fails with
the file name and the record's byte offset.

Format of a record: uint64 length, uint32 masked crc32c(length), data, uint32 masked
crc32c(data), little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from hvd_bert.data.errors import CorruptRecordError, DatasetError
from hvd_bert.data.example_proto import (parse_example, serialize_example, serialize_rows, unpack_varints,
                                        varint)
from hvd_bert.files import atomic_write

__all__ = ["CorruptRecordError", "DatasetError", "write_examples", "write_records", "serialize_rows",
           "iter_records", "decode_example", "decode_batch", "shard_name", "read_ordered", "count_message"]

_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> int:
    import crc32c  # a C extension with no framework behind it

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def shard_name(index: int, total: int, prefix: str = "part") -> str:
    return f"{prefix}-{index:05d}-of-{total:05d}.tfrecord"


# ------------------------------------------------------------------ tf.train.Example, by hand
# Example { Features features = 1 }  Features { map<string, Feature> feature = 1 }
# Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3 } }
# BytesList { repeated bytes value = 1 }  FloatList { repeated float value = 1 [packed] }
# Int64List { repeated int64 value = 1 [packed] }
# Written as protobuf's deterministic serialization writes it (map entries sorted by key), so the
# bytes equal TensorFlow's ``Example.SerializeToString(deterministic=True)`` (tested in tests/tf).


def write_examples(path: str | Path, examples: Iterable[Mapping[str, tuple[Any, str]]]) -> int:
    """Write ``{feature: (values, "int"|"float"|"byte")}`` examples as ``tf.train.Example``
    records to ``path`` atomically. Returns the number of records."""
    return write_records(path, (serialize_example(ex) for ex in examples))


def write_records(path: str | Path, records: Iterable[bytes]) -> int:
    """Write serialized records to ``path`` as a TFRecord file, atomically. Returns their number."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "wb") as f:
            for data in records:
                length = struct.pack("<Q", len(data))
                f.write(b"".join((length, struct.pack("<I", _masked_crc(length)), data,
                                  struct.pack("<I", _masked_crc(data)))))
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
    ``("int"|"float", length)``; a missing feature or a wrong length is a DatasetError. The int
    features' packed varints are decoded together, in one vectorised pass."""
    feats = parse_example(record)
    out, ints = {}, []
    for name, (kind, length) in spec.items():
        if name not in feats:
            raise DatasetError(f"record has no feature {name!r}; is this the right kind of data?")
        number, payloads = feats[name]
        if kind == "int":
            if number not in (0, 3):
                raise DatasetError(f"feature {name!r} is not an int64 list")
            # packed (what every writer does) or, as protobuf also accepts, one varint per field
            ints.append((name, length, b"".join(p if isinstance(p, bytes) else varint(p) for p in payloads)))
        else:
            if number not in (0, 2):
                raise DatasetError(f"feature {name!r} is not a float list")
            arr = np.frombuffer(b"".join(p for p in payloads if isinstance(p, bytes)), dtype="<f4")
            _check_length(name, len(arr), length)
            out[name] = arr.astype(np.float32)
    if ints:
        blob = b"".join(p for _, _, p in ints)
        values = unpack_varints(blob)
        ends = np.cumsum(np.frombuffer(blob, np.uint8) < 0x80)  # values completed after each byte
        pos = 0
        for name, length, payload in ints:
            start = int(ends[pos - 1]) if pos else 0
            pos += len(payload)
            stop = int(ends[pos - 1]) if pos else 0
            _check_length(name, stop - start, length)
            out[name] = values[start:stop]
    return {name: out[name] for name in spec}


def decode_batch(records: Sequence[bytes], spec: Mapping[str, tuple[str, int]]) -> dict[str, np.ndarray]:
    """``np.stack`` of :func:`decode_example` over ``records``, with the int features of the
    whole batch decoded in one vectorised pass (the readers' per-batch path)."""
    if not records:
        raise ValueError("decode_batch needs at least one record")
    int_names = [n for n, (kind, _) in spec.items() if kind == "int"]
    rows, blobs = [], []
    for rec in records:
        feats = parse_example(rec)
        row = {}
        for name, (kind, length) in spec.items():
            if name not in feats:
                raise DatasetError(f"record has no feature {name!r}; is this the right kind of data?")
            number, payloads = feats[name]
            if kind == "int":
                if number not in (0, 3) or len(payloads) != 1 or not isinstance(payloads[0], bytes):
                    return _stack([decode_example(r, spec) for r in records], spec)  # unusual layout
                blobs.append(payloads[0])
            else:
                if number not in (0, 2):
                    raise DatasetError(f"feature {name!r} is not a float list")
                arr = np.frombuffer(b"".join(p for p in payloads if isinstance(p, bytes)), dtype="<f4")
                _check_length(name, len(arr), length)
                row[name] = arr
        rows.append(row)
    out = {n: np.stack([r[n] for r in rows]).astype(np.float32) for n, (k, _) in spec.items() if k == "float"}
    if int_names:
        values = unpack_varints(b"".join(blobs))
        want = [spec[n][1] for n in int_names]
        per_record = sum(want)
        if values.size != per_record * len(records):
            return _stack([decode_example(r, spec) for r in records], spec)  # names the bad feature
        values = values.reshape(len(records), per_record)
        start = 0
        for name, n in zip(int_names, want):
            out[name] = values[:, start:start + n]
            start += n
    return {name: out[name] for name in spec}


def _stack(rows: list[dict], spec) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in rows]) for k in spec}


def _check_length(name: str, got: int, want: int) -> None:
    if got != want:
        raise DatasetError(f"feature {name!r} has {got} values, expected {want}; the data was prepared "
                           f"with other settings (see dataset.json)")


def count_message(folder, name: str, actual: int, claimed: int) -> str:
    return (f"{Path(folder) / name} holds {actual} records, but {Path(folder) / 'dataset.json'} says "
            f"{claimed}: the sidecar does not describe these shards; prepare the data again")


def read_ordered(folder: str | Path, plan, shuffle_buffer: int, stream: int, verify: bool = True,
                 counts: Mapping[str, int] | None = None, before_shard=None) -> Iterator[bytes]:
    """One rank's records for one epoch in the toolkit's reading order (the reference that the
    TensorFlow reader reproduces): ``plan.files`` in order, every ``record_stride``-th record
    from ``record_offset``, then windows of ``shuffle_buffer`` sorted by
    ``sharding.shuffle_keys``. ``counts``: each file's records as the sidecar says (a file that
    holds another number is a DatasetError naming it). ``before_shard()`` runs before each file
    is opened (``sidecar.SidecarWatch.check``: the data was not prepared again meanwhile)."""
    from hvd_bert.core.sharding import window_order

    def stream_records():
        i = 0
        for name in plan.files:
            _ = before_shard() if before_shard is not None else None
            n = 0
            for _, rec in iter_records(Path(folder) / name, verify):
                if i % plan.record_stride == plan.record_offset:
                    yield rec
                i += 1
                n += 1
            if counts is not None and n != counts[name]:
                raise DatasetError(count_message(folder, name, n, counts[name]))

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
