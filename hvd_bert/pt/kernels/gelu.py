"""Fused kernels: bias + GELU as one C loop on a CPU, through ``torch.compile`` elsewhere, with
an eager fallback.

BERT's intermediate layer computes ``gelu(x W^T + b)``. Unfused, that reads and writes the
activation several times (the add, then each elementwise op of GELU); fused, the add and the
GELU (forward and backward, the bias gradient's column sum with it) become one loop over
memory. Both GELU forms are supported: ``"tanh"`` (BERT's original approximation) and
``"none"`` (the exact erf form).

On a CPU, fp32, the loop is C (built like the fused optimizer kernels,
:mod:`hvd_bert.pt.kernels.build`) calling glibc's vector ``tanhf``/``erff``/``expf``: 2x faster
forward and 3x backward than ``torch.compile``'s code, whose ``tanh`` is scalar-speed here.
Other dtypes and devices (bf16 autocast, a GPU) use ``torch.compile``. Set
``HVD_BERT_COMPILE=0`` to use the eager composition for all (same numbers, no build or compile
time). If building or compiling fails (no C compiler, an unsupported platform), the next path
is used with one warning.
"""

from __future__ import annotations

import ctypes
import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from hvd_bert.core.kernels import check_gelu_form, compile_enabled
from hvd_bert.pt.kernels.build import CKernels, threads as _threads

__all__ = ["bias_gelu", "bias_gelu_compiled", "bias_gelu_eager", "c_served", "compile_enabled", "LinearGELU"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def bias_gelu_eager(x: torch.Tensor, bias: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The unfused composition: ``gelu(x + bias)``."""
    y = x + bias
    if approximate == "tanh":
        return 0.5 * y * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)))
    check_gelu_form(approximate)
    return 0.5 * y * (1.0 + torch.erf(y * (1.0 / math.sqrt(2.0))))


_compiled: dict[str, Callable] = {}
_failed = False


def _compiled_fn(approximate: str) -> Callable | None:
    global _failed
    if _failed or not compile_enabled():
        return None
    fn = _compiled.get(approximate)
    if fn is None:
        def f(x, b):
            return bias_gelu_eager(x, b, approximate)
        fn = _compiled[approximate] = torch.compile(f, dynamic=None, fullgraph=True)
    return fn


_C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
/* glibc's libmvec vector variants (x86-64, glibc >= 2.35), as <math.h> declares them under
   -ffast-math; the rest of this file keeps IEEE semantics */
__attribute__((simd("notinbranch"))) float tanhf(float);
__attribute__((simd("notinbranch"))) float erff(float);
__attribute__((simd("notinbranch"))) float expf(float);
#define K0 0.7978845608028654f  /* sqrt(2 / pi) */
#define K1 0.044715f
#define R2 0.7071067811865476f  /* 1 / sqrt(2) */
#define RP 0.3989422804014327f  /* 1 / sqrt(2 pi) */
/* tanh form: y = z (1 + tanh u) / 2, u = K0 (z + K1 z^3); erf form: y = z (1 + erf(z R2)) / 2 */
#define FWD_tanh(z) (0.5f * (z) * (1.0f + tanhf(K0 * ((z) + K1 * (z) * (z) * (z)))))
#define FWD_erf(z) (0.5f * (z) * (1.0f + erff((z) * R2)))
static inline float dgelu_tanh(float z) {
  const float t = tanhf(K0 * (z + K1 * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * K0 * (1.0f + 3.0f * K1 * z * z);
}
static inline float dgelu_erf(float z) {
  return 0.5f * (1.0f + erff(z * R2)) + z * RP * expf(-0.5f * z * z);
}
#define DEFINE(F)                                                                             \
void bias_gelu_##F(const float *x, const float *b, float *y, int64_t rows, int64_t cols,    \
                   int nt) {                                                                \
  _Pragma("omp parallel for num_threads(nt) schedule(static)")                              \
  for (int64_t r = 0; r < rows; r++) {                                                      \
    const float *xr = x + r * cols; float *yr = y + r * cols;                               \
    _Pragma("omp simd")                                                                     \
    for (int64_t c = 0; c < cols; c++) { const float z = xr[c] + b[c]; yr[c] = FWD_##F(z); } \
  }                                                                                         \
}                                                                                           \
/* dx = dy gelu'(x + b); db = the column sums of dx (each thread sums its rows, then adds) */ \
int bias_gelu_bwd_##F(const float *x, const float *b, const float *dy, float *dx, float *db, \
                      int64_t rows, int64_t cols, int nt) {                                 \
  int failed = 0;                                                                           \
  memset(db, 0, (size_t)cols * sizeof(float));                                              \
  _Pragma("omp parallel num_threads(nt)")                                                   \
  {                                                                                         \
    float *acc = calloc((size_t)cols, sizeof(float));                                       \
    _Pragma("omp for schedule(static)")                                                     \
    for (int64_t r = 0; r < rows; r++) {                                                    \
      const float *xr = x + r * cols, *gr = dy + r * cols; float *dr = dx + r * cols;       \
      _Pragma("omp simd")                                                                   \
      for (int64_t c = 0; c < cols; c++) {                                                  \
        const float v = gr[c] * dgelu_##F(xr[c] + b[c]);                                    \
        dr[c] = v;                                                                          \
        if (acc) acc[c] += v;                                                               \
      }                                                                                     \
    }                                                                                       \
    _Pragma("omp critical")                                                                 \
    {                                                                                       \
      if (acc) { for (int64_t c = 0; c < cols; c++) db[c] += acc[c]; } else failed = 1;     \
    }                                                                                       \
    free(acc);                                                                              \
  }                                                                                         \
  return failed;                                                                            \
}
DEFINE(tanh)
DEFINE(erf)
"""


def _declare(lib: ctypes.CDLL) -> None:
    ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for f in ("tanh", "erf"):
        getattr(lib, f"bias_gelu_{f}").argtypes = [ptr] * 3 + [i64, i64, i32]
        getattr(lib, f"bias_gelu_bwd_{f}").argtypes = [ptr] * 5 + [i64, i64, i32]
        getattr(lib, f"bias_gelu_bwd_{f}").restype = i32


_C = CKernels("bias_gelu", _C_SOURCE, _declare, "C bias+GELU kernel", "torch.compile")
_C_FORM = {"tanh": "tanh", "none": "erf"}


def c_served(x: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether the C kernel serves ``gelu(x + bias)``: fp32 CPU tensors, ``bias`` the size of
    ``x``'s last dimension, ``HVD_BERT_COMPILE`` on and the kernel built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and bias.dtype == torch.float32
            and bias.device.type == "cpu" and bias.dim() == 1 and x.dim() >= 1
            and x.shape[-1] == bias.shape[0] and compile_enabled() and _C.library() is not None)


class _CBiasGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, form):
        x, bias = x.contiguous(), bias.contiguous()
        ctx.save_for_backward(x, bias)
        ctx.form = form
        y = torch.empty_like(x)
        cols = bias.shape[0]
        getattr(_C.library(), f"bias_gelu_{form}")(x.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                                   x.numel() // cols, cols, _threads())
        return y

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensors
        grad = grad.contiguous()
        dx, db = torch.empty_like(x), torch.empty_like(bias)
        cols = bias.shape[0]
        if getattr(_C.library(), f"bias_gelu_bwd_{ctx.form}")(x.data_ptr(), bias.data_ptr(), grad.data_ptr(),
                                                              dx.data_ptr(), db.data_ptr(), x.numel() // cols,
                                                              cols, _threads()):
            raise MemoryError("bias+GELU backward: no memory for the bias gradient's row sums")
        return dx, db, None


def bias_gelu_compiled(x: torch.Tensor, bias: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(x + bias)`` through ``torch.compile`` (the eager composition where that fails or
    ``HVD_BERT_COMPILE=0``)."""
    global _failed
    check_gelu_form(approximate)
    fn = _compiled_fn(approximate)
    if fn is not None:
        try:
            return fn(x, bias)
        except Exception as e:  # noqa: BLE001  (compiler missing or unsupported: fall back)
            _failed = True
            warnings.warn(f"hvd_bert: torch.compile of bias+GELU failed ({type(e).__name__}: "
                          f"{str(e)[:200]}); using the eager composition", stacklevel=2)
    return bias_gelu_eager(x, bias, approximate)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(x + bias)`` as one fused kernel (forward and backward): the C loop where it
    serves (:func:`c_served`), else :func:`bias_gelu_compiled`."""
    check_gelu_form(approximate)
    if c_served(x, bias):
        return _CBiasGELU.apply(x, bias, _C_FORM[approximate])
    return bias_gelu_compiled(x, bias, approximate)


class LinearGELU(torch.nn.Module):
    """``gelu(x W^T + b)`` with the bias add fused into the GELU (BERT's intermediate layer).
    Its parameters are named like ``torch.nn.Linear``'s (``weight``, ``bias``)."""

    def __init__(self, in_features: int, out_features: int, approximate: str = "tanh"):
        super().__init__()
        lin = torch.nn.Linear(in_features, out_features)
        self.weight = lin.weight
        self.bias = lin.bias
        self.approximate = approximate

    def fused_bias_activation(self, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """gelu(y + bias), the bias add fused (what a tensor-parallel share of this layer keeps)."""
        return bias_gelu(y, bias, self.approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused_bias_activation(F.linear(x, self.weight), self.bias)
