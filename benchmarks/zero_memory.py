"""Memory per rank and step time of ZeRO stages 0, 1 and 2 (``train.zero.stage``) and of tensor
parallelism (``train.tensor_parallel``) on 2 ranks: a BERT-Large-sized layer stack (24 layers,
hidden 1024, 16 heads, intermediate 4096: 302M parameters, no embeddings) trained with LAMB in
fp32 by hvd_bert's PyTorch engine, each layout its own ``horovodrun -np 2 --gloo`` job, in the
same run. Stage 0 without tensor parallelism is the peer; with ``--tp 2`` both ranks form one
group (one data-parallel replica: half the global batch).

    .venv/bin/python benchmarks/zero_memory.py [--steps 3] [--k 2] [--layers 24] [--tp 2] [--json out.json]
    .venv/bin/python benchmarks/zero_memory.py --collectives     # Horovod's CPU collectives, 100 MB
    .venv/bin/python benchmarks/zero_memory.py --bf16-weights --np 4 --stages 2 --layers 6

``--bf16-weights``: each stage under bf16 autocast twice, with fp32 weights (the peer) and with
bf16 weights over fp32 masters (``train.precision.weights=bf16``), on ``--np`` ranks.

Per rank: the optimizer state the engine holds (its own count of the state tensors' bytes),
the peak resident memory of the process (``ru_maxrss``, after the steps) and the median time
of a step (k micro-batches of 2 x 32 tokens, the reduce, the LAMB step, the allgather).
"""

import argparse
import json
import os
import statistics
import sys
import time

HIDDEN, HEADS, INTER, LOCAL_B, SEQ = 1024, 16, 4096, 2, 32


def worker(stage: int, k: int, steps: int, layers: int, tp: int = 1, precision: int = 0) -> None:
    """``precision``: 0 fp32, 1 bf16 autocast with fp32 weights, 2 bf16 weights over fp32 masters."""
    import resource

    import torch

    from hvd_bert.config.bert import BertConfig
    from hvd_bert.config import TrainConfig, apply_overrides
    from hvd_bert.pt.engine import Engine
    from hvd_bert.pt.models.bert import BertLayer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    c = BertConfig(hidden_size=HIDDEN, num_layers=layers, num_heads=HEADS, intermediate_size=INTER,
                   hidden_dropout=0.0, attention_dropout=0.0)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(BertLayer(c) for _ in range(layers))
    x = torch.randn(LOCAL_B, SEQ, HIDDEN)
    bias = torch.zeros(LOCAL_B, 1, 1, SEQ)

    def loss_fn(m, batch):
        h = batch
        for layer in m.layers:
            h = layer(h, bias)
        return (h.float() ** 2).mean()

    cfg = apply_overrides(TrainConfig(), [
        "optim.name=lamb", "optim.lr=1e-4", "schedule.name=constant", f"batch.local_batch_size={LOCAL_B}",
        f"batch.backward_passes_per_step={k}", f"zero.stage={stage}", f"tensor_parallel={tp}",
        *(["precision.mode=bf16"] if precision else []),
        *(["precision.weights=bf16"] if precision == 2 else [])])
    engine = Engine.from_config(model, cfg, loss_fn=loss_fn)
    if precision == 2:  # (what a bf16 embedding gives the layers; CPU autocast leaves LayerNorm's dtypes)
        x = x.to(torch.bfloat16)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        for _ in range(k):
            res = engine.train_micro_batch(x)
        assert res is not None and not res.skipped
        if i:  # the first step (allocations, the first collectives) is not timed
            times.append(time.perf_counter() - t0)
    mem = engine.memory()
    print("RESULT " + json.dumps(dict(
        stage=stage, tp=tp, rank=engine.rank, precision=["fp32", "bf16", "bf16 weights"][precision],
        weight_bytes=mem["parameters"], params=sum(p.numel() for p in model.parameters()),
        state_bytes=mem["optimizer_state"], grad_bytes=mem["gradients"],
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        median_s=statistics.median(times))), flush=True)


def collectives() -> None:
    """Horovod's allreduce, reduce-scatter and allgather of the same 100 MB on this rank's CPU
    (best of 3 after one warm-up): what stage 2's reduction is built on."""
    import torch
    import horovod.torch as hvd
    hvd.init()
    n = 25_000_000
    x = torch.randn(n)

    def best(f):
        f()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return min(times)
    got = dict(allreduce=best(lambda: hvd.allreduce(x, op=hvd.Average, name="ar")),
               reducescatter=best(lambda: hvd.reducescatter(x, op=hvd.Average, name="rs")),
               allgather=best(lambda: hvd.allgather(x[: n // hvd.size()].reshape(1, -1), name="ag")))
    if hvd.rank() == 0:
        print("COLLECTIVES " + json.dumps(got), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json")
    ap.add_argument("--collectives", action="store_true", help="time Horovod's CPU collectives instead")
    ap.add_argument("--tp", type=int, nargs="+", default=[1],
                    help="tensor-parallel group sizes to run at stage 0 besides (2: both ranks in one group)")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="bf16 weights over fp32 masters against fp32 weights, both under bf16 autocast")
    ap.add_argument("--np", type=int, default=2, help="ranks (--bf16-weights)")
    ap.add_argument("--worker", nargs=6, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--collectives-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if args.collectives_worker:
        collectives()
        return
    from hvd_bert.cluster import launch
    if args.collectives:
        print("| launcher | allreduce s | reduce-scatter s | vs allreduce | allgather (1/2 each) s |")
        print("|---|---:|---:|---:|---:|")
        for launcher in ("gloo", "mpi"):
            res = launch.run([__file__, "--collectives-worker"], np=2, launcher=launcher, timeout=600,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
            line = next(ln for ln in res.stdout.splitlines() if "COLLECTIVES " in ln)
            t = json.loads(line.split("COLLECTIVES ", 1)[1])
            print(f"| {launcher} | {t['allreduce']:.3f} | {t['reducescatter']:.3f} | "
                  f"{t['reducescatter'] / t['allreduce']:.2f}x | {t['allgather']:.3f} |")
        return
    if args.bf16_weights:
        return compare_weights(args, launch)
    rows = []
    runs = [(stage, 1) for stage in args.stages] + [(0, t) for t in args.tp if t > 1]
    for stage, tp in runs:
        rows += worker_rows(launch, 2, stage, args, tp, 0)
    base = {r["rank"]: r for r in rows if r["stage"] == 0 and r["tp"] == 1}
    gib = 2 ** 30
    print(f"{rows[0]['params'] / 1e6:.1f}M parameters, 2 ranks, k={args.k}, LAMB fp32")
    print("| stage | TP | rank | parameters held | optimizer state GiB | vs stage 0 | gradients held GiB | "
          "peak RSS GiB | vs stage 0 | step s | vs stage 0 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = base.get(r["rank"])
        rel = (lambda key: f"{r[key] / b[key]:.2f}x") if b else (lambda key: "-")
        print(f"| {r['stage']} | {r['tp']} | {r['rank']} | {r['params'] / 1e6:.1f}M | "
              f"{r['state_bytes'] / gib:.3f} | {rel('state_bytes')} | "
              f"{r['grad_bytes'] / gib:.3f} | {r['peak_rss'] / gib:.2f} | {rel('peak_rss')} | "
              f"{r['median_s']:.2f} | {rel('median_s')} |")
    dump(args.json, rows)


def dump(path: str | None, rows: list[dict]) -> None:
    """The rows as JSON to ``--json``, when given."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def worker_rows(launch, np_: int, stage: int, args, tp: int, precision: int) -> list[dict]:
    """One layout's job on ``np_`` ranks (gloo, a thread each): each rank's RESULT, by rank."""
    res = launch.run([__file__, "--worker", str(stage), str(args.k), str(args.steps), str(args.layers),
                      str(tp), str(precision)], np=np_, launcher="gloo", timeout=1500,
                     env=dict(os.environ, OMP_NUM_THREADS="1"))
    if not res.ok:
        sys.exit(res.explain())
    got = [json.loads(ln.split("RESULT ", 1)[1]) for ln in res.stdout.splitlines() if "RESULT " in ln]
    return sorted(got, key=lambda r: r["rank"])


def compare_weights(args, launch) -> None:
    """Each stage with fp32 and with bf16 weights under bf16 autocast, on ``args.np`` ranks."""
    rows = []
    for stage in args.stages:
        for precision in (1, 2):
            rows += worker_rows(launch, args.np, stage, args, 1, precision)
    gib = 2 ** 30
    print(f"{rows[0]['params'] / 1e6:.1f}M parameters, {args.np} ranks, k={args.k}, LAMB, bf16 autocast")
    print("| stage | weights | rank | weights GiB | gradients GiB | optimizer state GiB | state of a rank "
          "GiB | vs fp32 weights | peak RSS GiB | vs fp32 weights | step s | vs fp32 weights |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    peer = {(r["stage"], r["rank"]): r for r in rows if r["precision"] == "bf16"}
    for r in rows:
        b = peer[r["stage"], r["rank"]]
        held = r["weight_bytes"] + r["grad_bytes"] + r["state_bytes"]
        base = b["weight_bytes"] + b["grad_bytes"] + b["state_bytes"]
        print(f"| {r['stage']} | {'bf16' if r['precision'] == 'bf16 weights' else 'fp32'} | {r['rank']} | "
              f"{r['weight_bytes'] / gib:.3f} | {r['grad_bytes'] / gib:.3f} | {r['state_bytes'] / gib:.3f} | "
              f"{held / gib:.3f} | {held / base:.2f}x | {r['peak_rss'] / gib:.2f} | "
              f"{r['peak_rss'] / b['peak_rss']:.2f}x | {r['median_s']:.2f} | "
              f"{r['median_s'] / b['median_s']:.2f}x |")
    dump(args.json, rows)


if __name__ == "__main__":
    main()
