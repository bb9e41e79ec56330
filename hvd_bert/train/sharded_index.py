"""What a sharded checkpoint's index and shard headers may say, checked before anything is read
(:mod:`hvd_bert.train.sharded_checkpoint`'s Reader calls :func:`validate` when it opens one). A
checkpoint folder is untrusted input: a hand-edited or damaged index must not allocate memory
for a shape it claims, read bytes outside its files, or fill a tensor twice or not at all."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from hvd_bert.train.checkpoint import SHARDED_INDEX as INDEX
from hvd_bert.train.engine import CheckpointError

__all__ = ["DTYPES", "MAX_INDEX_BYTES", "FIX", "share_shape", "norm_split", "header_entry_fault", "validate"]

FIX = "delete the folder to resume from the checkpoint before it, or restore it from a copy"


def share_shape(shape, split) -> tuple:
    shape = tuple(int(s) for s in shape)
    if split is None:
        return shape
    dim, parts, _ = split
    if shape[dim] % parts:
        raise ValueError(f"dimension {dim} of {shape} does not split {parts} ways")
    return shape[:dim] + (shape[dim] // parts,) + shape[dim + 1:]


def norm_split(split) -> tuple | None:
    """A split into one part is the whole tensor."""
    return None if split is None or split[1] == 1 else tuple(split)


DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_NUMPY = {np.dtype(v).name: k for k, v in DTYPES.items()}  # the manifest's dtype -> the header's
MAX_INDEX_BYTES = 256 * 2**20  # far above an index of BERT-Large's pieces written by 1024 ranks


def _count(x, low: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


MAX_VALUES = 2**48  # far above any tensor a host holds; bounds a claimed shape before numpy sees it


def _shape_fault(shape) -> str | None:
    """What is wrong with a claimed shape (a list of at most 8 counts whose dimensions, zero or
    not, multiply to at most MAX_VALUES: a shape of [2**62, 2**62, 0] holds no value but no
    array can take it); None when sound."""
    if not (isinstance(shape, list) and len(shape) <= 8 and all(_count(d) for d in shape)):
        return "not a list of counts"
    if math.prod(max(d, 1) for d in shape) > MAX_VALUES:
        return f"more than the {MAX_VALUES} values a tensor may have"
    return None


def header_entry_fault(entry, body: int) -> str | None:
    """What is wrong with one tensor's entry of a safetensors header whose data holds ``body``
    bytes; None when it is sound (a known dtype, a shape of counts, a byte range of that size
    inside the data)."""
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        return "has no known dtype"
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    bad = _shape_fault(shape)
    if bad:
        return f"has the shape {shape!r} ({bad})"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
            and offsets[0] <= offsets[1] <= body):
        return f"has the byte range {offsets!r}, not inside its {body} bytes of data"
    if offsets[1] - offsets[0] != math.prod(shape) * np.dtype(DTYPES[entry["dtype"]]).itemsize:
        return f"has a byte range of {offsets[1] - offsets[0]} bytes for {math.prod(shape)} values"
    return None


def _piece_fault(e) -> str | None:
    """What is wrong with one piece of a manifest (types and ranges); None when it is sound."""
    if not isinstance(e, dict):
        return "is not a JSON object"
    name, shape, split, flat = e.get("name"), e.get("shape"), e.get("split"), e.get("flat")
    if not isinstance(name, str) or not name:
        return "has no tensor name"
    if not name.isprintable() or len(name) > 1024:  # (no control or format character: U+202E, NUL)
        return f"has the tensor name {name[:80]!r}, not a name a checkpoint of this toolkit writes"
    bad = _shape_fault(shape)
    if bad:
        return f"({name}) has the shape {shape!r}, {bad}"
    if split is not None:
        if not (isinstance(split, list) and len(split) == 3 and _count(split[0]) and _count(split[1], 1)
                and _count(split[2]) and split[0] < len(shape) and split[2] < split[1]):
            return f"({name}) has the split {split!r}, not [dim, parts, index] of its shape {shape}"
        if shape[split[0]] % split[1]:
            return f"({name}) splits dimension {split[0]} of {shape} {split[1]} ways, which does not divide "\
                   f"it"
    n = math.prod(share_shape(shape, norm_split(split)))
    if not (isinstance(flat, list) and len(flat) == 2 and all(_count(v) for v in flat)
            and flat[0] <= flat[1] <= n):
        return f"({name}) has the range {flat!r}, not inside the {n} values of its share"
    if e.get("dtype") not in _NUMPY:
        return f"({name}) has the dtype {e.get('dtype')!r}"
    crc = e.get("crc32c")
    if not (isinstance(crc, str) and len(crc) == 8 and all(ch in "0123456789abcdef" for ch in crc)):
        return f"({name}) has no CRC-32C"
    return None


def _meta_fault(meta) -> str | None:
    """What is wrong with the index's ``meta`` (the keys this format reads); None when sound."""
    if not isinstance(meta, dict):
        return "its meta is not a JSON object"
    if "optimizer_step" in meta and not _count(meta["optimizer_step"]):
        return f"its meta's optimizer_step is {meta['optimizer_step']!r}, not a count of steps"
    if "optimizer_step" in meta and _count(meta.get("step")) and meta["optimizer_step"] > meta["step"]:
        return (f"its meta's optimizer_step {meta['optimizer_step']} is more updates than its {meta['step']} "
                f"steps applied")
    scaler = meta.get("scaler", {})
    if not isinstance(scaler, dict) or not all(
            isinstance(v, (int, float, bool)) and (not isinstance(v, float) or math.isfinite(v))
            for v in scaler.values()):
        return f"its meta's scaler is {scaler!r}, not an object of numbers"
    scale = meta.get("loss_scale", {"scale": 1.0, "good_steps": 0})
    if not (isinstance(scale, dict) and set(scale) == {"scale", "good_steps"} and _count(scale["good_steps"])
            and isinstance(scale["scale"], (int, float)) and not isinstance(scale["scale"], bool)
            and math.isfinite(scale["scale"]) and scale["scale"] > 0):
        return f"its meta's loss_scale is {scale!r}, not a positive scale and a count of good steps"
    layout = meta.get("layout")
    ranks = ("world_size", "tensor_parallel")
    if layout is not None and not (isinstance(layout, dict) and all(_count(v) for v in layout.values())
                                   and all(_count(layout.get(k, 1), 1) for k in ranks)
                                   and layout.get("zero_stage", 0) in (0, 1, 2)):
        return f"its meta's layout is {layout!r}, not counts of ranks (at least 1) and a ZeRO stage (0 to 2)"
    return None


def validate(folder: Path, index: dict,
             header_of: Callable[[str], dict]) -> tuple[dict, dict[str, list[dict]]]:
    """Check a loaded index, and the header of every shard it names, completely, before anything
    is allocated or read; returns ``(meta, {tensor: [its pieces]})``. Checked: every type and
    range; each file is there with the size written and a sound header holding each piece as
    written (dtype, number of values); a tensor's pieces agree on its shape and split, and cover
    each of its shares exactly once (so a shape claimed in the index is backed by as many bytes
    in the files), and each agrees with the rank manifest it was merged from. A fault is a
    CheckpointError naming the file and what is wrong."""
    where = folder / INDEX

    def fault(what: str):
        return CheckpointError(f"{where} is damaged: {what}; {FIX}")

    bad = _meta_fault(index.get("meta"))
    if bad:
        raise fault(bad)
    chunks: dict[str, list[dict]] = {}
    for file, info in index["files"].items():
        p = folder / file
        if not isinstance(file, str) or Path(file).name != file or file in ("", ".", "..") or \
                not (p.exists() or p.is_symlink()):
            raise CheckpointError(f"{folder}: {INDEX} names the shard {file}, which is missing; {FIX}")
        if not p.is_file():  # (a FIFO, a device or a folder, itself or behind a link: never opened)
            raise CheckpointError(f"{p} is not a regular file (a folder, a pipe or a device where a shard "
                                  f"was written); {FIX}")
        if not (isinstance(info, dict) and _count(info.get("bytes"))
                and isinstance(info.get("pieces"), dict)):
            raise fault(f"its entry for {file} is not {{bytes, pieces}}")
        if p.stat().st_size != info["bytes"]:
            raise CheckpointError(f"{p} is truncated or damaged: {p.stat().st_size} bytes, "
                                  f"{info['bytes']} were written; {FIX}")
        header = header_of(file)  # (itself checked: header_entry_fault)
        for key, e in info["pieces"].items():
            bad = _piece_fault(e)
            if bad:
                raise fault(f"the piece {key} of {file} {bad}")
            entry = header.get(key) if key != "__metadata__" else None
            a, b = e["flat"]
            if not isinstance(entry, dict) or entry["dtype"] != _NUMPY[e["dtype"]] or \
                    math.prod(entry["shape"]) != b - a:
                raise CheckpointError(f"{where} is damaged, or {p} is: the index's piece {key} ({e['name']}, "
                                      f"{b - a} values of {e['dtype']}) is not what the file holds under "
                                      f"that key; {FIX}")
            chunks.setdefault(e["name"], []).append({**e, "file": file, "key": key})
    for name, pieces in chunks.items():
        shapes = {tuple(c["shape"]) for c in pieces}
        splits = {(norm_split(c["split"]) or (None, 1, 0))[:2] for c in pieces}
        if len(shapes) > 1 or len(splits) > 1:
            raise fault(f"the pieces of {name} disagree on its shape or split "
                        f"({sorted(map(str, shapes | splits))})")
        shares: dict[int, list] = {}
        for c in pieces:
            shares.setdefault((norm_split(c["split"]) or (0, 1, 0))[2], []).append(tuple(c["flat"]))
        parts = next(iter(splits))[1]
        n = math.prod(share_shape(pieces[0]["shape"], norm_split(pieces[0]["split"])))
        for k in range(parts):
            end = 0
            for a, b in sorted(shares.get(k, [])):
                if a != end:
                    raise fault(f"the pieces of {name} ({f'share {k}, ' if parts > 1 else ''}values {end} to "
                                f"{a}) {'overlap' if a < end else 'leave a gap'}")
                end = b
            if end != n:
                raise fault(f"the pieces of {name} cover {end} of its {n} values"
                            f"{f' in share {k}' if parts > 1 else ''}")
    _agree_with_manifests(folder, index)
    return index["meta"], chunks


def _agree_with_manifests(folder: Path, index: dict) -> None:
    """Each rank also wrote its own manifest beside its shard (``rank-N.json``, what the index was
    merged from): an index whose pieces differ from a manifest there (names swapped between
    tensors of one shape, which no size or CRC check can see) is damaged."""
    import json

    for file, info in index["files"].items():
        manifest = folder / (Path(file).stem + ".json")
        if not manifest.is_file() or manifest.is_symlink():
            continue
        try:
            pieces = json.loads(manifest.read_bytes().decode("utf-8")).get("pieces")
        except (OSError, ValueError, RecursionError, AttributeError):
            pieces = None
        if pieces != info["pieces"]:
            raise CheckpointError(f"{folder / INDEX} is damaged: its pieces of {file} are not what "
                                  f"{manifest.name}, written with that shard, says; {FIX}")
