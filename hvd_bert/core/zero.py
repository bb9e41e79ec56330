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

__all__ = ["Partition", "partition", "shard_of", "unshard", "partial_sq_sums", "sharded_step",
           "committed_shards", "commit_row", "follow", "recovery", "shard_holders", "overlap", "LostShards"]


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


# ---------------------------------------------------------------------- elastic commits (REFERENCE 10)
class LostShards(RuntimeError):
    """Shards of the optimizer state that no surviving rank holds."""


def committed_shards(rank: int, size: int) -> list[int]:
    """The shards an elastic commit of rank ``rank`` keeps: its own and its ring neighbour's
    (rank + 1's), so that each shard lives on two ranks and any one rank can be lost."""
    return sorted({rank, (rank + 1) % size})


def commit_row(commit: dict | None) -> list[int]:
    """What a rank tells the others of its commit (``{"world_size", "step", "shards"}``; None: a
    rank that joined) as an allgathered row of 4 integers: the world size it was made on, its
    step and the shards it holds."""
    if commit is None:
        return [-1] * 4
    return [int(commit["world_size"]), int(commit["step"]), *sorted(int(j) for j in commit["shards"]), -1][:4]


def follow(commit: dict | None, new: dict | None) -> dict | None:
    """The commit an engine keeps after a new world's recovery: ``new``, written into the old
    commit's dict when there is one (a later restore of that same commit, which Horovod's state
    holds, then finds the new world's shards)."""
    if commit is None or new is None:
        return new
    commit.clear()
    commit.update(new)
    return commit


def recovery(rows: Sequence[Sequence[int]]) -> tuple[int, int, dict[int, int]] | None:
    """``(old world size, step, {old shard: the rank to send it})`` from every rank's
    :func:`commit_row`; None when no rank had committed. Raises :class:`LostShards` when commits
    disagree or a shard was lost with every rank that held it."""
    commits = [(r[0], r[1], [j for j in r[2:] if j >= 0]) for r in rows]
    known = {(n, s) for n, s, _ in commits if n >= 0}
    if not known:
        return None
    if len(known) > 1:
        raise LostShards(f"the ranks' elastic commits disagree ({sorted(known)}); restart the job from its "
                         f"last checkpoint (hvd-bert resumes it)")
    ((old_size, step),) = known
    return old_size, step, shard_holders([js if n >= 0 else None for n, _, js in commits], old_size)


def shard_holders(held: Sequence[Sequence[int] | None], old_size: int) -> dict[int, int]:
    """``{old shard: the first rank of the new world that holds it}`` from what each rank's
    commit holds (None: a rank that joined, holding nothing). Raises :class:`LostShards` naming
    the shards that every rank holding them took with it."""
    holder: dict[int, int] = {}
    for r, shards in enumerate(held):
        for j in shards or ():
            holder.setdefault(int(j), r)
    lost = [j for j in range(old_size) if j not in holder]
    if lost:
        raise LostShards(f"the optimizer state of former ranks {lost} was lost with them and their ring "
                         f"neighbours (an elastic commit keeps each shard on two ranks: one lost rank is "
                         f"recovered, not two neighbours); restart the job from its last checkpoint "
                         f"(hvd-bert resumes it)")
    return holder


def overlap(old: Partition, shard: int, new: Partition, rank: int) -> tuple[int, int, int, int] | None:
    """Where old shard ``shard`` and rank ``rank``'s new shard share elements (both partitions of
    the same flat vector): ``(start, stop)`` in the old shard and ``(start, stop)`` in the new
    one; None when they do not (the padding shares nothing)."""
    a0, b0 = old.bounds(shard)
    a1, b1 = new.bounds(rank)
    a, b = max(a0, a1), min(b0, b1, old.total)
    if a >= b:
        return None
    return a - a0, b - a0, a - a1, b - a1
