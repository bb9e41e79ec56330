"""Fused CPU kernels for the LAMB and LARS updates (one loop over memory per pass).

On a CPU an optimizer step is bound by memory traffic: the floor is reading w, g, m, v and
writing w, m, v once (LAMB, 28 B per fp32 parameter). A chain of ``torch._foreach_*`` ops
streams the arrays once per op; running that chain over cache-sized slices (the fallback in
:mod:`hvd_bert.pt.optim`) saves most of it, but every op is still a separate kernel call.
These kernels do each pass of the update as one OpenMP loop, vectorised by the compiler:

    LAMB pass 1   read w, g, m, v; write m, v; accumulate ||w||^2 and ||u||^2
    LAMB pass 2   read w, m, v (u recomputed, not stored); write w
    LARS norms    read w, g; accumulate ||w||^2 and ||g||^2
    LARS update   read w, g, v; write v, w

(40 B and 28 B per parameter: 1.43x the floor at best; a group without the trust ratio needs
no norms and does LAMB in one pass.) The math is :mod:`hvd_bert.common.optim`'s, in the
order of operations of the foreach path; squared norms are accumulated in float64.

The C source below is compiled once per CPU model with the system C compiler (``$CC``,
default ``cc``; ``-O3 -march=native -fopenmp``) into ``$HVD_BERT_CACHE/kernels`` and loaded
with :mod:`ctypes`: no PyTorch headers, about a second to build. It serves contiguous fp32 and
fp64 CPU tensors. ``HVD_BERT_FUSED_OPTIM=0`` turns it off; without a compiler (or if the build
fails) the foreach path is used, with one warning.
"""

from __future__ import annotations

import ctypes

import torch

from hvd_bert.common.kernels import env_flag
from hvd_bert.pt.cbuild import CKernels, threads as _threads

__all__ = ["enabled", "usable", "lamb_pass1", "lamb_pass2", "lamb_one_pass", "sumsq2",
           "lars_update"]

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <omp.h>

#define OMP_(...) _Pragma(#__VA_ARGS__)
#define OMP(...) OMP_(__VA_ARGS__)
/* Each thread of a team takes one contiguous share of whole BLOCKs, the same share in every
   kernel for the same n and team size. A second pass over a tensor walks its share backwards,
   so it starts on what the first pass left in the caches. Squared norms are summed in T within
   a BLOCK (full-width vector lanes: a reduction at memory speed) and in double across them. */
#define BLOCK 2048
#define TEAM if(n >= 65536) num_threads(nt)
#define SHARE(lo, hi)                                                                         \
    const int64_t per_ = ((n + BLOCK - 1) / BLOCK + omp_get_num_threads() - 1)               \
                         / omp_get_num_threads() * BLOCK;                                     \
    const int64_t lo = omp_get_thread_num() * per_ < n ? omp_get_thread_num() * per_ : n;     \
    const int64_t hi = lo + per_ < n ? lo + per_ : n;
#define BACKWARD(lo, hi, b0, e)                                                               \
    for (int64_t b0 = hi > lo ? lo + (hi - lo - 1) / BLOCK * BLOCK : lo - 1,                  \
                 e = b0 + BLOCK < hi ? b0 + BLOCK : hi;                                       \
         b0 >= lo; b0 -= BLOCK, e = b0 + BLOCK)
#define FORWARD(lo, hi, b0, e)                                                                \
    for (int64_t b0 = lo, e = lo + BLOCK < hi ? lo + BLOCK : hi; b0 < hi;                     \
         b0 += BLOCK, e = b0 + BLOCK < hi ? b0 + BLOCK : hi)
/* LAMB at element i, with DEFINE's constants: the moments, then the update direction u. */
#define LAMB_MOMENTS(T, i)                                                                    \
    const T gi = g[i] * tc, mi = m[i] + a1 * (gi - m[i]), vi = v[i] * tb2 + a2 * (gi * gi); \
    m[i] = mi; v[i] = vi;
#define LAMB_U(SQRT, mi, vi, i) (tw * w[i] + tr * ((mi) / (SQRT(vi) / ts + te)))
#define LAMB_CONSTANTS(T)                                                                     \
    const T a1 = (T)(1.0 - b1), tb2 = (T)b2, a2 = (T)(1.0 - b2), tc = (T)clip;               \
    const T ts = (T)sqrt_c2, te = (T)eps, tw = (T)wd, tr = (T)rc1;

#define DEFINE(T, S, SQRT)                                                                    \
void lamb_pass1_##S(const T* restrict w, const T* restrict g, T* restrict m, T* restrict v,  \
                    int64_t n, double b1, double b2, double clip, double sqrt_c2,            \
                    double eps, double wd, double rc1, int nt, double* out) {                \
    LAMB_CONSTANTS(T)                                                                        \
    double wsq = 0.0, usq = 0.0;                                                             \
    OMP(omp parallel reduction(+:wsq,usq) TEAM) {                                            \
        SHARE(lo, hi)                                                                        \
        FORWARD(lo, hi, b0, e) {                                                             \
            T bw = 0, bu = 0;                                                                \
            OMP(omp simd reduction(+:bw,bu))                                                 \
            for (int64_t i = b0; i < e; i++) {                                               \
                LAMB_MOMENTS(T, i)                                                           \
                const T u = LAMB_U(SQRT, mi, vi, i);                                      \
                bw += w[i] * w[i];                                                           \
                bu += u * u;                                                                 \
            }                                                                                \
            wsq += bw; usq += bu;                                                            \
        }                                                                                    \
    }                                                                                        \
    out[0] = wsq; out[1] = usq;                                                              \
}                                                                                            \
void lamb_pass2_##S(T* restrict w, const T* restrict m, const T* restrict v, int64_t n,      \
                    double sqrt_c2, double eps, double wd, double rc1, double scale, int nt) {\
    const T ts = (T)sqrt_c2, te = (T)eps, tw = (T)wd, tr = (T)rc1, sc = (T)scale;            \
    OMP(omp parallel TEAM) {                                                                 \
        SHARE(lo, hi)                                                                        \
        BACKWARD(lo, hi, b0, e) {                                                            \
            OMP(omp simd)                                                                    \
            for (int64_t i = b0; i < e; i++)                                                 \
                w[i] = w[i] + sc * LAMB_U(SQRT, m[i], v[i], i);                           \
        }                                                                                    \
    }                                                                                        \
}                                                                                            \
void lamb_one_pass_##S(T* restrict w, const T* restrict g, T* restrict m, T* restrict v,     \
                       int64_t n, double b1, double b2, double clip, double sqrt_c2,         \
                       double eps, double wd, double rc1, double scale, int nt) {            \
    LAMB_CONSTANTS(T)                                                                        \
    const T sc = (T)scale;                                                                   \
    OMP(omp parallel TEAM) {                                                                 \
        SHARE(lo, hi)                                                                        \
        FORWARD(lo, hi, b0, e) {                                                             \
            OMP(omp simd)                                                                    \
            for (int64_t i = b0; i < e; i++) {                                               \
                LAMB_MOMENTS(T, i)                                                           \
                w[i] = w[i] + sc * LAMB_U(SQRT, mi, vi, i);                               \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
}                                                                                            \
void sumsq2_##S(const T* restrict a, const T* restrict b, int64_t n, int nt, double* out) {  \
    double sa = 0.0, sb = 0.0;                                                               \
    OMP(omp parallel reduction(+:sa,sb) TEAM) {                                              \
        SHARE(lo, hi)                                                                        \
        FORWARD(lo, hi, b0, e) {                                                             \
            T ba = 0, bb = 0;                                                                \
            OMP(omp simd reduction(+:ba,bb))                                                 \
            for (int64_t i = b0; i < e; i++) {                                               \
                ba += a[i] * a[i];                                                           \
                bb += b[i] * b[i];                                                           \
            }                                                                                \
            sa += ba; sb += bb;                                                              \
        }                                                                                    \
    }                                                                                        \
    out[0] = sa; out[1] = sb;                                                                \
}                                                                                            \
void lars_update_##S(T* restrict w, const T* restrict g, T* restrict v, int64_t n,           \
                     double mu, double scale, double wd, int nt) {                           \
    const T tm = (T)mu, sc = (T)scale, tw = (T)wd;                                           \
    OMP(omp parallel TEAM) {                                                                 \
        SHARE(lo, hi)                                                                        \
        BACKWARD(lo, hi, b0, e) {                                                            \
            OMP(omp simd)                                                                    \
            for (int64_t i = b0; i < e; i++) {                                               \
                T vi = tm * v[i] + (g[i] + tw * w[i]) * sc;                                  \
                v[i] = vi;                                                                   \
                w[i] = w[i] - vi;                                                            \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
}

DEFINE(float, f32, sqrtf)  /* sqrtf: sqrt would promote the whole update to double */
DEFINE(double, f64, sqrt)
"""

_DTYPES = {torch.float32: ("f32", ctypes.c_float), torch.float64: ("f64", ctypes.c_double)}


def _declare(lib: ctypes.CDLL) -> None:
    d, i64, i32, ptr = ctypes.c_double, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    for s in ("f32", "f64"):
        getattr(lib, f"lamb_pass1_{s}").argtypes = [ptr] * 4 + [i64] + [d] * 7 + [i32, ptr]
        getattr(lib, f"lamb_pass2_{s}").argtypes = [ptr] * 3 + [i64] + [d] * 5 + [i32]
        getattr(lib, f"lamb_one_pass_{s}").argtypes = [ptr] * 4 + [i64] + [d] * 8 + [i32]
        getattr(lib, f"sumsq2_{s}").argtypes = [ptr] * 2 + [i64, i32, ptr]
        getattr(lib, f"lars_update_{s}").argtypes = [ptr] * 3 + [i64] + [d] * 3 + [i32]


_KERNELS = CKernels("fused_optim", _SOURCE, _declare, "fused CPU optimizer kernels", "the foreach path")


def enabled() -> bool:
    """False when ``HVD_BERT_FUSED_OPTIM`` is ``0``, ``false`` or empty."""
    return env_flag("HVD_BERT_FUSED_OPTIM")


def usable(*tensor_lists: list[torch.Tensor]) -> bool:
    """Whether the kernels serve these tensors: contiguous dense CPU tensors, all fp32 or all
    fp64, and the kernels on and built."""
    first = tensor_lists[0][0]
    if first.device.type != "cpu" or first.dtype not in _DTYPES or not enabled():
        return False
    for ts in tensor_lists:
        for t in ts:
            if t.dtype != first.dtype or t.device.type != "cpu" or t.is_sparse or not t.is_contiguous():
                return False
    return _KERNELS.library() is not None


def _fn(name: str, t: torch.Tensor):
    return getattr(_KERNELS.library(), f"{name}_{_DTYPES[t.dtype][0]}")


def lamb_pass1(w, g, m, v, b1, b2, clip, sqrt_c2, eps, wd, rc1) -> tuple[float, float]:
    """Moments m, v in place; returns (||w||^2, ||u||^2)."""
    out = (ctypes.c_double * 2)()
    _fn("lamb_pass1", w)(w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), w.numel(),
                         b1, b2, clip, sqrt_c2, eps, wd, rc1, _threads(), out)
    return out[0], out[1]


def lamb_pass2(w, m, v, sqrt_c2, eps, wd, rc1, scale) -> None:
    """w += scale * u, u recomputed from the updated moments."""
    _fn("lamb_pass2", w)(w.data_ptr(), m.data_ptr(), v.data_ptr(), w.numel(),
                         sqrt_c2, eps, wd, rc1, scale, _threads())


def lamb_one_pass(w, g, m, v, b1, b2, clip, sqrt_c2, eps, wd, rc1, scale) -> None:
    """Moments and w += scale * u in one pass (no trust ratio)."""
    _fn("lamb_one_pass", w)(w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), w.numel(),
                            b1, b2, clip, sqrt_c2, eps, wd, rc1, scale, _threads())


def sumsq2(a, b) -> tuple[float, float]:
    """(||a||^2, ||b||^2) in one pass."""
    out = (ctypes.c_double * 2)()
    _fn("sumsq2", a)(a.data_ptr(), b.data_ptr(), a.numel(), _threads(), out)
    return out[0], out[1]


def lars_update(w, g, v, mu, scale, wd) -> None:
    """v = mu v + scale (g + wd w); w -= v."""
    _fn("lars_update", w)(w.data_ptr(), g.data_ptr(), v.data_ptr(), w.numel(), mu, scale, wd,
                          _threads())
