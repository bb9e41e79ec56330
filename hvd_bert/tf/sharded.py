"""The TensorFlow engine's sharded checkpoints (``train.checkpoint_format=sharded``): the same
folders, index and resharding as PyTorch's (:mod:`hvd_bert.train.sharded_checkpoint`), written
by every rank in the background.

* **What a rank writes.** 1/N of the model's weights (the partition over the world's ranks) and
  of the optimizer state (ZeRO: its shard, the pieces it updated; stage 0: the same 1/N of the
  state every rank holds). A BERT model's weights go under their portable (PyTorch) names and
  layouts, as ``hvd-bert convert`` writes them, so either framework's ``convert`` and ``predict``
  read them; the optimizer state under the variables' own names, in TensorFlow's layout.
* **Reading.** Every rank reads its own pieces, whatever world size or ZeRO stage wrote them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_bert.train import sharded_checkpoint as S
from hvd_bert.train.sharded_writer import Writer, fresh_folder
from hvd_bert.train.checkpoint import checkpoint_path

__all__ = ["writer", "save", "load_into"]


def writer() -> Writer:
    return Writer(lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


def _model_tensors(engine) -> list[tuple[str, tuple, tf.Variable, bool]]:
    """``(name, whole shape, variable, transposed)`` of every weight: a BERT model's under its
    portable names and layouts, any other model's under the variables' names."""
    from hvd_bert.tf.models.bert import BertModel, weight_map

    weights = engine.weights()
    if isinstance(engine.model, BertModel):
        wm = weight_map(engine.model)
        if {id(v) for v, _ in wm.values()} == {id(v) for v in weights}:
            return [(f"model/{k}", tuple(v.shape[::-1] if t else v.shape), v, t) for k, (v, t) in wm.items()]
    return [(f"model/{_name(v)}", tuple(v.shape), v, False) for v in weights]


def _name(v) -> str:
    return v.name.split(":")[0]


def _optimizer_specs(engine) -> dict[str, list[tuple[str, tuple, None]]]:
    buffers = engine.zero.buffers if engine.zero is not None else tuple(engine.optimizer.buffers)
    return {b: [(f"optim/{b}/{_name(v)}", tuple(v.shape), None) for v in engine.variables] for b in buffers}


def pieces_of(engine) -> list[tuple[S.Piece, np.ndarray]]:
    """This rank's pieces of the weights and the optimizer state, copied to host memory."""
    n, r = engine.world_size, engine.rank
    tensors = _model_tensors(engine)
    specs = [(name, shape, None) for name, shape, _, _ in tensors]
    out = []
    for i, p in S.rank_pieces(specs, n, r):
        _, _, v, t = tensors[i]
        value = v.numpy().T if t else v.numpy()
        out.append((p, np.ascontiguousarray(value, dtype=np.float32).reshape(-1)[slice(*p.flat)].copy()))
    z = engine.zero
    for b, bspecs in _optimizer_specs(engine).items():
        if z is not None:
            shard = z.state[b].numpy()
            out += [(S.Piece(bspecs[i][0], bspecs[i][1], None, (off, off + k)), shard[pos:pos + k].copy())
                    for i, off, pos, k in z.pieces]
        else:
            slots = engine.optimizer.slots(b)
            out += [(p, slots[i].numpy().reshape(-1)[slice(*p.flat)].copy())
                    for i, p in S.rank_pieces(bspecs, n, r)]
    return out


def optimizer_step(engine) -> int:
    return engine.zero.step_count if engine.zero is not None else int(engine.optimizer.applied_steps.numpy())


def save(engine, writer: Writer, folder: str | Path, meta: dict, keep: int) -> Path:
    """As PyTorch's: copy this rank's pieces to host memory, write them in the background (rank 0:
    then the index and the pruning); returns the checkpoint's folder (a collective)."""
    writer.wait()
    path = fresh_folder(checkpoint_path(folder, engine.step_count, S.SUFFIX), engine.rank,
                          lambda: hvd.allreduce(tf.constant(0.0), name="hvd_bert.barrier.shards"))  # Horovod:
    pieces = pieces_of(engine)
    meta = {**meta, "optimizer_step": optimizer_step(engine),
            "scaler": {"loss_scale": float(engine.loss_scale.numpy()),
                       "good_steps": int(engine.good_steps.numpy())},
            "layout": {"world_size": engine.world_size, "zero_stage": engine.zero.stage if engine.zero else 0,
                       "tensor_parallel": 1}}
    return writer.save(path, Path(folder), engine.rank, engine.world_size, pieces, meta, keep)


def load_into(engine, folder: str | Path) -> dict:
    """Every rank reads its pieces of a complete sharded checkpoint; a failure on any rank is
    raised on every rank. Returns the checkpoint's metadata."""
    return S.read_on_every_rank(lambda reader: _load(engine, reader), folder,
                                lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


def _load(engine, reader: S.Reader) -> dict:
    meta = reader.meta
    for name, shape, v, t in _model_tensors(engine):
        a = reader.read(name, shape=shape).reshape(shape)
        v.assign(a.T if t else a)
    step = int(meta.get("optimizer_step", 0))
    z = engine.zero
    for b, bspecs in _optimizer_specs(engine).items():
        if z is not None:
            shard = np.zeros(z.part.shard, np.float32)
            for i, off, pos, k in z.pieces:
                shard[pos:pos + k] = reader.read(bspecs[i][0], None, (off, off + k), shape=bspecs[i][1])
            z.state[b].assign(shard)
        else:
            for (name, shape, _), slot in zip(bspecs, engine.optimizer.slots(b)):
                slot.assign(reader.read(name, shape=shape).reshape(shape))
    if z is not None:
        z.step_count = step
    else:
        engine.optimizer.applied_steps.assign(step)
        engine.optimizer.iterations.assign(step)
    engine.loss_scale.assign(meta["scaler"]["loss_scale"])
    engine.good_steps.assign(meta["scaler"]["good_steps"])
    return meta
