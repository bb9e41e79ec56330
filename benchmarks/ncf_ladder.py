"""The large-batch ladder on NCF, measured: five rungs, each trained to the same target HR@10,
on 1 and 2 Horovod ranks, with each rung's hyperparameters picked by a small sweep.

    .venv/bin/pip install -r requirements-bench.txt        # matplotlib for the plot
    .venv/bin/python benchmarks/ncf_ladder.py               # synthetic ml-1m-sized data
    .venv/bin/python benchmarks/ncf_ladder.py --movielens ml-1m/ratings.dat --work runs/ladder-ml1m
    .venv/bin/python benchmarks/ncf_ladder.py --data DIR    # a folder from hvd-bert prepare-ncf

The rungs follow the talk's (batch multipliers of a base batch B0 = 1024, chosen so that an
epoch of ml-1m-sized data, 5M training pairs, still has 25 steps at 192 x B0):

  1. baseline       batch B0          sweep: optimizer (momentum SGD; Adam with NVIDIA's NCF betas
                                      0.25/0.5 and with the usual 0.9/0.999) x learning rate
  2. + LR scaling   batch 16 x B0     lr = rung 1's lr x 16^e, sweep e in {1 (the linear rule), 0.75,
                                      0.5 (the square-root rule)}
  3. + warmup       batch 192 x B0    lr = rung 1's lr x 192^e with rung 2's e, linear warmup from 0:
                                      sweep 1 or 3 epochs
  4. + LARS         batch 192 x B0    LARS (trust ratio eta = 0.001, momentum 0.9), rung 3's warmup,
                                      sweep lr in {5, 10, 20}
  5. + AMP          batch 192 x B0    rung 4 with bf16 autocast (CPU: no tensor cores; see BENCHMARKS.md)

Every run is ``hvd-bert ncf`` (PyTorch) under ``horovodrun``, evaluated every quarter epoch;
the time to target is the training time from the start of training to the evaluation that
first reaches the target (the evaluations themselves and process start-up excluded; the
wall time with evaluations is in the JSON). The sweep runs on 1 rank; the chosen settings then run
on 2 ranks. Results: ``benchmarks/results/ncf_ladder.json`` and ``ncf_ladder.png``; each run's
metrics stay under ``--work`` and a rerun reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hvd_bert.cluster import launch  # noqa: E402

B0 = 1024
MODEL = ["--set", "model.factors=32", "--set", "model.layers=[64, 32]"]
# the talk's times (one GPU, ml-20m): seconds to target
TALK = {1: 1230, 2: 140, 3: 100, 4: 110, 5: 55}
NAMES = {1: "baseline", 2: "+ LR scaling (x16)", 3: "+ warmup (x192)", 4: "+ LARS (x192)", 5: "+ AMP (x192)"}


def run(args, name: str, np_: int, overrides: list[str]) -> dict:
    out = Path(args.work) / f"{name}-np{np_}"
    done = out / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    if out.exists():
        import shutil
        shutil.rmtree(out)
    cmd = ["-m", "hvd_bert", "ncf", "--framework", "pt", "--set", f"train.output_dir={out}",
           "--set", f"target_hr={args.target}", "--set", "train.log_every=1000", "--set", f"eval_every={args.eval_every}", *MODEL, *overrides]
    if args.data:
        cmd += ["--set", f"data={args.data}"]
    res = launch.run(cmd, np=np_, timeout=3600, env=dict(os.environ, OMP_NUM_THREADS=str(max(1, args.cores // np_))))
    if not res.ok:
        raise SystemExit(res.explain())
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if "hr@10" in e]
    reached = next((e for e in evals if e["hr@10"] >= args.target), None)
    result = {"name": name, "np": np_, "overrides": overrides, "evals": evals,
              "reached": reached is not None,
              "time_to_target_s": reached["train_s"] if reached else None,
              "wall_to_target_s": reached["time_s"] if reached else None,
              "epochs_to_target": reached["epoch"] if reached else None,
              "final_hr": evals[-1]["hr@10"], "final_ndcg": evals[-1]["ndcg@10"],
              "best_hr": max(e["hr@10"] for e in evals), "wall_s": evals[-1]["train_s"]}
    done.write_text(json.dumps(result))
    status = (f"{result['time_to_target_s']:.1f} s, {result['epochs_to_target']:g} epochs" if reached
              else "not reached")
    print(f"  {name} np={np_}: {status} (final HR@10 {result['final_hr']:.4f})", flush=True)
    return result


def best(results: list[dict]) -> dict:
    """Fastest to target; if none reached it, the highest HR@10."""
    hit = [r for r in results if r["reached"]]
    return min(hit, key=lambda r: r["time_to_target_s"]) if hit else max(results, key=lambda r: r["best_hr"])


def settings(batch: int, np_: int, opt: str, lr: float, epochs: int, warmup_epochs: float = 0,
             steps_per_epoch: int = 0, precision: str = "fp32", betas: str = "std") -> list[str]:
    s = ["--set", f"train.batch.local_batch_size={batch // np_}", "--set", f"train.optim.name={opt}",
         "--set", f"train.optim.lr={lr:.6g}", "--set", f"epochs={epochs}", "--set", "train.optim.weight_decay=0",
         "--set", f"train.precision.mode={precision}"]
    if opt == "adamw":
        b1, b2 = (0.25, 0.5) if betas == "nv" else (0.9, 0.999)
        s += ["--set", f"train.optim.beta1={b1}", "--set", f"train.optim.beta2={b2}", "--set", "train.optim.eps=1e-8"]
    if warmup_epochs:
        s += ["--set", "train.schedule.name=linear_warmup",
              "--set", f"train.schedule.warmup_steps={max(1, int(warmup_epochs * steps_per_epoch))}"]
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="prepared NCF folder (default: synthetic ml-1m under the cache)")
    ap.add_argument("--movielens", help="a MovieLens ratings file (ml-1m ratings.dat, ml-20m ratings.csv): "
                                        "prepared into WORK/data first")
    ap.add_argument("--target", type=float, default=0.78, help="HR@10 to reach")
    ap.add_argument("--eval-every", type=float, default=0.25, help="evaluate every this many epochs")
    ap.add_argument("--work", default=str(ROOT / "runs" / "ncf_ladder"), help="per-run results (reused)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.movielens:
        from hvd_bert.data.ncf import prepare_ncf
        args.data = str(Path(args.work) / "data")
        if not (Path(args.data) / "dataset.json").is_file():
            prepare_ncf(args.data, movielens=args.movielens, overwrite=True)
    from hvd_bert.data.defaults import default_ncf_data
    from hvd_bert.data.ncf import load_ncf
    data = load_ncf(args.data or default_ncf_data())
    pairs = len(data.train_users) * 5
    spe = {m: pairs // (B0 * m) for m in (1, 16, 192)}  # steps per epoch at each batch
    print(f"{pairs} training pairs an epoch; steps per epoch: {spe}", flush=True)

    sweep: dict[int, list] = {}
    # rung 1: optimizer x lr at B0
    grid1 = [("sgd", 0.3, "std"), ("adamw", 0.0005, "nv"), ("adamw", 0.001, "nv"), ("adamw", 0.002, "nv"),
             ("adamw", 0.001, "std"), ("adamw", 0.003, "std")]
    names1 = {f"r1-{o}-{lr:g}" + ("-std" if o == "adamw" and b == "std" else ""): (o, lr, b) for o, lr, b in grid1}
    sweep[1] = [run(args, n, 1, settings(B0, 1, o, lr, 4, betas=b)) for n, (o, lr, b) in names1.items()]
    opt1, lr1, b1 = names1[best(sweep[1])["name"]]

    def s2(e):
        return settings(16 * B0, 1, opt1, lr1 * 16 ** e, 10, betas=b1)
    exps = (1.0, 0.75, 0.5)
    sweep[2] = [run(args, f"r2-e{e:g}", 1, s2(e)) for e in exps]
    e2 = float(best(sweep[2])["name"].split("-e")[1])
    lr3 = lr1 * 192 ** e2

    def s3(w, precision="fp32"):
        return settings(192 * B0, 1, opt1, lr3, 30, w, spe[192], betas=b1, precision=precision)
    sweep[3] = [run(args, f"r3-w{w:g}", 1, s3(w)) for w in (1, 3)]
    w3 = float(best(sweep[3])["name"].split("-w")[1])

    def s4(lr, precision="fp32"):
        return settings(192 * B0, 1, "lars", lr, 30, w3, spe[192], precision=precision)
    sweep[4] = [run(args, f"r4-lr{lr:g}", 1, s4(lr)) for lr in (5, 10, 20)]
    lr4 = float(best(sweep[4])["name"].split("-lr")[1])
    chosen = {1: settings(B0, 1, opt1, lr1, 4, betas=b1), 2: s2(e2), 3: s3(w3), 4: s4(lr4), 5: s4(lr4, "bf16")}
    sweep[5] = [run(args, "r5-bf16", 1, chosen[5])]
    batches = {1: B0, 2: 16 * B0, 3: 192 * B0, 4: 192 * B0, 5: 192 * B0}
    opt_name = "momentum SGD" if opt1 == "sgd" else f"Adam (betas {'0.25/0.5' if b1 == 'nv' else '0.9/0.999'})"
    hp = {1: f"{opt_name}, lr {lr1:g}", 2: f"lr {lr1 * 16 ** e2:.4g} = {lr1:g} x 16^{e2:g}",
          3: f"lr {lr3:.4g} = {lr1:g} x 192^{e2:g}, warmup {w3:g} epochs",
          4: f"LARS lr {lr4:g}, eta 0.001, momentum 0.9, warmup {w3:g} epochs", 5: "as rung 4, bf16 autocast"}

    finals: dict[int, dict[int, dict]] = {}
    for rung in range(1, 6):
        finals[rung] = {1: best(sweep[rung])}
        for np_ in [n for n in args.ranks if n > 1]:
            s = list(chosen[rung])
            s[1] = f"train.batch.local_batch_size={batches[rung] // np_}"
            finals[rung][np_] = run(args, f"final-r{rung}", np_, s)

    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "target_hr": args.target, "eval_every": args.eval_every, "b0": B0, "data": str(args.movielens or args.data or "synthetic ml-1m"),
              "steps_per_epoch": spe, "sweep": sweep, "hyperparameters": hp, "batches": batches,
              "finals": {r: {str(n): v for n, v in d.items()} for r, d in finals.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ncf_ladder.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    plot(report, out / "ncf_ladder.png")


def _int_keys(report: dict) -> dict:
    """The report with its rung keys as ints (JSON makes them strings)."""
    out = dict(report)
    for key in ("finals", "hyperparameters", "batches", "sweep"):
        out[key] = {int(k): v for k, v in report[key].items()}
    return out


def table(report: dict) -> str:
    report = _int_keys(report)
    lines = ["| rung | global batch | hyperparameters (sweep winner) | ranks | training time to target (s) | epochs | "
             "final HR@10 | final NDCG@10 | speed-up vs rung 1 | talk: speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for rung in range(1, 6):
        for n, r in report["finals"][rung].items():
            base = report["finals"][1][n]
            if r["reached"] and base["reached"]:
                sp = f"{base['time_to_target_s'] / r['time_to_target_s']:.2f}x"
            else:
                sp = "n/a"
            t = f"{r['time_to_target_s']:.1f}" if r["reached"] else f"not reached ({r['wall_s']:.0f} s)"
            ep = f"{r['epochs_to_target']:.3g}" if r["reached"] else "-"
            lines.append(f"| {rung} {NAMES[rung]} | {report['batches'][rung]} | {report['hyperparameters'][rung]} | "
                         f"{n} | {t} | {ep} | {r['final_hr']:.4f} | {r['final_ndcg']:.4f} | {sp} | "
                         f"{TALK[1] / TALK[rung]:.1f}x |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    report = _int_keys(report)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -r requirements-bench.txt): no plot")
        return
    ranks = sorted({n for d in report["finals"].values() for n in d}, key=int)
    fig, axes = plt.subplots(1, len(ranks), figsize=(6.5 * len(ranks), 4.5), squeeze=False)
    for ax, n in zip(axes[0], ranks):
        for rung in range(1, 6):
            r = report["finals"][rung][n]
            ax.plot([e["train_s"] for e in r["evals"]], [e["hr@10"] for e in r["evals"]], marker="o", ms=3,
                    label=f"{rung} {NAMES[rung]}")
        ax.axhline(report["target_hr"], color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("training time, evaluations excluded (s, log)")
        ax.set_ylabel("HR@10")
        ax.set_title(f"NCF ladder, {n} rank{'s' if int(n) > 1 else ''} (target {report['target_hr']})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
