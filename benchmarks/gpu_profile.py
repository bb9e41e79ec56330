"""Where a BERT pretraining step's time goes, with ``torch.profiler``: the device's time split
into matrix products, attention, normalisation, other elementwise kernels and the optimizer,
and the host gaps (the step's wall time the device spent idle: launch overhead, host
synchronisations, Python). The step is the job's: hvd_bert's PyTorch BERT, the masked-LM and
next-sentence loss, and NVLAMB built as ``hvd-bert pretrain`` builds it
(``hvd_bert.pt.optim.build_optimizer``), under bf16 autocast on a GPU.

    .venv/bin/python benchmarks/gpu_profile.py --device cuda --preset large --seq 128 --batch 64
    .venv/bin/python benchmarks/gpu_profile.py --smoke          # the plumbing on the CPU

On a GPU the categories are the CUDA kernels' names (cuBLAS/CUTLASS products, flash/efficient
attention and softmax, layer norm, multi-tensor optimizer kernels); on the CPU (``--smoke``) the
operators' own times. ``--fill`` and ``--pack`` as in benchmarks/bert_train.py; ``--compile``:
the encoder layers under ``torch.compile`` (``compile_layers``).
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch

from bert_train import _batch  # benchmarks/bert_train.py

CATEGORIES = (
    ("optimizer", re.compile(r"multi_tensor|foreach|lamb|adam|optim", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax|cudnn.*attn", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|cublas|sm\d+_|matmul|aten::(mm|addmm|bmm|linear)$|nvjet", re.I)),
    ("normalisation", re.compile(r"layer_?norm|LayerNorm", re.I)),
)


def category(name: str) -> str:
    return next((c for c, pat in CATEGORIES if pat.search(name)), "elementwise/other")


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="large")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--predictions", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fill", type=float, default=1.0)
    ap.add_argument("--pack", action="store_true", help="the batch packed (pack_sequences)")
    ap.add_argument("--compile", action="store_true", help="the encoder layers compiled (compile_layers)")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: the plumbing only")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.smoke:
        a.preset, a.device, a.batch, a.steps, a.warmup = "tiny", "cpu", 8, 2, 1
    from hvd_bert.config.bert import bert_preset
    from hvd_bert.config.train import OptimConfig
    from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
    from hvd_bert.pt.optim import build_optimizer

    cfg = bert_preset(a.preset, vocab_size=30522)
    batch = _batch(torch, cfg.vocab_size, a.batch, a.seq, a.predictions, a.device, a.fill, a.pack)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).to(a.device).train()
    if a.compile:
        model.compile_layers()  # (the warm-up steps compile)
    opt = build_optimizer(model.named_parameters(), OptimConfig(name="nvlamb", lr=1e-4, weight_decay=0.01))
    cuda = a.device.startswith("cuda")
    dtype = torch.bfloat16 if a.precision == "bf16" else None

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        with torch.profiler.record_function("forward+backward"):
            with torch.autocast(torch.device(a.device).type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = pretraining_loss(model, batch)[0]
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    wall_us = (time.perf_counter() - t) / a.steps * 1e6

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        sync()
    events = list(prof.events())
    optim_ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == "optimizer"]
    ranges = ("forward+backward", "optimizer")
    split: dict[str, float] = {}
    if cuda:  # the kernels, on the device's timeline
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in ranges]
        for k in kernels:
            c = category(k.name)
            split[c] = split.get(c, 0.0) + (k.time_range.end - k.time_range.start)
        busy = union_us([(k.time_range.start, k.time_range.end) for k in kernels])
    else:  # the CPU's operators, each by its own time (children excluded)
        for k in (e for e in events if e.name not in ranges):
            inside = any(s <= k.time_range.start < e for s, e in optim_ranges)
            c = "optimizer" if inside else category(k.name)
            split[c] = split.get(c, 0.0) + k.self_cpu_time_total
        busy = sum(split.values())
    span = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    per_step = {c: v / a.steps for c, v in split.items()}
    gaps = max(0.0, span - busy) / a.steps
    rows = int(batch["input_ids"].shape[0])
    report = {"preset": a.preset, "seq": a.seq, "batch": a.batch, "rows": rows, "fill": a.fill, "pack": a.pack,
              "compile": a.compile,
              "device": a.device, "precision": a.precision, "step_ms": wall_us / 1e3,
              "sequences_per_s": a.batch / (wall_us / 1e6),
              "device_ms": {c: v / 1e3 for c, v in sorted(per_step.items())},
              "host_gaps_ms": gaps / 1e3, "profiled_step_ms": span / a.steps / 1e3,
              "top_kernels": [(e.key, e.device_time_total / a.steps / 1e3 if cuda else e.self_cpu_time_total
                               / a.steps / 1e3) for e in sorted(prof.key_averages(),
                                                               key=lambda e: -(e.device_time_total if cuda
                                                                               else e.self_cpu_time_total))[:15]]}
    how = (", packed" if a.pack else "") + (", compiled layers" if a.compile else "")
    print(f"BERT-{a.preset} seq {a.seq} batch {a.batch} ({rows} rows, fill {a.fill}{how}), "
          f"{a.precision}, {a.device}: {report['step_ms']:.1f} ms/step, {report['sequences_per_s']:.1f} seq/s")
    prof_ms = report["profiled_step_ms"]
    for c, v in sorted(report["device_ms"].items(), key=lambda kv: -kv[1]):
        print(f"  {c:<18} {v:9.2f} ms  {100 * v / prof_ms:5.1f}%")
    print(f"  {'host gaps':<18} {report['host_gaps_ms']:9.2f} ms  {100 * report['host_gaps_ms'] / prof_ms:5.1f}%"
          f"  (of {prof_ms:.1f} ms per profiled step)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
