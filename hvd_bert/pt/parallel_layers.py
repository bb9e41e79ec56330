"""Tensor-parallel layers any PyTorch model can use (Shoeybi et al. 2019, Megatron-LM's
``ColumnParallelLinear`` and ``RowParallelLinear``), over a Horovod process set, and
:func:`parallelize`, which applies a model's *plan* (which submodule is split how, written beside
the model, as torchtitan's per-model plans) to one block.

With T ranks in the group, for ``y = x A^T + b``:

* :class:`ColumnParallelLinear` holds A's rows (output features) ``r T .. (r + 1) T`` and b's:
  its output is this rank's share of the features. Its input's gradient is summed over the group
  (the conjugate operator f: the identity forward, an allreduce backward), unless the block copies
  its input once for several column layers (``copy_input=False``, a :class:`CopyToGroup` before).
* :class:`RowParallelLinear` holds A's columns (input features): its input is a column layer's
  share, its partial outputs are summed over the group (g: an allreduce forward, the identity
  backward) and the whole bias is added once.

Each layer says which dimension of which parameter it splits (``SPLIT``): the split is written
there once, and :func:`split_dims` reads it off a parallelized model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CopyToGroup", "ColumnParallelLinear", "RowParallelLinear", "parallelize", "split_dims",
           "COPY", "COLUMN", "ROW"]

COPY, COLUMN, ROW = "copy", "column", "row"  # what a plan says of a submodule


class _Copy(torch.autograd.Function):
    """f: the identity forward; the gradient summed over the group backward."""

    @staticmethod
    def forward(ctx, x, pset):
        ctx.pset = pset
        return x

    @staticmethod
    def backward(ctx, grad):
        import horovod.torch as hvd  # (here: a model module imports the plan's names without Horovod)

        return hvd.allreduce(grad.contiguous(), op=hvd.Sum, process_set=ctx.pset), None


class _Reduce(torch.autograd.Function):
    """g: the partial outputs summed over the group forward; the identity backward."""

    @staticmethod
    def forward(ctx, x, pset):
        import horovod.torch as hvd

        return hvd.allreduce(x.contiguous(), op=hvd.Sum, process_set=pset)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class CopyToGroup(nn.Module):
    """f as a module: a block's input, entering its column-parallel layers (no parameters)."""

    def __init__(self, pset):
        super().__init__()
        self.pset = pset

    def forward(self, x):
        return _Copy.apply(x, self.pset)


def _share(t: torch.Tensor, dim: int, size: int, rank: int) -> torch.Tensor:
    return t.detach().chunk(size, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """This rank's output features of a linear layer (its ``weight``'s rows, its ``bias``);
    ``activation(y, bias)`` fuses the bias into an activation (None: ``y + bias``)."""

    SPLIT = {"weight": 0, "bias": 0}

    def __init__(self, in_features: int, out_features: int, pset, size: int, *, activation=None,
                 copy_input: bool = True):
        super().__init__()
        if out_features % size:
            raise ValueError(f"a tensor-parallel group of {size} must divide the {out_features} output "
                             f"features")
        self.pset, self.copy_input, self.activation = pset, copy_input, activation
        self.weight = nn.Parameter(torch.empty(out_features // size, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features // size))

    @classmethod
    @torch.no_grad()
    def from_dense(cls, dense: nn.Module, pset, size: int, rank: int, copy_input: bool = True):
        """This rank's share of a dense ``nn.Linear``-like module (its ``weight`` and ``bias``;
        its ``fused_bias_activation(y, bias)``, if it has one, kept)."""
        out_f, in_f = dense.weight.shape
        layer = cls(in_f, out_f, pset, size, activation=getattr(dense, "fused_bias_activation", None),
                    copy_input=copy_input).to(dense.weight.device, dense.weight.dtype)
        layer.weight.copy_(_share(dense.weight, 0, size, rank))
        layer.bias.copy_(_share(dense.bias, 0, size, rank))
        return layer

    def forward(self, x):
        if self.copy_input:
            x = _Copy.apply(x, self.pset)
        y = F.linear(x, self.weight)
        return self.activation(y, self.bias) if self.activation is not None else y + self.bias


class RowParallelLinear(nn.Module):
    """This rank's input features of a linear layer (its ``weight``'s columns) and the whole
    ``bias``, added once after the partial outputs are summed over the group."""

    SPLIT = {"weight": 1}

    def __init__(self, in_features: int, out_features: int, pset, size: int):
        super().__init__()
        if in_features % size:
            raise ValueError(f"a tensor-parallel group of {size} must divide the {in_features} input "
                             f"features")
        self.pset = pset
        self.weight = nn.Parameter(torch.empty(out_features, in_features // size))
        self.bias = nn.Parameter(torch.zeros(out_features))

    @classmethod
    @torch.no_grad()
    def from_dense(cls, dense: nn.Module, pset, size: int, rank: int):
        out_f, in_f = dense.weight.shape
        layer = cls(in_f, out_f, pset, size).to(dense.weight.device, dense.weight.dtype)
        layer.weight.copy_(_share(dense.weight, 1, size, rank))
        layer.bias.copy_(dense.bias.detach())
        return layer

    def forward(self, x):
        return _Reduce.apply(F.linear(x, self.weight), self.pset) + self.bias


def parallelize(block: nn.Module, plan: dict[str, str], pset, size: int, rank: int) -> nn.Module:
    """Apply ``plan`` (submodule name -> COPY, COLUMN or ROW) to ``block`` in place: each named
    dense submodule replaced by this rank's share of it. A block whose plan has a COPY entry
    copies its input once (that submodule becomes a :class:`CopyToGroup`) and its column layers
    do not copy theirs again."""
    copies = COPY in plan.values()
    for name, how in plan.items():
        dense = getattr(block, name)
        if how == COPY:
            new = CopyToGroup(pset)
        elif how == COLUMN:
            new = ColumnParallelLinear.from_dense(dense, pset, size, rank, copy_input=not copies)
        elif how == ROW:
            new = RowParallelLinear.from_dense(dense, pset, size, rank)
        else:
            raise ValueError(f"a tensor-parallel plan says copy, column or row, not {how!r} ({name})")
        setattr(block, name, new)
    return block


def split_dims(model: nn.Module) -> dict[str, int]:
    """Every split parameter of a parallelized ``model`` and the dimension it is split along."""
    out = {}
    for prefix, module in model.named_modules():
        for param, dim in getattr(module, "SPLIT", {}).items():
            out[f"{prefix}.{param}" if prefix else param] = dim
    return out
