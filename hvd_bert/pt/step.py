"""A step of the PyTorch engine decided on the device (``Engine.step_on_device``): the global
gradient norm, the unscaling and the clip in one factor, and the decision to skip a non-finite
step as a gate the update is scaled by (``optim_parts.coef``), with no host read of a training
value; :class:`DeviceStep` carries the outcome until ``Engine.finish_step`` reads it, once.

On a CPU the toolkit's LAMB, NVLAMB and LARS take their fused C kernels, which read their
coefficients from host memory (where the tensors are: no device to wait for); elsewhere, and
with ``HVD_BERT_FUSED_OPTIM=0``, the optimizer's rule runs over the whole tensors
(``optim_parts.piece_rule``), the path a GPU takes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from hvd_bert.pt.kernels import optim as fused_optim
from hvd_bert.pt.optim import Lamb, Lars
from hvd_bert.pt.optim_parts import advance_steps, local_norms, piece_rule, whole_parts

__all__ = ["DeviceStep", "plain_step", "global_grad_norm", "host_reads", "READS"]

# every way a tensor's value reaches the host from Python
READS = ("item", "__float__", "__bool__", "__int__", "__index__", "tolist", "numpy", "cpu")


@dataclass
class DeviceStep:
    """A step decided on the device: its LR, and as 0-d tensors the gate (1 applied, 0
    skipped), the global gradient norm and the loss scale after it (None without scaling)."""

    lr: float
    gate: torch.Tensor
    grad_norm: torch.Tensor
    scale: torch.Tensor | None


def global_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The norm of the gradients as a 0-d float64 tensor on their device (no host read; the
    C kernel's sum on a CPU, where the data is host memory)."""
    if fused_optim.usable(grads):  # one pass at memory speed on a CPU
        return torch.tensor(fused_optim.sumsq(grads), dtype=torch.float64).sqrt()
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack([n.double() for n in norms]))


@torch.no_grad()
def plain_step(optimizer: torch.optim.Optimizer, inv_scale, max_grad_norm: float | None,
               t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The update of the whole parameters (ZeRO stage 0), every rank holding the same reduced
    gradients: ``(gate, norm)`` as 0-d tensors. ``inv_scale``: the loss scale's inverse (a
    number or a 0-d tensor); ``max_grad_norm``: the engine's clip, where the optimizer has none
    of its own (NVLAMB's); ``t``: the step number the update is (its bias corrections)."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        device = optimizer.param_groups[0]["params"][0].device
        return torch.ones((), device=device), torch.zeros((), dtype=torch.float64, device=device)
    norm = global_grad_norm(grads) * inv_scale
    gate = torch.isfinite(norm).to(torch.float32)
    rule = piece_rule(optimizer)
    own = rule.clip_limit()
    limit = own if own is not None else max_grad_norm
    # the unscaling and the clip in one factor of the gradients
    clip = inv_scale * (1.0 if limit is None
                        else torch.where(norm > limit, limit / norm, torch.ones_like(norm)))
    if fused_optim.usable(grads) and isinstance(optimizer, (Lamb, Lars)):
        if bool(gate):  # (a CPU: host memory, no device to wait for)
            if torch.is_tensor(clip) or clip != 1.0:
                torch._foreach_mul_(grads, clip.to(grads[0].dtype) if torch.is_tensor(clip) else clip)
            _step_unclipped(optimizer, own is not None)
        return gate, norm
    steps = [t] * len(optimizer.param_groups)
    rule.update(whole_parts(optimizer, rule.buffers, steps), local_norms(optimizer),
                clip if torch.is_tensor(clip) or clip != 1.0 else None, gate)
    if rule.has_step:
        advance_steps(optimizer, gate)
    return gate, norm


def _step_unclipped(optimizer: torch.optim.Optimizer, clips: bool) -> None:
    """The optimizer's own step (Horovod's, its allreduce done) with its clip limit set aside:
    the gradients were clipped already."""
    limits = [g["max_grad_norm"] for g in optimizer.param_groups] if clips else []
    for group in optimizer.param_groups if clips else []:
        group["max_grad_norm"] = None
    try:
        with optimizer.skip_synchronize():
            optimizer.step()
    finally:
        for group, limit in zip(optimizer.param_groups, limits):
            group["max_grad_norm"] = limit


@contextlib.contextmanager
def host_reads():
    """Every host read of a tensor's value from Python while the block runs (:data:`READS`),
    listed by name in the list it yields: a check of a step on a CPU, where CUDA's
    ``torch.cuda.set_sync_debug_mode`` has nothing to see."""
    seen: list[str] = []
    originals = {name: torch.Tensor.__dict__.get(name) for name in READS}
    def counted(name: str, original):
        def read(self, *a, **k):
            seen.append(name)
            return original(self, *a, **k)
        return read

    for name in READS:
        setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
