"""Fused CPU kernels for the LAMB and LARS updates (one loop over memory per pass, one call
per parameter group).

On a CPU an optimizer step is bound by memory traffic: the floor is reading w, g, m, v and
writing w, m, v once (LAMB, 28 B per fp32 parameter). A chain of ``torch._foreach_*`` ops
streams the arrays once per op; running that chain over cache-sized slices (the fallback in
:mod:`hvd_bert.pt.optim`) saves most of it, but every op is still a separate kernel call.
These kernels do each pass of the update as one vectorised loop:

    LAMB pass 1   read w, g, m, v; write m, v; accumulate ||w||^2 and ||u||^2
    LAMB pass 2   read w, m, v (u recomputed, not stored); write w
    LARS norms    read w, g; accumulate ||w||^2 and ||g||^2
    LARS update   read w, g, v; write v, w

(40 B and 28 B per parameter: 1.43x the floor at best for a tensor bigger than the caches; the
second pass of a smaller one reads back what the first left in the last-level cache. A group
without the trust ratio needs no norms and does each tensor in one pass.)

One call steps a whole group inside one OpenMP team (a multi-tensor apply, as apex's): a
tensor of at least ``SPLIT`` elements is shared by the team in contiguous runs of whole blocks,
its squared norms summed per thread and then in thread order after a barrier, so the trust
ratio is the same bit for bit on every run with the same thread count (ranks stepping the same
gradients stay identical); a shorter tensor (biases, LayerNorm) goes whole to one thread, with
no barrier. Norms are summed in T within a block of 2048 (full-width vector lanes) and in
double across blocks. The math is :mod:`hvd_bert.core.optim`'s; the update direction is
m / (sqrt(v) * (1 / sqrt(c2)) + eps) / c1 (one division per element), as in the foreach path.

The C source is compiled once per CPU model with the system C compiler (:mod:`hvd_bert.pt.kernels.build`:
``$CC``, ``-O3 -march=native -fopenmp``) and loaded with :mod:`ctypes`: no PyTorch headers,
about a second to build. It serves contiguous fp32 and fp64 CPU tensors.
``HVD_BERT_FUSED_OPTIM=0`` turns it off; without a compiler (or if the build fails) the foreach
path is used, with one warning.
"""

from __future__ import annotations

import ctypes

import torch

from hvd_bert.core.kernels import env_flag
from hvd_bert.pt.kernels.build import CKernels, threads as _threads

__all__ = ["enabled", "usable", "lamb_step", "lars_step", "sumsq"]

_HEADER = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#define OMP_(...) _Pragma(#__VA_ARGS__)
#define OMP(...) OMP_(__VA_ARGS__)
#define BLOCK 2048
#define SPLIT 65536
#define PAD 8 /* doubles between two threads' partial sums: one cache line each */

/* [lo, hi): thread tid's share of n elements, a contiguous run of whole BLOCKs, the same
   share in every pass for the same n and team size. */
static inline void share(int64_t n, int tid, int nth, int64_t* lo, int64_t* hi) {
    const int64_t per = ((n + BLOCK - 1) / BLOCK + nth - 1) / nth * BLOCK;
    *lo = tid * per < n ? tid * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}
static inline double lamb_ratio(double wsq, double usq) {
    return wsq > 0 && usq > 0 ? sqrt(wsq) / sqrt(usq) : 1.0;
}
static inline double lars_trust(double wsq, double gsq, double wd, double eta, double eps) {
    const double wn = sqrt(wsq), gn = sqrt(gsq);
    return wn > 0 && gn > 0 ? eta * wn / fmax(gn + wd * wn + eps, 1e-38) : 1.0;
}
"""

# One copy per element type: $T the type, $S its suffix, $SQRT its square root (sqrtf for
# float: sqrt would promote the whole update to double). A second pass over a share walks it
# backwards, so it starts on what the first pass left in the caches.
_TEMPLATE = r"""
typedef struct { $T a1, b2, a2, clip, rts, eps, wd, rc1; } lamb_c_$S;

/* u at element i from the updated moments mi, vi */
#define U_$S(c, wi, mi, vi) ((c).wd * (wi) + (c).rc1 * ((mi) / ($SQRT(vi) * (c).rts + (c).eps)))
#define FOR_BLOCKS(b0, e, lo, hi) \
    for (int64_t b0 = lo, e = lo + BLOCK < hi ? lo + BLOCK : hi; b0 < hi; \
         b0 += BLOCK, e = b0 + BLOCK < hi ? b0 + BLOCK : hi)
#define FOR_BLOCKS_BACK(b0, e, lo, hi) \
    for (int64_t b0 = hi > lo ? lo + (hi - lo - 1) / BLOCK * BLOCK : lo - 1, \
         e = b0 + BLOCK < hi ? b0 + BLOCK : hi; b0 >= lo; b0 -= BLOCK, e = b0 + BLOCK)

/* pass 1: moments in place; adds ||w||^2 and ||u||^2 over [lo, hi) to out[0], out[1] */
static void lamb_p1_$S(const $T* restrict w, const $T* restrict g, $T* restrict m, $T* restrict v,
                       int64_t lo, int64_t hi, lamb_c_$S c, double* out) {
    double sw = 0.0, su = 0.0;
    FOR_BLOCKS(b0, e, lo, hi) {
        $T bw = 0, bu = 0;
        OMP(omp simd reduction(+:bw,bu))
        for (int64_t i = b0; i < e; i++) {
            const $T gi = g[i] * c.clip, mi = m[i] + c.a1 * (gi - m[i]);
            const $T vi = v[i] * c.b2 + c.a2 * (gi * gi);
            m[i] = mi; v[i] = vi;
            const $T u = U_$S(c, w[i], mi, vi);
            bw += w[i] * w[i];
            bu += u * u;
        }
        sw += bw; su += bu;
    }
    out[0] += sw; out[1] += su;
}
/* pass 2: w += scale u */
static void lamb_p2_$S($T* restrict w, const $T* restrict m, const $T* restrict v, int64_t lo,
                       int64_t hi, lamb_c_$S c, $T scale) {
    FOR_BLOCKS_BACK(b0, e, lo, hi) {
        OMP(omp simd)
        for (int64_t i = b0; i < e; i++) w[i] = w[i] + scale * U_$S(c, w[i], m[i], v[i]);
    }
}
/* no trust ratio: moments and w += scale u in one pass */
static void lamb_p0_$S($T* restrict w, const $T* restrict g, $T* restrict m, $T* restrict v,
                       int64_t lo, int64_t hi, lamb_c_$S c, $T scale) {
    FOR_BLOCKS(b0, e, lo, hi) {
        OMP(omp simd)
        for (int64_t i = b0; i < e; i++) {
            const $T gi = g[i] * c.clip, mi = m[i] + c.a1 * (gi - m[i]);
            const $T vi = v[i] * c.b2 + c.a2 * (gi * gi);
            m[i] = mi; v[i] = vi;
            w[i] = w[i] + scale * U_$S(c, w[i], mi, vi);
        }
    }
}
static void sumsq2_$S(const $T* restrict a, const $T* restrict b, int64_t lo, int64_t hi,
                      double* out) {
    double sa = 0.0, sb = 0.0;
    FOR_BLOCKS(b0, e, lo, hi) {
        $T ba = 0, bb = 0;
        OMP(omp simd reduction(+:ba,bb))
        for (int64_t i = b0; i < e; i++) { ba += a[i] * a[i]; bb += b[i] * b[i]; }
        sa += ba; sb += bb;
    }
    out[0] += sa; out[1] += sb;
}
static double sumsq1_$S(const $T* restrict a, int64_t lo, int64_t hi) {
    double sa = 0.0;
    FOR_BLOCKS(b0, e, lo, hi) {
        double ba = 0; /* squares in double: a finite gradient of 1e20 has a finite norm */
        OMP(omp simd reduction(+:ba))
        for (int64_t i = b0; i < e; i++) ba += (double)a[i] * (double)a[i];
        sa += ba;
    }
    return sa;
}
/* v = mu v + scale (g + wd w); w -= v */
static void lars_p2_$S($T* restrict w, const $T* restrict g, $T* restrict v, int64_t lo,
                       int64_t hi, $T mu, $T scale, $T wd) {
    FOR_BLOCKS_BACK(b0, e, lo, hi) {
        OMP(omp simd)
        for (int64_t i = b0; i < e; i++) {
            const $T vi = mu * v[i] + (g[i] + wd * w[i]) * scale;
            v[i] = vi;
            w[i] = w[i] - vi;
        }
    }
}

/* The team walks the group's tensors in order. A tensor of SPLIT elements or more is shared
   (the norms: per-thread partial sums, a barrier, then every thread adds them in thread order;
   the partials alternate between two buffers, so the next shared tensor cannot overwrite them
   while a thread still reads). A shorter one goes whole to one thread, in turn. Every thread
   meets the same barriers: the test for sharing depends only on n[k] and the team size. */
#define TEAM_WALK(NORMS, UPDATE, ONE_PASS)                                                 \
    double* part = adapt ? calloc((size_t)2 * nt * PAD, sizeof(double)) : NULL;              \
    if (adapt && !part) return -1;                                                            \
    OMP(omp parallel num_threads(nt)) {                                                       \
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();                    \
        int whole = 0, shared = 0;                                                            \
        for (int k = 0; k < count; k++) {                                                     \
            int64_t lo = 0, hi = n[k];                                                        \
            const int alone = n[k] < SPLIT || nth == 1;                                      \
            if (alone && whole++ % nth != tid) continue;                                      \
            if (!alone) share(n[k], tid, nth, &lo, &hi);                                      \
            if (!adapt) { ONE_PASS; continue; }                                               \
            double sums[2] = {0.0, 0.0};                                                      \
            if (alone) {                                                                      \
                NORMS(sums);                                                                  \
            } else {                                                                          \
                double* mine = part + ((size_t)(shared & 1) * nth + tid) * PAD;               \
                mine[0] = mine[1] = 0.0;                                                      \
                NORMS(mine);                                                                  \
                OMP(omp barrier)                                                              \
                for (int t = 0; t < nth; t++) {                                               \
                    sums[0] += part[((size_t)(shared & 1) * nth + t) * PAD];                  \
                    sums[1] += part[((size_t)(shared & 1) * nth + t) * PAD + 1];              \
                }                                                                             \
                shared++;                                                                     \
            }                                                                                 \
            UPDATE(sums);                                                                     \
        }                                                                                     \
    }                                                                                         \
    free(part);                                                                               \
    return 0;

/* One LAMB step of a group: w, g, m, v arrays of count tensor pointers, n their lengths. */
int lamb_step_$S($T* const* w, $T* const* g, $T* const* m, $T* const* v, const int64_t* n,
                 int count, double b1, double b2, double clip, double sqrt_c2, double eps,
                 double wd, double rc1, double lr, int adapt, int nt) {
    const lamb_c_$S c = {($T)(1.0 - b1), ($T)b2, ($T)(1.0 - b2), ($T)clip, ($T)(1.0 / sqrt_c2),
                         ($T)eps, ($T)wd, ($T)rc1};
#define LAMB_NORMS_$S(out) lamb_p1_$S(w[k], g[k], m[k], v[k], lo, hi, c, out)
#define LAMB_UPDATE_$S(s) lamb_p2_$S(w[k], m[k], v[k], lo, hi, c, ($T)(-lr * lamb_ratio(s[0], s[1])))
    TEAM_WALK(LAMB_NORMS_$S, LAMB_UPDATE_$S, lamb_p0_$S(w[k], g[k], m[k], v[k], lo, hi, c, ($T)(-lr)))
}
/* One LARS step of a group (adapt 0: neither trust ratio nor weight decay). */
int lars_step_$S($T* const* w, $T* const* g, $T* const* v, const int64_t* n, int count,
                 double lr, double mu, double wd, double eta, double eps, int adapt, int nt) {
#define LARS_NORMS_$S(out) sumsq2_$S(w[k], g[k], lo, hi, out)
#define LARS_UPDATE_$S(s) lars_p2_$S(w[k], g[k], v[k], lo, hi, ($T)mu, \
                                     ($T)(lr * lars_trust(s[0], s[1], wd, eta, eps)), ($T)wd)
    TEAM_WALK(LARS_NORMS_$S, LARS_UPDATE_$S, lars_p2_$S(w[k], g[k], v[k], lo, hi, ($T)mu, ($T)lr, 0))
}
/* The sum of squares of every element of count tensors (a global gradient norm, squared):
   per-thread sums, added in thread order. */
int sumsq_$S($T* const* a, const int64_t* n, int count, int nt, double* out) {
    double* part = calloc((size_t)nt * PAD, sizeof(double));
    if (!part) return -1;
    OMP(omp parallel num_threads(nt)) {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int whole = 0;
        double mine = 0.0;
        for (int k = 0; k < count; k++) {
            int64_t lo = 0, hi = n[k];
            const int alone = n[k] < SPLIT || nth == 1;
            if (alone && whole++ % nth != tid) continue;
            if (!alone) share(n[k], tid, nth, &lo, &hi);
            mine += sumsq1_$S(a[k], lo, hi);
        }
        part[(size_t)tid * PAD] = mine;
    }
    double total = 0.0;
    for (int t = 0; t < nt; t++) total += part[(size_t)t * PAD];
    free(part);
    *out = total;
    return 0;
}
#undef FOR_BLOCKS
#undef FOR_BLOCKS_BACK
"""

_SOURCE = _HEADER + "".join(
    _TEMPLATE.replace("$SQRT", q).replace("$T", t).replace("$S", s)
    for t, s, q in (("float", "f32", "sqrtf"), ("double", "f64", "sqrt")))

_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


def _declare(lib: ctypes.CDLL) -> None:
    d, i32 = ctypes.c_double, ctypes.c_int
    ptrs, lens = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)
    for s in _DTYPES.values():
        f = getattr(lib, f"lamb_step_{s}")
        f.argtypes, f.restype = [ptrs] * 4 + [lens, i32] + [d] * 8 + [i32, i32], i32
        f = getattr(lib, f"lars_step_{s}")
        f.argtypes, f.restype = [ptrs] * 3 + [lens, i32] + [d] * 5 + [i32, i32], i32
        f = getattr(lib, f"sumsq_{s}")
        f.argtypes, f.restype = [ptrs, lens, i32, i32, ctypes.POINTER(d)], i32


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


def _pointers(ts: list[torch.Tensor]):
    return (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])


def _call(name: str, lists: tuple[list[torch.Tensor], ...], *args, out=()) -> None:
    first = lists[0]
    fn = getattr(_KERNELS.library(), f"{name}_{_DTYPES[first[0].dtype]}")
    lens = (ctypes.c_int64 * len(first))(*[t.numel() for t in first])
    if fn(*[_pointers(ts) for ts in lists], lens, len(first), *args, _threads(), *out) != 0:
        raise MemoryError(f"hvd_bert: {name} could not allocate its partial sums")


def lamb_step(params, grads, m, v, b1, b2, clip, sqrt_c2, eps, wd, rc1, lr, adapt: bool) -> None:
    """One LAMB step of a group, in place: moments, then w -= lr * ratio * u per tensor (ratio
    ||w|| / ||u||, 1 where either is 0; without ``adapt`` ratio is 1 and one pass does it)."""
    _call("lamb_step", (params, grads, m, v), b1, b2, clip, sqrt_c2, eps, wd, rc1, lr, int(adapt))


def lars_step(params, grads, bufs, lr, mu, wd, eta, eps, adapt: bool) -> None:
    """One LARS step of a group, in place: v = mu v + lr trust (g + wd w); w -= v (without
    ``adapt``, trust 1 and no weight decay)."""
    _call("lars_step", (params, grads, bufs), lr, mu, wd, eta, eps, int(adapt))


def sumsq(tensors: list[torch.Tensor]) -> float:
    """The sum of the squares of every element of ``tensors`` (one pass, summed in double; the
    same bits on every run with the same thread count)."""
    out = ctypes.c_double()
    _call("sumsq", (tensors,), out=(ctypes.byref(out),))
    return out.value
