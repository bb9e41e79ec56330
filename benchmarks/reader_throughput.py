"""Input pipeline against the training step: examples/s of the PyTorch and TensorFlow readers
on 1 and 2 ranks, against the examples/s a tiny BERT training step consumes; and the training
step time fed by the real PyTorch reader vs the same batches already in memory (the gap is
the I/O the prefetch thread did not hide).

    .venv/bin/python benchmarks/reader_throughput.py [--batch 32] [--steps 60]

The data is the built-in corpus prepared once (8 shards, seq 128) under the cache folder.
Each reader runs in its own process, as a job does.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prepare(folder: Path) -> None:
    if not (folder / "dataset.json").is_file():
        subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--output", str(folder),
                        "--num-shards", "8", "--dupe-factor", "3"], check=True, capture_output=True)


def read_worker(fw: str, folder: str, rank: int, world: int, batch: int, epochs: int) -> None:
    n, t0 = 0, time.perf_counter()
    for epoch in range(epochs):
        if fw == "pt":
            from hvd_bert.pt.data import ShardedDataset
            ds = ShardedDataset(folder, "bert-pretraining", rank, world, batch, seed=0, epoch=epoch)
            for b in ds:
                n += b["input_ids"].shape[0]
        else:
            from hvd_bert.tf.data import make_dataset
            ds, _ = make_dataset(folder, "bert-pretraining", rank, world, batch, seed=0, epoch=epoch)
            for b in ds:
                n += int(b["input_ids"].shape[0])
    print(json.dumps({"examples": n, "seconds": time.perf_counter() - t0}))


def reader_rate(fw: str, folder: Path, world: int, batch: int, epochs: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", fw, str(folder), str(r), str(world),
                               str(batch), str(epochs)], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return sum(o["examples"] for o in outs) / max(o["seconds"] for o in outs)


def train_rates(folder: Path, batch: int, steps: int) -> dict:
    import torch
    from hvd_bert.config.bert import bert_preset
    from hvd_bert.data.sidecar import read_sidecar
    from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
    from hvd_bert.pt.data import ShardedDataset

    meta = read_sidecar(folder, "bert-pretraining")
    torch.manual_seed(0)
    model = BertForPreTraining(bert_preset("tiny", vocab_size=meta["vocab_size"]))
    opt = torch.optim.AdamW(model.parameters(), 1e-4)

    def step(b):
        loss, _ = pretraining_loss(model, b)
        opt.zero_grad()
        loss.backward()
        opt.step()

    ds = ShardedDataset(folder, "bert-pretraining", 0, 1, batch, seed=0)
    it = ds.stream()
    cached = [next(it) for _ in range(steps)]
    for b in cached[:5]:  # warm-up (compiles the fused kernels)
        step(b)
    t = time.perf_counter()
    for b in cached:
        step(b)
    t_mem = (time.perf_counter() - t) / steps
    it = ds.stream(start_batch=steps)
    next(it)
    t = time.perf_counter()
    for _ in range(steps):
        step(next(it))
    t_read = (time.perf_counter() - t) / steps
    return {"step_s_in_memory": t_mem, "step_s_with_reader": t_read, "consumed_per_s": batch / t_mem}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fw, folder, rank, world, batch, epochs = args.worker
        read_worker(fw, folder, int(rank), int(world), int(batch), int(epochs))
        return
    cache = Path(os.environ.get("HVD_BERT_CACHE", Path.home() / ".cache" / "hvd_bert"))
    folder = cache / "bench" / "bert-seq128"
    prepare(folder)
    rows = {f"{fw} reader, {w} rank(s)": reader_rate(fw, folder, w, args.batch, args.epochs)
            for fw in ("pt", "tf") for w in (1, 2)}
    tr = train_rates(folder, args.batch, args.steps)
    print(f"\ndata: {folder} (built-in corpus, seq 128, 8 shards); batch {args.batch}")
    print(f"{'what':<28} {'examples/s':>11} {'x what tiny BERT consumes':>26}")
    for k, v in rows.items():
        print(f"{k:<28} {v:>11,.0f} {v / tr['consumed_per_s']:>25.1f}x")
    print(f"{'tiny BERT step consumes':<28} {tr['consumed_per_s']:>11,.0f}")
    gap = tr["step_s_with_reader"] / tr["step_s_in_memory"]
    print(f"\ntiny BERT step: {tr['step_s_in_memory'] * 1e3:.1f} ms with batches in memory, "
          f"{tr['step_s_with_reader'] * 1e3:.1f} ms fed by the reader ({gap:.2f}x)")


if __name__ == "__main__":
    main()
