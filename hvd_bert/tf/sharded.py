"""The TensorFlow engine's declared state (:mod:`hvd_bert.train.sharded_state`): what a sharded
checkpoint saves of it and puts back, in the same folders, index and resharding as PyTorch's.

* **The model**: every weight, held whole by every rank. A BERT model's go under their portable
  (PyTorch) names and layouts, as ``hvd-bert convert`` writes them, so either framework's
  ``convert`` and ``predict`` read them; any other model's under the variables' own names.
* **The optimizer**: each buffer of each variable, in TensorFlow's layout. Under ZeRO this
  rank's shard holds a flat range of some of them (``held``); otherwise every rank holds them.
* **The counters**: the optimizer's step, the loss scale and its good steps.
"""

from __future__ import annotations

import numpy as np
import horovod.tensorflow as hvd

from hvd_bert.train.sharded_state import Declared, EngineState
from hvd_bert.train.sharded_writer import Writer

__all__ = ["writer", "declare"]


def writer() -> Writer:
    return Writer(lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


def _model_tensors(engine) -> list[tuple[str, tuple, object, bool]]:
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


def _flat(value, transposed: bool) -> np.ndarray:
    return np.ascontiguousarray(value.T if transposed else value, dtype=np.float32).reshape(-1)


def declare(engine) -> EngineState:
    """The engine's state as the checkpoint layer sees it."""
    tensors = []
    for name, shape, v, t in _model_tensors(engine):
        tensors.append(Declared(
            name, shape, None,
            read=lambda lo, hi, v=v, t=t: _flat(v.numpy(), t)[lo:hi].copy(),
            put=lambda a, v=v, t=t, shape=shape: v.assign(a.reshape(shape).T if t else a.reshape(shape))))
    z = engine.zero
    shards, held = {}, {}  # (a load's shards being filled; a save's shards on the host, read once)

    def host(b):
        if b not in held:
            held[b] = z.state[b].numpy()
        return held[b]
    for b in (z.buffers if z is not None else tuple(engine.optimizer.buffers)):
        if z is not None:
            shards[b] = np.zeros(0, np.float32)
            for i, off, pos, k in z.pieces:
                v = engine.variables[i]

                def put(a, b=b, pos=pos, k=k):
                    shards[b][pos:pos + k] = a
                tensors.append(Declared(
                    f"optim/{b}/{_name(v)}", tuple(v.shape), None, group=b, held=(off, off + k), put=put,
                    read=lambda lo, hi, b=b, d=pos - off: host(b)[d + lo:d + hi].copy()))
        else:
            for v, slot in zip(engine.variables, engine.optimizer.slots(b)):
                tensors.append(Declared(
                    f"optim/{b}/{_name(v)}", tuple(v.shape), None, group=b,
                    read=lambda lo, hi, s=slot: s.numpy().reshape(-1)[lo:hi].copy(),
                    put=lambda a, s=slot: s.assign(a.reshape(s.shape))))

    def before_load():
        for b in shards:
            shards[b] = np.zeros(z.part.shard, np.float32)

    def restore(step: int, loss_scale: dict) -> None:
        for b, shard in shards.items():
            z.state[b].assign(shard)
        if z is not None:
            z.step_count = step
        else:
            engine.optimizer.applied_steps.assign(step)
            engine.optimizer.iterations.assign(step)
        engine.loss_scale.assign(loss_scale["scale"])
        engine.good_steps.assign(loss_scale["good_steps"])

    step = z.step_count if z is not None else int(engine.optimizer.applied_steps.numpy())
    return EngineState(
        tensors, optimizer_step=step,
        loss_scale={"scale": float(engine.loss_scale.numpy()), "good_steps": int(engine.good_steps.numpy())},
        layout={"world_size": engine.world_size, "zero_stage": z.stage if z else 0, "tensor_parallel": 1},
        rank=engine.rank, world_size=engine.world_size, writers=engine.world_size, writer=engine.rank,
        restore=restore, before_load=before_load)
