"""Optimizer step time on a BERT-Base-sized parameter set (110M fp32 parameters in BERT's
tensor shapes): hvd_bert's Lamb / NVLamb / Lars against torch-optimizer's Lamb, a naive
per-tensor LAMB loop, torch's AdamW (foreach), and the memory-traffic floor (the bytes the
update must read and write over this machine's measured copy bandwidth). hvd_bert's
optimizers run twice: through the fused CPU kernels (``hvd_bert.pt.kernels.optim``, the
default) and through the foreach path (``HVD_BERT_FUSED_OPTIM=0``). The candidates take their
steps in turn, round after round (one step each per round), so the machine's drift hits all
of them alike.

    .venv/bin/python benchmarks/optimizer_step.py [--preset base] [--repeats 5] [--json out.json]
"""

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bert_shapes import bert_parameter_shapes  # noqa: E402

from hvd_bert.config import OptimConfig  # noqa: E402
from hvd_bert.pt.optim import Lamb, Lars, NVLamb, param_groups  # noqa: E402


class NaiveLamb(torch.optim.Optimizer):
    """LAMB written the obvious way: a Python loop over tensors, one op at a time."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                g = p.grad
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
                m_hat = st["m"] / (1 - b1 ** st["t"])
                v_hat = st["v"] / (1 - b2 ** st["t"])
                u = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                wn, un = p.norm(), u.norm()
                ratio = (wn / un) if wn > 0 and un > 0 else 1.0
                p.sub_(group["lr"] * ratio * u)


def copy_bandwidth(nbytes=512 * 2**20, repeats=5):
    """Bytes moved per second over a large tensor: the better of a copy (read + write) and
    an in-place add (a, b read, a written: the optimizers' in-place pattern, which pays no
    write-allocate read). The faster of the two makes the floor the stricter."""
    a = torch.empty(nbytes // 4)
    b = torch.empty_like(a)
    a.uniform_()
    b.copy_(a)
    copy, add = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        copy.append(time.perf_counter() - t)
        t = time.perf_counter()
        b.add_(a)
        add.append(time.perf_counter() - t)
    return max(2 * nbytes / statistics.median(copy), 3 * nbytes / statistics.median(add))


def make_params(preset):
    torch.manual_seed(0)
    named = [(n, torch.nn.Parameter(torch.randn(s) * 0.02)) for n, s in bert_parameter_shapes(preset)]
    for _, p in named:
        p.grad = torch.randn_like(p) * 1e-3
    return named


@contextlib.contextmanager
def fused_kernels(on: bool):
    old = os.environ.get("HVD_BERT_FUSED_OPTIM")
    os.environ["HVD_BERT_FUSED_OPTIM"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HVD_BERT_FUSED_OPTIM"]
        else:
            os.environ["HVD_BERT_FUSED_OPTIM"] = old


def timed_step(opt, fused):
    with fused_kernels(fused):
        t = time.perf_counter()
        opt.step()
        return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    named = make_params(args.preset)
    n = sum(p.numel() for _, p in named)
    bw = copy_bandwidth()
    cfg = OptimConfig(name="lamb", weight_decay=0.01)
    ours = {
        "Lamb": lambda ps: Lamb(param_groups(ps, cfg), lr=1e-3, weight_decay=0.01),
        "NVLamb": lambda ps: NVLamb(param_groups(ps, OptimConfig(name="nvlamb")), lr=1e-3),
        "Lars": lambda ps: Lars(param_groups(ps, OptimConfig(name="lars", weight_decay=1e-4)), lr=1.0),
    }
    candidates = {}  # name: (make, fused kernels on)
    for fused, label in ((True, "fused"), (False, "foreach")):
        for opt_name, make in ours.items():
            candidates[f"hvd_bert {opt_name} ({label})"] = (make, fused)
    candidates["naive per-tensor LAMB loop"] = (lambda ps: NaiveLamb([p for _, p in ps]), False)
    candidates["torch AdamW (foreach)"] = (
        lambda ps: torch.optim.AdamW([p for _, p in ps], foreach=True), False)
    try:
        import torch_optimizer
        candidates["torch-optimizer Lamb 0.3.0"] = (
            lambda ps: torch_optimizer.Lamb([p for _, p in ps]), False)
    except ImportError:
        print("torch-optimizer not installed (pip install -r requirements-bench.txt): skipped")
    # Minimum traffic in bytes per parameter (fp32): LAMB/AdamW read w, g, m, v and write
    # w, m, v (7 x 4 B); LARS reads w, g, v and writes w, v (5 x 4 B).
    floor_bytes = {"Lars": 5 * 4, "default": 7 * 4}
    opts = {}
    for name, (make, fused) in candidates.items():
        opts[name] = make(named)
        timed_step(opts[name], fused)  # creates the state: not timed
    times = {name: [] for name in candidates}
    bws = [bw]
    for _ in range(args.repeats):
        for name, (_, fused) in candidates.items():
            times[name].append(timed_step(opts[name], fused))
        bws.append(copy_bandwidth())
    bw = statistics.median(bws)
    rows = []
    for name in candidates:
        med, best = statistics.median(times[name]), min(times[name])
        per_param = floor_bytes["Lars"] if "Lars" in name else floor_bytes["default"]
        floor = per_param * n / bw
        rows.append(dict(optimizer=name, median_s=med, min_s=best, floor_s=floor,
                         x_floor=med / floor))
    base = next(r["median_s"] for r in rows if r["optimizer"] == "hvd_bert Lamb (fused)")
    print(f"\nparameters: {n / 1e6:.1f}M fp32 in {len(named)} tensors ({args.preset}); "
          f"copy bandwidth {bw / 1e9:.2f} GB/s (median of {len(bws)}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"{'optimizer':<30} {'median s':>9} {'x floor':>8} {'vs hvd_bert Lamb (fused)':>25}")
    for r in rows:
        print(f"{r['optimizer']:<30} {r['median_s']:>9.3f} {r['x_floor']:>8.2f} "
              f"{r['median_s'] / base:>24.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(params=n, copy_bw=bw, rows=rows), indent=1))
    assert all(math.isfinite(p.detach().sum()) for _, p in named)


if __name__ == "__main__":
    main()
