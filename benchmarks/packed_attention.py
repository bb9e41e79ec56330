"""Packed attention: the attention of one packed batch through the dense bias and through
varlen attention (``packed_attention``), against the same sequences padded, side by side.

    .venv/bin/python benchmarks/packed_attention.py --seq 512 --batch 16 --threads 2 --repeats 3 --rounds 3

The batch: ``--batch`` sequences of ``--seq`` with Wikipedia's fill at 512 (half full, the others
of a uniform length: about 78% real tokens), packed as the loader packs them
(``hvd_bert.data.packing.pack_batch``). Each variant runs in a fresh process (its peak is its
own) with BERT-Base's heads (12 x 64): the forward and backward of
``hvd_bert.pt.models.bert``'s attention on random q, k, v that need gradients, timed after one
warm-up, the best of ``--repeats``; its peak memory is the process's (``VmHWM``; CUDA's
allocations on a GPU) over its baseline before the first call; ``--rounds`` alternate the
variants, and each reports its median round. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import emit, peak_bytes  # noqa: E402

VARIANTS = ("padded", "packed-bias", "packed-varlen")


def batch_of(seq: int, batch: int, seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    n = np.where(rng.random(batch) < 0.5, rng.integers(seq // 8, seq + 1, batch), seq)
    mask = (np.arange(seq) < n[:, None]).astype(np.int64)
    return {"input_ids": mask * 7, "input_mask": mask, "segment_ids": np.zeros_like(mask),
            "masked_lm_positions": np.ones((batch, 1), np.int64)}


def one(variant: str, seq: int, batch: int, heads: int, head_size: int, repeats: int, device: str,
        precision: str) -> dict:
    import torch

    from hvd_bert.data.packing import pack_batch
    from hvd_bert.pt.models.bert import Segments, attention, varlen_attention

    b = batch_of(seq, batch)
    if variant != "padded":
        b = pack_batch(b, segments=variant == "packed-varlen")
    rows = len(b["input_ids"])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if variant == "padded":
        keep = torch.from_numpy(b["input_mask"])[:, None, None, :].bool()
    elif variant == "packed-bias":
        seqs = torch.from_numpy(b["sequence_ids"])
        keep = (seqs[:, None, :, None] == seqs[:, None, None, :]) & (seqs[:, None, None, :] > 0)
    if variant == "packed-varlen":
        mask = Segments(torch.from_numpy(b["segment_offsets"]).to(device), seq)
    else:
        mask = ((~keep).to(dtype) * torch.finfo(dtype).min).to(device)
    base = peak_bytes(device)

    def run():
        q, k, v = (torch.randn(rows, heads, seq, head_size, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        if variant == "packed-varlen":
            out = varlen_attention(q, k, v, mask, 0.1, True)
        else:
            out = attention(q, k, v, mask, 0.1, True)
        out.float().sum().backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    real = int(b["input_mask"].sum())
    return {"variant": variant, "rows": rows, "real_tokens": real, "token_slots": rows * seq,
            "seconds": min(times), "peak_bytes_over_baseline": peak_bytes(device) - base}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # (a variant: the child's part)
    a = ap.parse_args()
    if a.one:
        import torch

        torch.set_num_threads(a.threads)
        print(json.dumps(one(a.one, a.seq, a.batch, a.heads, a.head_size, a.repeats, a.device, a.precision)))
        return
    rounds: dict[str, list[dict]] = {v: [] for v in a.variants}
    for _ in range(a.rounds):  # (the variants alternate: a drift in the machine's speed hits each)
        for variant in a.variants:
            out = subprocess.run([sys.executable, __file__, "--one", variant, "--seq", str(a.seq), "--batch",
                                  str(a.batch), "--heads", str(a.heads), "--head-size", str(a.head_size),
                                  "--repeats", str(a.repeats), "--threads", str(a.threads), "--device",
                                  a.device, "--precision", a.precision], capture_output=True, text=True,
                                 check=True, env={**os.environ, "OMP_NUM_THREADS": str(a.threads)})
            rounds[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rounds[variant][-1]), file=sys.stderr, flush=True)
    runs = []
    for got in rounds.values():  # the median round of each
        got.sort(key=lambda r: r["seconds"])
        runs.append({**got[len(got) // 2], "seconds_by_round": [r["seconds"] for r in got]})
    ref = runs[0]
    for r in runs:
        r["time_vs_first"] = r["seconds"] / ref["seconds"]
        r["memory_vs_first"] = r["peak_bytes_over_baseline"] / max(1, ref["peak_bytes_over_baseline"])
    emit({"seq": a.seq, "batch": a.batch, "heads": a.heads, "head_size": a.head_size, "device": a.device,
          "precision": a.precision, "threads": a.threads, "runs": runs}, a.json)


if __name__ == "__main__":
    main()
