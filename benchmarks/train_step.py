"""2-rank training step of a small model: hvd_bert's Engine against the same model under
PyTorch DDP (gloo) and a plain Horovod loop, with and without gradient accumulation, so the
toolkit's overhead is visible. All three in the same run, same model, data and threads.

    .venv/bin/python benchmarks/train_step.py [--steps 30] [--k 1 4] [--json out.json]
    .venv/bin/python benchmarks/train_step.py --sweep [--repeats 2]

Each variant runs as its own 2-process job (horovodrun -np 2 --gloo; DDP uses the ranks
horovodrun assigns and its own gloo process group). ``--sweep`` times plain Horovod under
each launcher (horovodrun --gloo, mpirun) across its CPU operations (Gloo over TCP, MPI over
shared memory) and cycle times, and OpenMPI yielding while it waits, with DDP as the peer in the same run, each configuration
``--repeats`` times interleaved (this machine's noise shows as the spread).
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

HIDDEN, LAYERS, LOCAL_B = 1024, 4, 64


def build():
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))
    x = torch.randn(LOCAL_B, HIDDEN)
    y = torch.randn(LOCAL_B, 1)
    return model, x, y


def worker(variant: str, k: int, steps: int, warmup: int) -> None:
    import torch
    torch.set_num_threads(1)
    model, x, y = build()
    loss_fn = torch.nn.MSELoss()
    rank = int(os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    if variant == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=rank,
                                world_size=int(os.environ["HOROVOD_SIZE"]))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)

        def step():
            for i in range(k):
                ctx = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
                with ctx:
                    (loss_fn(ddp(x), y) / k).backward()
            opt.step()
            opt.zero_grad()
    elif variant == "horovod":
        import horovod.torch as hvd
        hvd.init()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=k)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

        def step():
            for _ in range(k):
                (loss_fn(model(x), y) / k).backward()
            opt.step()
            opt.zero_grad()
    elif variant == "hvd_bert":
        from hvd_bert.core.schedules import Constant
        from hvd_bert.pt.engine import Engine
        engine = Engine(model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                        schedule=Constant(1e-3), backward_passes_per_step=k)

        def step():
            for _ in range(k):
                with engine.autocast():
                    loss = loss_fn(model(x), y)
                if engine.backward(loss):
                    engine.step()
    else:
        raise SystemExit(f"unknown variant {variant}")
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        print("RESULT " + json.dumps(dict(variant=variant, k=k, median_s=statistics.median(times),
                                          mean_s=statistics.fmean(times))), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--json")
    ap.add_argument("--sweep", action="store_true", help="Horovod's launchers and knobs against DDP")
    ap.add_argument("--repeats", type=int, default=2, help="--sweep: runs of each configuration")
    ap.add_argument("--only", nargs="+", default=[], help="--sweep: only configurations naming one of these "
                    "(DDP always runs)")
    ap.add_argument("--worker", nargs=2, metavar=("VARIANT", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.steps, args.warmup)
        return
    if args.sweep:
        return sweep(args)
    from hvd_bert.cluster import launch
    rows = []
    for k in args.k:
        for variant in ("ddp", "horovod", "hvd_bert"):
            res = launch.run([__file__, "--worker", variant, str(k), "--steps", str(args.steps),
                              "--warmup", str(args.warmup)], np=2, launcher="gloo", timeout=900,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
            if not res.ok:
                sys.exit(res.explain())
            line = next(ln for ln in res.stdout.splitlines() if "RESULT " in ln)
            rows.append(json.loads(line.split("RESULT ", 1)[1]))
    params = (HIDDEN * HIDDEN + HIDDEN) * LAYERS + HIDDEN + 1
    print(f"\nmodel: {LAYERS}x{HIDDEN} MLP, {params / 1e6:.1f}M fp32 parameters; local batch {LOCAL_B}; "
          f"2 ranks x 1 thread; {args.steps} timed steps after {args.warmup} warm-up")
    print(f"{'k':>2} {'variant':<10} {'ms/step':>9} {'samples/s':>10} {'vs horovod':>11} {'vs ddp':>8}")
    for k in args.k:
        by = {r["variant"]: r for r in rows if r["k"] == k}
        for v in ("ddp", "horovod", "hvd_bert"):
            r = by[v]
            sps = 2 * LOCAL_B * k / r["median_s"]
            print(f"{k:>2} {v:<10} {r['median_s'] * 1e3:>9.1f} {sps:>10.0f} "
                  f"{r['median_s'] / by['horovod']['median_s']:>10.2f}x "
                  f"{r['median_s'] / by['ddp']['median_s']:>7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


# (label, launcher, variant, environment): DDP is the peer; Horovod's defaults are a 1 ms cycle
# and, under mpirun, MPI's CPU operations; hvd_bert's Engine runs with hvd_bert's defaults
# (hvd_bert.cluster.horovod.CPU_DEFAULTS), which are the "cycle 5 ms" rows (and "MPI yields" under mpirun)
SWEEP = [("DDP (gloo)", "gloo", "ddp", {}),
         ("horovodrun --gloo", "gloo", "horovod", {}),
         ("horovodrun --gloo, cycle 5 ms", "gloo", "horovod", {"HOROVOD_CYCLE_TIME": "5"}),
         ("horovodrun --gloo, cycle 20 ms", "gloo", "horovod", {"HOROVOD_CYCLE_TIME": "20"}),
         ("mpirun (Horovod's defaults: MPI ops)", "mpi", "horovod", {}),
         ("mpirun, MPI ops, cycle 5 ms", "mpi", "horovod", {"HOROVOD_CPU_OPERATIONS": "mpi",
                                                            "HOROVOD_CYCLE_TIME": "5"}),
         ("mpirun, MPI ops, cycle 20 ms", "mpi", "horovod", {"HOROVOD_CPU_OPERATIONS": "mpi",
                                                             "HOROVOD_CYCLE_TIME": "20"}),
         ("mpirun, MPI ops, cycle 10 ms", "mpi", "horovod", {"HOROVOD_CPU_OPERATIONS": "mpi",
                                                             "HOROVOD_CYCLE_TIME": "10"}),
         ("mpirun, MPI ops, cycle 5 ms, MPI yields", "mpi", "horovod",
          {"HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CYCLE_TIME": "5", "OMPI_MCA_mpi_yield_when_idle": "1"}),
         ("mpirun, MPI ops, cycle 10 ms, MPI yields", "mpi", "horovod",
          {"HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CYCLE_TIME": "10", "OMPI_MCA_mpi_yield_when_idle": "1"}),
         ("hvd_bert Engine, horovodrun --gloo", "gloo", "hvd_bert", {}),
         ("hvd_bert Engine, mpirun", "mpi", "hvd_bert", {})]


def sweep(args) -> None:
    from hvd_bert.cluster import launch
    runs: dict[tuple[int, str], list[float]] = {}
    chosen = [c for i, c in enumerate(SWEEP) if i == 0 or not args.only or any(o in c[0] for o in args.only)]
    for rep in range(args.repeats):
        for k in args.k:
            for label, launcher, variant, extra in chosen:
                env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
                for var in ("HOROVOD_CYCLE_TIME", "HOROVOD_CPU_OPERATIONS", "OMPI_MCA_mpi_yield_when_idle"):
                    if var not in extra:
                        env.pop(var, None)
                res = launch.run([__file__, "--worker", variant, str(k), "--steps", str(args.steps),
                                  "--warmup", str(args.warmup)], np=2, launcher=launcher, timeout=900, env=env)
                if not res.ok:
                    sys.exit(res.explain())
                line = next(ln for ln in res.stdout.splitlines() if "RESULT " in ln)
                runs.setdefault((k, label), []).append(json.loads(line.split("RESULT ", 1)[1])["median_s"])
                print(f"run {rep + 1}: k={k} {label}: {runs[(k, label)][-1] * 1e3:.1f} ms", flush=True)
    print(f"\n2 ranks x 1 thread; {args.steps} timed steps after {args.warmup} warm-up; median per run, "
          f"{args.repeats} run(s) each")
    print(f"{'k':>2} {'configuration':<36} {'ms/step (runs)':>22} {'vs ddp':>7}")
    for k in args.k:
        ddp = statistics.median(runs[(k, SWEEP[0][0])])
        for label, *_ in chosen:
            t = runs[(k, label)]
            print(f"{k:>2} {label:<36} {statistics.median(t) * 1e3:>7.1f} "
                  f"({', '.join(f'{x * 1e3:.1f}' for x in t):>12}) {statistics.median(t) / ddp:>6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(k=k, configuration=lab, median_s=t) for (k, lab), t in runs.items()], f, indent=1)


if __name__ == "__main__":
    main()
