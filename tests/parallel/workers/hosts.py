"""One Horovod rank of a multi-host run: where it is (host name, rank, local and cross rank)
and an allreduce of a 3 MB tensor whose exact sum the test knows.

    horovodrun -np 4 -H node1:2,node2:2 --gloo --network-interface eth0 python hosts.py OUT_DIR

Each rank writes OUT_DIR/rank<r>.json.
"""

import json
import os
import socket
import sys

import numpy as np

import hvd_bert  # noqa: F401  (sets TF_USE_LEGACY_KERAS before anything loads TensorFlow)

N = 750_000


def contribution(rank: int) -> np.ndarray:
    """Integers in float32 (exact sums in any order): the result must be bit-identical."""
    return ((np.arange(N, dtype=np.int64) * (rank + 3)) % 1021).astype(np.float32)


def main(out: str) -> None:
    import horovod.torch as hvd
    import torch

    hvd.init()  # Horovod:
    r = hvd.rank()
    total = hvd.allreduce(torch.from_numpy(contribution(r)), op=hvd.Sum, name="hosts.sum").numpy()
    want = sum(contribution(i).astype(np.float64) for i in range(hvd.size()))
    # a float sum whose value depends on the order of summation: the same placement of ranks
    # must give the same bits on one host and on several
    noisy = hvd.allreduce(torch.from_numpy(np.float32(1.0 / (r + 1.7)) * np.linspace(0.1, 3.0, 1000,
                                                                                    dtype=np.float32)),
                          op=hvd.Sum, name="hosts.noisy").numpy()
    hosts = hvd.allgather_object(socket.gethostname())
    res = dict(rank=r, size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
               cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), host=socket.gethostname(),
               hosts=hosts, exact=bool(np.array_equal(total.astype(np.float64), want)),
               noisy=noisy.tolist(), pid=os.getpid(),
               hierarchical=os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", ""))
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])
