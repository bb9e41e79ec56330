"""One rank of tests/parallel/test_zero_commit.py: ZeRO's elastic commit (``ShardedOptimizer.commit``:
a rank's shard and its ring neighbour's) and its recovery after ranks are lost
(``ShardedOptimizer.recover``), under real Horovod.

    python zero_commit.py LOST OUT_DIR

Every rank of the world fills its shard of each LAMB buffer with the buffer's known values
(``value(buffer, flat index)``), commits, and records the commit's bytes. The ranks not in LOST
(a comma-separated list) then form a process set, the world after the loss; a ShardedOptimizer over
it recovers its shards from their commits. Each survivor records whether its new shard holds the
known values, or the error the recovery raised; each lost rank records only its commit."""

import json
import os
import sys

import horovod.torch as hvd
import torch

from hvd_bert.config import OptimConfig
from hvd_bert.pt import init_horovod
from hvd_bert.pt.optim import build_optimizer
from hvd_bert.pt.zero import ShardedOptimizer


def value(b: int, idx: torch.Tensor) -> torch.Tensor:
    return (idx.double() * 0.001 + 10 * b + 1).float()


def fill(z: ShardedOptimizer) -> None:
    lo, _ = z.part.bounds(z.rank)
    idx = torch.arange(lo, lo + z.part.shard)
    for b, name in enumerate(z.buffers):
        z.state[name].copy_(torch.where(idx < z.part.total, value(b, idx), torch.zeros(())))


def main():
    lost, out = [int(x) for x in sys.argv[1].split(",") if x], sys.argv[2]
    init_horovod(process_sets=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(13, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    opt = build_optimizer(model.named_parameters(), OptimConfig(name="lamb"))
    z = ShardedOptimizer(opt, stage=1)
    fill(z)
    commit = z.commit()
    result = {"rank": hvd.rank(), "commit_bytes": z.commit_bytes(commit), "state_bytes": z.state_bytes(),
              "total_bytes": z.part.total * 4 * len(z.buffers), "held": sorted(commit["shards"])}
    survivors = [r for r in range(hvd.size()) if r not in lost]
    # (every rank registers it, the same order; Horovod's set of every rank is the global one)
    after = hvd.global_process_set if not lost else hvd.add_process_set(survivors)
    if hvd.rank() in survivors:
        z2 = ShardedOptimizer(opt, stage=1, process_set=after)
        try:
            z2.recover(commit)
            lo, _ = z2.part.bounds(z2.rank)
            idx = torch.arange(lo, lo + z2.part.shard)
            ok = all(torch.equal(z2.state[n][idx < z2.part.total], value(b, idx[idx < z2.part.total]))
                     for b, n in enumerate(z2.buffers))
            result.update(recovered=ok, new_world=z2.size, error=None)
        except RuntimeError as e:
            result.update(recovered=False, error=str(e))
    hvd.barrier()
    with open(os.path.join(out, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
