"""Rank 1 raises after init; rank 0 then waits in an allreduce that can never complete.
The launcher must end the job with a non-zero status rather than hang."""

import torch
import horovod.torch as hvd

hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("rank 1 failed on purpose")
hvd.allreduce(torch.ones(1))
