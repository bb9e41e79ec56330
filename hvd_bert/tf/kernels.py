"""Fused bias + GELU for TensorFlow: XLA (``jit_compile=True``) fuses the add and the GELU
(forward and backward) into one loop over memory. ``approximate="tanh"`` is BERT's tanh form,
``"none"`` the exact erf form (PyTorch's names, as in ``hvd_bert.pt.kernels.gelu``).
``HVD_BERT_COMPILE=0`` (or empty) uses the eager composition."""

from __future__ import annotations

import math

import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.core.kernels import GELU_FORMS, check_gelu_form, compile_enabled

__all__ = ["bias_gelu", "bias_gelu_eager", "DenseGELU"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def bias_gelu_eager(x, bias, approximate: str = "tanh"):
    y = x + tf.cast(bias, x.dtype)
    if check_gelu_form(approximate) == "tanh":
        c = tf.cast(_SQRT_2_OVER_PI, y.dtype)
        return 0.5 * y * (1.0 + tf.tanh(c * (y + tf.cast(0.044715, y.dtype) * y * y * y)))
    return 0.5 * y * (1.0 + tf.math.erf(y * tf.cast(1.0 / math.sqrt(2.0), y.dtype)))


_fused = {form: tf.function(lambda x, b, f=form: bias_gelu_eager(x, b, f), jit_compile=True)
          for form in GELU_FORMS}


def bias_gelu(x, bias, approximate: str = "tanh"):
    """``gelu(x + bias)`` as one XLA-fused kernel."""
    if not compile_enabled():
        return bias_gelu_eager(x, bias, approximate)
    return _fused[check_gelu_form(approximate)](x, bias)


class DenseGELU(tf.keras.layers.Layer):
    """``gelu(x W + b)`` with the bias add fused into the GELU (BERT's intermediate layer);
    variables named like ``Dense``'s (``kernel``, ``bias``)."""

    def __init__(self, units: int, approximate: str = "tanh", kernel_initializer="glorot_uniform", **kw):
        super().__init__(**kw)
        self.units, self.approximate = units, approximate
        self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        self.kernel = self.add_weight("kernel", shape=(int(input_shape[-1]), self.units),
                                      initializer=self.kernel_initializer)
        self.bias = self.add_weight("bias", shape=(self.units,), initializer="zeros")
        super().build(input_shape)

    def call(self, x):
        y = tf.matmul(x, tf.cast(self.kernel, x.dtype))
        return bias_gelu(y, tf.cast(self.bias, y.dtype), self.approximate)

    def get_config(self):
        return dict(super().get_config(), units=self.units, approximate=self.approximate,
                    kernel_initializer=tf.keras.initializers.serialize(self.kernel_initializer))
