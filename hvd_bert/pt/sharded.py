"""The PyTorch engine's declared state (:mod:`hvd_bert.train.sharded_state`): what a sharded
checkpoint (``train.checkpoint_format=sharded``, the default on more than one rank) saves of it
and puts back. The checkpoint layer decides who writes what and owns every file and key.

* **The model**: each tensor of its ``state_dict`` (with bf16 weights, the fp32 masters in
  place of the parameters), under tensor parallelism this rank's share, split as its parallel
  layer declares (``parallel_layers.split_dims``); every data-parallel replica holds it whole.
* **The optimizer**: each buffer of each parameter. Under ZeRO (stage 1 or 2) this rank's shard
  holds a flat range of some of them (``held``); otherwise every replica holds them whole.
* **The counters**: the optimizer's step and GradScaler's scale and good steps.
"""

from __future__ import annotations

import numpy as np
import torch
import horovod.torch as hvd

from hvd_bert.pt.parallel_layers import split_dims
from hvd_bert.train.sharded_state import Declared, EngineState
from hvd_bert.train.sharded_writer import Writer

__all__ = ["writer", "declare"]


def writer() -> Writer:
    """The background writer of this process's sharded checkpoints (Horovod's object allgather
    says every rank's outcome)."""
    return Writer(lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", copy=True).reshape(-1).numpy()


def _numpy_dtype(t: torch.Tensor) -> str:
    return "float32" if t.dtype == torch.bfloat16 else str(t.detach().cpu()[:0].numpy().dtype)  # (masters)


def declare(engine, saving: bool = True) -> EngineState:
    """The engine's state as the checkpoint layer sees it. ``saving``: the model's values as a
    checkpoint holds them (``Engine.model_state``, a collective with bf16 weights); otherwise
    the tensors a load puts values into."""
    tp, z = engine.tp, engine.zero
    dims = split_dims(engine.model) if tp is not None else {}

    def split(name, shape):
        dim = dims.get(name)
        if dim is None:
            return tuple(shape), None
        whole = list(shape)
        whole[dim] *= tp.size
        return tuple(whole), (dim, tp.size, tp.rank)

    loaded: dict = {}
    tensors = []
    for name, t in (engine.model_state() if saving else engine.model.state_dict()).items():
        whole, sp = split(name, t.shape)
        tensors.append(Declared(
            f"model/{name}", whole, sp, dtype=_numpy_dtype(t),
            read=lambda lo, hi, t=t: _host(t.reshape(-1)[lo:hi]),
            put=lambda v, name=name, t=t: loaded.setdefault("model", {}).__setitem__(
                name, torch.from_numpy(v).view(t.shape))))
    params = [p for g in engine.optimizer.param_groups for p in g["params"]]
    names = engine.param_names()
    if z is not None:  # ZeRO: the shard's pieces (stage 0, under tensor parallelism: all of them)
        for b in z.buffers:
            for i, off, pos, n in z.pieces:
                whole, sp = split(names[i], params[i].shape)
                shard = z.state[b]
                tensors.append(Declared(
                    f"optim/{b}/{names[i]}", whole, sp, group=b, held=(off, off + n) if z.stage else None,
                    read=lambda lo, hi, s=shard, d=pos - off: _host(s[d + lo:d + hi]),
                    put=lambda v, b=b, pos=pos, n=n: z.state[b][pos:pos + n].copy_(torch.from_numpy(v))))
    else:
        from hvd_bert.pt.optim_parts import piece_rule

        for b in piece_rule(engine.optimizer).buffers:
            for i, p in enumerate(params):
                whole, sp = split(names[i], p.shape)
                tensors.append(Declared(
                    f"optim/{b}/{names[i]}", whole, sp, group=b,
                    read=lambda lo, hi, p=p, b=b: _host(engine.optimizer.state[p][b].reshape(-1)[lo:hi]),
                    put=lambda v, i=i, b=b, p=p: loaded.setdefault("optimizer", {}).setdefault(
                        i, {}).__setitem__(b, torch.from_numpy(v).view(p.shape).to(p.dtype))))
    sd = engine.scaler.state_dict()

    def before_load():
        if z is not None:
            for b in z.buffers:
                z.state[b].zero_()

    @torch.no_grad()
    def restore(step: int, loss_scale: dict) -> None:
        engine.load_model_state(loaded.pop("model", {}))
        if z is not None:
            z.step_count = step
        else:
            state = {i: {"step": torch.tensor(float(step), dtype=torch.float32), **entry}
                     for i, entry in loaded.pop("optimizer", {}).items()}
            engine.optimizer.load_state_dict({**engine.optimizer.state_dict(), "state": state})
        if engine.scaler.is_enabled():  # (its factors and interval are this run's settings)
            engine.scaler.load_state_dict({**engine.scaler.state_dict(), "scale": loss_scale["scale"],
                                           "_growth_tracker": loss_scale["good_steps"]})

    return EngineState(
        tensors, optimizer_step=_optimizer_step(engine), rank=engine.rank, world_size=engine.world_size,
        loss_scale={"scale": float(sd.get("scale", 1.0)), "good_steps": int(sd.get("_growth_tracker", 0))},
        layout={"world_size": engine.world_size, "zero_stage": z.stage if z else 0,
                "tensor_parallel": tp.size if tp is not None else 1},
        writers=engine.data_size, writer=engine.data_rank, replica=tp is None or tp.rank == 0,
        restore=restore, before_load=before_load)


def _optimizer_step(engine) -> int:
    if engine.zero is not None:
        return engine.zero.step_count
    for p in (p for g in engine.optimizer.param_groups for p in g["params"]):
        st = engine.optimizer.state.get(p, {})
        if "step" in st:
            return int(float(st["step"]))
    return 0
