"""One rank of `hvd-bert simulate --calibrate`: times Horovod allreduces of several sizes
(PyTorch, fp32) and prints them from rank 0."""

import json
import time

import torch
import horovod.torch as hvd

hvd.init()
sizes = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
out = []
for s in sizes:
    t = torch.ones(s // 4)
    for _ in range(3):
        hvd.allreduce(t, name=f"warm{s}")
    reps = 20 if s < 2**20 else 5
    t0 = time.perf_counter()
    for _ in range(reps):
        hvd.allreduce(t, name=f"probe{s}")
    out.append((s, (time.perf_counter() - t0) / reps))
if hvd.rank() == 0:
    print("PROBE " + json.dumps({"size": hvd.size(), "points": out}))
