"""ZeRO's partition of the parameters over N data-parallel ranks, framework-free (REFERENCE
section 9): the math a stage-1/2 engine does on its shard, and what both engines are tested
against.

* The tensors are flattened in order into one vector, padded to a multiple of N, and cut into
  N equal contiguous shards; rank r owns elements ``[r S, (r + 1) S)``. A tensor may span
  shards: a rank holds *pieces* of tensors (:meth:`Partition.pieces`).
* A trust ratio (LAMB, LARS) needs each whole tensor's norm. Each rank sums the squares of its
  pieces per tensor (:func:`partial_sq_sums`); one allreduce (a sum) of that vector completes
  every norm at once, and NVLAMB's global gradient norm is one more element of it.
* :func:`sharded_step` is one optimizer step of one rank on its shard, given that allreduce: the
  same chain as ``core.optim``'s step on the whole model, with the norms completed from outside;
  run on every rank it gives exactly the weights of that step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
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


def sharded_step(name: str, w: np.ndarray, g: np.ndarray, state: dict, part: Partition, rank: int, *,
                 allreduce: Callable[[np.ndarray], np.ndarray], **hparams) -> tuple[np.ndarray, dict]:
    """One step of ``core.optim``'s optimizer ``name`` by rank ``rank`` on its shard ``w`` with its
    reduced gradient shard ``g`` and its shard of the state (``{"step", <buffer>: flat}``; ``{}``
    at first): the same chain as the whole model's step, run on the pieces of tensors the shard
    holds, with the whole tensors' norms completed by ``allreduce`` (a sum over the ranks, every
    rank calling it alike: ``core.optim.Norms``). ``hparams`` are the step's (``decay_mask`` and
    ``adapt_mask`` per tensor, as for the whole model)."""
    init, step = O.OPTIMIZERS[name]
    pieces = part.pieces(rank)

    def views(x: np.ndarray) -> list[np.ndarray]:
        return [x[pos:pos + n] for _, _, pos, n in pieces]
    for key in ("decay_mask", "adapt_mask"):  # per tensor -> per piece
        if hparams.get(key) is not None:
            hparams[key] = [hparams[key][i] for i, *_ in pieces]
    w, g = w.astype(np.float64), g.astype(np.float64)
    zero = init(views(w))
    buffers = [f.name for f in fields(zero) if f.name != "step"]
    st = replace(zero, step=state.get("step", 0),
                 **{b: tuple(views(state[b])) for b in buffers if b in state})
    norms = O.Norms(tuple(i for i, *_ in pieces), len(part.sizes), allreduce)
    new_w, new_st, _ = step(views(w), views(g), st, norms=norms, **hparams)
    out, new_state = w.copy(), {"step": new_st.step}
    for b in buffers:
        new_state[b] = np.zeros_like(w)
    for j, (_, _, pos, n) in enumerate(pieces):
        out[pos:pos + n] = new_w[j]
        for b in buffers:
            new_state[b][pos:pos + n] = getattr(new_st, b)[j]
    return out, new_state
