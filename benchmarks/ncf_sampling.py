"""NCF training-pair sampling per epoch and rank: hvd_bert's per-rank sampling
(``data.ncf.EpochData``: each rank computes only its own pairs, by position) against the
whole-epoch sampling every rank used to do (``ncf_data.sample_train_negatives`` over all
positives, then every P-th pair), on the same prepared data, in the same run.

    .venv/bin/python benchmarks/ncf_sampling.py --synthetic ml-1m --ranks 2
    .venv/bin/python benchmarks/ncf_sampling.py --data DIR --ranks 2      # a prepared folder

The figure is the median over ``--repeats`` of the seconds for one rank's whole epoch (rank 0
of ``--ranks``), and the peak memory the sampling adds (tracemalloc, numpy's allocations).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data")
    ap.add_argument("--synthetic", default="ml-1m")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=65536, help="global batch")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from hvd_bert.data.ncf import EpochData
    from hvd_bert.data.ncf import _positive_lookup, load_ncf, prepare_ncf, sample_train_negatives

    tmp = None
    if not a.data:
        tmp = tempfile.TemporaryDirectory()
        prepare_ncf(tmp.name + "/d", synthetic=a.synthetic)
    data = load_ncf(a.data or tmp.name + "/d")
    lookup = _positive_lookup(data.train_users, data.train_items, data.n_items)
    ep = EpochData(data, 0, a.ranks, a.batch // a.ranks, 1, 4, seed=0)

    def old(epoch):
        rng = np.random.default_rng([0, epoch])
        u, i, y = sample_train_negatives(data.train_users, data.train_items, data.n_items, 4, rng, lookup)
        return u[0::a.ranks], i[0::a.ranks], y[0::a.ranks]

    def new(epoch):
        return [x for x in ep.epoch(epoch)]

    rows = {}
    for name, fn in (("whole epoch on every rank (before)", old), ("this rank's pairs only (now)", new)):
        times, peak = [], 0
        for r in range(a.repeats):
            tracemalloc.start()
            t = time.perf_counter()
            fn(r)
            times.append(time.perf_counter() - t)
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        rows[name] = (statistics.median(times), peak)
    pairs = len(data.train_users) * 5
    print(f"{a.data or 'synthetic ' + a.synthetic}: {len(data.train_users)} positives, {pairs} pairs per epoch, "
          f"{a.ranks} ranks, rank 0's share")
    base = rows["whole epoch on every rank (before)"][0]
    for name, (s, peak) in rows.items():
        print(f"  {name:<36} {s:7.3f} s  peak {peak / 2**20:8.1f} MiB  x{base / s:.2f}")


if __name__ == "__main__":
    main()
