"""LAMB, NVLAMB and LARS as ``torch.optim.Optimizer`` subclasses.

They implement the math of :mod:`hvd_bert.core.optim` (the reference they are tested
against) with multi-tensor ``torch._foreach_*`` kernels: one call per operation over all
tensors of a parameter group, no Python loop over elements. Per-group options:

    ``weight_decay``  decoupled weight decay of the group
    ``adapt``         whether the group gets the layer-wise trust ratio

:func:`param_groups` builds the groups from parameter names (BERT: no weight decay for
``bias`` and ``LayerNorm``) through :class:`hvd_bert.config.OptimConfig`, and
:func:`build_optimizer` makes any of the toolkit's optimizers from that config.

Each optimizer's rule is written once, as ``update(parts, norms, clip)`` over *parts* of its
tensors (:class:`Part`: a parameter group's tensors whole, or the pieces of them a ZeRO shard
holds) with the whole tensors' norms completed by the caller (:class:`Norms`: locally for a
plain ``step()``, by an allreduce over the ranks for ``hvd_bert.pt.zero``), the way DeepSpeed's
stages hand their partition to the wrapped optimizer. A plain ``step()`` on the CPU takes the C
kernels of :mod:`hvd_bert.pt.kernels.optim` instead (the same rule, tested against it).
:func:`piece_rule` gives the rule of any optimizer ZeRO supports (torch's SGD and AdamW too).

``init_state()`` creates the zero state explicitly. Horovod's ``broadcast_optimizer_state``
otherwise creates it by taking a fake step with zero gradients, which advances LAMB's step
count (its bias correction) and applies one weight decay.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

from hvd_bert.config import OptimConfig
from hvd_bert.pt.kernels import optim as fused_optim
from hvd_bert.pt.optim_parts import (Norms, Part, add_, add_product_, add_sq_norms, clipped, coef, init_state,
                                     lerp_, local_norms, plan_slices, scale_, trust_ratios, views,
                                     whole_parts)

__all__ = ["Lamb", "NVLamb", "Lars", "Lion", "param_groups", "build_optimizer", "init_state"]


@torch.no_grad()
def _fill_state(opt: torch.optim.Optimizer, buffers: Sequence[str]) -> None:
    """Step 0 and zero ``buffers`` for every parameter of ``opt`` without state."""
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float32)
                for name in buffers:
                    st[name] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _closure_loss(closure):
    """``step(closure)``'s loss: the closure re-evaluated with gradients on (None without one)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _group_tensors(group, state, names: Sequence[str]):
    params = [p for p in group["params"] if p.grad is not None]
    grads = [p.grad for p in params]
    bufs = [[state[p][n] for p in params] for n in names]
    return params, grads, bufs


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, arXiv:1904.00962, Alg. 2), as ``hvd_bert.core.optim.lamb_step``.

    Args:
        lr, betas, eps, weight_decay: as in the paper; eps is outside the square root.
        bias_correction: Adam bias correction (default on).
        adapt: apply the trust ratio (per group; default on: TF BERT, optax).
        max_grad_norm: if set, clip the global norm of all gradients (over every group) to
            it before the update (NVLAMB). Read from the first group. The norm of the last
            step is kept in ``last_grad_norm`` (None without clipping).

    Every setting lives in the parameter groups: ``hvd.DistributedOptimizer`` rebuilds the
    optimizer from ``param_groups`` alone, so anything kept elsewhere would be lost.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, bias_correction: bool = True,
                 adapt: bool | None = True, max_grad_norm: float | None = None, **extra):
        if lr <= 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyperparameters: lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, adapt=adapt,
                        max_grad_norm=max_grad_norm, **extra)
        super().__init__(params, defaults)
        self.last_grad_norm: torch.Tensor | None = None
        self._host_steps: dict[int, int] = {}

    def _adapt(self, group) -> bool:
        return bool(group["adapt"])

    def init_state(self) -> None:
        """Zero moments and step 0 for every parameter that has none yet."""
        _fill_state(self, ("exp_avg", "exp_avg_sq"))

    def _clip_factor(self) -> torch.Tensor | None:
        """With ``max_grad_norm`` set: the factor min(1, max / G) for the global gradient norm
        G (kept in ``last_grad_norm``); None without it (no pass over the gradients)."""
        max_norm = self.param_groups[0]["max_grad_norm"]
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if max_norm is None or not grads:
            return None
        if fused_optim.usable(grads):  # one pass at memory speed, the sum in double
            gnorm = torch.tensor(math.sqrt(fused_optim.sumsq(grads)), dtype=grads[0].dtype)
        else:
            norms = torch._foreach_norm(grads)
            dtype = torch.float64 if all(n.dtype == torch.float64 for n in norms) else torch.float32
            gnorm = torch.linalg.vector_norm(torch.stack([n.to(dtype) for n in norms]))
        self.last_grad_norm = gnorm
        # g / (G / max) when G > max, unchanged otherwise (apex FusedLAMB; a clip, not a scale).
        return torch.where(gnorm > max_norm, max_norm / gnorm, torch.ones_like(gnorm))

    buffers = ("exp_avg", "exp_avg_sq")  # the state a ZeRO shard holds a piece of
    has_step = True

    def clip_limit(self) -> float | None:
        """NVLAMB's global gradient norm limit (None: no clip), which ZeRO applies as step() does."""
        return self.param_groups[0]["max_grad_norm"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        self.init_state()
        clip = self._clip_factor()
        steps, fused = [], True
        for gi, group in enumerate(self.param_groups):
            params, grads, (st, m, v) = _group_tensors(group, self.state, ("step", "exp_avg", "exp_avg_sq"))
            if any(g.is_sparse for g in grads):
                raise RuntimeError("Lamb does not support sparse gradients")
            if params:
                torch._foreach_add_(st, 1.0)
            steps.append(self._step_of(gi, st) if params else 0)
            fused = fused and (not params or fused_optim.usable(params, grads, m, v))
        if fused:  # CPU: the C kernels, group by group (the norms are local)
            for group, t in zip(self.param_groups, steps):
                params, grads, (m, v) = _group_tensors(group, self.state, self.buffers)
                if params:
                    self._update_fused(group, params, grads, m, v, 1.0 if clip is None else float(clip),
                                       *self._corrections(group, t), self._adapt(group))
            return loss
        self.update(whole_parts(self, self.buffers, steps), local_norms(self), clip)
        return loss

    def _step_of(self, gi: int, steps: list[torch.Tensor]) -> int:
        """The group's step number, counted on the host: the step tensors (kept for
        checkpoints) are read once, after a start or a load, not every step (a device sync)."""
        t = self._host_steps.get(gi)
        t = int(steps[0].item()) if t is None else t + 1  # every tensor of a group steps together
        self._host_steps[gi] = t
        return t

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._host_steps = {}

    def _corrections(self, group, t: int) -> tuple[float, float]:
        """(sqrt(c2), 1 / c1): Adam's bias corrections at step t (1 without them)."""
        beta1, beta2 = group["betas"]
        if not group["bias_correction"]:
            return 1.0, 1.0
        return math.sqrt(1.0 - beta2 ** t), 1.0 / (1.0 - beta1 ** t)

    @torch.no_grad()
    def update(self, parts: Sequence[Part], norms: Norms, clip=None, gate=None) -> None:
        """LAMB's rule over ``parts`` (whole tensors or a shard's pieces), in two passes over
        cache-sized slices: (1) the moments, the update u = m_hat / (sqrt(v_hat) + eps) + wd w
        and the squared norms of w and u; then each whole tensor's norms (``norms.complete``) and
        (2) u again and w -= lr * ratio * u. Recomputing u costs arithmetic but no full-size
        temporary. ``clip`` (a 0-d tensor, a number or None) scales the gradient slices on the
        device: no host sync; ``gate``: a step decided on the device (``optim_parts.coef``)."""
        like = self.param_groups[0]["params"][0]
        sq = torch.zeros(2, norms.count, dtype=torch.float64, device=like.device)
        adapting = any(self._adapt(g) for g in self.param_groups)

        def update_of(part, w, mm, vv):
            sqrt_c2, rc1 = self._corrections(part.group, part.step)
            wd, eps = part.group["weight_decay"], part.group["eps"]
            denom = torch._foreach_sqrt(vv)
            torch._foreach_mul_(denom, 1.0 / sqrt_c2)
            torch._foreach_add_(denom, eps)
            if wd:
                u = torch._foreach_mul(w, wd)
                torch._foreach_addcdiv_(u, mm, denom, value=rc1)
            else:
                u = torch._foreach_div(mm, denom)
                if rc1 != 1.0:
                    torch._foreach_mul_(u, rc1)
            return u

        for part in parts:  # pass 1
            beta1, beta2 = part.group["betas"]
            m, v = (part.state[n] for n in self.buffers)
            for chunk in plan_slices(part.w):
                w, g, mm, vv = (views(t, chunk) for t in (part.w, part.g, m, v))
                g = clipped(g, clip, gate)
                lerp_(mm, g, 1.0 - beta1, gate)
                scale_(vv, beta2, gate)
                add_product_(vv, g, g, 1.0 - beta2, gate)
                if self._adapt(part.group):
                    add_sq_norms(sq, 0, chunk, part, w)
                    add_sq_norms(sq, 1, chunk, part, update_of(part, w, mm, vv))
        if adapting:
            norm = norms.complete(sq).sqrt()
            ratios = trust_ratios(list(norm[0].unbind()), list(norm[1].unbind()))
        for part in parts:  # pass 2
            m, v = (part.state[n] for n in self.buffers)
            adapt, lr = self._adapt(part.group), part.group["lr"]
            scales = (coef(-lr * ratios[part.index], gate).to(like.dtype).unbind() if adapt and part.index
                      else None)
            for chunk in plan_slices(part.w):
                w, mm, vv = (views(t, chunk) for t in (part.w, m, v))
                u = update_of(part, w, mm, vv)
                if adapt:  # w -= lr * ratio * u in one pass: addcmul with a 0-d scale per slice
                    torch._foreach_addcmul_(w, u, [scales[i] for i, _ in chunk])
                else:
                    add_(w, u, -lr, gate)

    @staticmethod
    def _update_fused(group, params, grads, m, v, clip, sqrt_c2, rc1, adapt) -> None:
        """The same update with :mod:`hvd_bert.pt.kernels.optim`'s kernels: the whole group in
        one call, tensor by tensor, pass 2 right after pass 1 (a tensor that fits in the
        last-level cache, every BERT matrix but the word embeddings, is read back from there)."""
        beta1, beta2 = group["betas"]
        fused_optim.lamb_step(params, grads, m, v, beta1, beta2, clip, sqrt_c2, group["eps"],
                              group["weight_decay"], rc1, group["lr"], adapt)


class NVLamb(Lamb):
    """NVLAMB (NVIDIA apex FusedLAMB): clip the global gradient norm to ``max_grad_norm``
    (default 1.0), then LAMB with bias correction. As in apex, groups without weight decay
    skip the trust ratio unless ``use_nvlamb=True`` (a group's explicit ``adapt`` wins).
    As ``hvd_bert.core.optim.nvlamb_step``.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, max_grad_norm: float = 1.0,
                 use_nvlamb: bool = False, **extra):
        extra.pop("bias_correction", None)
        extra.setdefault("adapt", None)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         bias_correction=True, max_grad_norm=max_grad_norm,
                         use_nvlamb=use_nvlamb, **extra)

    def _adapt(self, group) -> bool:
        if group["adapt"] is not None:
            return bool(group["adapt"])
        return bool(group["use_nvlamb"]) or group["weight_decay"] != 0.0


class Lars(torch.optim.Optimizer):
    """LARS (You, Gitman, Ginsburg 2017) in the MLPerf form, as
    ``hvd_bert.core.optim.lars_step``:

        trust = eta ||w|| / (||g|| + wd ||w|| + eps)  (1 when ||w|| or ||g|| is 0)
        v = momentum v + lr trust (g + wd w);  w -= v

    Groups with ``adapt=False`` (bias, normalisation) get neither trust ratio nor weight
    decay: v = momentum v + lr g.
    """

    def __init__(self, params, lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 1e-3, eps: float = 0.0, adapt: bool = True):
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0 or eta <= 0 or eps < 0:
            raise ValueError(f"invalid LARS hyperparameters: lr={lr}, momentum={momentum}, "
                             f"weight_decay={weight_decay}, eta={eta}, eps={eps}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      eta=eta, eps=eps, adapt=adapt))

    def init_state(self) -> None:
        """A zero momentum buffer and step 0 for every parameter that has none yet."""
        _fill_state(self, ("momentum_buffer",))

    buffers = ("momentum_buffer",)  # the state a ZeRO shard holds a piece of
    has_step = True

    def clip_limit(self) -> float | None:
        return None

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        self.init_state()
        fused = True
        for group in self.param_groups:
            params, grads, (steps, bufs) = _group_tensors(group, self.state, ("step", "momentum_buffer"))
            if params:
                torch._foreach_add_(steps, 1.0)
                fused = fused and fused_optim.usable(params, grads, bufs)
        if fused:  # CPU: the C kernels, group by group (the norms are local)
            for group in self.param_groups:
                params, grads, (bufs,) = _group_tensors(group, self.state, self.buffers)
                if params:
                    self._update_fused(group, params, grads, bufs)
            return loss
        self.update(whole_parts(self, self.buffers, [1] * len(self.param_groups)), local_norms(self))
        return loss

    @torch.no_grad()
    def update(self, parts: Sequence[Part], norms: Norms, clip=None, gate=None) -> None:
        """LARS's rule over ``parts`` (whole tensors or a shard's pieces): the norms of w and g
        (each whole tensor's: ``norms.complete``), then one pass over cache-sized slices:
        d = (g + wd w) lr trust; v = mu v + d; w -= v (``gate``: ``optim_parts.coef``)."""
        like = self.param_groups[0]["params"][0]
        sq = torch.zeros(2, norms.count, dtype=torch.float64, device=like.device)
        for part in parts:
            if part.group["adapt"]:
                for chunk in plan_slices(part.w):
                    add_sq_norms(sq, 0, chunk, part, views(part.w, chunk))
                    add_sq_norms(sq, 1, chunk, part, clipped(views(part.g, chunk), clip, gate))
        if any(g["adapt"] for g in self.param_groups):
            wn, gn = norms.complete(sq).sqrt().unbind()
        for part in parts:
            group = part.group
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            scales = None
            if group["adapt"] and part.index:
                w, g = wn[part.index], gn[part.index]
                ok = (w > 0) & (g > 0)
                trust = torch.where(ok, group["eta"] * w / (g + wd * w + group["eps"]).clamp_min(1e-38),
                                    torch.ones_like(w))
                scales = (lr * trust).to(like.dtype).unbind()
            (bufs,) = (part.state[n] for n in self.buffers)
            for chunk in plan_slices(part.w):
                ws, vs = views(part.w, chunk), views(bufs, chunk)
                gs = clipped(views(part.g, chunk), clip, gate)
                scale_(vs, mu, gate)
                if scales is None:
                    add_(vs, gs, lr, gate)
                else:
                    d = torch._foreach_add(gs, ws, alpha=wd) if wd else torch._foreach_mul(gs, 1.0)
                    torch._foreach_mul_(d, [scales[i] for i, _ in chunk])
                    add_(vs, d, 1.0, gate)
                add_(ws, vs, -1.0, gate)

    @staticmethod
    def _update_fused(group, params, grads, bufs) -> None:
        """The same update with :mod:`hvd_bert.pt.kernels.optim`'s kernels, the group in one
        call: per tensor the norms of w and g in one pass, then momentum and update in another."""
        fused_optim.lars_step(params, grads, bufs, *(group[k] for k in ("lr", "momentum", "weight_decay",
                                                                          "eta", "eps", "adapt")))


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, arXiv:2302.06675), as ``hvd_bert.core.optim.lion_step``:
    w -= lr (sign(b1 m + (1 - b1) g) + wd w); m = b2 m + (1 - b2) g."""

    buffers = ("exp_avg",)
    has_step = True

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        if lr <= 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid Lion hyperparameters: lr={lr}, betas={betas}, "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def clip_limit(self) -> float | None:
        return None

    def init_state(self) -> None:
        _fill_state(self, self.buffers)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        self.init_state()
        for group in self.param_groups:
            params, _, (steps,) = _group_tensors(group, self.state, ("step",))
            if params:
                torch._foreach_add_(steps, 1.0)
        self.update(whole_parts(self, self.buffers, [1] * len(self.param_groups)), local_norms(self))
        return loss

    @torch.no_grad()
    def update(self, parts: Sequence[Part], norms: Norms, clip=None, gate=None) -> None:
        """Lion's rule over ``parts``, slice by cache-sized slice (no norms; ``gate``:
        ``optim_parts.coef``)."""
        for part in parts:
            beta1, beta2 = part.group["betas"]
            lr, wd = part.group["lr"], part.group["weight_decay"]
            for chunk in plan_slices(part.w):
                w, m = views(part.w, chunk), views(part.state["exp_avg"], chunk)
                g = clipped(views(part.g, chunk), clip, gate)
                c = torch._foreach_mul(m, beta1)
                torch._foreach_add_(c, g, alpha=1.0 - beta1)
                c = torch._foreach_sign(c)
                if wd:
                    torch._foreach_add_(c, w, alpha=wd)
                add_(w, c, -lr, gate)
                scale_(m, beta2, gate)
                add_(m, g, 1.0 - beta2, gate)


def param_groups(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], cfg: OptimConfig,
                 ) -> list[dict]:
    """Parameter groups by name: ``decay`` (weight decay, trust ratio) and ``no_decay``
    (names matching ``cfg.exclude``: no weight decay; trust ratio as ``cfg`` says)."""
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    names = [n for n, _ in named]
    decay, adapt = cfg.masks(names)
    groups: dict[tuple[bool, bool], dict] = {}
    for (name, p), d, a in zip(named, decay, adapt):
        key = (d, a)
        if key not in groups:
            groups[key] = {"params": [], "names": [],
                           "weight_decay": cfg.weight_decay if d else 0.0, "adapt": a}
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return list(groups.values())


def build_optimizer(named_parameters, cfg: OptimConfig, lr: float | None = None) -> torch.optim.Optimizer:
    """The optimizer ``cfg.name`` over parameter groups from :func:`param_groups`."""
    groups = param_groups(named_parameters, cfg)
    lr = cfg.lr if lr is None else lr
    if cfg.name == "lamb":
        return Lamb(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                    weight_decay=cfg.weight_decay, bias_correction=cfg.bias_correction,
                    max_grad_norm=cfg.max_grad_norm)
    if cfg.name == "nvlamb":
        return NVLamb(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                      weight_decay=cfg.weight_decay, max_grad_norm=cfg.effective_max_grad_norm,
                      use_nvlamb=bool(cfg.trust_ratio_on_excluded))
    if cfg.name == "lars":
        return Lars(groups, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                    eta=cfg.eta, eps=cfg.eps)
    if cfg.name == "lion":
        return Lion(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    for g in groups:
        g.pop("adapt")
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                 weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
