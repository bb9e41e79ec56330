"""Optimizer math as pure functions over lists of numpy arrays with explicit state.

This is the single home of the update rules; the PyTorch and TensorFlow optimizers
implement the same math and are tested against these functions on the same inputs.
Norms are L2 over one flattened tensor (a "layer"). ``state.step`` counts applied updates
(t = 1 for the first); a step skipped for overflow is simply not taken.

Per-tensor behaviour comes from two boolean masks, built from parameter names with
:func:`name_mask`:
    ``decay_mask[i]``  tensor i gets weight decay,
    ``adapt_mask[i]``  tensor i gets the layer-wise trust ratio (LAMB / LARS).

References:
    LAMB: You et al. 2019, arXiv:1904.00962, Algorithm 2.
    NVLAMB: NVIDIA apex FusedLAMB (``csrc/multi_tensor_lamb.cu``): LAMB after clipping the
        global gradient norm to ``max_grad_norm``.
    LARS: You, Gitman, Ginsburg 2017, arXiv:1708.03888, in the MLPerf reference form.
    AdamW: Loshchilov & Hutter 2019, arXiv:1711.05101.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "BERT_EXCLUDE", "LARS_EXCLUDE", "name_mask", "global_norm", "clip_by_global_norm",
    "lamb_trust_ratio", "lars_trust_ratio", "AdamState", "MomentumState", "StepInfo",
    "adam_init", "momentum_init", "lamb_step", "nvlamb_step", "lars_step", "sgd_step",
    "adamw_step", "OPTIMIZERS", "init_state", "apply_step",
]

# BERT's parameters without weight decay (and, for NVLAMB by default, without trust ratio).
BERT_EXCLUDE: tuple[str, ...] = ("bias", "LayerNorm", "layer_norm")
# LARS: bias and normalisation parameters get neither trust ratio nor weight decay.
LARS_EXCLUDE: tuple[str, ...] = ("bias", "LayerNorm", "layer_norm", "batch_norm", "BatchNorm")

Arrays = list[np.ndarray]


def name_mask(names: Iterable[str], exclude: Sequence[str]) -> list[bool]:
    """``True`` for each name that matches none of the ``exclude`` regular expressions
    (``re.search``; a plain word matches as a substring)."""
    compiled = [re.compile(p) for p in exclude]
    return [not any(c.search(n) for c in compiled) for n in names]


def _as_arrays(xs: Iterable) -> Arrays:
    return [np.asarray(x) for x in xs]


def _norm(x: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(x, dtype=np.float64))))


def global_norm(tensors: Iterable[np.ndarray]) -> float:
    """``sqrt(sum_i ||t_i||^2)``: one norm across all tensors."""
    return math.sqrt(sum(_norm(t) ** 2 for t in tensors))


def clip_by_global_norm(grads: Sequence[np.ndarray], max_norm: float) -> tuple[Arrays, float]:
    """Scale all gradients by ``max_norm / G`` when their global norm ``G > max_norm``;
    leave them unchanged otherwise. Returns the gradients and ``G``."""
    g = global_norm(grads)
    if g > max_norm:
        return [x / (g / max_norm) for x in grads], g
    return list(grads), g


def lamb_trust_ratio(w_norm: float, u_norm: float) -> float:
    """``||w|| / ||u||``; 1 when either norm is zero."""
    if w_norm == 0.0 or u_norm == 0.0:
        return 1.0
    return w_norm / u_norm


def lars_trust_ratio(w_norm: float, g_norm: float, eta: float, weight_decay: float,
                     eps: float = 0.0) -> float:
    """``eta * ||w|| / (||g|| + wd * ||w|| + eps)``; 1 when ``||w||`` or ``||g||`` is zero."""
    if w_norm == 0.0 or g_norm == 0.0:
        return 1.0
    return eta * w_norm / (g_norm + weight_decay * w_norm + eps)


@dataclass(frozen=True)
class AdamState:
    """First and second moments (LAMB, NVLAMB, AdamW) and the number of applied steps."""

    step: int
    m: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class MomentumState:
    """Momentum buffers (SGD, LARS) and the number of applied steps."""

    step: int
    v: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class StepInfo:
    """What a step measured: per-tensor trust ratios (1.0 where not adapted) and the global
    gradient norm before any clipping."""

    trust_ratios: tuple[float, ...] = ()
    grad_norm: float = float("nan")
    extra: dict = field(default_factory=dict)


def adam_init(params: Sequence[np.ndarray]) -> AdamState:
    zeros = tuple(np.zeros_like(np.asarray(p)) for p in params)
    return AdamState(step=0, m=zeros, v=tuple(z.copy() for z in zeros))


def momentum_init(params: Sequence[np.ndarray]) -> MomentumState:
    return MomentumState(step=0, v=tuple(np.zeros_like(np.asarray(p)) for p in params))


def _masks(n: int, decay_mask, adapt_mask) -> tuple[list[bool], list[bool]]:
    decay = [True] * n if decay_mask is None else list(decay_mask)
    adapt = [True] * n if adapt_mask is None else list(adapt_mask)
    if len(decay) != n or len(adapt) != n:
        raise ValueError(f"masks must have one entry per tensor ({n}), got "
                         f"{len(decay)} (decay_mask) and {len(adapt)} (adapt_mask)")
    return decay, adapt


def _check_lengths(params, grads, *buffers) -> None:
    n = len(params)
    if len(grads) != n or any(len(b) != n for b in buffers):
        raise ValueError(f"params, grads and state must hold the same number of tensors, got "
                         f"{n} params, {len(grads)} grads, {[len(b) for b in buffers]} state")


def lamb_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
              lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
              weight_decay: float = 0.0, bias_correction: bool = True,
              decay_mask: Sequence[bool] | None = None, adapt_mask: Sequence[bool] | None = None,
              max_grad_norm: float | None = None) -> tuple[Arrays, AdamState, StepInfo]:
    """One LAMB update (REFERENCE section 1).

    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; r = m_hat / (sqrt(v_hat) + eps);
    u = r + wd w; w -= lr * ratio * u with ratio = ||w|| / ||u|| (1 on a zero norm).
    ``max_grad_norm`` first clips the global gradient norm (NVLAMB); ``None`` skips it.
    """
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.m, state.v)
    decay, adapt = _masks(len(params), decay_mask, adapt_mask)
    gnorm = global_norm(grads)
    if max_grad_norm is not None and gnorm > max_grad_norm:
        grads = [g / (gnorm / max_grad_norm) for g in grads]
    t = state.step + 1
    c1 = 1.0 - beta1 ** t if bias_correction else 1.0
    c2 = 1.0 - beta2 ** t if bias_correction else 1.0
    new_w, new_m, new_v, ratios = [], [], [], []
    for w, g, m, v, d, a in zip(params, grads, state.m, state.v, decay, adapt):
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        u = (m / c1) / (np.sqrt(v / c2) + eps)
        if d and weight_decay:
            u = u + weight_decay * w
        ratio = lamb_trust_ratio(_norm(w), _norm(u)) if a else 1.0
        new_w.append(w - lr * ratio * u)
        new_m.append(m)
        new_v.append(v)
        ratios.append(ratio)
    return new_w, AdamState(t, tuple(new_m), tuple(new_v)), StepInfo(tuple(ratios), gnorm)


def nvlamb_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                weight_decay: float = 0.01, max_grad_norm: float = 1.0,
                decay_mask: Sequence[bool] | None = None, use_nvlamb: bool = False,
                ) -> tuple[Arrays, AdamState, StepInfo]:
    """NVLAMB (apex FusedLAMB): clip the global gradient norm to ``max_grad_norm``, then LAMB
    with bias correction. The trust ratio is skipped for tensors without weight decay
    (apex's default) unless ``use_nvlamb=True``, which applies it to every tensor."""
    n = len(params)
    decay = [True] * n if decay_mask is None else list(decay_mask)
    adapt = [True] * n if use_nvlamb else [d and weight_decay != 0.0 for d in decay]
    return lamb_step(params, grads, state, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay, bias_correction=True, decay_mask=decay,
                     adapt_mask=adapt, max_grad_norm=max_grad_norm)


def lars_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: MomentumState, *,
              lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 1e-3,
              eps: float = 0.0, adapt_mask: Sequence[bool] | None = None,
              ) -> tuple[Arrays, MomentumState, StepInfo]:
    """One LARS update (MLPerf form).

    trust = eta ||w|| / (||g|| + wd ||w|| + eps); v = mu v + lr trust (g + wd w); w -= v.
    Tensors with ``adapt_mask[i] == False`` (bias, normalisation) get neither trust ratio nor
    weight decay: v = mu v + lr g.
    """
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.v)
    _, adapt = _masks(len(params), None, adapt_mask)
    new_w, new_v, ratios = [], [], []
    for w, g, v, a in zip(params, grads, state.v, adapt):
        if a:
            trust = lars_trust_ratio(_norm(w), _norm(g), eta, weight_decay, eps)
            v = momentum * v + lr * trust * (g + weight_decay * w)
        else:
            trust = 1.0
            v = momentum * v + lr * g
        new_w.append(w - v)
        new_v.append(v)
        ratios.append(trust)
    return new_w, MomentumState(state.step + 1, tuple(new_v)), StepInfo(tuple(ratios), global_norm(grads))


def sgd_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: MomentumState, *,
             lr: float, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False,
             decay_mask: Sequence[bool] | None = None) -> tuple[Arrays, MomentumState, StepInfo]:
    """SGD with momentum in PyTorch's form: d = g + wd w; v = mu v + d; w -= lr v
    (Nesterov: w -= lr (d + mu v))."""
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.v)
    decay, _ = _masks(len(params), decay_mask, None)
    new_w, new_v = [], []
    for w, g, v, dm in zip(params, grads, state.v, decay):
        d = g + weight_decay * w if (dm and weight_decay) else g
        # PyTorch initialises the buffer with the first gradient; with v0 = 0 this is the same.
        v = momentum * v + d
        new_w.append(w - lr * (d + momentum * v if nesterov else v))
        new_v.append(v)
    n = len(params)
    return new_w, MomentumState(state.step + 1, tuple(new_v)), StepInfo((1.0,) * n, global_norm(grads))


def adamw_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
               lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, decay_mask: Sequence[bool] | None = None,
               ) -> tuple[Arrays, AdamState, StepInfo]:
    """AdamW (decoupled weight decay): w -= lr (m_hat / (sqrt(v_hat) + eps) + wd w)."""
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.m, state.v)
    decay, _ = _masks(len(params), decay_mask, None)
    t = state.step + 1
    c1, c2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
    new_w, new_m, new_v = [], [], []
    for w, g, m, v, d in zip(params, grads, state.m, state.v, decay):
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        u = (m / c1) / (np.sqrt(v / c2) + eps)
        if d and weight_decay:
            u = u + weight_decay * w
        new_w.append(w - lr * u)
        new_m.append(m)
        new_v.append(v)
    n = len(params)
    return new_w, AdamState(t, tuple(new_m), tuple(new_v)), StepInfo((1.0,) * n, global_norm(grads))


# name -> (state initialiser, step function); the frontends use the same names.
OPTIMIZERS = {
    "sgd": (momentum_init, sgd_step),
    "adamw": (adam_init, adamw_step),
    "lamb": (adam_init, lamb_step),
    "nvlamb": (adam_init, nvlamb_step),
    "lars": (momentum_init, lars_step),
}


def _lookup(name: str):
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}") from None


def init_state(name: str, params: Sequence[np.ndarray]):
    """The zero state of optimizer ``name`` for ``params``."""
    return _lookup(name)[0](params)


def apply_step(name: str, params, grads, state, **hparams):
    """One step of optimizer ``name``: ``(params, state, info)``."""
    return _lookup(name)[1](params, grads, state, **hparams)

