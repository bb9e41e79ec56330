"""``tf.train.Example``'s protobuf wire format, written and read without TensorFlow: varints,
length-delimited fields, the feature map, and whole columns of rows serialized at once
(``serialize_rows``); ``hvd_bert.data.records`` frames them as TFRecords."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from hvd_bert.data.errors import CorruptRecordError

__all__ = ["varint", "serialize_rows", "serialize_example", "unpack_varints", "parse_example"]


def varint(n: int) -> bytes:
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
    return varint(number << 3 | 2) + varint(len(payload)) + payload


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
    """The bytes of a features-map entry before its ``n`` payload bytes: what ``serialize_example``
    writes as ``_field(1, key + _field(2, _field(tag, _field(1, payload))))``."""
    inner = (b"\x0a" + varint(n)) if n else b""
    feat = varint(tag << 3 | 2) + varint(len(inner) + n)
    value = key + b"\x12" + varint(len(feat) + len(inner) + n)
    return b"\x0a" + varint(len(value) + len(feat) + len(inner) + n) + value + feat + inner


def serialize_rows(features: Mapping[str, tuple[np.ndarray, str]]) -> list[bytes]:
    """``tf.train.Example`` records of a batch: ``{name: (matrix, "int"|"float")}``, row i of
    every matrix being record i (the bytes ``serialize_example`` gives each row, much faster: the
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
        out.append(b"\x0a" + varint(len(body)) + body)
    return out


def serialize_example(ex: Mapping[str, tuple[Any, str]]) -> bytes:
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


def unpack_varints(buf: bytes) -> np.ndarray:
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


def parse_example(record: bytes) -> dict[str, tuple[int, list]]:
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
