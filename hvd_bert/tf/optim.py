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

The base class's own ``weight_decay`` (applied before the update, outside the trust ratio)
stays off: LAMB's decay is part of the update. NVLAMB's global-norm clip is the base class's
``global_clipnorm``, applied inside ``apply_gradients``: after Horovod's allreduce and after
``LossScaleOptimizer`` unscales, as NVLAMB requires.
"""

from __future__ import annotations

import re
from typing import Sequence

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.config import OptimConfig
from hvd_bert.tf import check_keras

check_keras()
keras = tf.keras

__all__ = ["Lamb", "NVLamb", "AdamW", "Lars", "SGD", "build_optimizer"]


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

    def _decays(self, variable) -> bool:
        return self.decay_rate != 0.0 and not _matches(variable.name, self.exclude_from_weight_decay_patterns)

    def _adapts(self, variable) -> bool:
        return not _matches(variable.name, self.exclude_from_layer_adaptation_patterns)

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
    """One momentum buffer per variable (SGD, LARS)."""

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._buf = [self.add_variable_from_reference(v, "momentum") for v in var_list]


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

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        g = tf.cast(_dense(gradient), dtype)
        lr = tf.cast(self.learning_rate, dtype)
        b1, b2 = _c(self.beta_1, dtype), _c(self.beta_2, dtype)
        i = self._index_dict[self._var_key(variable)]
        m, v = self._m[i], self._v[i]
        m.assign(b1 * m + (1.0 - b1) * g)
        v.assign(b2 * v + (1.0 - b2) * g * g)
        m_hat, v_hat = m, v
        if self.bias_correction:
            t = tf.cast(self._applied + 1, dtype)
            m_hat = m / (1.0 - tf.pow(b1, t))
            v_hat = v / (1.0 - tf.pow(b2, t))
        u = m_hat / (tf.sqrt(v_hat) + _c(self.epsilon, dtype))
        if self._decays(variable):
            u = u + _c(self.decay_rate, dtype) * variable
        if self._adapts(variable):
            u = u * _trust_ratio(tf.norm(variable), tf.norm(u))
        variable.assign_sub(lr * u)

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

    def _adapts(self, variable) -> bool:
        return self.use_nvlamb or self._decays(variable)

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

    def _adapts(self, variable) -> bool:
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

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        g = tf.cast(_dense(gradient), dtype)
        lr = tf.cast(self.learning_rate, dtype)
        mu = _c(self.momentum, dtype)
        buf = self._buf[self._index_dict[self._var_key(variable)]]
        if self._adapts(variable):
            wd = _c(self.decay_rate, dtype)
            w_norm, g_norm = tf.norm(variable), tf.norm(g)
            ok = tf.logical_and(w_norm > 0, g_norm > 0)
            denom = g_norm + wd * w_norm + _c(self.epsilon, dtype)
            trust = tf.where(ok, _c(self.eta, dtype) * w_norm / tf.where(ok, denom, 1.0), 1.0)
            buf.assign(mu * buf + lr * trust * (g + wd * variable))
        else:
            buf.assign(mu * buf + lr * g)
        variable.assign_sub(buf)

    def get_config(self):
        config = super().get_config()
        for k in ("exclude_from_weight_decay", "exclude_from_layer_adaptation", "max_grad_norm"):
            config.pop(k, None)
        config.update(momentum=self.momentum, eta=self.eta, epsilon=self.epsilon,
                      exclude=self.exclude_from_weight_decay_patterns)
        return config


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

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        d = tf.cast(_dense(gradient), dtype)
        if self._decays(variable):
            d = d + _c(self.decay_rate, dtype) * variable
        mu = _c(self.momentum, dtype)
        buf = self._buf[self._index_dict[self._var_key(variable)]]
        buf.assign(mu * buf + d)
        step = d + mu * buf if self.nesterov else buf
        variable.assign_sub(tf.cast(self.learning_rate, dtype) * step)

    def get_config(self):
        config = super().get_config()
        for k in ("exclude_from_layer_adaptation", "max_grad_norm"):
            config.pop(k, None)
        config.update(momentum=self.momentum, nesterov=self.nesterov)
        return config


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
    if cfg.name == "adamw":
        return AdamW(lr, beta_1=cfg.beta1, beta_2=cfg.beta2, epsilon=cfg.eps, weight_decay=cfg.weight_decay,
                     exclude_from_weight_decay=exclude)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
