"""An engine's declared state, and its save to and load from a sharded checkpoint
(:mod:`hvd_bert.train.sharded_checkpoint`'s format), framework-free.

An engine does not write checkpoints: it declares what it holds (:class:`EngineState`), one
:class:`Declared` tensor per named piece of state (model weights, or their fp32 masters; each
optimizer buffer of each parameter), each saying

* its name in the whole model and its whole shape;
* its split: which share this rank holds of a tensor-parallel tensor, ``(dim, parts, index)``,
  as the parallel layers themselves declare it (None: whole);
* its held range: the flat range of that share this rank holds (a ZeRO shard's piece; None:
  all of it), and its group (the tensors one partition is cut over: the model's, or one
  optimizer buffer's);
* how to read its values to host memory and how to put them back;

and the counters beside them: the optimizer's step, the loss scale (one schema for both
frameworks: ``{"scale": float, "good_steps": int}``), and the layout that wrote them. This
module owns everything else: which rank writes which piece (the data-parallel partition of
what every replica holds, the held pieces of a ZeRO shard, a tensor-parallel group's whole
tensors by its first rank only), every metadata key and its validation, and the order of a
load. The per-framework adapters (``pt/sharded.py``, ``tf/sharded.py``) are their declarations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hvd_bert.train import sharded_checkpoint as S
from hvd_bert.train.checkpoint import checkpoint_path
from hvd_bert.train.engine import CheckpointError
from hvd_bert.train.sharded_index import FIX, share_shape
from hvd_bert.train.sharded_writer import Writer, fresh_folder

__all__ = ["Declared", "EngineState", "save", "load", "pieces_of", "loss_scale_of"]


@dataclass(frozen=True)
class Declared:
    """One named tensor of an engine's state as this rank holds it. ``read(lo, hi)``: elements
    [lo, hi) of its share (flat, row-major), copied to host memory; ``put(values)``: its held
    values (``held``, or the whole share), flat, put back."""

    name: str                 # "model/<parameter>" or "optim/<buffer>/<parameter>"
    shape: tuple              # the whole tensor's
    split: tuple | None       # (dim, parts, index): this rank's tensor-parallel share; None: whole
    read: Callable[[int, int], np.ndarray]
    put: Callable[[np.ndarray], None]
    group: str = "model"      # the tensors one writers' partition is cut over
    held: tuple | None = None  # (start, stop) of the share this rank holds alone (a ZeRO shard's piece)
    dtype: str = "float32"    # what a load reads it as

    def span(self) -> tuple[int, int]:
        whole = (0, math.prod(share_shape(self.shape, self.split)))
        return tuple(self.held) if self.held is not None else whole


@dataclass
class EngineState:
    """What an engine declares for a sharded checkpoint. ``writers``/``writer``: the replicas
    that share the writing of what each holds whole (the data-parallel group) and this rank's
    place among them; ``replica``: False on a tensor-parallel rank other than its group's first
    (the tensors whole on every rank of a group are written once). ``restore(optimizer_step,
    loss_scale)`` runs after every tensor is put back; ``before_load()`` before."""

    tensors: list[Declared]
    optimizer_step: int
    loss_scale: dict          # {"scale": float, "good_steps": int}
    layout: dict              # world_size, zero_stage, tensor_parallel
    rank: int
    world_size: int
    writers: int
    writer: int
    restore: Callable[[int, dict], None]
    replica: bool = True
    before_load: Callable[[], None] = field(default=lambda: None)


def pieces_of(state: EngineState) -> list[tuple[S.Piece, np.ndarray]]:
    """This rank's pieces of the declared state, copied to host memory: of what every replica
    holds, its 1/``writers`` of each group (the ZeRO partition's cut, so that a ZeRO rank writes
    the weights it updated); of what it holds alone, all of it."""
    out, groups = [], {}
    for t in state.tensors:
        if t.held is not None:
            if state.replica or t.split is not None:
                out.append((S.Piece(t.name, tuple(t.shape), t.split, t.span()), t.read(*t.span())))
        else:
            groups.setdefault(t.group, []).append(t)
    for tensors in groups.values():
        specs = [(t.name, tuple(t.shape), t.split) for t in tensors]
        for i, p in S.rank_pieces(specs, state.writers, state.writer, state.replica):
            out.append((p, tensors[i].read(*p.span())))
    return out


def save(state: EngineState, writer: Writer, folder: str | Path, step: int, meta: dict, keep: int,
         barrier: Callable[[], None]) -> Path:
    """Copy this rank's pieces to host memory, then write them in the background (rank 0: then
    the index, then the pruning of older checkpoints; a collective). Returns the folder."""
    writer.wait()  # (one save in flight: the one before is on disk, or its error raised here)
    # (a checkpoint of this step again: its old files go; no rank writes before it is fresh)
    path = fresh_folder(checkpoint_path(folder, step, S.SUFFIX), state.rank, barrier)
    pieces = pieces_of(state)
    meta = {**meta, "optimizer_step": int(state.optimizer_step),
            "loss_scale": _checked_scale(state.loss_scale), "layout": dict(state.layout)}
    return writer.save(path, Path(folder), state.rank, state.world_size, pieces, meta, keep)


def load(state: EngineState, folder: str | Path, allgather_object) -> dict:
    """Every rank reads its shares of a complete sharded checkpoint (any layout wrote it) into
    the declared state; returns the checkpoint's metadata. A failure on any rank is raised on
    every rank (a collective)."""
    return S.read_on_every_rank(lambda reader: _load(state, reader), folder, allgather_object)


def _load(state: EngineState, reader: S.Reader) -> dict:
    meta = reader.meta
    scale = loss_scale_of(meta, reader.folder / S.INDEX)
    state.before_load()
    for t in state.tensors:
        t.put(reader.read(t.name, t.split, t.held, dtype=np.dtype(t.dtype), shape=t.shape))
    state.restore(int(meta.get("optimizer_step", 0)), scale)
    return meta


def _checked_scale(scale: dict) -> dict:
    return {"scale": float(scale["scale"]), "good_steps": int(scale["good_steps"])}


def loss_scale_of(meta: dict, path) -> dict:
    """The loss scale a checkpoint's metadata holds, ``{"scale", "good_steps"}``: its
    ``loss_scale``, or what checkpoints written before this schema hold under ``scaler``
    (PyTorch's GradScaler state, ``{}`` when disabled; TensorFlow's ``loss_scale``/``good_steps``)."""
    if "loss_scale" in meta:
        got = meta["loss_scale"]
        scale, good = (got.get("scale"), got.get("good_steps")) if isinstance(got, dict) else (None, None)
    else:
        old = meta.get("scaler") or {}
        scale = old.get("scale", old.get("loss_scale", 1.0)) if isinstance(old, dict) else None
        good = old.get("_growth_tracker", old.get("good_steps", 0)) if isinstance(old, dict) else None
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale)
            and scale > 0 and isinstance(good, int) and not isinstance(good, bool) and good >= 0):
        got = meta.get("loss_scale", meta.get("scaler"))
        raise CheckpointError(f"{path} is damaged: its loss scale {got!r} is not a positive scale and a "
                              f"count of good steps; {FIX}")
    return {"scale": float(scale), "good_steps": good}
