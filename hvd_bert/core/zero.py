"""ZeRO's partition of the parameters over N data-parallel ranks, framework-free (REFERENCE
section 9): the math a stage-1/2 engine does on its shard, and what both engines are tested
against.

* The tensors are flattened in order into one vector, padded to a multiple of N, and cut into
  N equal contiguous shards; rank r owns elements ``[r S, (r + 1) S)``. A tensor may span
  shards: a rank holds *pieces* of tensors (:meth:`Partition.pieces`).
* A trust ratio (LAMB, LARS) needs each whole tensor's norm. Each rank sums the squares of its
  pieces per tensor (:func:`partial_sq_sums`); one allreduce (a sum) of that vector completes
  every norm at once, and NVLAMB's global gradient norm is one more element of it.
* :func:`sharded_step` is one optimizer step of one rank on its shard, given that allreduce;
  run on every rank it gives exactly the weights of ``core.optim``'s step on the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hvd_bert.core import optim as O

__all__ = ["Partition", "partition", "shard_of", "unshard", "partial_sq_sums", "sharded_step"]


@dataclass(frozen=True)
class Partition:
    sizes: tuple[int, ...]   # elements of each tensor, in order
    world_size: int
    shard: int               # elements per shard (the padded total / world_size)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def bounds(self, rank: int) -> tuple[int, int]:
        """Rank ``rank``'s elements of the flat (padded) vector."""
        return rank * self.shard, (rank + 1) * self.shard

    def pieces(self, rank: int) -> list[tuple[int, int, int, int]]:
        """``(tensor, offset in the tensor, offset in the shard, length)`` of every piece of a
        tensor that rank ``rank`` owns, in order (the padding belongs to no tensor)."""
        lo, hi = self.bounds(rank)
        out, start = [], 0
        for i, n in enumerate(self.sizes):
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                out.append((i, a - start, a - lo, b - a))
            start += n
        return out


def partition(sizes: Sequence[int], world_size: int) -> Partition:
    if world_size < 1 or any(n < 0 for n in sizes):
        raise ValueError(f"world_size must be >= 1 and sizes >= 0, got {world_size}, {list(sizes)}")
    total = sum(sizes)
    return Partition(tuple(int(n) for n in sizes), world_size, -(-total // world_size) if total else 0)


def shard_of(tensors: Sequence[np.ndarray], part: Partition, rank: int) -> np.ndarray:
    """Rank ``rank``'s shard of ``tensors`` (zeros in the padding)."""
    out = np.zeros(part.shard, dtype=np.result_type(*tensors) if tensors else np.float64)
    for i, off, pos, n in part.pieces(rank):
        out[pos:pos + n] = np.ravel(tensors[i])[off:off + n]
    return out


def unshard(shards: Sequence[np.ndarray], part: Partition, shapes: Sequence[tuple[int, ...]]) -> list:
    """The whole tensors from every rank's shard (what an allgather gives)."""
    flat = np.concatenate(list(shards))[:part.total]
    out, start = [], 0
    for n, shape in zip(part.sizes, shapes):
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


def partial_sq_sums(shard: np.ndarray, part: Partition, rank: int) -> np.ndarray:
    """Per tensor, the sum of squares of rank ``rank``'s pieces of it (zeros for the tensors it
    holds none of); the sum over ranks is each tensor's squared norm."""
    out = np.zeros(len(part.sizes))
    for i, _, pos, n in part.pieces(rank):
        piece = shard[pos:pos + n].astype(np.float64)
        out[i] += float(np.dot(piece, piece))
    return out


def _per_element(values: Sequence, part: Partition, rank: int, fill=0.0) -> np.ndarray:
    """A per-tensor value spread over the elements of rank ``rank``'s shard."""
    out = np.full(part.shard, fill, dtype=np.float64)
    for i, _, pos, n in part.pieces(rank):
        out[pos:pos + n] = values[i]
    return out


def sharded_step(name: str, w: np.ndarray, g: np.ndarray, state: dict, part: Partition, rank: int, *,
                 allreduce: Callable[[np.ndarray], np.ndarray], lr: float, weight_decay: float = 0.0,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float | None = None, momentum: float = 0.9,
                 eta: float = 1e-3, max_grad_norm: float | None = None, bias_correction: bool = True,
                 decay_mask: Sequence[bool] | None = None, adapt_mask: Sequence[bool] | None = None,
                 ) -> tuple[np.ndarray, dict]:
    """One ``lamb``, ``nvlamb`` or ``lars`` step of rank ``rank`` on its shard ``w`` with its
    reduced gradient shard ``g`` (as ``core.optim``'s steps; NVLAMB: apex's adapt mask) and its
    shard of the state (``{"step", "m", "v"}`` or ``{"step", "v"}``; ``{}`` at first).
    ``allreduce`` sums a vector over the ranks, every rank calling it alike: LARS once (the
    per-tensor partial sums of squares of the weights and the gradients), LAMB twice (the
    weights' with the gradient's total, then the updates')."""
    k = len(part.sizes)
    decay = [True] * k if decay_mask is None else list(decay_mask)
    if name == "nvlamb":
        adapt = [d and weight_decay != 0.0 for d in decay]
        max_grad_norm = 1.0 if max_grad_norm is None else max_grad_norm
    else:
        adapt = [True] * k if adapt_mask is None else list(adapt_mask)
    w, g = w.astype(np.float64), g.astype(np.float64)
    eps = (0.0 if name == "lars" else 1e-6) if eps is None else eps  # (core.optim's defaults)
    if name == "lars":
        sums = allreduce(np.concatenate([partial_sq_sums(w, part, rank), partial_sq_sums(g, part, rank)]))
        wn, gn = np.sqrt(sums[:k]), np.sqrt(sums[k:])
        ratio = [O.lars_trust_ratio(wn[i], gn[i], eta, weight_decay, eps) if adapt[i] else 1.0
                 for i in range(k)]
        on = _per_element([1.0 if a else 0.0 for a in adapt], part, rank)
        u = np.where(on > 0, _per_element(ratio, part, rank) * (g + weight_decay * w), g)
        v = momentum * state.get("v", np.zeros_like(w)) + lr * u
        return w - v, {"step": state.get("step", 0) + 1, "v": v}
    if name not in ("lamb", "nvlamb"):
        raise ValueError(f"sharded_step has lamb, nvlamb and lars, not {name!r}")
    # The gradient's global norm (clipping) and the weights' norms need no update yet: the
    # update's norms do, so LAMB allreduces twice in this reference (an engine can fold the
    # first into the gradient's reduce-scatter).
    first = allreduce(np.concatenate([partial_sq_sums(w, part, rank), [float(np.dot(g, g))]]))
    wn, gnorm = np.sqrt(first[:k]), float(np.sqrt(first[k]))
    if max_grad_norm is not None and gnorm > max_grad_norm:
        g = g * (max_grad_norm / gnorm)
    t = state.get("step", 0) + 1
    m = beta1 * state.get("m", np.zeros_like(w)) + (1.0 - beta1) * g
    v = beta2 * state.get("v", np.zeros_like(w)) + (1.0 - beta2) * g * g
    c1, c2 = (1.0 - beta1 ** t, 1.0 - beta2 ** t) if bias_correction else (1.0, 1.0)
    u = (m / c1) / (np.sqrt(v / c2) + eps)
    if weight_decay:
        u = u + weight_decay * _per_element([1.0 if d else 0.0 for d in decay], part, rank) * w
    un = np.sqrt(allreduce(partial_sq_sums(u, part, rank)))
    ratio = [O.lamb_trust_ratio(wn[i], un[i]) if adapt[i] else 1.0 for i in range(k)]
    return w - lr * _per_element(ratio, part, rank, 1.0) * u, {"step": t, "m": m, "v": v}
