"""A model whose replicated training state does not fit this machine, trained, saved and resumed
under another layout: BERT for pretraining at about 475M parameters (hidden 1536, 15 layers, 16
heads, intermediate 6144, vocabulary 30522), LAMB in fp32, sequences of 32.

    .venv/bin/python benchmarks/beyond_one_rank.py [--layers 15] [--hidden 1536] [--folder /tmp/beyond]

Four runs, each its own ``horovodrun --gloo`` job:

1. **replicated** (4 ranks, ZeRO 0, TP 1): the toolkit's memory plan (``jobs.pretrain.plan_memory``,
   what ``hvd-bert pretrain`` runs before it builds anything) on every rank; it refuses to start.
2. **split** (4 ranks, TP 2 x ZeRO-2): built on the meta device (``tensor_parallel.build``), 3
   timed steps, a sharded checkpoint saved in the background while the next step runs, then one
   saved and waited for (blocking).
3. **resumed** (2 ranks, TP 1 x ZeRO-2): the split run's checkpoint resumed under another world
   size and tensor-parallel degree, 2 steps.

Per rank and phase: the peak resident memory of that phase alone (``VmHWM`` of /proc/self/status,
reset with ``/proc/self/clear_refs`` at the phase's start), and the times. The training state the
engine holds is its own count (``engine.memory()``).
"""

import argparse
import json
import os
import statistics
import sys
import time

GIB = 2 ** 30


def vm_hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # (Linux: 5 resets the peak resident set to now)
        f.write("5")


def config(layers: int, hidden: int):
    from hvd_bert.config.bert import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=hidden, num_layers=layers, num_heads=16,
                      intermediate_size=4 * hidden, max_position_embeddings=64, hidden_dropout=0.0,
                      attention_dropout=0.0)


def train_config(tp: int, stage: int, world: int):
    from hvd_bert.config import TrainConfig, apply_overrides

    return apply_overrides(TrainConfig(), [
        "optim.name=lamb", "optim.lr=1e-4", "schedule.name=constant", "batch.local_batch_size=2",
        "batch.backward_passes_per_step=1", f"zero.stage={stage}", f"tensor_parallel={tp}",
        "checkpoint_format=sharded", "resume_resized=true", "zero.bucket_mb=32"])


def batch(c, step: int, rows: int):
    import torch

    g = torch.Generator().manual_seed(step)
    s, p = 32, 5
    return {"input_ids": torch.randint(0, c.vocab_size, (rows, s), generator=g),
            "segment_ids": torch.zeros(rows, s, dtype=torch.long),
            "input_mask": torch.ones(rows, s, dtype=torch.long),
            "masked_lm_positions": torch.randint(0, s, (rows, p), generator=g),
            "masked_lm_ids": torch.randint(0, c.vocab_size, (rows, p), generator=g),
            "masked_lm_weights": torch.ones(rows, p),
            "next_sentence_labels": torch.zeros(rows, dtype=torch.long)}


def worker(mode: str, layers: int, hidden: int, folder: str) -> None:
    import torch
    import horovod.torch as hvd

    from hvd_bert.config import ConfigError
    from hvd_bert.jobs.pretrain import plan_memory
    from hvd_bert.pt.backend import BACKEND
    from hvd_bert.pt.models.bert import pretraining_loss

    c = config(layers, hidden)
    tp, stage, world = {"replicated": (1, 0, 4), "split": (2, 2, 4), "resumed": (1, 2, 2)}[mode]
    cfg = train_config(tp, stage, world)
    BACKEND.init(cfg)
    torch.set_num_threads(1)
    out = {"mode": mode, "rank": hvd.rank()}
    try:
        out["plan"] = plan_memory(cfg, c, BACKEND, hvd.size())
    except ConfigError as e:
        out["refused"] = str(e)
        print("RESULT " + json.dumps(out), flush=True)
        return
    phases = {}

    def phase(name, fn):
        reset_hwm()
        t0 = time.perf_counter()
        got = fn()
        phases[name] = {"hwm": vm_hwm(), "s": time.perf_counter() - t0}
        return got

    model = phase("build", lambda: BACKEND.bert_pretraining(c, 32, 5, cfg))
    engine = phase("engine", lambda: BACKEND.engine(model, pretraining_loss, cfg))
    if mode == "resumed":
        phase("resume", lambda: engine.resume(folder))
    rows = 2

    def step():
        res = engine.train_micro_batch(batch(c, 1000 + engine.step_count * 7 + engine.data_rank, rows))
        assert res is not None and not res.skipped, res
    times = []
    reset_hwm()
    for i in range(4 if mode == "split" else 2):
        t0 = time.perf_counter()
        step()
        if i:
            times.append(time.perf_counter() - t0)
    phases["steps"] = {"hwm": vm_hwm(), "s": statistics.median(times)}
    if mode == "split":
        # a background save: the host copy (staging) on this thread, then the write beside a step
        hvd.barrier()  # (every rank starts the save together: no rank's time is waiting for another)
        reset_hwm()
        t0 = time.perf_counter()
        engine.save(folder)
        staged = time.perf_counter() - t0
        t1 = time.perf_counter()
        step()
        step_beside = time.perf_counter() - t1
        t2 = time.perf_counter()
        engine.wait_for_save()
        phases["save_background"] = {"hwm": vm_hwm(), "staging_s": staged, "step_beside_s": step_beside,
                                     "waited_after_s": time.perf_counter() - t2}
        # a blocking save: the same, waited for at once
        hvd.barrier()
        reset_hwm()
        t0 = time.perf_counter()
        engine.save(folder)
        engine.wait_for_save()
        phases["save_blocking"] = {"hwm": vm_hwm(), "s": time.perf_counter() - t0}
    m = engine.memory()
    out.update(phases=phases, step=engine.step_count, params_held=sum(p.numel() for p in model.parameters()),
               dense=BACKEND.param_count(model), memory={k: m[k] for k in ("parameters", "gradients",
                                                                             "optimizer_state")})
    hvd.barrier()
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--folder", default="/tmp/hvd_bert_beyond")
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.layers, args.hidden, args.folder)
        return
    import shutil

    from hvd_bert.cluster import launch

    shutil.rmtree(args.folder, ignore_errors=True)
    results = {}
    for mode, np_ in (("replicated", 4), ("split", 4), ("resumed", 2)):
        t0 = time.perf_counter()
        res = launch.run([__file__, "--worker", mode, "--layers", str(args.layers), "--hidden",
                          str(args.hidden), "--folder", args.folder], np=np_, launcher="gloo", timeout=3000,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
        if not res.ok:
            sys.exit(res.explain())
        got = [json.loads(ln.split("RESULT ", 1)[1]) for ln in res.stdout.splitlines() if "RESULT " in ln]
        results[mode] = sorted(got, key=lambda r: r["rank"])
        print(f"{mode}: {np_} ranks, {time.perf_counter() - t0:.0f} s", flush=True)
    report(results, args.folder)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(results: dict, folder: str) -> None:
    def g(n):
        return f"{n / GIB:.2f}"
    rep = results["replicated"][0]
    print(f"\nreplicated on 4 ranks: {rep.get('refused') or rep.get('plan')}")
    split = results["split"]
    print(f"\nsplit: {split[0]['dense'] / 1e6:.1f}M parameters, each rank holding "
          f"{split[0]['params_held'] / 1e6:.1f}M")
    print("| run | rank | build GiB | engine GiB | resume GiB | steps GiB | background save GiB | "
          "blocking save GiB | weights + grads + state GiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in ("split", "resumed"):
        for r in results[mode]:
            p = r["phases"]
            cells = " | ".join(g(p[k]["hwm"]) if k in p else "-" for k in
                               ("build", "engine", "resume", "steps", "save_background", "save_blocking"))
            m = r["memory"]
            print(f"| {mode} | {r['rank']} | {cells} | "
                  f"{g(m['parameters'] + m['gradients'] + m['optimizer_state'])} |")
    print("\n| rank | step s | background save: staging s | step beside the write s | waited after s | "
          "blocking save s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in split:
        p = r["phases"]
        b = p["save_background"]
        print(f"| {r['rank']} | {p['steps']['s']:.2f} | {b['staging_s']:.2f} | {b['step_beside_s']:.2f} | "
              f"{b['waited_after_s']:.2f} | {p['save_blocking']['s']:.2f} |")
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(folder) for f in fs)
    print(f"\ncheckpoint folder: {size / GIB:.2f} GiB on disk")


if __name__ == "__main__":
    main()
