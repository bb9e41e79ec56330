"""Optimizer math as small composable transforms over lists of numpy arrays, with explicit
state, in the spirit of optax: a :class:`Transform` maps ``(updates, state, params)`` to new
updates and state; :func:`chain` runs several in order; an optimizer is a chain, e.g.

    LAMB   = chain(clip_by_global_norm (NVLAMB), scale_by_adam, add_decayed_weights(mask),
                   scale_by_trust_ratio(mask), scale(-lr))
    LARS   = chain(scale_by_lars(eta, wd, mask), scale(lr), trace(momentum), scale(-1))
    SGD    = chain(add_decayed_weights(mask), trace(momentum, nesterov), scale(-lr))
    AdamW  = chain(scale_by_adam, add_decayed_weights(mask), scale(-lr))
    Lion   = chain(scale_by_lion, add_decayed_weights(mask), scale(-lr))

and ``params + updates`` is the new weights. ``lamb_step`` and the others are these chains with
the step's hyperparameters, the state kept as :class:`AdamState` / :class:`MomentumState`.

This is the single home of the update rules; the PyTorch and TensorFlow optimizers
implement the same math and are tested against these functions on the same inputs.
Norms are L2 over one flattened tensor (a "layer"). ``state.step`` counts applied updates
(t = 1 for the first); a step skipped for overflow is simply not taken. The whole tensors' norms
come from a :class:`Norms` (``norms=``): :data:`LOCAL` when the arrays are the whole tensors;
for the pieces of them a ZeRO shard holds, one that completes them by an allreduce over the
ranks (:func:`hvd_bert.core.zero.sharded_step`). So a rule is written once, here, for both.

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
    Lion: Chen et al. 2023, arXiv:2302.06675, Algorithm 2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Sequence

import numpy as np

__all__ = [
    "BERT_EXCLUDE", "LARS_EXCLUDE", "name_mask", "global_norm", "clip_by_global_norm",
    "lamb_trust_ratio", "lars_trust_ratio", "AdamState", "MomentumState", "StepInfo",
    "adam_init", "momentum_init", "lamb_step", "nvlamb_step", "lars_step", "sgd_step",
    "adamw_step", "lion_step", "scale_by_lion", "OPTIMIZERS", "init_state",
           "state_buffers", "apply_step", "Transform",
    "chain", "clip_by_global_norm_tx",
    "scale_by_adam", "add_decayed_weights", "scale_by_trust_ratio", "scale_by_lars", "trace", "scale",
    "apply_updates", "TrustRatios", "Norms", "LOCAL",
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


def _sq(x: np.ndarray) -> float:
    return float(np.sum(np.square(x, dtype=np.float64)))


def _norm(x: np.ndarray) -> float:
    return math.sqrt(_sq(x))


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
class Norms:
    """The whole tensors' norms for the arrays an update runs over. Without ``index`` each array
    is a whole tensor (:data:`LOCAL`). With it, the arrays are pieces (``index[j]``: piece j's
    tensor among ``count``), and ``allreduce`` sums a vector over the ranks holding the other
    pieces (every rank calls it alike, once per call here)."""

    index: tuple[int, ...] | None = None
    count: int = 0
    allreduce: Callable[[np.ndarray], np.ndarray] | None = None

    def of(self, *lists: Sequence[np.ndarray]) -> list[list[float]]:
        """For each list of arrays, each array's whole tensor's norm."""
        if self.index is None:
            return [[_norm(x) for x in xs] for xs in lists]
        sums = np.zeros((len(lists), self.count))
        for row, xs in enumerate(lists):
            for i, x in zip(self.index, xs):
                sums[row, i] += _sq(x)
        total = np.sqrt(np.asarray(self.allreduce(sums.ravel()), dtype=np.float64)).reshape(sums.shape)
        return [[float(total[row, i]) for i in self.index] for row in range(len(lists))]

    def global_norm(self, xs: Sequence[np.ndarray]) -> float:
        """One norm across all the tensors (the pieces' over every rank)."""
        if self.index is None:
            return global_norm(xs)
        local = sum(_sq(x) for x in xs)
        return math.sqrt(float(np.asarray(self.allreduce(np.array([local])))[0]))


LOCAL = Norms()


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


# ---------------------------------------------------------------------- transforms
@dataclass(frozen=True)
class Transform:
    """``init(params) -> state`` and ``update(updates, state, params) -> (updates, state)``."""

    init: Callable[[Sequence[np.ndarray]], Any]
    update: Callable[[Arrays, Any, Arrays], tuple[Arrays, Any]]


def _stateless(fn: Callable[[Arrays, Arrays], Arrays]) -> Transform:
    return Transform(lambda params: None, lambda u, state, params: (fn(u, params), None))


def chain(*transforms: Transform) -> Transform:
    """The transforms applied in order; the state is the tuple of their states."""
    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(updates, states, params):
        out = []
        for t, s in zip(transforms, states):
            updates, s = t.update(updates, s, params)
            out.append(s)
        return updates, tuple(out)
    return Transform(init, update)


def clip_by_global_norm_tx(max_norm: float | None, norms: Norms = LOCAL) -> Transform:
    """Scale the updates by ``max_norm / G`` when their global norm ``G`` exceeds it (None: never)."""
    if max_norm is None:
        return _stateless(lambda u, params: u)

    def clip(u, params):
        g = norms.global_norm(u)
        return [x / (g / max_norm) for x in u] if g > max_norm else list(u)
    return _stateless(clip)


def scale_by_adam(beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                  bias_correction: bool = True) -> Transform:
    """Adam's direction ``m_hat / (sqrt(v_hat) + eps)`` (eps outside the root, as BERT's), its
    state an :class:`AdamState` counting applied steps."""
    def update(g, state: AdamState, params):
        t = state.step + 1
        c1 = 1.0 - beta1 ** t if bias_correction else 1.0
        c2 = 1.0 - beta2 ** t if bias_correction else 1.0
        m = [beta1 * m + (1.0 - beta1) * x for m, x in zip(state.m, g)]
        v = [beta2 * v + (1.0 - beta2) * x * x for v, x in zip(state.v, g)]
        u = [(a / c1) / (np.sqrt(b / c2) + eps) for a, b in zip(m, v)]
        return u, AdamState(t, tuple(m), tuple(v))
    return Transform(adam_init, update)


def add_decayed_weights(weight_decay: float, mask: Sequence[bool]) -> Transform:
    """``u + wd w`` where ``mask`` is True (decoupled weight decay)."""
    return _stateless(lambda u, params: [x + weight_decay * w if d and weight_decay else x
                                         for x, w, d in zip(u, params, mask)])


@dataclass(frozen=True)
class TrustRatios:
    """The trust ratios a step applied, one per tensor (1.0 where not adapted)."""

    ratios: tuple[float, ...] = ()


def scale_by_trust_ratio(mask: Sequence[bool], norms: Norms = LOCAL) -> Transform:
    """LAMB's layer adaptation: ``u * ||w|| / ||u||`` where ``mask`` is True (1 on a zero norm);
    the state after an update holds the ratios."""
    def update(u, state, params):
        wn, un = norms.of(params, u)
        ratios = [lamb_trust_ratio(a_, b_) if a else 1.0 for a_, b_, a in zip(wn, un, mask)]
        return [r * x for r, x in zip(ratios, u)], TrustRatios(tuple(ratios))
    return Transform(lambda params: TrustRatios(), update)


def scale_by_lars(eta: float, weight_decay: float, eps: float, mask: Sequence[bool],
                  norms: Norms = LOCAL) -> Transform:
    """LARS in the MLPerf form: ``eta ||w|| / (||g|| + wd ||w|| + eps) * (g + wd w)`` where
    ``mask`` is True (the ratio from the raw gradient), ``g`` elsewhere; the ratios as state."""
    def update(g, state, params):
        wn, gn = norms.of(params, g)
        ratios = [lars_trust_ratio(a_, b_, eta, weight_decay, eps) if a else 1.0
                  for a_, b_, a in zip(wn, gn, mask)]
        u = [r * (x + weight_decay * w) if a else x for r, x, w, a in zip(ratios, g, params, mask)]
        return u, TrustRatios(tuple(ratios))
    return Transform(lambda params: TrustRatios(), update)


def trace(momentum: float, nesterov: bool = False) -> Transform:
    """Momentum: ``v = mu v + u``, giving ``v`` (Nesterov: ``u + mu v``); the state a
    :class:`MomentumState`."""
    def update(u, state: MomentumState, params):
        v = [momentum * b + x for b, x in zip(state.v, u)]
        out = [x + momentum * b for x, b in zip(u, v)] if nesterov else v
        return out, MomentumState(state.step + 1, tuple(v))
    return Transform(momentum_init, update)


def scale_by_lion(beta1: float = 0.9, beta2: float = 0.99) -> Transform:
    """Lion's direction ``sign(b1 m + (1 - b1) g)``, then ``m = b2 m + (1 - b2) g``; the state a
    :class:`MomentumState` (its ``v`` is Lion's m)."""
    def update(g, state: MomentumState, params):
        u = [np.sign(beta1 * m + (1.0 - beta1) * x) for m, x in zip(state.v, g)]
        m = [beta2 * m + (1.0 - beta2) * x for m, x in zip(state.v, g)]
        return u, MomentumState(state.step + 1, tuple(m))
    return Transform(momentum_init, update)


def scale(factor: float) -> Transform:
    """``factor * u`` (``scale(-lr)``: a descent step of the learning rate)."""
    return _stateless(lambda u, params: [factor * x for x in u])


def apply_updates(params: Sequence[np.ndarray], updates: Sequence[np.ndarray]) -> Arrays:
    return [w + u for w, u in zip(params, updates)]


def _run(tx: Transform, params, grads, states) -> tuple[Arrays, tuple]:
    updates, states = tx.update(grads, states, params)
    return apply_updates(params, updates), states


# ---------------------------------------------------------------------- the optimizers
def _unadapted_step(params, grads, state, decay_mask, norms: Norms, build) -> tuple:
    """A step without trust ratios: ``build(decay mask)`` gives the chain and the place of the
    optimizer's state among its transforms' (the others stateless)."""
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, *[getattr(state, f.name) for f in fields(state) if f.name != "step"])
    decay, _ = _masks(len(params), decay_mask, None)
    tx, at = build(decay)
    states = tuple(state if i == at else None for i in range(3))
    new_w, out = _run(tx, params, grads, states)
    return new_w, out[at], StepInfo((1.0,) * len(params), norms.global_norm(grads))


def lamb_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
              lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
              weight_decay: float = 0.0, bias_correction: bool = True,
              decay_mask: Sequence[bool] | None = None, adapt_mask: Sequence[bool] | None = None,
              max_grad_norm: float | None = None, norms: Norms = LOCAL) -> tuple[Arrays, AdamState, StepInfo]:
    """One LAMB update (You et al., Algorithm 2; REFERENCE section 1).

    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; r = m_hat / (sqrt(v_hat) + eps);
    u = r + wd w; w -= lr * ratio * u with ratio = ||w|| / ||u|| (1 on a zero norm).
    ``max_grad_norm`` first clips the global gradient norm (NVLAMB); ``None`` skips it.
    """
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.m, state.v)
    decay, adapt = _masks(len(params), decay_mask, adapt_mask)
    tx = chain(clip_by_global_norm_tx(max_grad_norm, norms),
               scale_by_adam(beta1, beta2, eps, bias_correction),
               add_decayed_weights(weight_decay, decay), scale_by_trust_ratio(adapt, norms), scale(-lr))
    new_w, (_, adam, _, trust, _) = _run(tx, params, grads, (None, state, None, TrustRatios(), None))
    return new_w, adam, StepInfo(trust.ratios, norms.global_norm(grads))


def nvlamb_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                weight_decay: float = 0.01, max_grad_norm: float = 1.0,
                decay_mask: Sequence[bool] | None = None, use_nvlamb: bool = False, norms: Norms = LOCAL,
                ) -> tuple[Arrays, AdamState, StepInfo]:
    """NVLAMB (apex FusedLAMB): clip the global gradient norm to ``max_grad_norm``, then LAMB
    with bias correction. The trust ratio is skipped for tensors without weight decay
    (apex's default) unless ``use_nvlamb=True``, which applies it to every tensor."""
    n = len(params)
    decay = [True] * n if decay_mask is None else list(decay_mask)
    adapt = [True] * n if use_nvlamb else [d and weight_decay != 0.0 for d in decay]
    return lamb_step(params, grads, state, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay, bias_correction=True, decay_mask=decay,
                     adapt_mask=adapt, max_grad_norm=max_grad_norm, norms=norms)


def lars_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: MomentumState, *,
              lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 1e-3,
              eps: float = 0.0, adapt_mask: Sequence[bool] | None = None, norms: Norms = LOCAL,
              ) -> tuple[Arrays, MomentumState, StepInfo]:
    """One LARS update (You, Gitman, Ginsburg 2017, in the MLPerf form).

    trust = eta ||w|| / (||g|| + wd ||w|| + eps); v = mu v + lr trust (g + wd w); w -= v.
    Tensors with ``adapt_mask[i] == False`` (bias, normalisation) get neither trust ratio nor
    weight decay: v = mu v + lr g.
    """
    params, grads = _as_arrays(params), _as_arrays(grads)
    _check_lengths(params, grads, state.v)
    _, adapt = _masks(len(params), None, adapt_mask)
    tx = chain(scale_by_lars(eta, weight_decay, eps, adapt, norms), scale(lr), trace(momentum), scale(-1.0))
    new_w, (trust, _, mom, _) = _run(tx, params, grads, (TrustRatios(), None, state, None))
    return new_w, mom, StepInfo(trust.ratios, norms.global_norm(grads))


def sgd_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: MomentumState, *,
             lr: float, momentum: float = 0.9, weight_decay: float = 0.0, nesterov: bool = False,
             decay_mask: Sequence[bool] | None = None, norms: Norms = LOCAL,
             ) -> tuple[Arrays, MomentumState, StepInfo]:
    """SGD with momentum in PyTorch's form: d = g + wd w; v = mu v + d; w -= lr v
    (Nesterov: w -= lr (d + mu v)). PyTorch starts the buffer at the first d; v0 = 0 is the same."""
    return _unadapted_step(params, grads, state, decay_mask, norms, lambda decay: (
        chain(add_decayed_weights(weight_decay, decay), trace(momentum, nesterov), scale(-lr)), 1))


def adamw_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: AdamState, *,
               lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0, decay_mask: Sequence[bool] | None = None, norms: Norms = LOCAL,
               ) -> tuple[Arrays, AdamState, StepInfo]:
    """AdamW (Loshchilov & Hutter, decoupled weight decay): w -= lr (m_hat / (sqrt(v_hat) + eps) + wd w)."""
    return _unadapted_step(params, grads, state, decay_mask, norms, lambda decay: (
        chain(scale_by_adam(beta1, beta2, eps), add_decayed_weights(weight_decay, decay), scale(-lr)), 0))


def lion_step(params: Sequence[np.ndarray], grads: Sequence[np.ndarray], state: MomentumState, *,
              lr: float, beta1: float = 0.9, beta2: float = 0.99, weight_decay: float = 0.0,
              decay_mask: Sequence[bool] | None = None, norms: Norms = LOCAL,
              ) -> tuple[Arrays, MomentumState, StepInfo]:
    """Lion (Chen et al. 2023, Algorithm 2): w -= lr (sign(b1 m + (1 - b1) g) + wd w);
    m = b2 m + (1 - b2) g. Every element moves by lr (plus the decay): no norms."""
    return _unadapted_step(params, grads, state, decay_mask, norms, lambda decay: (
        chain(scale_by_lion(beta1, beta2), add_decayed_weights(weight_decay, decay), scale(-lr)), 0))


# name -> (state initialiser, step function); the frontends use the same names.
OPTIMIZERS = {
    "sgd": (momentum_init, sgd_step),
    "adamw": (adam_init, adamw_step),
    "lamb": (adam_init, lamb_step),
    "nvlamb": (adam_init, nvlamb_step),
    "lars": (momentum_init, lars_step),
    "lion": (momentum_init, lion_step),
}


def _lookup(name: str):
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}") from None


def init_state(name: str, params: Sequence[np.ndarray]):
    """The zero state of optimizer ``name`` for ``params``."""
    return _lookup(name)[0](params)


def state_buffers(name: str) -> int:
    """How many parameter-sized buffers optimizer ``name`` keeps (moments, momentum)."""
    state = init_state(name, [np.zeros(1)])
    return sum(1 for v in vars(state).values() if isinstance(v, tuple))


def apply_step(name: str, params, grads, state, **hparams):
    """One step of optimizer ``name``: ``(params, state, info)``."""
    return _lookup(name)[1](params, grads, state, **hparams)

