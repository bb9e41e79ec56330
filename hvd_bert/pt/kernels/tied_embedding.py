"""The word embeddings and the masked-LM decoder that shares their weight, with the weight's
gradient built in one buffer on a CPU.

Through PyTorch's ``F.embedding`` and ``F.linear`` the tied weight (BERT-Base: 30528 x 768,
94 MB) gets three fresh buffers of its size in every backward pass: the decoder's gradient,
the lookup's zero-filled gradient, and their sum (autograd adds the two out of place). On a
CPU each is a fresh ``mmap`` whose pages the kernel faults in and zeroes: about 200 ms each
for BERT-Base on a 2-core machine. Here the decoder hands its weight gradient to the lookup
(through a ``Tie`` made for one forward pass), which adds the looked-up rows into it in place
and returns it as the weight's only gradient: one buffer, no fill, no sum.

The decoder takes the weight detached, so the lookup is the weight's one producer in the
graph, and each forward pass has its own ``Tie``: a loss summed over several forward passes
gets each pass's decoder gradient once. Where the decoder's backward does not run (a loss
without the masked-LM term) the lookup starts from zeros as ``F.embedding`` does.

It serves a CPU weight that needs a gradient while grad mode is on and autocast is off; else
``tie_for`` returns ``None`` and ``lookup``/``project`` are ``F.embedding``/``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = ["Tie", "tie_for", "lookup", "project"]


class Tie:
    """One forward pass's hand-over: the decoder's weight gradient, until the lookup takes it."""

    __slots__ = ("grad",)

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None


def tie_for(weight: torch.Tensor) -> Tie | None:
    """A ``Tie`` for one forward pass where the shared-buffer path serves ``weight``, else ``None``."""
    if (weight.device.type != "cpu" or not weight.requires_grad or not torch.is_grad_enabled()
            or torch.is_autocast_enabled("cpu")):
        return None
    return Tie()


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids, tie):
        ctx.save_for_backward(ids)
        ctx.tie, ctx.shape = tie, weight.shape
        return F.embedding(ids, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        ids, = ctx.saved_tensors
        tie = ctx.tie
        gw, tie.grad = tie.grad, None
        if gw is None:  # the decoder's backward did not run in this pass
            gw = grad.new_zeros(ctx.shape)
        gw.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]))
        return gw, None, None


class _Decoder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tie):
        ctx.save_for_backward(x, weight)
        ctx.tie, ctx.has_bias = tie, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gw = g2.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.tie.grad is None:
            ctx.tie.grad = gw
        else:  # the same pass's decoder applied twice
            ctx.tie.grad += gw
        gx = grad @ weight if ctx.needs_input_grad[0] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, None, gb, None


def lookup(weight: torch.Tensor, ids: torch.Tensor, tie: Tie | None) -> torch.Tensor:
    """``F.embedding(ids, weight)``; with a ``tie``, its gradient is the decoder's buffer."""
    return F.embedding(ids, weight) if tie is None else _Lookup.apply(weight, ids, tie)


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            tie: Tie | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; with a ``tie``, the weight's gradient goes to the lookup."""
    if tie is None or not (x.requires_grad or bias is not None and bias.requires_grad):
        return F.linear(x, weight, bias)
    return _Decoder.apply(x, weight.detach(), bias, tie)
