"""Dropout as one C loop over memory, its mask drawn from a counter-based hash.

``torch.nn.functional.dropout`` on a CPU draws a Bernoulli sample per element from the
generator one at a time: on BERT-Base's activations (8 x 128 x 768) it takes ~5 ms against
~0.1 ms for an add, and BERT has three per layer (two on the hidden states, one on the
attention probabilities), a tenth of a training step (BENCHMARKS.md). Here element ``i`` is
kept when ``hash(i, key) >= p * 2**32`` (two rounds of MurmurHash3's 32-bit finaliser, a
vectorised loop); ``key`` is one draw (62 bits) from PyTorch's generator per call, so the masks
follow ``torch.manual_seed`` and a restored RNG state as before. The mask is never stored: the
backward pass recomputes it from the key (no mask tensor held for backward). ``p`` is used to
2**-32; kept elements are scaled by ``1 / (1 - p)``.

:func:`dropout_add` fuses the residual add that follows BERT's hidden dropout
(``residual + dropout(x)``) into the same loop. Served: contiguous fp32 CPU tensors (another
dtype or device uses PyTorch's dropout); ``HVD_BERT_FAST_DROPOUT=0`` turns it off; the C source
is built like the fused optimizer kernels (:mod:`hvd_bert.pt.kernels.build`).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from hvd_bert.core.kernels import env_flag
from hvd_bert.pt.kernels.build import CKernels, threads as _threads

__all__ = ["dropout", "dropout_add", "enabled", "served"]

_SOURCE = r"""
#include <stdint.h>
static inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16; return h;
}
/* out[i] = (res ? res[i] : 0) + (keep(i) ? x[i] * scale : 0); keep(i): hash(i, key) >= thresh */
void dropout_f32(const float *x, const float *res, float *out, int64_t n, uint64_t key,
                 uint32_t thresh, float scale, int threads) {
  const uint32_t k1 = (uint32_t)key, k2 = (uint32_t)(key >> 32);
  #pragma omp parallel for simd num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = fmix32(fmix32((uint32_t)i ^ k1) + k2 + (uint32_t)(i >> 32));
    float d = h >= thresh ? x[i] * scale : 0.0f;
    out[i] = res ? res[i] + d : d;
  }
}
"""


def _declare(lib: ctypes.CDLL) -> None:
    ptr = ctypes.c_void_p
    lib.dropout_f32.argtypes = [ptr, ptr, ptr, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint32,
                                ctypes.c_float, ctypes.c_int]


_KERNELS = CKernels("dropout", _SOURCE, _declare, "fast CPU dropout kernel", "PyTorch's dropout")


def enabled() -> bool:
    """False when ``HVD_BERT_FAST_DROPOUT`` is ``0``, ``false`` or empty."""
    return env_flag("HVD_BERT_FAST_DROPOUT")


def _run(x: torch.Tensor, res: torch.Tensor | None, p: float, key: int) -> torch.Tensor:
    out = torch.empty_like(x)
    _KERNELS.library().dropout_f32(x.data_ptr(), None if res is None else res.data_ptr(), out.data_ptr(),
                                   x.numel(), key, min(int(p * 2.0 ** 32), 2 ** 32 - 1), 1.0 / (1.0 - p),
                                   _threads())
    return out


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, res, p, key):
        ctx.p, ctx.key, ctx.has_res = p, key, res is not None
        return _run(x, res, p, key)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        gx = _run(grad, None, ctx.p, ctx.key) if ctx.needs_input_grad[0] else None
        return gx, (grad if ctx.has_res else None), None, None


def served(x: torch.Tensor, res: torch.Tensor | None = None) -> bool:
    """Whether the kernel serves ``x`` (and ``res``): fp32 CPU tensors of one shape, the
    kernel on and built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and enabled()
            and (res is None or (res.dtype == x.dtype and res.device == x.device and res.shape == x.shape))
            and _KERNELS.library() is not None)


def dropout_add(x: torch.Tensor, residual: torch.Tensor | None, p: float,
                training: bool = True) -> torch.Tensor:
    """``residual + dropout(x, p)`` (``dropout(x, p)`` when ``residual`` is None), one loop."""
    if not training or p == 0.0:
        return x if residual is None else residual + x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not served(x, residual):
        d = F.dropout(x, p, True)
        return d if residual is None else residual + d
    key = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))  # from PyTorch's generator
    return _Dropout.apply(x.contiguous(), None if residual is None else residual.contiguous(), p, key)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``torch.nn.functional.dropout(x, p, training)`` with the mask from the hash."""
    return dropout_add(x, None, p, training)
