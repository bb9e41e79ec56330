"""The interconnect lessons on a real (fake) two-node cluster with a slow link: a training step
whose allreduce dominates, timed with k = 1, 2, 4, 8 micro-batches per step
(``backward_passes_per_step``: accumulate locally, communicate once per step), with and without
fp16 compression, against the alpha-beta model of ``hvd-bert simulate`` fitted to the same link.

    sudo .venv/bin/python benchmarks/shaped_link.py [--rate 300mbit] [--json out.json] [--plot out.png]

It brings up 2 nodes x 2 ranks with ``scripts/fake_cluster.sh`` (links shaped by tc tbf), runs
everything from node1 and takes the cluster down again. In one launch the worker (this file,
``--worker``) times, per configuration, Horovod's DistributedOptimizer on an MLP of about 4.2M
parameters (17 MB of fp32 gradients in 34 tensors; BERT-Base's 110M would take a minute per
allreduce at these rates) and, first, the same micro-batch without any communication (the
compute time the model is given). A second launch runs ``hvd-bert simulate --calibrate``'s
allreduce probe on the same 4 ranks; the fitted ring model then projects every configuration.

Hierarchical allreduce is not measured: Horovod 0.28 has it only through NCCL (a CPU build
switches HOROVOD_HIERARCHICAL_ALLREDUCE off at init), so "flat" is the only CPU algorithm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, LAYERS, LOCAL_B = 512, 16, 96
KS = (1, 2, 4, 8)


def worker(steps: int, out: str) -> None:
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)
    hvd.init()  # Horovod:

    def build():
        torch.manual_seed(0)
        layers = []
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))

    x, y = torch.randn(LOCAL_B, HIDDEN), torch.randn(LOCAL_B, 1)
    loss_fn = torch.nn.MSELoss()
    model = build()
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))

    # compute alone: forward + backward of one micro-batch, no communication
    for _ in range(3):
        loss_fn(model(x), y).backward()
    t0 = time.perf_counter()
    for _ in range(10):
        loss_fn(model(x), y).backward()
    compute = hvd.allreduce(torch.tensor((time.perf_counter() - t0) / 10), op=hvd.Average,
                            name="compute").item()

    rows = []
    for fp16 in (False, True):
        for k in KS:
            model = build()
            opt = hvd.DistributedOptimizer(  # Horovod:
                torch.optim.SGD(model.parameters(), lr=1e-4), named_parameters=model.named_parameters(),
                backward_passes_per_step=k,
                compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none)
            times = []
            for s in range(steps + 1):
                hvd.allreduce(torch.zeros(1), name=f"sync.{fp16}.{k}.{s}")  # start the step together
                t0 = time.perf_counter()
                for _ in range(k):
                    (loss_fn(model(x), y) / k).backward()
                opt.step()
                opt.zero_grad()
                if s:  # the first step pays for set-up
                    times.append(time.perf_counter() - t0)
            step = hvd.allreduce(torch.tensor(statistics.median(times)), op=hvd.Average,
                                 name=f"t.{fp16}.{k}").item()
            rows.append(dict(k=k, fp16=fp16, step_s=step, per_micro_batch_s=step / k))
    if hvd.rank() == 0:
        Path(out).write_text(json.dumps(dict(size=hvd.size(), params=params, tensors=tensors,
                                             local_batch=LOCAL_B, compute_s=compute, rows=rows)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="300mbit", help="tc tbf rate of every node's link")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration (the median)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "shaped_link.json"))
    ap.add_argument("--plot", default=str(ROOT / "benchmarks" / "results" / "shaped_link.png"))
    ap.add_argument("--worker", nargs=2, metavar=("STEPS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1])
        return 0

    from hvd_bert.cluster import launch
    from hvd_bert.core import cost_model as S

    if not launch.is_root():
        print("shaped_link: needs root (network namespaces): sudo .venv/bin/python benchmarks/shaped_link.py",
              file=sys.stderr)
        return 2
    env = dict(os.environ, FAKE_CLUSTER_PREFIX="hvdb", FAKE_CLUSTER_NET="10.213.11",
               FAKE_CLUSTER_STATE="/run/hvd_bert_bench_cluster", OMP_NUM_THREADS="1")
    script = str(ROOT / "scripts" / "fake_cluster.sh")
    names = ("FAKE_CLUSTER_PREFIX", "FAKE_CLUSTER_NET", "FAKE_CLUSTER_STATE")
    prefix = ["env", *[f"{k}={env[k]}" for k in names], "bash", script, "exec", "node1"]
    subprocess.run(["bash", script, "up", "2", "--link-rate", args.rate], env=env, check=True)
    try:
        out = Path("/tmp") / f"shaped_link-{os.getpid()}.json"
        t0 = time.time()
        res = launch.run([__file__, "--worker", str(args.steps), str(out)], np=4, hosts="node1:2,node2:2",
                         nic="eth0", prefix=prefix, env=env, timeout=1800)
        if not res.ok:
            print(res.explain(), file=sys.stderr)
            return 1
        measured = json.loads(out.read_text())
        out.unlink()
        wall = time.time() - t0
        probe_run = launch.run(["-m", "hvd_bert.cluster.allreduce_probe"], np=4, hosts="node1:2,node2:2", nic="eth0",
                               prefix=prefix, env=env, timeout=900)
        if not probe_run.ok:
            print(probe_run.explain(), file=sys.stderr)
            return 1
    finally:
        subprocess.run(["bash", script, "down"], env=env, check=False)
    probe, alpha, bw = S.fit_probe(probe_run.stdout)
    net = S.Interconnect(alpha, bw, note=f"fitted to the {args.rate} link: alpha {alpha * 1e6:.0f} us, "
                                         f"{bw / 1e6:.1f} MB/s per rank")
    wl = S.Workload("shaped-mlp", measured["params"], measured["tensors"], measured["compute_s"],
                    measured["local_batch"])
    for r in measured["rows"]:
        kw = dict(algorithm="ring", fusion_bytes=128 * S.MIB, fp16=r["fp16"], backward_passes_per_step=r["k"])
        r["model_step_s"] = S.project(wl, measured["size"], net, overlap=True, **kw).step_s
        r["model_error"] = r["model_step_s"] / r["step_s"] - 1
    result = dict(rate=args.rate, ranks="2 nodes x 2 ranks", alpha_s=alpha, bandwidth_Bps=bw,
                  probe=probe["points"], wall_s=wall, command=" ".join(sys.argv), **measured)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))

    print(f"link {args.rate}, 2 nodes x 2 ranks; model {measured['params'] / 1e6:.1f}M parameters "
          f"({measured['params'] * 4 / 1e6:.0f} MB fp32), compute {measured['compute_s'] * 1e3:.0f} ms per "
          f"micro-batch of {LOCAL_B}")
    print(f"fitted ring model: alpha {alpha * 1e6:.0f} us, bandwidth {bw / 1e6:.1f} MB/s per rank")
    print(f"{'k':>2} {'grads':>5} {'step ms':>9} {'per micro-batch':>15} {'model ms':>9} {'model off':>9}")
    for r in measured["rows"]:
        print(f"{r['k']:>2} {'fp16' if r['fp16'] else 'fp32':>5} {r['step_s'] * 1e3:>9.0f} "
              f"{r['per_micro_batch_s'] * 1e3:>15.0f} {r['model_step_s'] * 1e3:>9.0f} "
              f"{r['model_error']:>+9.0%}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for fp16, color in ((False, "tab:blue"), (True, "tab:orange")):
            rows = [r for r in measured["rows"] if r["fp16"] == fp16]
            label = "fp16 gradients" if fp16 else "fp32 gradients"
            ax.plot([r["k"] for r in rows], [r["per_micro_batch_s"] * 1e3 for r in rows], "o-", color=color,
                    label=f"measured, {label}")
            ax.plot([r["k"] for r in rows], [r["model_step_s"] / r["k"] * 1e3 for r in rows], "x--",
                    color=color, label=f"model, {label}")
        ax.axhline(measured["compute_s"] * 1e3, color="gray", lw=0.8, label="compute alone")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k = backward_passes_per_step")
        ax.set_ylabel("ms per micro-batch")
        ax.set_title(f"2 nodes x 2 ranks over a {args.rate} link")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
