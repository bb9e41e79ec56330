"""Where a fused LARS step's time goes, on BERT-Base's parameter set (110M fp32 parameters in
its tensor shapes), against what the memory of this machine can do.

A LARS step with trust ratios is two passes over each tensor: the norms (read w and g, 8 B a
parameter) and the update (read w, g, v, write w, v, 20 B: the floor). This times, in
interleaved rounds (one call each per round, medians):
  - the whole step (``hvd_bert.pt.kernels.optim.lars_step``, trust ratios on);
  - the update pass alone (the same kernel without trust ratios: one pass, the floor's 20 B);
  - the norms pass alone (``sumsq`` over w and g: a read-only pass);
and the machine's bandwidth for each access pattern over 512 MiB: a read-only sum of squares
(R), an in-place add (M: two arrays read, one written) and a copy. The step's floor is
20 B / M per parameter; two passes cannot go below 8 B / R + 20 B / M, so the best a two-pass
step can reach is ``1 + 0.4 M / R`` times its floor.

    .venv/bin/python benchmarks/lars_passes.py [--rounds 11] [--json out.json]
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bert_shapes import bert_parameter_shapes  # noqa: E402

from hvd_bert.pt.kernels import optim as fused_optim  # noqa: E402


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not fused_optim.usable([torch.zeros(1)]):
        raise SystemExit("lars_passes: the fused CPU kernels are off or could not be built")
    torch.manual_seed(0)
    w = [torch.randn(s) * 0.02 for _, s in bert_parameter_shapes("base")]
    g = [torch.randn_like(x) * 1e-3 for x in w]
    v = [torch.zeros_like(x) for x in w]
    n = sum(x.numel() for x in w)
    big = torch.rand(512 * 2**18)  # 512 MiB of fp32
    other = torch.rand_like(big)
    copy_into = torch.empty_like(big)
    cases = {
        "LARS step (norms + update)": lambda: fused_optim.lars_step(w, g, v, 1e-3, 0.9, 1e-4, 1e-3, 0.0, True),
        "update pass alone": lambda: fused_optim.lars_step(w, g, v, 1e-3, 0.9, 0.0, 1e-3, 0.0, False),
        "norms pass alone (w and g)": lambda: fused_optim.sumsq(w + g),
        "bw: read-only sum of squares": lambda: fused_optim.sumsq([big]),
        "bw: in-place add": lambda: other.add_(big),
        "bw: copy": lambda: copy_into.copy_(big),
    }
    for fn in cases.values():  # warm-up: the kernels' build, first touches
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(a.rounds):
        for k, fn in cases.items():
            times[k].append(timed(fn))
    med = {k: statistics.median(ts) for k, ts in times.items()}
    nbytes = big.numel() * 4
    read_bw = nbytes / med["bw: read-only sum of squares"]
    add_bw = 3 * nbytes / med["bw: in-place add"]
    copy_bw = 2 * nbytes / med["bw: copy"]
    floor = 20 * n / max(add_bw, copy_bw)
    bound = 8 * n / read_bw + floor
    print(f"{n / 1e6:.1f}M fp32 parameters (BERT-Base shapes), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.machine()}, {a.rounds} rounds")
    print(f"bandwidth: read-only {read_bw / 1e9:.1f} GB/s, in-place add {add_bw / 1e9:.1f} GB/s, "
          f"copy {copy_bw / 1e9:.1f} GB/s")
    for k in ("LARS step (norms + update)", "update pass alone", "norms pass alone (w and g)"):
        print(f"  {k:<28} {med[k] * 1e3:8.1f} ms  {med[k] / floor:5.2f}x floor")
    print(f"  {'floor (20 B/param at the better of add and copy)':<28} {floor * 1e3:8.1f} ms")
    print(f"  {'two-pass bound (+ 8 B/param read-only)':<28} {bound * 1e3:8.1f} ms  {bound / floor:5.2f}x floor")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "params": n, "threads": torch.get_num_threads(), "rounds": a.rounds,
            "median_s": med, "read_bw": read_bw, "add_bw": add_bw, "copy_bw": copy_bw,
            "floor_s": floor, "two_pass_bound_s": bound}, indent=1))


if __name__ == "__main__":
    main()
