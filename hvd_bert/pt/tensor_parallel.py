"""Tensor (Megatron-style) parallelism for BERT's layers over Horovod process sets (Shoeybi et
al. 2019, REFERENCE section 9). The layers, their groups and the gathering of their shares are
here and tested against the dense model; the training engine does not use them yet (no
``train.tensor_parallel`` setting): the gradient average over the data-parallel groups, LAMB's
trust ratios over a split tensor, each group's data and the checkpoints are still to come.

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
rebuilds the dense ``state_dict`` from the shares, :func:`SPLIT_DIMS` says which tensors are
split along which dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd

from hvd_bert.pt.kernels.dropout import dropout_add
from hvd_bert.pt.kernels.gelu import bias_gelu

__all__ = ["Groups", "make_groups", "split_layers", "gather", "gather_state_dict", "split_dim", "TPBertLayer"]

# the layer tensors that are split, and along which dimension (0: output features, 1: input)
_SPLIT = {"query.weight": 0, "query.bias": 0, "key.weight": 0, "key.bias": 0, "value.weight": 0,
          "value.bias": 0, "intermediate.weight": 0, "intermediate.bias": 0,
          "attention_output.weight": 1, "output.weight": 1}


def split_dim(name: str) -> int | None:
    """The dimension along which a parameter called ``name`` is split (None: whole on every rank)."""
    if ".layers." not in f".{name}":
        return None
    tail = name.split(".")[-2:]
    return _SPLIT.get(".".join(tail))


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
        raise ValueError(f"a tensor-parallel group of {tp} does not divide the {n} ranks")
    tp_sets = [hvd.add_process_set(list(range(g * tp, (g + 1) * tp))) for g in range(n // tp)]
    dp_sets = [hvd.add_process_set(list(range(t, n, tp))) for t in range(tp)]
    return Groups(tp, r % tp, r // tp, n // tp, tp_sets[r // tp], dp_sets[r % tp])


class _Copy(torch.autograd.Function):
    """f: the identity forward; the gradient summed over the group backward."""

    @staticmethod
    def forward(ctx, x, pset):
        ctx.pset = pset
        return x

    @staticmethod
    def backward(ctx, grad):
        return hvd.allreduce(grad.contiguous(), op=hvd.Sum, process_set=ctx.pset), None


class _Reduce(torch.autograd.Function):
    """g: the partial outputs summed over the group forward; the identity backward."""

    @staticmethod
    def forward(ctx, x, pset):
        return hvd.allreduce(x.contiguous(), op=hvd.Sum, process_set=pset)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class TPBertLayer(nn.Module):
    """One rank's share of a ``BertLayer`` (``hvd_bert.pt.models.bert``): heads/T heads and
    intermediate/T features, the same parameter names."""

    def __init__(self, c, groups: Groups):
        super().__init__()
        t = groups.size
        if c.num_heads % t or c.intermediate_size % t:
            raise ValueError(f"a tensor-parallel group of {t} must divide the heads ({c.num_heads}) and "
                             f"the intermediate size ({c.intermediate_size})")
        self.c, self.groups = c, groups
        h, hl, il = c.hidden_size, c.hidden_size // t, c.intermediate_size // t
        self.heads = c.num_heads // t
        self.query, self.key, self.value = nn.Linear(h, hl), nn.Linear(h, hl), nn.Linear(h, hl)
        self.attention_output = _RowLinear(hl, h)
        self.attention_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(h, il)
        self.output = _RowLinear(il, h)
        self.output_LayerNorm = nn.LayerNorm(h, eps=c.layer_norm_eps)

    def forward(self, x, attn_bias):
        from hvd_bert.pt.models.bert import attention

        b, s, _ = x.shape
        pset, p, train = self.groups.tp_set, self.c.hidden_dropout, self.training
        xi = _Copy.apply(x, pset)
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])
        qkv = F.linear(xi, w, bias).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in qkv)
        ctx = attention(q, k, v, attn_bias, self.c.attention_dropout, train).transpose(1, 2).reshape(b, s, -1)
        out = _Reduce.apply(F.linear(ctx, self.attention_output.weight), pset) + self.attention_output.bias
        x = self.attention_LayerNorm(dropout_add(out, x, p, train))
        xi = _Copy.apply(x, pset)
        mid = bias_gelu(F.linear(xi, self.intermediate.weight), self.intermediate.bias, self.c.gelu)
        out = _Reduce.apply(F.linear(mid, self.output.weight), pset) + self.output.bias
        return self.output_LayerNorm(dropout_add(out, x, p, train))


class _RowLinear(nn.Module):
    """A row-parallel projection's share: the weight's input columns, the whole bias (added
    once, after the sum)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))


def _share(t: torch.Tensor, dim: int, groups: Groups) -> torch.Tensor:
    return t.detach().chunk(groups.size, dim=dim)[groups.rank].clone()


@torch.no_grad()
def split_layers(model: nn.Module, groups: Groups) -> nn.Module:
    """Replace ``model.layers`` (dense ``BertLayer`` modules) by this rank's shares of them, the
    weights cut from the dense ones; in place, returns ``model``."""
    for i, layer in enumerate(model.layers):
        tp = TPBertLayer(layer.c, groups).to(next(layer.parameters()).device)
        dense = dict(layer.named_parameters())
        for name, param in tp.named_parameters():
            dim = _SPLIT.get(name)
            param.copy_(dense[name] if dim is None else _share(dense[name], dim, groups))
        model.layers[i] = tp
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
