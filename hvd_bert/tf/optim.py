"""LAMB, NVLAMB and LARS as tf-keras optimizers (the Keras 2 API of ``TF_USE_LEGACY_KERAS=1``).

They implement :mod:`hvd_bert.core.optim` (the reference they are tested against) and
work alone, under ``hvd.DistributedOptimizer`` (model.fit) and under Keras'
``LossScaleOptimizer``. Exclusions are regular expressions over variable names
(``re.search``; BERT: ``bias``, ``LayerNorm``, ``layer_norm``):

    ``exclude_from_weight_decay``       no weight decay for matching variables
    ``exclude_from_layer_adaptation``   no trust ratio for matching variables

Defaults follow ``hvd_bert.core.optim``: LAMB applies the trust ratio to every variable (as
optax; tfa's LAMB instead falls back to the weight-decay exclusions), NVLAMB skips it where
there is no weight decay (apex) unless ``use_nvlamb=True``, LARS gives excluded variables
neither trust ratio nor weight decay.

Each optimizer's rule is written once, as ``update(w, g, state, pieces, t, lr, complete)``: a
pure function of flat tensors that are one whole variable (``update_step``, the plain step) or
the pieces of many that a ZeRO shard holds (:class:`Pieces` says which element belongs to
which variable), with the whole variables' norms completed by ``complete`` (ZeRO: an allreduce
over the ranks; the plain step: nothing to add), the way DeepSpeed's stages hand their
partition to the wrapped optimizer.

The base class's own ``weight_decay`` (applied before the update, outside the trust ratio)
stays off: LAMB's decay is part of the update. NVLAMB's global-norm clip is the base class's
``global_clipnorm``, applied inside ``apply_gradients``: after Horovod's allreduce and after
``LossScaleOptimizer`` unscales, as NVLAMB requires.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.config import OptimConfig
from hvd_bert.tf import check_keras

check_keras()
keras = tf.keras

__all__ = ["Lamb", "NVLamb", "AdamW", "Lars", "SGD", "Lion", "Pieces", "build_optimizer"]


def _matches(name: str, patterns: Sequence[str] | None) -> bool:
    return bool(patterns) and any(re.search(p, name) for p in patterns)


def _c(value, dtype):
    """A Python number as a tensor of ``dtype`` (``tf.cast`` would round it through float32)."""
    return tf.constant(value, dtype=dtype)


def _dense(gradient):
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


def _trust_ratio(w_norm, u_norm):
    """||w|| / ||u||, 1 where either is zero."""
    ok = tf.logical_and(w_norm > 0, u_norm > 0)
    return tf.where(ok, w_norm / tf.where(ok, u_norm, tf.ones_like(u_norm)), tf.ones_like(w_norm))


@dataclass
class Pieces:
    """Which variable each element of an update's flat tensors belongs to (``seg``; None: one
    whole variable) among ``count``, and each variable's weight decay and trust ratio flags."""

    decays: Sequence[bool]
    adapts: Sequence[bool]
    seg: tf.Tensor | None = None

    @property
    def count(self) -> int:
        return len(self.decays)

    def sums(self, x):
        """Per variable, the sum of squares of its elements here."""
        if self.seg is None:
            return tf.reshape(tf.reduce_sum(x * x), [1])
        return tf.math.unsorted_segment_sum(x * x, self.seg, self.count)

    def spread(self, per_variable, dtype):
        """A per-variable value on each element (a scalar for one whole variable)."""
        values = tf.cast(per_variable, dtype)
        return values[0] if self.seg is None else tf.gather(values, self.seg)

    def norms(self, rows: list, complete: Callable | None):
        """The whole variables' norms from these elements' sums of squares (``complete``: the sum
        over the ranks holding pieces of them, a ``[rows, count]`` tensor in and out)."""
        sq = tf.stack([self.sums(x) for x in rows])
        return tf.sqrt(sq if complete is None else complete(sq))


class _HvdBertOptimizer(keras.optimizers.Optimizer):
    """Shared plumbing: our weight decay replaces the base class's, serialisable config."""

    def __init__(self, name, learning_rate, weight_decay, exclude_from_weight_decay,
                 exclude_from_layer_adaptation, max_grad_norm=None, jit_compile=False, **kwargs):
        kwargs.pop("global_clipnorm", None)  # from a config: max_grad_norm carries it
        kwargs.pop("is_legacy_optimizer", None)
        super().__init__(name=name, weight_decay=None, global_clipnorm=max_grad_norm,
                         jit_compile=jit_compile, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.decay_rate = float(weight_decay)  # `weight_decay` is the base class's (kept None)
        self.exclude_from_weight_decay_patterns = list(exclude_from_weight_decay or [])
        self.exclude_from_layer_adaptation_patterns = (
            None if exclude_from_layer_adaptation is None else list(exclude_from_layer_adaptation))
        self.max_grad_norm = max_grad_norm

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_applied_built", False):
            return
        self._applied_built = True
        # Updates applied. Not `iterations`: Horovod's gradient aggregation advances
        # `iterations` on every micro-batch, which would shift LAMB's bias correction.
        self._applied = self.add_variable((), dtype=tf.int64, name="applied_steps")

    @property
    def applied_steps(self):
        return self._applied

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        result = super().apply_gradients(grads_and_vars, *args, **kwargs)
        self._applied.assign_add(1)
        return result

    def decays(self, variable) -> bool:
        """Whether ``variable`` gets weight decay."""
        return self.decay_rate != 0.0 and not _matches(variable.name, self.exclude_from_weight_decay_patterns)

    def adapts(self, variable) -> bool:
        """Whether ``variable`` gets the layer-wise trust ratio."""
        return not _matches(variable.name, self.exclude_from_layer_adaptation_patterns)

    def slots(self, name: str) -> list:
        """The optimizer's state variables ``name`` (one of ``buffers``), one per variable."""
        return self._slots[name]

    def update_step(self, gradient, variable):
        """The plain step: the rule on one whole variable with its own norms."""
        dtype = variable.dtype
        i = self._index_dict[self._var_key(variable)]
        state = {n: self._slots[n][i] for n in self.buffers}
        w, new = self.update(variable, tf.cast(_dense(gradient), dtype), state,
                             Pieces([self.decays(variable)], [self.adapts(variable)]),
                             self._applied + 1, self.learning_rate)
        for n, value in new.items():
            state[n].assign(value)
        variable.assign(w)

    def get_config(self):
        config = super().get_config()
        config.pop("global_clipnorm", None)
        config.update(learning_rate=self._serialize_hyperparameter(self._learning_rate),
                      weight_decay=self.decay_rate,
                      exclude_from_weight_decay=self.exclude_from_weight_decay_patterns,
                      exclude_from_layer_adaptation=self.exclude_from_layer_adaptation_patterns,
                      max_grad_norm=self.max_grad_norm)
        return config


class _MomentumOptimizer(_HvdBertOptimizer):
    """One momentum buffer per variable (SGD, LARS, Lion); ``DROPPED``: the base settings the
    optimizer does not have, ``own_config()``: those it adds."""

    buffers = ("momentum",)
    DROPPED = ("exclude_from_layer_adaptation", "max_grad_norm")

    def own_config(self) -> dict:
        return {}

    def get_config(self):
        config = super().get_config()
        for k in self.DROPPED:
            config.pop(k, None)
        config.update(self.own_config())
        return config

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._slots = {"momentum": [self.add_variable_from_reference(v, "momentum") for v in var_list]}


@keras.utils.register_keras_serializable(package="hvd_bert")
class Lamb(_HvdBertOptimizer):
    """LAMB (You et al. 2019, arXiv:1904.00962, Alg. 2), as ``hvd_bert.core.optim.lamb_step``.

    ``max_grad_norm`` clips the global gradient norm first (NVLAMB); ``None`` does not.
    """

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay=0.0, bias_correction=True, exclude_from_weight_decay=None,
                 exclude_from_layer_adaptation=None, max_grad_norm=None, name="Lamb", **kwargs):
        super().__init__(name, learning_rate, weight_decay, exclude_from_weight_decay,
                         exclude_from_layer_adaptation, max_grad_norm, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.bias_correction = bias_correction

    buffers = ("m", "v")

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._slots = {n: [self.add_variable_from_reference(v, n) for v in var_list] for n in self.buffers}

    def update(self, w, g, state: dict, pieces: Pieces, t, lr, complete=None):
        """LAMB's rule: the moments, u = m_hat / (sqrt(v_hat) + eps) + wd w, and w - lr ratio u
        with ratio = ||w|| / ||u|| of each whole variable (1 on a zero norm). ``(w, state)``."""
        dtype = w.dtype
        b1, b2 = _c(self.beta_1, dtype), _c(self.beta_2, dtype)
        m = b1 * state["m"] + (1.0 - b1) * g
        v = b2 * state["v"] + (1.0 - b2) * g * g
        m_hat, v_hat = m, v
        if self.bias_correction:
            t = tf.cast(t, dtype)
            m_hat, v_hat = m / (1.0 - tf.pow(b1, t)), v / (1.0 - tf.pow(b2, t))
        u = m_hat / (tf.sqrt(v_hat) + _c(self.epsilon, dtype))
        if any(pieces.decays):
            u = u + _c(self.decay_rate, dtype) * pieces.spread(pieces.decays, dtype) * w
        if any(pieces.adapts):
            norm = tf.cast(pieces.norms([w, u], complete), dtype)
            ratio = tf.where(tf.constant(list(pieces.adapts)), _trust_ratio(norm[0], norm[1]), 1.0)
            u = u * pieces.spread(ratio, dtype)
        return w - tf.cast(lr, dtype) * u, {"m": m, "v": v}

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                      bias_correction=self.bias_correction)
        return config


@keras.utils.register_keras_serializable(package="hvd_bert")
class NVLamb(Lamb):
    """NVLAMB (apex FusedLAMB): clip the global gradient norm to ``max_grad_norm`` (default
    1.0), then LAMB with bias correction; no trust ratio for variables without weight decay
    unless ``use_nvlamb=True``. As ``hvd_bert.core.optim.nvlamb_step``."""

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay=0.01, exclude_from_weight_decay=None, max_grad_norm=1.0,
                 use_nvlamb=False, name="NVLamb", **kwargs):
        kwargs.pop("bias_correction", None)
        kwargs.pop("exclude_from_layer_adaptation", None)
        super().__init__(learning_rate, beta_1, beta_2, epsilon, weight_decay, True,
                         exclude_from_weight_decay, None, max_grad_norm, name=name, **kwargs)
        self.use_nvlamb = use_nvlamb

    def adapts(self, variable) -> bool:
        return self.use_nvlamb or self.decays(variable)

    def get_config(self):
        config = super().get_config()
        config.pop("bias_correction", None)
        config.pop("exclude_from_layer_adaptation", None)
        config["use_nvlamb"] = self.use_nvlamb
        return config


@keras.utils.register_keras_serializable(package="hvd_bert")
class AdamW(Lamb):
    """AdamW (decoupled weight decay) as ``hvd_bert.core.optim.adamw_step``:
    w -= lr (m_hat / (sqrt(v_hat) + eps) + wd w). Keras' own AdamW puts epsilon inside the
    bias-corrected step size instead, so its updates differ from PyTorch's and the core's."""

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8, weight_decay=0.0,
                 exclude_from_weight_decay=None, name="AdamW", **kwargs):
        kwargs.pop("bias_correction", None)
        kwargs.pop("exclude_from_layer_adaptation", None)
        kwargs.pop("max_grad_norm", None)
        super().__init__(learning_rate, beta_1, beta_2, epsilon, weight_decay, True,
                         exclude_from_weight_decay, None, None, name=name, **kwargs)

    def adapts(self, variable) -> bool:
        return False  # no trust ratio: plain Adam steps

    def get_config(self):
        config = super().get_config()
        for k in ("bias_correction", "exclude_from_layer_adaptation", "max_grad_norm"):
            config.pop(k, None)
        return config


@keras.utils.register_keras_serializable(package="hvd_bert")
class Lars(_MomentumOptimizer):
    """LARS (MLPerf form), as ``hvd_bert.core.optim.lars_step``:
    trust = eta ||w|| / (||g|| + wd ||w|| + eps); v = mu v + lr trust (g + wd w); w -= v.
    Variables matching ``exclude`` get neither trust ratio nor weight decay."""

    def __init__(self, learning_rate=1.0, momentum=0.9, weight_decay=0.0, eta=1e-3, epsilon=0.0,
                 exclude=None, name="Lars", **kwargs):
        kwargs.pop("exclude_from_weight_decay", None)
        kwargs.pop("exclude_from_layer_adaptation", None)
        kwargs.pop("max_grad_norm", None)
        super().__init__(name, learning_rate, weight_decay, exclude, exclude, None, **kwargs)
        self.momentum, self.eta, self.epsilon = momentum, eta, epsilon

    def update(self, w, g, state: dict, pieces: Pieces, t, lr, complete=None):
        """LARS's rule: trust = eta ||w|| / (||g|| + wd ||w|| + eps) of each whole variable;
        v = mu v + lr trust (g + wd w) (excluded variables: mu v + lr g); w - v. ``(w, state)``."""
        dtype = w.dtype
        lr, mu, wd = tf.cast(lr, dtype), _c(self.momentum, dtype), _c(self.decay_rate, dtype)
        d = g
        if any(pieces.adapts):
            wn, gn = tf.unstack(tf.cast(pieces.norms([w, g], complete), dtype))
            ok = tf.logical_and(tf.constant(list(pieces.adapts)), tf.logical_and(wn > 0, gn > 0))
            denom = gn + wd * wn + _c(self.epsilon, dtype)
            trust = tf.where(ok, _c(self.eta, dtype) * wn / tf.where(ok, denom, 1.0), 1.0)
            on = pieces.spread(pieces.adapts, dtype) > 0
            d = tf.where(on, pieces.spread(trust, dtype) * (g + wd * w), g)
        buf = mu * state["momentum"] + lr * d
        return w - buf, {"momentum": buf}

    DROPPED = ("exclude_from_weight_decay", "exclude_from_layer_adaptation", "max_grad_norm")

    def own_config(self) -> dict:
        return dict(momentum=self.momentum, eta=self.eta, epsilon=self.epsilon,
                    exclude=self.exclude_from_weight_decay_patterns)


@keras.utils.register_keras_serializable(package="hvd_bert")
class SGD(_MomentumOptimizer):
    """SGD with momentum in PyTorch's form, as ``hvd_bert.core.optim.sgd_step``:
    d = g + wd w; v = mu v + d; w -= lr v (Nesterov: w -= lr (d + mu v)). Keras' own SGD keeps
    ``mu m - lr g`` instead, which differs from this as soon as the learning rate changes."""

    def __init__(self, learning_rate=0.01, momentum=0.9, weight_decay=0.0, nesterov=False,
                 exclude_from_weight_decay=None, name="SGD", **kwargs):
        kwargs.pop("exclude_from_layer_adaptation", None)
        kwargs.pop("max_grad_norm", None)
        super().__init__(name, learning_rate, weight_decay, exclude_from_weight_decay, None, None,
                         **kwargs)
        self.momentum, self.nesterov = momentum, nesterov

    def update(self, w, g, state: dict, pieces: Pieces, t, lr, complete=None):
        """SGD's rule: d = g + wd w; v = mu v + d; w - lr v (Nesterov: w - lr (d + mu v))."""
        dtype = w.dtype
        d = g
        if any(pieces.decays):
            d = d + _c(self.decay_rate, dtype) * pieces.spread(pieces.decays, dtype) * w
        mu = _c(self.momentum, dtype)
        buf = mu * state["momentum"] + d
        step = d + mu * buf if self.nesterov else buf
        return w - tf.cast(lr, dtype) * step, {"momentum": buf}

    def own_config(self) -> dict:
        return dict(momentum=self.momentum, nesterov=self.nesterov)


@keras.utils.register_keras_serializable(package="hvd_bert")
class Lion(_MomentumOptimizer):
    """Lion (Chen et al. 2023, arXiv:2302.06675), as ``hvd_bert.core.optim.lion_step``:
    w -= lr (sign(b1 m + (1 - b1) g) + wd w); m = b2 m + (1 - b2) g (m: the ``momentum`` slot)."""

    def __init__(self, learning_rate=1e-4, beta_1=0.9, beta_2=0.99, weight_decay=0.0,
                 exclude_from_weight_decay=None, name="Lion", **kwargs):
        kwargs.pop("exclude_from_layer_adaptation", None)
        kwargs.pop("max_grad_norm", None)
        super().__init__(name, learning_rate, weight_decay, exclude_from_weight_decay, None, None, **kwargs)
        self.beta_1, self.beta_2 = beta_1, beta_2

    def update(self, w, g, state: dict, pieces: Pieces, t, lr, complete=None):
        dtype = w.dtype
        b1, b2, m = _c(self.beta_1, dtype), _c(self.beta_2, dtype), state["momentum"]
        u = tf.sign(b1 * m + (1.0 - b1) * g)
        if any(pieces.decays):
            u = u + _c(self.decay_rate, dtype) * pieces.spread(pieces.decays, dtype) * w
        return w - tf.cast(lr, dtype) * u, {"momentum": b2 * m + (1.0 - b2) * g}

    def own_config(self) -> dict:
        return dict(beta_1=self.beta_1, beta_2=self.beta_2)


def build_optimizer(cfg: OptimConfig, lr: float | None = None) -> keras.optimizers.Optimizer:
    """The optimizer ``cfg.name`` with ``cfg``'s hyperparameters and name-based exclusions."""
    lr = cfg.lr if lr is None else lr
    exclude = list(cfg.effective_exclude)
    if cfg.name == "lamb":
        on_excluded = True if cfg.trust_ratio_on_excluded is None else cfg.trust_ratio_on_excluded
        return Lamb(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.bias_correction,
                    exclude_from_weight_decay=exclude,
                    exclude_from_layer_adaptation=None if on_excluded else exclude,
                    max_grad_norm=cfg.max_grad_norm)
    if cfg.name == "nvlamb":
        return NVLamb(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, exclude,
                      max_grad_norm=cfg.effective_max_grad_norm,
                      use_nvlamb=bool(cfg.trust_ratio_on_excluded))
    if cfg.name == "lars":
        return Lars(lr, cfg.momentum, cfg.weight_decay, cfg.eta, cfg.eps, exclude=exclude)
    if cfg.name == "sgd":
        return SGD(lr, cfg.momentum, cfg.weight_decay, cfg.nesterov, exclude_from_weight_decay=exclude)
    if cfg.name == "lion":
        return Lion(lr, cfg.beta1, cfg.beta2, cfg.weight_decay, exclude_from_weight_decay=exclude)
    if cfg.name == "adamw":
        return AdamW(lr, beta_1=cfg.beta1, beta_2=cfg.beta2, epsilon=cfg.eps, weight_decay=cfg.weight_decay,
                     exclude_from_weight_decay=exclude)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
