"""What an optimizer's rule runs over in hvd_bert's PyTorch frontend: the *parts* of its tensors
(:class:`Part`: a parameter group's tensors whole, or the pieces of them a ZeRO shard holds) and
the whole tensors' norms (:class:`Norms`: local for a plain step, completed by an allreduce for
``hvd_bert.pt.zero``), the cache-sized slices the elementwise work runs over, and
:func:`piece_rule`: the rule of any optimizer ZeRO supports (the toolkit's own, whose
``update(parts, norms, clip)`` is their rule, and torch's SGD and AdamW, whose piece rules are
here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from hvd_bert.core.kernels import env_count

__all__ = ["Part", "Norms", "whole_parts", "local_norms", "plan_slices", "views", "trust_ratios",
           "sq_norms", "add_sq_norms", "clipped", "coef", "lerp_", "scale_", "add_", "add_product_",
           "advance_steps", "piece_rule", "init_state", "SUPPORTED"]


# Elementwise work runs over slices of about this many elements (small tensors grouped,
# large ones cut), so the chain of ops over one slice stays in the CPU cache instead of
# streaming every array from memory once per op. On CUDA, and with 0, whole tensors are used.
CHUNK_ELEMENTS = env_count("HVD_BERT_FOREACH_CHUNK", 1 << 18, 0, 1 << 40,
                           "a chunk of elements for the CPU's foreach updates (0: whole tensors)")


def plan_slices(tensors: list[torch.Tensor]) -> list[list[tuple[int, slice]]]:
    """Chunks of (tensor index, flat element range) covering every tensor once."""
    if not tensors:
        return []
    cpu = tensors[0].device.type == "cpu"
    if not cpu or CHUNK_ELEMENTS <= 0 or not all(t.is_contiguous() for t in tensors):
        return [[(i, slice(0, t.numel())) for i, t in enumerate(tensors)]]
    chunks, cur, acc = [], [], 0
    for i, t in enumerate(tensors):
        n = t.numel()
        for lo in range(0, max(n, 1), CHUNK_ELEMENTS):
            hi = min(lo + CHUNK_ELEMENTS, n)
            cur.append((i, slice(lo, hi)))
            acc += hi - lo
            if acc >= CHUNK_ELEMENTS:
                chunks.append(cur)
                cur, acc = [], 0
    if cur:
        chunks.append(cur)
    return chunks


def views(tensors: list[torch.Tensor], chunk: list[tuple[int, slice]]) -> list[torch.Tensor]:
    return [tensors[i].view(-1)[sl] for i, sl in chunk]


def trust_ratios(w_norms: list[torch.Tensor], u_norms: list[torch.Tensor]) -> torch.Tensor:
    """||w|| / ||u|| per tensor, 1 where either norm is zero."""
    w = torch.stack(w_norms)
    u = torch.stack(u_norms)
    ok = (w > 0) & (u > 0)
    return torch.where(ok, w / torch.where(ok, u, torch.ones_like(u)), torch.ones_like(w))


@dataclass
class Part:
    """One parameter group's share of an update: its tensors (``index``: each one's place among
    the optimizer's parameters, over all groups), as whole tensors or as the pieces of them a
    shard holds (contiguous views, updated in place), the same pieces of their gradients and
    of each state buffer, and the group's step number (t = 1 for the first)."""

    group: dict
    index: list[int]
    w: list[torch.Tensor]
    g: list[torch.Tensor]
    state: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    step: int = 1


@dataclass
class Norms:
    """What completes the per-tensor sums of squares of an update's pieces into the whole
    tensors' (``complete``: a ``[rows, count]`` float64 tensor in, the same out; every rank calls
    it alike). Locally (a plain step) the pieces are the tensors: nothing to add."""

    count: int
    complete: Callable[[torch.Tensor], torch.Tensor] = lambda sq: sq


def whole_parts(opt: torch.optim.Optimizer, buffers: Sequence[str], steps: Sequence[int]) -> list[Part]:
    """The parts of a plain step: each group's parameters with a gradient, whole (flat views)."""
    parts, start = [], 0
    for group, t in zip(opt.param_groups, steps):
        ps = group["params"]
        have = [i for i, p in enumerate(ps) if p.grad is not None]
        parts.append(Part(group, [start + i for i in have], [ps[i].view(-1) for i in have],
                          [ps[i].grad.view(-1) for i in have],
                          {n: [opt.state[ps[i]][n].view(-1) for i in have] for n in buffers}, t))
        start += len(ps)
    return parts


def local_norms(opt: torch.optim.Optimizer) -> Norms:
    """A plain step's norms: every tensor whole on this rank."""
    return Norms(sum(len(g["params"]) for g in opt.param_groups))


def sq_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's sum of squares, in double."""
    return torch.stack(torch._foreach_norm(tensors)).double() ** 2


def add_sq_norms(sq: torch.Tensor, row: int, chunk, part: Part, tensors: list[torch.Tensor]) -> None:
    """Add the sums of squares of a chunk's slices to their tensors' entries of ``sq[row]``."""
    idx = torch.tensor([part.index[i] for i, _ in chunk], device=sq.device)
    sq[row].index_add_(0, idx, sq_norms(tensors).to(sq.device))


def clipped(g: list[torch.Tensor], clip, gate=None) -> list[torch.Tensor]:
    """The clipped gradient slices (a cache-sized temporary), or ``g`` without a clip. With a
    ``gate`` (a step decided on the device, :func:`coef`) the slices are made finite: a skipped
    step's inf and NaN would poison even the zero coefficients that keep its state."""
    if clip is None and gate is None:
        return g
    factor = 1.0 if clip is None else clip.to(g[0].dtype) if torch.is_tensor(clip) else clip
    out = torch._foreach_mul(g, factor)
    if gate is not None:
        for t in out:
            t.nan_to_num_(0.0, 0.0, 0.0)
    return out


# A step decided on the device (hvd_bert.pt.engine: no host read of its gradients' norm) is
# *gated*: ``gate`` is a 0-d tensor, 1 to apply the step and 0 to skip it, and every change the
# rule makes is scaled by it, so that a skipped step leaves each tensor as it was, bit for bit
# (its gradients made finite by ``clipped``). ``gate=None``: the step applies (numbers only).
def coef(value, gate):
    """The coefficient ``value`` of a change (a number or a 0-d tensor), gated."""
    return value if gate is None else gate * value


def lerp_(a: list[torch.Tensor], b: list[torch.Tensor], weight: float, gate) -> None:
    """a += weight (b - a), gated."""
    if gate is None:
        torch._foreach_lerp_(a, b, weight)
    else:
        torch._foreach_lerp_(a, b, [gate * weight] * len(a))


def scale_(a: list[torch.Tensor], factor, gate) -> None:
    """a *= factor, gated (a skipped step multiplies by 1)."""
    torch._foreach_mul_(a, factor if gate is None else 1.0 + (factor - 1.0) * gate)


def add_(a: list[torch.Tensor], b: list[torch.Tensor], alpha, gate) -> None:
    """a += alpha b, gated."""
    if gate is None and not torch.is_tensor(alpha):
        torch._foreach_add_(a, b, alpha=alpha)
    else:
        torch._foreach_add_(a, torch._foreach_mul(b, coef(alpha, gate)))


def add_product_(a: list[torch.Tensor], b: list[torch.Tensor], c: list[torch.Tensor], value: float,
                 gate) -> None:
    """a += value b c, gated."""
    if gate is None:
        torch._foreach_addcmul_(a, b, c, value=value)
    else:
        add_(a, torch._foreach_mul(b, c), value, gate)


@torch.no_grad()
def advance_steps(opt: torch.optim.Optimizer, gate) -> None:
    """Every parameter's step counter (its ``step`` state, where it has one) += gate."""
    steps = [opt.state[p]["step"] for g in opt.param_groups for p in g["params"]
             if p.grad is not None and "step" in opt.state[p]]
    if steps:
        torch._foreach_add_(steps, gate.to(steps[0].dtype) if torch.is_tensor(gate) else gate)


# ---------------------------------------------------------------------- torch's own optimizers
@torch.no_grad()
def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s zero state without taking a step (see the module docstring).

    Supports the toolkit's optimizers and torch's SGD, Adam and AdamW."""
    opt = optimizer
    if hasattr(opt, "init_state"):
        opt.init_state()
        return
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            if st:
                continue
            if isinstance(opt, torch.optim.SGD):
                if group.get("momentum", 0):
                    st["momentum_buffer"] = torch.zeros_like(p)
            elif isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                st["step"] = torch.zeros((), dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_sq"] = torch.zeros_like(p)
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p)
            else:
                raise TypeError(
                    f"cannot create the state of {type(opt).__name__} without a step; use one of "
                    f"hvd_bert's optimizers or torch's SGD/Adam/AdamW, or give it an init_state() method")


class _TorchRule:
    """A torch optimizer's rule over parts, part by part (no norms, no clip of its own)."""

    buffers: tuple[str, ...] = ()
    has_step = True

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.param_groups = optimizer.param_groups

    def clip_limit(self) -> float | None:
        return None

    @torch.no_grad()
    def update(self, parts: Sequence[Part], norms: Norms, clip=None, gate=None) -> None:
        for part in parts:
            if part.w:
                self.update_part(part, clipped(part.g, clip, gate), gate)


class _TorchAdamW(_TorchRule):
    """``torch.optim.AdamW``'s rule over parts (its options as hvd_bert builds it: no amsgrad,
    maximize or capturable): w *= 1 - lr wd; the moments; w -= lr m_hat / (sqrt(v_hat) + eps)."""

    buffers = ("exp_avg", "exp_avg_sq")

    def update_part(self, part: Part, g: list[torch.Tensor], gate=None) -> None:
        group, t = part.group, part.step
        beta1, beta2 = group["betas"]
        m, v = (part.state[n] for n in self.buffers)
        scale_(part.w, 1.0 - group["lr"] * group["weight_decay"], gate)
        lerp_(m, g, 1.0 - beta1, gate)
        scale_(v, beta2, gate)
        add_product_(v, g, g, 1.0 - beta2, gate)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(1.0 - beta2 ** t))
        torch._foreach_add_(denom, group["eps"])
        if gate is None:
            torch._foreach_addcdiv_(part.w, m, denom, value=-group["lr"] / (1.0 - beta1 ** t))
        else:
            add_(part.w, torch._foreach_div(m, denom), -group["lr"] / (1.0 - beta1 ** t), gate)


class _TorchSGD(_TorchRule):
    """``torch.optim.SGD``'s rule over parts (no dampening or maximize): d = g + wd w; with
    momentum b = mu b + d and d = b (Nesterov: d + mu b); w -= lr d."""

    has_step = False

    def __init__(self, optimizer: torch.optim.Optimizer):
        super().__init__(optimizer)
        self.buffers = ("momentum_buffer",) if any(g.get("momentum", 0) for g in self.param_groups) else ()

    def update_part(self, part: Part, d: list[torch.Tensor], gate=None) -> None:
        group = part.group
        if group["weight_decay"]:
            d = torch._foreach_add(d, part.w, alpha=group["weight_decay"])
        if self.buffers and group["momentum"]:
            bufs = part.state["momentum_buffer"]
            scale_(bufs, group["momentum"], gate)
            add_(bufs, d, 1.0, gate)
            d = torch._foreach_add(d, bufs, alpha=group["momentum"]) if group["nesterov"] else bufs
        add_(part.w, d, -group["lr"], gate)


SUPPORTED = "lamb, nvlamb, lars, adamw and sgd"


def piece_rule(optimizer: torch.optim.Optimizer):
    """The rule ``update(parts, norms, clip, gate)`` of ``optimizer`` with its ``buffers``, ``has_step``
    and ``clip_limit()``: the optimizer itself when it has one (the toolkit's LAMB, NVLAMB, LARS,
    or a user's optimizer written the same way), else torch's SGD and AdamW as hvd_bert builds
    them. ValueError for anything else."""
    if all(hasattr(optimizer, a) for a in ("update", "buffers", "has_step", "clip_limit")):
        return optimizer
    def used(*options):
        return [k for k in options if any(g.get(k) for g in optimizer.param_groups)]
    bad = []
    if isinstance(optimizer, torch.optim.AdamW):
        bad = used("amsgrad", "maximize", "capturable")
        if not bad:
            return _TorchAdamW(optimizer)
    elif isinstance(optimizer, torch.optim.SGD):
        bad = used("dampening", "maximize")
        if not bad:
            return _TorchSGD(optimizer)
    raise ValueError(f"train.zero.stage > 0 supports {SUPPORTED} (as hvd_bert builds them, or an optimizer "
                     f"with update(parts, norms, clip)), not {type(optimizer).__name__}"
                     + (f" with {', '.join(bad)}" if bad else ""))
