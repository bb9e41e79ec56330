"""The smallest Horovod program: every rank contributes its rank number, all receive the sum.

    horovodrun -np 2 -H localhost:2 --gloo python examples/allreduce.py
"""

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: sum of ranks = {total.item():g}", flush=True)
