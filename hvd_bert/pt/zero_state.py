"""The optimizer state's shards of ZeRO (:class:`hvd_bert.pt.zero.ShardedOptimizer`, a subclass)
in and out: a consolidated checkpoint's state gathered to rank 0 or sent from it shard by shard,
a tensor-parallel rank's own share, and Horovod elastic's commits (a rank's shard and its ring
neighbour's) from which the new world's shards are rebuilt after a lost rank."""

from __future__ import annotations

import torch
import horovod.torch as hvd

from hvd_bert.core import zero as Z

__all__ = ["ShardStates"]


class ShardStates:
    """The checkpoint and elastic methods of :class:`hvd_bert.pt.zero.ShardedOptimizer`."""

    def consolidated_state_dict(self) -> dict | None:
        """The unsharded optimizer's ``state_dict`` on rank 0 (None elsewhere), received buffer
        by buffer, shard by shard (a collective)."""
        full = {}
        for name in self.buffers:
            flat = None
            if self.rank == 0:
                flat = torch.empty(self.part.shard * self.size, dtype=self.state[name].dtype)
            for r in range(self.size):
                shard = self.state[name] if r == self.rank else torch.empty_like(self.state[name])
                got = shard if self.size == 1 else hvd.broadcast(
                    shard, root_rank=self.roots[r], name=f"hvd_bert.zero.save.{name}.{r}",
                    process_set=self.process_set)
                if flat is not None:
                    lo, hi = self.part.bounds(r)
                    flat[lo:hi].copy_(got.cpu())
            full[name] = flat
        if self.rank != 0:
            return None
        sd = self.optimizer.state_dict()
        state = {}
        for i, p in enumerate(self.params):
            entry = {}
            if self.has_step:
                entry["step"] = torch.tensor(float(self.step_count), dtype=torch.float32)
            for name in self.buffers:
                entry[name] = full[name][self.starts[i]:self.starts[i + 1]].view(p.shape)
            state[i] = entry
        sd["state"] = state
        return sd

    def load_sharded(self, state_dict: dict | None) -> None:
        """This rank's shard of a stage-0-format optimizer state that rank 0 holds (a
        collective; ``state_dict`` is read on rank 0 only)."""
        step = None
        if self.rank == 0:
            states = [state_dict["state"].get(i, {}) for i in range(len(self.params))]
            step = int(float(states[0]["step"])) if self.has_step and states and "step" in states[0] else 0
        self.step_count = hvd.broadcast_object(step, root_rank=self.roots[0], name="hvd_bert.zero.load.step",
                                               process_set=self.process_set)
        for name in self.buffers:
            for r in range(self.size):
                shard = torch.zeros_like(self.state[name])
                if self.rank == 0:
                    lo, hi = self.part.bounds(r)
                    self._read([s.get(name) for s in states], lo, hi, shard)
                got = hvd.broadcast(shard, root_rank=self.roots[0], name=f"hvd_bert.zero.load.{name}.{r}",
                                    process_set=self.process_set)
                if r == self.rank:
                    self.state[name].copy_(got)

    def load_local(self, state_dict: dict) -> None:
        """This rank's shard of a stage-0-format optimizer state that every rank holds (no
        collective: under tensor parallelism each rank was sent its share whole)."""
        states = [state_dict["state"].get(i, {}) for i in range(len(self.params))]
        first = states[0] if states else {}
        self.step_count = int(float(first["step"])) if self.has_step and "step" in first else 0
        lo, hi = self.part.bounds(self.rank)
        for name in self.buffers:
            self._read([st.get(name) for st in states], lo, hi, self.state[name])

    # ------------------------------------------------------------------ elastic
    def commit(self) -> dict:
        """What an elastic commit keeps of the optimizer state (a collective): this rank's shard and
        a copy of its ring neighbour's (rank r + 1's, sent by an alltoall), in host memory: 2/N of
        the state per rank, from which the loss of any one rank is recovered (:meth:`recover`)."""
        shards = {self.rank: {n: self.state[n].to("cpu", copy=True) for n in self.buffers}}
        if self.size > 1 and self.buffers:  # (Z.committed_shards: this one and rank + 1's)
            mine = torch.stack([self.state[n] for n in self.buffers]).reshape(1, -1)
            splits = torch.zeros(self.size, dtype=torch.int32)
            splits[(self.rank - 1) % self.size] = 1  # Horovod: to the ring neighbour before this rank
            got, _ = hvd.alltoall(mine, splits=splits, name="hvd_bert.zero.commit",
                                  process_set=self.process_set)
            got = got.reshape(len(self.buffers), -1).cpu()
            shards[(self.rank + 1) % self.size] = {n: got[i].clone() for i, n in enumerate(self.buffers)}
        return {"world_size": self.size, "step": self.step_count, "shards": shards}

    @staticmethod
    def commit_bytes(commit: dict) -> int:
        return sum(t.numel() * t.element_size() for s in commit["shards"].values() for t in s.values())

    def recover(self, commit: dict | None) -> dict | None:
        """This world's shards (after :meth:`repartition`) from the commits the ranks hold now (a
        collective; a worker that joined holds none): each old shard is broadcast once by a rank
        that holds it, and every rank keeps what falls in its new shard. Returns this rank's
        commit in the new world (None when no rank had committed: the state stays fresh).
        Raises ``core.zero.LostShards`` when a shard was held by ranks that are all gone (two
        neighbours)."""
        plan = Z.recovery(hvd.allgather(torch.tensor([Z.commit_row(commit)], dtype=torch.int64),
                                        name="hvd_bert.zero.recover", process_set=self.process_set).tolist())
        if plan is None:
            return None
        old_size, step, holder = plan
        old = Z.partition(self.part.sizes, old_size)
        self.step_count = step
        for name in self.buffers:
            self.state[name].zero_()
            for j in range(old_size):
                src = commit["shards"][j][name] if holder[j] == self.rank else \
                    torch.empty(old.shard, dtype=self.state[name].dtype)
                got = hvd.broadcast(src, root_rank=self.roots[holder[j]],
                                    name=f"hvd_bert.zero.recover.{name}.{j}", process_set=self.process_set)
                cut = Z.overlap(old, j, self.part, self.rank)
                if cut is not None:
                    self.state[name][cut[2]:cut[3]].copy_(got[cut[0]:cut[1]])
        return self.commit()

