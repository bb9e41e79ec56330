"""ZeRO stages 1 and 2 over Horovod for the TensorFlow engine (``train.zero.stage``), as
:mod:`hvd_bert.pt.zero` for PyTorch: the same flat partition (:mod:`hvd_bert.core.zero`), the
same step on a rank's shard, the same consolidated checkpoints.

* **stage 1**: the engine's accumulators and its one grouped allreduce stay; each rank then
  updates its shard of the weights from its part of the reduced gradients, and the updated
  shards are allgathered into every rank's variables.
* **stage 2**: no accumulators: every micro-batch's gradients are reduced at once into a shard
  accumulator (NCCL's reduce-scatter on a GPU; on a CPU an allreduce of which the rank keeps its
  part: under Gloo Horovod 0.28.1's CPU reduce-scatter takes 1.6x an allreduce).
* The optimizer (hvd_bert's tf-keras Lamb, NVLamb, AdamW, Lars or SGD) does the step: its own
  rule (``update``) runs on the shard, told which variable each element belongs to
  (``tf.optim.Pieces``), with the whole variables' norms completed by an allreduce; this module
  keeps only the partition, the reduction, the norms' allreduce and the allgather. The
  optimizer's slots are never built. A checkpoint holds a freshly built optimizer of the same
  configuration with the consolidated state in its slots: stage 0's format, written by rank 0,
  resumable at any stage and world size.
"""

from __future__ import annotations

import math

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_bert.core import zero as Z
from hvd_bert.tf.optim import Pieces

__all__ = ["ShardedState"]


def _check(opt) -> None:
    if not all(hasattr(opt, a) for a in ("update", "buffers", "slots", "decays", "adapts")):
        raise ValueError(f"train.zero.stage > 0 supports hvd_bert's Lamb, NVLamb, AdamW, Lars and SGD (an "
                         f"optimizer with update(w, g, state, pieces, t, lr, complete)), not "
                         f"{type(opt).__name__}")


class ShardedState:
    """This rank's shard of the optimizer state and the collectives of a ZeRO step."""

    def __init__(self, optimizer, variables: list, *, stage: int, compression=hvd.Compression.none):
        self.optimizer, self.variables, self.stage = optimizer, variables, stage
        _check(optimizer)
        self.buffers = tuple(optimizer.buffers)
        self.compression = compression
        self.starts = [0]
        for v in variables:
            self.starts.append(self.starts[-1] + int(tf.size(v)))
        self.decays = [optimizer.decays(v) for v in variables]
        self.adapts = [optimizer.adapts(v) for v in variables]
        self.step_count = 0
        self.native_reduce_scatter = bool(tf.config.list_physical_devices("GPU"))
        self.repartition()

    def repartition(self) -> None:
        """Split the state over the ranks as they are now (at start, and after Horovod elastic
        changed the world: :meth:`recover` then fills the new shards)."""
        self.rank, self.size = hvd.rank(), hvd.size()
        self.part = Z.partition([int(tf.size(v)) for v in self.variables], self.size)
        self.pieces = self.part.pieces(self.rank)
        # which variable each element of the shard belongs to (the padding: one more, excluded)
        seg = np.full(self.part.shard, len(self.variables), np.int32)
        for i, _, pos, n in self.pieces:
            seg[pos:pos + n] = i
        self.shard_pieces = Pieces(self.decays + [False], self.adapts + [False], tf.constant(seg))
        self.state = {n: tf.Variable(tf.zeros([self.part.shard], tf.float32), trainable=False)
                      for n in self.buffers}
        self.grad_shard = tf.Variable(tf.zeros([self.part.shard], tf.float32), trainable=False) \
            if self.stage == 2 else None

    def state_bytes(self) -> int:
        return sum(int(tf.size(t)) * 4 for t in self.state.values())

    # ------------------------------------------------------------------ shards
    def _shard(self, tensors) -> tf.Tensor:
        """This rank's shard of whole tensors (float32, zeros in the padding)."""
        parts = [tf.reshape(tf.cast(tensors[i], tf.float32), [-1])[off:off + n]
                 for i, off, _, n in self.pieces]
        covered = sum(n for *_, n in self.pieces)
        parts.append(tf.zeros([self.part.shard - covered], tf.float32))
        return tf.concat(parts, 0)

    def _flat(self, tensors) -> tf.Tensor:
        flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], 0)
        return tf.concat([flat, tf.zeros([self.part.shard * self.size - self.part.total], tf.float32)], 0)

    def reduce_micro(self, grads: list) -> None:
        """Stage 2: add this rank's shard of the average over ranks of one micro-batch's
        gradients to the shard accumulator (a collective)."""
        block = tf.reshape(self._flat(grads), [self.size, self.part.shard])
        if self.native_reduce_scatter:
            mine = hvd.reducescatter(block, op=hvd.Average, name="hvd_bert.zero.rs")[0]
        else:
            mine = hvd.allreduce(block, op=hvd.Average, name="hvd_bert.zero.rs",
                                 compression=self.compression)[self.rank]
        self.grad_shard.assign_add(mine)

    @staticmethod
    def _allreduce(values: list[float], name: str) -> list[float]:
        return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name).numpy().tolist()

    # ------------------------------------------------------------------ the step
    def step(self, grads: list | None, *, lr: float, inv_scale: float, max_grad_norm: float | None
             ) -> tuple[bool, float]:
        """One step on this rank's shard (stage 1: of the reduced ``grads``; 2: of the shard
        accumulator), then the allgather into the variables. ``(finite, gradient norm)``; a
        non-finite norm changes nothing on any rank."""
        if self.stage == 2:
            g = self.grad_shard.read_value()
            self.grad_shard.assign(tf.zeros_like(self.grad_shard))
        else:
            g = self._shard(grads)
        g = g * inv_scale
        w = self._shard(self.variables)
        gsq = float(tf.reduce_sum(tf.square(tf.cast(g, tf.float64))))
        total = self._allreduce([gsq], "hvd_bert.zero.norms")[0]
        if not math.isfinite(total):
            return False, float("inf")
        gnorm = math.sqrt(total)
        limit = getattr(self.optimizer, "max_grad_norm", None)
        limit = limit if limit is not None else max_grad_norm
        clip = limit / gnorm if limit is not None and gnorm > limit else 1.0
        g = g * clip
        self.step_count += 1
        # the optimizer's rule on this rank's pieces, the whole variables' norms by an allreduce
        w, new = self.optimizer.update(w, g, {n: self.state[n].read_value() for n in self.buffers},
                                       self.shard_pieces, self.step_count, lr, complete=self._complete)
        for n in self.buffers:
            self.state[n].assign(new[n])
        self._allgather(w)
        return True, gnorm

    @staticmethod
    def _complete(sq: tf.Tensor) -> tf.Tensor:
        """The whole variables' sums of squares from every rank's pieces (a collective)."""
        total = hvd.allreduce(tf.cast(sq, tf.float64), op=hvd.Sum, name="hvd_bert.zero.piece_norms")
        return tf.cast(total, sq.dtype)

    def _allgather(self, w: tf.Tensor) -> None:
        full = tf.reshape(hvd.allgather(w[None], name="hvd_bert.zero.ag"), [-1])
        for i, v in enumerate(self.variables):
            v.assign(tf.cast(tf.reshape(full[self.starts[i]:self.starts[i + 1]], v.shape), v.dtype))

    # ------------------------------------------------------------------ checkpoints
    def fresh_optimizer(self):
        """An optimizer of the same configuration with its slots built (what a checkpoint
        holds; rank 0 only, for as long as a save or a resume takes)."""
        o = type(self.optimizer).from_config(self.optimizer.get_config())
        o.build(self.variables)
        return o

    def consolidated_optimizer(self):
        """Rank 0: a fresh optimizer holding every rank's shard of the state, received buffer by
        buffer, shard by shard (None elsewhere; a collective)."""
        fresh = self.fresh_optimizer() if self.rank == 0 else None
        for name in self.buffers:
            flat = []
            for r in range(self.size):
                got = hvd.broadcast(self.state[name].read_value(), root_rank=r,
                                    name=f"hvd_bert.zero.save.{name}.{r}")
                if fresh is not None:
                    flat.append(got)
            if fresh is not None:
                full = tf.concat(flat, 0)
                for i, slot in enumerate(fresh.slots(name)):
                    slot.assign(tf.reshape(full[self.starts[i]:self.starts[i + 1]], slot.shape))
        if fresh is not None:
            fresh.applied_steps.assign(self.step_count)
            fresh.iterations.assign(self.step_count)
            fresh.learning_rate.assign(self.optimizer.learning_rate)
        return fresh

    def load_sharded(self, fresh) -> None:
        """This rank's shard of the state a restored optimizer holds on rank 0 (a collective)."""
        step = int(fresh.applied_steps.numpy()) if fresh is not None else 0
        self.step_count = hvd.broadcast_object(step, root_rank=0, name="hvd_bert.zero.load.step")
        for name in self.buffers:
            full = self._flat(fresh.slots(name)) if fresh is not None else None
            for r in range(self.size):
                shard = tf.zeros([self.part.shard], tf.float32)
                if full is not None:
                    lo, hi = self.part.bounds(r)
                    shard = full[lo:hi]
                got = hvd.broadcast(shard, root_rank=0, name=f"hvd_bert.zero.load.{name}.{r}")
                if r == self.rank:
                    self.state[name].assign(got)

    # ------------------------------------------------------------------ elastic
    def commit(self) -> dict:
        """What an elastic commit keeps (a collective): this rank's shard and its ring neighbour's
        (``core.zero.committed_shards``, sent by an alltoall) in host memory, 2/N of the state."""
        shards = {self.rank: {n: self.state[n].numpy() for n in self.buffers}}
        if self.size > 1 and self.buffers:
            mine = tf.reshape(tf.stack([self.state[n] for n in self.buffers]), [1, -1])
            splits = np.zeros(self.size, np.int32)
            splits[(self.rank - 1) % self.size] = 1  # Horovod: to the ring neighbour before this rank
            got, _ = hvd.alltoall(mine, splits=tf.constant(splits), name="hvd_bert.zero.commit")
            got = tf.reshape(got, [len(self.buffers), -1]).numpy()
            shards[(self.rank + 1) % self.size] = {n: got[i].copy() for i, n in enumerate(self.buffers)}
        return {"world_size": self.size, "step": self.step_count, "shards": shards}

    def recover(self, commit: dict | None) -> dict | None:
        """This world's shards (after :meth:`repartition`) rebuilt from the ranks' commits (a
        collective; ``core.zero.recovery`` says which rank sends each old shard). Returns the
        commit in the new world (None: nobody had committed)."""
        plan = Z.recovery(hvd.allgather(tf.constant([Z.commit_row(commit)], tf.int64),
                                        name="hvd_bert.zero.recover").numpy().tolist())
        if plan is None:
            return None
        old_size, step, holder = plan
        old = Z.partition(self.part.sizes, old_size)
        self.step_count = step
        for name in self.buffers:
            shard = np.zeros(self.part.shard, np.float32)
            for j in range(old_size):
                src = commit["shards"][j][name] if holder[j] == self.rank else np.zeros(old.shard, np.float32)
                got = hvd.broadcast(tf.constant(src), root_rank=holder[j],
                                    name=f"hvd_bert.zero.recover.{name}.{j}").numpy()
                cut = Z.overlap(old, j, self.part, self.rank)
                if cut is not None:
                    shard[cut[2]:cut[3]] = got[cut[0]:cut[1]]
            self.state[name].assign(shard)
        return self.commit()

    def drop_gradients(self) -> None:
        if self.grad_shard is not None:
            self.grad_shard.assign(tf.zeros_like(self.grad_shard))
