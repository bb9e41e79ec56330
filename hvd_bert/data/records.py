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

from hvd_bert.files import atomic_write

__all__ = ["CorruptRecordError", "DatasetError", "write_examples", "write_records", "serialize_rows",
           "iter_records", "decode_example", "decode_batch", "shard_name", "read_ordered", "count_message"]

_MASK_DELTA = 0xA282EAD8


class DatasetError(ValueError):
    """A dataset folder that is missing, empty, or does not match what the reader expects."""


class CorruptRecordError(DatasetError):
    """A record whose CRC does not match, or a file that ends inside a record."""


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

def _varint(n: int) -> bytes:
    if 0 <= n < 16384:
        return _SMALL_VARINTS[n]
    return _varint_of(n)


def _varint_of(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # negative int64: ten bytes of two's complement, as protobuf
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [_varint_of(i) for i in range(16384)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varints(values: np.ndarray) -> bytes:
    """Packed varints of int64 values (numpy, vectorised over the values)."""
    v = np.asarray(values, dtype=np.int64).astype(np.uint64)
    if v.size == 0:
        return b""
    top = int(v.max())
    if top < 0x80:  # token ids of a small vocab, labels, weights: one byte each
        return v.astype(np.uint8).tobytes()
    # each value's 7-bit groups, low first; the continuation bit on all but its last group
    groups = max(1, (top.bit_length() + 6) // 7)
    shifts = np.arange(groups, dtype=np.uint64) * np.uint64(7)
    g = ((v[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    n = np.ones(v.size, dtype=np.int64)
    for k in range(1, groups):
        n += v >= np.uint64(1 << (7 * k))
    keep = np.arange(groups)[None, :] < n[:, None]
    g[np.arange(groups)[None, :] < (n - 1)[:, None]] |= 0x80
    return g[keep].tobytes()


def _varint_rows(m: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The packed varints of each row of an int matrix, at once: ``(bytes, row offsets)``."""
    v = np.ascontiguousarray(m, dtype=np.int64).astype(np.uint64).reshape(m.shape[0], -1)
    rows, cols = v.shape
    top = int(v.max()) if v.size else 0
    groups = max(1, (top.bit_length() + 6) // 7)
    n = np.ones(v.shape, dtype=np.int64)
    for k in range(1, groups):
        n += v >= np.uint64(1 << (7 * k))
    flat, nf = v.ravel(), n.ravel()
    shifts = np.arange(groups, dtype=np.uint64) * np.uint64(7)
    g = ((flat[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    k = np.arange(groups)[None, :]
    g[k < (nf - 1)[:, None]] |= 0x80
    data = g[k < nf[:, None]].tobytes()
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(n.sum(axis=1), out=offsets[1:])
    return data, offsets


def _entry_prefix(key: bytes, tag: int, n: int) -> bytes:
    """The bytes of a features-map entry before its ``n`` payload bytes: what ``_serialize``
    writes as ``_field(1, key + _field(2, _field(tag, _field(1, payload))))``."""
    inner = (b"\x0a" + _varint(n)) if n else b""
    feat = _varint(tag << 3 | 2) + _varint(len(inner) + n)
    value = key + b"\x12" + _varint(len(feat) + len(inner) + n)
    return b"\x0a" + _varint(len(value) + len(feat) + len(inner) + n) + value + feat + inner


def serialize_rows(features: Mapping[str, tuple[np.ndarray, str]]) -> list[bytes]:
    """``tf.train.Example`` records of a batch: ``{name: (matrix, "int"|"float")}``, row i of
    every matrix being record i (the bytes ``_serialize`` gives each row, much faster: the
    varints of every row at once, each entry's framing looked up by its payload length)."""
    names = sorted(features)
    rows = len(features[names[0]][0])
    parts = []
    for name in names:
        m, kind = features[name]
        key = _field(1, name.encode())
        if kind == "int":
            data, off = _varint_rows(m)
            tag = 3
        elif kind == "float":
            data = np.ascontiguousarray(m, dtype="<f4").reshape(rows, -1).tobytes()
            off = np.arange(rows + 1, dtype=np.int64) * (4 * (np.asarray(m).size // max(rows, 1)))
            tag = 2
        else:
            raise ValueError(f"feature {name!r}: serialize_rows takes int or float, got {kind!r}")
        off = off.tolist()
        cache: dict[int, bytes] = {}
        entries = []
        for i in range(rows):
            lo, hi = off[i], off[i + 1]
            prefix = cache.get(hi - lo)
            if prefix is None:
                prefix = cache[hi - lo] = _entry_prefix(key, tag, hi - lo)
            entries.append(prefix + data[lo:hi])
        parts.append(entries)
    out = []
    for row in zip(*parts):
        body = b"".join(row)
        out.append(b"\x0a" + _varint(len(body)) + body)
    return out


def _serialize(ex: Mapping[str, tuple[Any, str]]) -> bytes:
    entries = []
    for name in sorted(ex):
        values, kind = ex[name]
        if kind == "int":
            feat = _field(3, _field(1, _varints(np.asarray(values, dtype=np.int64))) if len(values) else b"")
        elif kind == "float":
            packed = np.asarray(values, dtype="<f4").tobytes()
            feat = _field(2, _field(1, packed) if packed else b"")
        elif kind == "byte":
            data = values.encode() if isinstance(values, str) else bytes(values)
            feat = _field(1, _field(1, data))
        else:
            raise ValueError(f"feature {name!r}: kind must be int, float or byte, got {kind!r}")
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feat)))
    return _field(1, b"".join(entries))


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("record ends inside a varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of one message: bytes for length-delimited fields,
    an int for varints, raw bytes for the fixed-width ones."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 2:
            n, pos = _read_len(buf, pos)
            if pos + n > end:
                raise CorruptRecordError("record ends inside a field")
            yield number, wire, buf[pos:pos + n]
            pos += n
        elif wire == 0:
            v, pos = _read_varint(buf, pos)
            yield number, wire, v
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            yield number, wire, buf[pos:pos + n]
            pos += n
        else:
            raise CorruptRecordError(f"unsupported protobuf wire type {wire}")


def _unpack_varints(buf: bytes) -> np.ndarray:
    """Packed varints -> int64, vectorised: each value ends at a byte below 0x80."""
    b = np.frombuffer(buf, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    if int(b.max()) < 0x80:
        return b.astype(np.int64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends[-1] != b.size - 1:
        raise CorruptRecordError("packed int64 list ends inside a varint")
    starts = np.concatenate(([0], ends[:-1] + 1))
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    parts = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(parts, starts).astype(np.int64)


def _parse_example(record: bytes) -> dict[str, tuple[int, list]]:
    """``{name: (kind field number, [value payloads])}`` of a serialized Example: one walk over
    the nesting (Example > Features > map entry > Feature > list) with the length-delimited
    messages found by offset, since this runs once per record in the readers."""
    out = {}
    for n1, _, features in _fields(record):
        if n1 == 1:
            for n2, _, entry in _fields(features):
                if n2 == 1:
                    name, kind, payloads = _parse_entry(entry)
                    out[name] = (kind, payloads)
    return out


def _parse_entry(entry: bytes) -> tuple[str, int, list]:
    """One ``map<string, Feature>`` entry: ``(name, oneof field number, payloads)``."""
    name, feature = "", b""
    for n3, _, v in _fields(entry):
        if n3 == 1:
            name = v.decode()
        elif n3 == 2:
            feature = v
    kind, payloads = 0, []
    for n4, _, lst in _fields(feature):  # the oneof: the last one wins, as in protobuf
        kind = n4
        payloads = None
        if len(lst) >= 2 and lst[0] == 0x0A:  # the usual case: one packed field 1 with all values
            n, p = _read_len(lst, 1)
            if p + n == len(lst):
                payloads = [lst[p:]]
        if payloads is None:
            payloads = [v for n5, _, v in _fields(lst) if n5 == 1]
    return name, kind, payloads


def _read_len(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:  # the common case: a length below 128
        return b, pos + 1
    return _read_varint(buf, pos)


def write_examples(path: str | Path, examples: Iterable[Mapping[str, tuple[Any, str]]]) -> int:
    """Write ``{feature: (values, "int"|"float"|"byte")}`` examples as ``tf.train.Example``
    records to ``path`` atomically. Returns the number of records."""
    return write_records(path, (_serialize(ex) for ex in examples))


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
    feats = _parse_example(record)
    out, ints = {}, []
    for name, (kind, length) in spec.items():
        if name not in feats:
            raise DatasetError(f"record has no feature {name!r}; is this the right kind of data?")
        number, payloads = feats[name]
        if kind == "int":
            if number not in (0, 3):
                raise DatasetError(f"feature {name!r} is not an int64 list")
            # packed (what every writer does) or, as protobuf also accepts, one varint per field
            ints.append((name, length, b"".join(p if isinstance(p, bytes) else _varint(p) for p in payloads)))
        else:
            if number not in (0, 2):
                raise DatasetError(f"feature {name!r} is not a float list")
            arr = np.frombuffer(b"".join(p for p in payloads if isinstance(p, bytes)), dtype="<f4")
            _check_length(name, len(arr), length)
            out[name] = arr.astype(np.float32)
    if ints:
        blob = b"".join(p for _, _, p in ints)
        values = _unpack_varints(blob)
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
        feats = _parse_example(rec)
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
        values = _unpack_varints(b"".join(blobs))
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
