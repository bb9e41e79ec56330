"""Optimizer step time on a BERT-Base-sized parameter set (110M fp32 parameters in BERT's
tensor shapes): hvd_bert's Lamb / NVLamb / Lars against torch-optimizer's Lamb, a naive
per-tensor LAMB loop, torch's AdamW (foreach), and the memory-traffic floor (the bytes the
update must read and write over this machine's measured copy bandwidth).

    .venv/bin/python benchmarks/optimizer_step.py [--preset base] [--repeats 5] [--json out.json]
"""

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bert_shapes import bert_parameter_shapes  # noqa: E402

from hvd_bert.common.config import OptimConfig  # noqa: E402
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
    """Bytes moved per second by a large tensor copy (read + write)."""
    a = torch.empty(nbytes // 4)
    b = torch.empty_like(a)
    a.uniform_()
    b.copy_(a)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times)


def make_params(preset):
    torch.manual_seed(0)
    named = [(n, torch.nn.Parameter(torch.randn(s) * 0.02)) for n, s in bert_parameter_shapes(preset)]
    for _, p in named:
        p.grad = torch.randn_like(p) * 1e-3
    return named


def time_steps(opt, repeats):
    opt.step()  # creates the state: not timed
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


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
    candidates = {
        "hvd_bert Lamb (foreach)": lambda ps: Lamb(param_groups(ps, cfg), lr=1e-3, weight_decay=0.01),
        "hvd_bert NVLamb (foreach)": lambda ps: NVLamb(
            param_groups(ps, OptimConfig(name="nvlamb")), lr=1e-3),
        "hvd_bert Lars (foreach)": lambda ps: Lars(
            param_groups(ps, OptimConfig(name="lars", weight_decay=1e-4)), lr=1.0),
        "naive per-tensor LAMB loop": lambda ps: NaiveLamb([p for _, p in ps]),
        "torch AdamW (foreach)": lambda ps: torch.optim.AdamW([p for _, p in ps], foreach=True),
    }
    try:
        import torch_optimizer
        candidates["torch-optimizer Lamb 0.3.0"] = lambda ps: torch_optimizer.Lamb([p for _, p in ps])
    except ImportError:
        print("torch-optimizer not installed (pip install -r requirements-bench.txt): skipped")
    # Minimum traffic in bytes per parameter (fp32): LAMB/AdamW read w, g, m, v and write
    # w, m, v (7 x 4 B); LARS reads w, g, v and writes w, v (5 x 4 B).
    floor_bytes = {"Lars": 5 * 4, "default": 7 * 4}
    rows = []
    for name, make in candidates.items():
        for _, p in named:  # fresh state for each candidate
            p.grad = p.grad
        opt = make(named)
        med, best = time_steps(opt, args.repeats)
        per_param = floor_bytes["Lars"] if "Lars" in name else floor_bytes["default"]
        floor = per_param * n / bw
        rows.append(dict(optimizer=name, median_s=med, min_s=best, floor_s=floor,
                         x_floor=med / floor))
        del opt
    base = next(r["median_s"] for r in rows if r["optimizer"] == "hvd_bert Lamb (foreach)")
    print(f"\nparameters: {n / 1e6:.1f}M fp32 in {len(named)} tensors ({args.preset}); "
          f"copy bandwidth {bw / 1e9:.2f} GB/s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print(f"{'optimizer':<30} {'median s':>9} {'x floor':>8} {'vs hvd_bert Lamb':>17}")
    for r in rows:
        print(f"{r['optimizer']:<30} {r['median_s']:>9.3f} {r['x_floor']:>8.2f} "
              f"{r['median_s'] / base:>16.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(params=n, copy_bw=bw, rows=rows), indent=1))
    assert all(math.isfinite(p.detach().sum()) for _, p in named)


if __name__ == "__main__":
    main()
