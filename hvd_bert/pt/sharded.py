"""The PyTorch engine's sharded checkpoints (``train.checkpoint_format=sharded``): what each rank
writes and reads of the format in :mod:`hvd_bert.train.sharded_checkpoint`, and the background
writer.

* **What a rank writes.** Its data-parallel replica's 1/D of the model's tensors (ZeRO's
  partition: under ZeRO, the pieces whose update it owns) and of the optimizer state (ZeRO: its
  shard; stage 0: the same 1/D of the state every rank holds). Under tensor parallelism each rank
  writes pieces of its own shares, and the tensors whole on every rank of a group are written by
  the group's first rank only. Nothing is gathered: no rank holds more than its own state.
* **In the background.** :func:`save` copies the pieces to host memory on the calling thread
  (the step waits for that copy only), then the core's ``Writer`` thread writes them; rank 0's
  thread also waits for every rank's manifest and writes the index. At most one save is in
  flight: the next save, and the end of the run, wait for it (``Writer.wait``, a collective that
  raises the first failing rank's error on every rank).
* **Reading under any layout.** Every rank opens the index and reads the byte ranges of its own
  shares (:class:`hvd_bert.train.sharded_checkpoint.Reader`), whatever world size, ZeRO stage or
  tensor-parallel degree wrote them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import horovod.torch as hvd

from hvd_bert.train import sharded_checkpoint as S
from hvd_bert.train.sharded_writer import Writer, fresh_folder
from hvd_bert.train.checkpoint import checkpoint_path

__all__ = ["writer", "pieces_of", "save", "load_into"]


def writer() -> Writer:
    """The background writer of this process's sharded checkpoints (Horovod's object allgather
    says every rank's outcome)."""
    return Writer(lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


def _local_tensors(engine, state: dict | None = None) -> tuple[list, list]:
    """``([(name, whole shape, split)], [tensor])`` of the model's state on this rank (``state``:
    the engine's ``model_state()`` to save; by default the model's tensors)."""
    from hvd_bert.pt import tensor_parallel as TP

    tp = engine.tp
    specs, tensors = [], []
    for name, t in (state if state is not None else engine.model.state_dict()).items():
        dim = TP.split_dim(name) if tp is not None else None
        whole = TP.whole_shape(name, t.shape, tp) if tp is not None else list(t.shape)
        specs.append((f"model/{name}", tuple(whole), (dim, tp.size, tp.rank) if dim is not None else None))
        tensors.append(t)
    return specs, tensors


def _optimizer_tensors(engine) -> tuple[list, dict[str, list], list]:
    """The optimizer state's ``(specs per parameter, {buffer: [spec per parameter]}, params)``."""
    from hvd_bert.pt import tensor_parallel as TP
    from hvd_bert.pt.optim_parts import piece_rule

    tp, names = engine.tp, engine.param_names()
    params = [p for g in engine.optimizer.param_groups for p in g["params"]]
    buffers = engine.zero.buffers if engine.zero is not None else tuple(piece_rule(engine.optimizer).buffers)
    specs = []
    for name, p in zip(names, params):
        dim = TP.split_dim(name) if tp is not None else None
        whole = TP.whole_shape(name, p.shape, tp) if tp is not None else list(p.shape)
        specs.append((name, tuple(whole), (dim, tp.size, tp.rank) if dim is not None else None))
    return specs, {b: [(f"optim/{b}/{n}", s, sp) for n, s, sp in specs] for b in buffers}, params


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", copy=True).reshape(-1).numpy()


def pieces_of(engine) -> list[tuple[S.Piece, np.ndarray]]:
    """This rank's pieces of the model and optimizer state, copied to host memory."""
    d, di = engine.data_size, engine.data_rank
    first = engine.tp is None or engine.tp.rank == 0  # (writes the tensors whole on its group)
    specs, tensors = _local_tensors(engine, engine.model_state())
    out = [(p, _host(tensors[i].reshape(-1)[slice(*p.flat)])) for i, p in S.rank_pieces(specs, d, di, first)]
    _, bufs, params = _optimizer_tensors(engine)
    z = engine.zero
    if z is not None and z.stage > 0:  # this rank's shard: the partition's pieces, as the step keeps them
        for i, off, pos, n in z.pieces:
            for b, bspecs in bufs.items():
                name, shape, split = bspecs[i]
                if first or split is not None:
                    out.append((S.Piece(name, shape, split, (off, off + n)), _host(z.state[b][pos:pos + n])))
        return out
    for b, bspecs in bufs.items():
        if z is not None:  # stage 0 under tensor parallelism: the whole local state in one shard
            full = [z.state[b][z.starts[i]:z.starts[i + 1]] for i in range(len(params))]
        else:
            full = [engine.optimizer.state[p][b] for p in params]
        out += [(p, _host(full[i].reshape(-1)[slice(*p.flat)]))
                for i, p in S.rank_pieces(bspecs, d, di, first)]
    return out


def optimizer_step(engine) -> int:
    if engine.zero is not None:
        return engine.zero.step_count
    for p in (p for g in engine.optimizer.param_groups for p in g["params"]):
        st = engine.optimizer.state.get(p, {})
        if "step" in st:
            return int(float(st["step"]))
    return 0


def save(engine, writer: Writer, folder: str | Path, meta: dict, keep: int) -> Path:
    """Copy this rank's pieces to host memory, then write them in the background (rank 0: then the
    index, then the pruning of older checkpoints). Returns the checkpoint's folder."""
    writer.wait()  # (one save in flight: the one before is on disk, or its error raised here)
    # (a checkpoint of this step again: its old files go; Horovod: no rank writes before it is fresh)
    path = fresh_folder(checkpoint_path(folder, engine.step_count, S.SUFFIX), engine.rank, hvd.barrier)
    pieces = pieces_of(engine)
    meta = {**meta, "optimizer_step": optimizer_step(engine), "scaler": engine.scaler.state_dict(),
            "layout": {"world_size": engine.world_size, "zero_stage": engine.zero.stage if engine.zero else 0,
                       "tensor_parallel": engine.tp.size if engine.tp is not None else 1}}
    return writer.save(path, Path(folder), engine.rank, engine.world_size, pieces, meta, keep)


def load_into(engine, folder: str | Path) -> dict:
    """Every rank reads its shares of a complete sharded checkpoint (any layout wrote it) into the
    model and optimizer; returns its metadata. A failure on any rank is raised on every rank."""
    return S.read_on_every_rank(lambda reader: _load(engine, reader), folder,
                                lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


@torch.no_grad()
def _load(engine, reader: S.Reader) -> dict:
    meta = reader.meta
    specs, tensors = _local_tensors(engine)
    state = {}
    for (name, whole, split), t in zip(specs, tensors):
        dtype = np.float32 if t.dtype == torch.bfloat16 else t.detach().cpu().numpy().dtype  # (masters)
        data = reader.read(name, split, dtype=dtype, shape=whole)
        state[name.removeprefix("model/")] = torch.from_numpy(data).view(t.shape)
    engine.load_model_state(state)
    _, bufs, params = _optimizer_tensors(engine)
    step = int(meta.get("optimizer_step", 0))
    z = engine.zero
    if z is not None:
        z.step_count = step
        for b, bspecs in bufs.items():
            z.state[b].zero_()
            for i, off, pos, n in z.pieces:
                name, whole, split = bspecs[i]
                z.state[b][pos:pos + n].copy_(torch.from_numpy(reader.read(name, split, (off, off + n),
                                                                           shape=whole)))
    else:
        sd = engine.optimizer.state_dict()
        state = {}
        for i, p in enumerate(params):
            entry = {"step": torch.tensor(float(step), dtype=torch.float32)}
            for b, bspecs in bufs.items():
                name, whole, split = bspecs[i]
                entry[b] = torch.from_numpy(reader.read(name, split, shape=whole)).view(p.shape).to(p.dtype)
            state[i] = entry
        engine.optimizer.load_state_dict({**sd, "state": state})
    engine.scaler.load_state_dict(meta["scaler"])
    return meta
