"""One rank of `hvd-bert simulate --calibrate`: times Horovod allreduces of several sizes
(PyTorch, fp32) and prints them from rank 0 (run as ``python -m hvd_bert.cluster.allreduce_probe``
under a launcher; importing it starts nothing)."""

import json
import time

__all__ = ["probe", "main"]

SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB


def probe(sizes=SIZES) -> list[tuple[int, float]]:
    """(bytes, seconds per allreduce) for each size, on the world Horovod was started with."""
    import torch
    import horovod.torch as hvd

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
    return out


def main() -> None:
    import horovod.torch as hvd

    hvd.init()
    points = probe()
    if hvd.rank() == 0:
        print("PROBE " + json.dumps({"size": hvd.size(), "points": points}))


if __name__ == "__main__":
    main()
