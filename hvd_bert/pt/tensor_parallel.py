"""Tensor (Megatron-style) parallelism for BERT's layers over Horovod process sets (Shoeybi et
al. 2019, REFERENCE section 9). The parallel layers are ``hvd_bert.pt.parallel_layers``' and the
split is BERT's plan (``BertLayer.TP_PLAN``, beside the model); the groups, the split of a dense
model and the gathering of its shares are here. ``hvd_bert.pt.engine`` uses them with
``train.tensor_parallel`` > 1: the gradients averaged over the data-parallel group (Horovod's
process set), every trust ratio and the global gradient norm over whole tensors (``pt.zero``'s
per-tensor sums, weighted by :func:`norm_weights`), one batch per group, checkpoints in the
dense format (gathered by the first group, sent to every rank tensor by tensor on a resume).

N ranks form N/T tensor-parallel groups of T consecutive ranks (one node's GPUs) and T
data-parallel groups of the ranks with the same place in their group:

    tensor-parallel group g:  ranks g T .. g T + T - 1      (rank r's place: r mod T)
    data-parallel group t:    ranks t, t + T, t + 2T, ...

In every layer the attention heads and the MLP's intermediate features are split T ways: the
query, key and value projections and the first MLP layer by output features (column-parallel),
the attention output and second MLP projections by input features (row-parallel, their partial
outputs summed by an allreduce in the group's process set, the bias added once). Entering a
column-parallel block, the input's gradient is summed the same way (the conjugate operators f
and g). Embeddings, LayerNorms, the pooler and the heads stay whole on every rank of a group.
A group reads one batch (its ranks are one data-parallel replica); the gradients are averaged
across the data-parallel group.

:func:`split_layers` turns a dense model's layers into this rank's share (the same parameter
names, so that the optimizer's groups and the checkpoints keep them), :func:`gather_state_dict`
rebuilds the dense ``state_dict`` from the shares, :func:`split_dim` says which tensors are
split along which dimension (the plan's, as each parallel layer declares it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

import horovod.torch as hvd

from hvd_bert.pt.models.bert import BertLayer
from hvd_bert.pt.parallel_layers import COLUMN, ROW, ColumnParallelLinear, RowParallelLinear, parallelize

__all__ = ["Groups", "make_groups", "build", "init_shares", "load_whole", "split_layers", "gather",
           "gather_state_dict", "split_dim", "setup", "norm_weights", "broadcast_in_group",
           "gather_optimizer_state", "scatter_from_rank0"]

_LAYERS = {COLUMN: ColumnParallelLinear, ROW: RowParallelLinear}


def split_dim(name: str) -> int | None:
    """The dimension along which a parameter called ``name`` is split (None: whole on every rank):
    BERT's plan says how its layer's submodule is split, and that parallel layer which of its
    parameters along which dimension."""
    if ".layers." not in f".{name}":
        return None
    module, param = name.split(".")[-2:]
    layer = _LAYERS.get(BertLayer.TP_PLAN.get(module))
    return None if layer is None else layer.SPLIT.get(param)


@dataclass
class Groups:
    size: int          # T
    rank: int          # this rank's place in its tensor-parallel group
    dp_rank: int       # its data-parallel replica
    dp_size: int       # N / T
    tp_set: object     # the Horovod process set of its tensor-parallel group
    dp_set: object     # of its data-parallel group


def make_groups(tp: int) -> Groups:
    """Register every group's process set (a collective: every rank, the same order; Horovod
    needs ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` at init: ``init_horovod(process_sets=True)``)."""
    n, r = hvd.size(), hvd.rank()
    if tp < 1 or n % tp:
        from hvd_bert.config import ConfigError

        raise ConfigError(f"train.tensor_parallel={tp} does not divide the {n} ranks: start a multiple of "
                          f"{tp} ranks (-np {max(tp, n - n % tp)}), or give train.tensor_parallel a divisor "
                          f"of {n}")
    if (n, tp) not in _GROUPS:  # (a process set is registered once: a second engine reuses it)
        def pset(ranks):  # (Horovod refuses a second set of every rank: that one is the global set)
            return hvd.global_process_set if ranks == list(range(n)) else hvd.add_process_set(ranks)
        tp_sets = [pset(list(range(g * tp, (g + 1) * tp))) for g in range(n // tp)]
        dp_sets = [pset(list(range(t, n, tp))) for t in range(tp)]
        _GROUPS[n, tp] = Groups(tp, r % tp, r // tp, n // tp, tp_sets[r // tp], dp_sets[r % tp])
    return _GROUPS[n, tp]


_GROUPS: dict = {}


def _share(t: torch.Tensor, dim: int, groups: Groups) -> torch.Tensor:
    return t.detach().chunk(groups.size, dim=dim)[groups.rank].clone()


@torch.no_grad()
def split_layers(model: nn.Module, groups: Groups) -> nn.Module:
    """Replace each of ``model.layers`` (dense ``BertLayer`` modules) by this rank's share of it
    (``BertLayer.TP_PLAN`` applied by ``parallel_layers.parallelize``, the weights cut from the
    dense ones); in place, returns ``model``."""
    t = groups.size
    for layer in model.layers:
        c = layer.c
        if c.num_heads % t or c.intermediate_size % t:
            raise ValueError(f"a tensor-parallel group of {t} must divide the heads ({c.num_heads}) and "
                             f"the intermediate size ({c.intermediate_size})")
        parallelize(layer, type(layer).TP_PLAN, groups.tp_set, t, groups.rank)
    return model


def gather(name: str, t: torch.Tensor, groups: Groups) -> torch.Tensor:
    """The whole of tensor ``name`` (a parameter, its gradient or its optimizer state) from the
    group's shares of it (a collective of the group); a tensor that is not split as it is."""
    dim = split_dim(name)
    if dim is None:
        return t
    moved = t.detach().transpose(0, dim).contiguous() if dim else t.detach().contiguous()
    full = hvd.allgather(moved, name=f"hvd_bert.tp.gather.{name}", process_set=groups.tp_set)
    return full.transpose(0, dim).contiguous() if dim else full


@torch.no_grad()
def gather_state_dict(model: nn.Module, groups: Groups) -> dict:
    """The dense model's ``state_dict``: every split tensor gathered over the tensor-parallel
    group (a collective of the group; every rank of it gets the whole)."""
    return {name: gather(name, t, groups) for name, t in model.state_dict().items()}


# ---------------------------------------------------------------------- building only a share
def build(make: Callable[[], nn.Module], *, seed: int, std: float, tp: int, device) -> nn.Module:
    """The model ``make()`` builds, with only this rank's share of it ever materialised: built on
    the meta device, its layers split over groups of ``tp`` ranks (none when ``tp`` is 1), then
    its shares allocated on ``device`` and initialised layout-independently
    (:func:`init_shares`). ``setup`` finds it split (``model.tp_groups``)."""
    groups = make_groups(tp) if tp > 1 else None
    with torch.device("meta"):
        model = make()
    if groups is not None:
        split_layers(model, groups)
    if any(True for _ in model.buffers()):
        raise ValueError(f"{type(model).__name__} has buffers, which a build on the meta device leaves empty")
    model.to_empty(device=device)
    init_shares(model, seed=seed, std=std, groups=groups)
    model.tp_groups = groups
    return model


@torch.no_grad()
def init_shares(model: nn.Module, *, seed: int, std: float, groups: Groups | None) -> None:
    """BERT's initialisation (``core.init.bert_rule``), each tensor drawn whole from a generator
    seeded by (seed, its name) and this rank's share kept: the same dense model for every layout."""
    from hvd_bert.core.init import bert_rule, tensor_seed

    for name, p in model.named_parameters():
        rule, scale = bert_rule(name, std)
        if rule != "normal":
            p.fill_(1.0 if rule == "ones" else 0.0)
            continue
        g = torch.Generator().manual_seed(tensor_seed(seed, name))
        whole = torch.empty(whole_shape(name, p.shape, groups)).normal_(0.0, scale, generator=g)
        p.copy_(share_of(name, whole, groups))


@torch.no_grad()
def load_whole(model: nn.Module, arrays: dict, groups: Groups, source: str) -> None:
    """Whole portable weights (a published or earlier checkpoint) into a split model, checked name
    by name against the whole shapes: each rank reads only its share of each split tensor where
    the weights are lazy (a safetensors file, a sharded checkpoint: ``weights.lazy``), one tensor
    at a time, so no rank holds the whole checkpoint."""
    import numpy as np

    from hvd_bert.weights.lazy import read_share
    from hvd_bert.weights.portable import fit_for_model

    state = model.state_dict()
    expected = {k: tuple(whole_shape(k, t.shape, groups)) for k, t in state.items()}
    fitted = fit_for_model(arrays, expected, classifier=False, source=source)
    for k in fitted:
        a = read_share(fitted, k, split_dim(k), groups.size, groups.rank)
        state[k].copy_(torch.from_numpy(np.ascontiguousarray(a)).to(state[k].dtype))


# ---------------------------------------------------------------------- the engine's side
def setup(model: nn.Module, tp: int) -> Groups:
    """Split ``model``'s layers over groups of ``tp`` ranks (a collective): the groups' process
    sets, one dense model (rank 0's) before the split, and one dropout stream per group. A model
    :func:`build` split already keeps its shares."""
    from hvd_bert.config import ConfigError

    built = getattr(model, "tp_groups", None)
    if built is not None:
        if built.size != tp:
            raise ConfigError(f"the model was built split {built.size} ways, train.tensor_parallel is {tp}")
        same_rng_in_group(built)
        return built
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(m, "c") for m in layers):
        raise ConfigError(f"train.tensor_parallel={tp} splits hvd_bert's BERT layers; this model "
                          f"({type(model).__name__}) has none: use train.tensor_parallel=1")
    groups = make_groups(tp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    split_layers(model, groups)
    same_rng_in_group(groups)
    return groups


def norm_weights(names: list[str], groups: Groups, sharded: bool) -> list[float]:
    """What each rank's sum of squares of a tensor counts in the allreduce over every rank that
    completes the tensor's norm: a tensor whole on the T ranks of a group counts 1/T on each,
    and one whole on every data-parallel replica (its state not split, ZeRO stage 0) 1/replicas."""
    return [(1.0 if split_dim(n) is not None else 1.0 / groups.size) *
            (1.0 if sharded else 1.0 / groups.dp_size) for n in names]


def broadcast_in_group(tensors, groups: Groups) -> None:
    """Every data-parallel replica takes the first replica's tensors (this rank's place in the
    group keeps its own share: a broadcast in the data-parallel process set)."""
    root = groups.rank  # (the global rank of the data-parallel group's first member)
    handles = [hvd.broadcast_async_(t, root_rank=root, name=f"hvd_bert.tp.bcast.{i}",
                                    process_set=groups.dp_set) for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)


def same_rng_in_group(groups: Groups) -> None:
    """The group's ranks draw the same dropout masks (their activations outside the split layers
    are one and the same): the first member's torch RNG state on every member."""
    state = hvd.broadcast(torch.get_rng_state(), root_rank=groups.dp_rank * groups.size,
                          name="hvd_bert.tp.rng", process_set=groups.tp_set)
    torch.set_rng_state(state)


def gather_optimizer_state(sd: dict, names: list[str], groups: Groups) -> dict:
    """A state_dict of the optimizer over this rank's shares, its split tensors made whole (a
    collective of the group)."""
    state = {i: {k: gather(names[i], t, groups) if t.dim() else t for k, t in st.items()}
             for i, st in sd["state"].items()}
    return {**sd, "state": state}


def share_of(name: str, full: torch.Tensor, groups: Groups | None) -> torch.Tensor:
    """This rank's share of the whole tensor ``name``."""
    dim = split_dim(name) if groups is not None else None
    return full if dim is None else _share(full, dim, groups)


def whole_shape(name: str, shape, groups: Groups | None) -> list[int]:
    dim = split_dim(name) if groups is not None else None
    out = list(shape)
    if dim is not None:
        out[dim] *= groups.size
    return out


def scatter_from_rank0(ckpt: dict | None, model: nn.Module, names: list[str], groups: Groups) -> dict:
    """Rank 0's whole checkpoint (model and optimizer state) to every rank, tensor by tensor, each
    keeping its share (a collective; a rank holds one whole tensor at a time). Returns the
    optimizer's state_dict over this rank's shares."""
    params = dict(model.named_parameters())
    state = model.state_dict()
    for name, t in state.items():
        full = ckpt["model"][name].contiguous() if hvd.rank() == 0 else \
            torch.empty(whole_shape(name, t.shape, groups), dtype=t.dtype)
        full = hvd.broadcast(full, root_rank=0, name=f"hvd_bert.tp.load.{name}")
        t.copy_(share_of(name, full, groups))
    meta = hvd.broadcast_object(None if hvd.rank() else {i: {k: (list(v.shape), str(v.dtype).split(".")[-1])
                                                                for k, v in st.items()}
                                                            for i, st in ckpt["optimizer"]["state"].items()},
                                root_rank=0, name="hvd_bert.tp.load.layout")
    opt_state = {}
    for i, entries in meta.items():
        opt_state[i] = {}
        for k, (shape, dtype) in entries.items():
            full = ckpt["optimizer"]["state"][i][k].contiguous() if hvd.rank() == 0 else \
                torch.empty(shape, dtype=getattr(torch, dtype))
            full = hvd.broadcast(full, root_rank=0, name=f"hvd_bert.tp.load.opt.{i}.{k}")
            opt_state[i][k] = share_of(names[i], full, groups) if full.dim() else full
    del params
    return {"state": opt_state}
