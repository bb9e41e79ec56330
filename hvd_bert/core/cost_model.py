"""Scaling projection from the alpha-beta allreduce cost model (REFERENCE section 5; Thakur et
al. 2005, Patarasuk & Yuan 2009): step time, communication time and scaling efficiency of
data-parallel training on N GPUs.

Cost of one allreduce of S bytes over N ranks, alpha = latency per hop, B = bandwidth per rank:
    ring          2(N-1) alpha + 2(N-1)/N * S/B
    tree          2 ceil(log2 N) alpha + 2 S/B          (pipelined double binary tree, NCCL)
    hierarchical  2[(g-1) alpha_in + (g-1)/g * S/B_in] + 2(M-1) alpha + 2(M-1)/M * (S/g)/B
                  (g ranks per node over B_in, M nodes over B: reduce-scatter in the node,
                  ring across nodes on 1/g of the data, all-gather in the node)
Tensor fusion with a buffer of F bytes makes K = ceil(S/F) collectives: the latency term is
paid K times, the bandwidth term once. fp16 compression halves S. With overlap, reductions
run during the backward pass (about 2/3 of the compute): only what exceeds it, and at least
the last fused buffer, is exposed. Gradient accumulation (k micro-batches per step)
multiplies the compute per communication by k.
    efficiency E = t_compute / (t_compute + exposed communication)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["Interconnect", "Workload", "allreduce_time", "project", "Projection", "INTERCONNECTS",
           "WORKLOADS", "fit_alpha_beta", "fit_probe", "BERT_LARGE_PHASES", "project_bert_recipe", "report"]

GB = 1e9
MIB = 2**20


@dataclass(frozen=True)
class Interconnect:
    """Links as seen by one rank."""

    alpha: float                 # seconds per hop across nodes (or across all ranks, flat)
    bandwidth: float             # bytes/s per rank across nodes (flat: between any two ranks)
    gpus_per_node: int = 1
    alpha_intra: float = 0.0     # seconds per hop inside a node
    bandwidth_intra: float = 0.0  # bytes/s per rank inside a node (0: same as across)
    note: str = ""


INTERCONNECTS = {
    # DGX-2H: 16 V100 on NVSwitch (150 GB/s per GPU, latency ~0 next to the network's), 8 x 100
    # Gb/s InfiniBand per node shared by 16 GPUs: 6.25 GB/s per GPU across nodes.
    "dgx2h": Interconnect(5e-6, 6.25 * GB, 16, 0.0, 150 * GB,
                          "DGX-2H: NVSwitch 150 GB/s/GPU, 8x100 Gb/s IB per 16 GPUs, alpha 5 us"),
    # REFERENCE section 5's flat example: 12.5 GB/s per rank, 5 us.
    "flat-12.5": Interconnect(5e-6, 12.5 * GB, 1, note="flat: 12.5 GB/s per rank, alpha 5 us"),
    # Horovod's 2017 runs: 4 Pascal GPUs per server on PCIe (~10 GB/s), 25 Gbit/s RoCE per
    # server shared by 4 GPUs (0.78 GB/s per GPU), ~10 us.
    "pascal-roce25": Interconnect(10e-6, 25e9 / 8 / 4, 4, 2e-6, 10 * GB,
                                  "4 P100 per server on PCIe 10 GB/s, 25 Gbit/s RoCE, alpha 10 us"),
}


@dataclass(frozen=True)
class Workload:
    """What one rank computes per micro-batch, and what it reduces."""

    name: str
    params: float              # trainable parameters
    tensors: int               # parameter tensors (allreduces without fusion)
    micro_batch_seconds: float  # forward + backward of one micro-batch on one GPU
    samples_per_micro_batch: int
    note: str = ""


def _bert(name, params, tensors, seq, local_batch, tflops, note):
    # ~6 FLOPs per parameter per token (forward 2, backward 4), at `tflops` sustained
    seconds = 6 * params * seq * local_batch / (tflops * 1e12)
    return Workload(name, params, tensors, seconds, local_batch, note)


WORKLOADS = {
    # BERT-Large phase 1 on V100: 340M parameters, seq 128, 64 sequences per GPU micro-batch,
    # 40 TFLOP/s sustained in fp16 (~1/3 of the V100's tensor-core peak).
    "bert-large-p1": _bert("bert-large-p1", 340e6, 398, 128, 64, 40,
                           "BERT-Large seq 128, 64 seq/GPU/micro-batch, 40 TFLOP/s sustained"),
    "bert-large-p2": _bert("bert-large-p2", 340e6, 398, 512, 16, 40,
                           "BERT-Large seq 512, 16 seq/GPU/micro-batch, 40 TFLOP/s sustained"),
    "bert-base-p1": _bert("bert-base-p1", 110e6, 206, 128, 64, 40,
                          "BERT-Base seq 128, 64 seq/GPU/micro-batch, 40 TFLOP/s sustained"),
    # Horovod's 2017 benchmark models on P100, batch 64 per GPU, single-GPU images/s of the era.
    "inception-v3": Workload("inception-v3", 23.8e6, 196, 64 / 135, 64, "P100 ~135 img/s"),
    "resnet-101": Workload("resnet-101", 44.5e6, 314, 64 / 125, 64, "P100 ~125 img/s"),
    "vgg-16": Workload("vgg-16", 138.4e6, 32, 64 / 125, 64, "P100 ~125 img/s"),
    # NCF (NeuMF, ml-20m): 31.8M parameters, mostly embeddings; 1M-sample micro-batches.
    "ncf": Workload("ncf", 31.8e6, 10, 0.060, 1 << 20, "NeuMF ml-20m, 2^20 samples in ~60 ms"),
}


def allreduce_time(size_bytes: float, ranks: int, net: Interconnect,
                   algorithm: Literal["ring", "tree", "hierarchical"] = "ring",
                   collectives: int = 1) -> float:
    """Seconds for ``collectives`` fused allreduces that move ``size_bytes`` in total."""
    n, s, k = ranks, float(size_bytes), max(1, collectives)
    if n <= 1:
        return 0.0
    if algorithm == "ring":
        return k * 2 * (n - 1) * net.alpha + 2 * (n - 1) / n * s / net.bandwidth
    if algorithm == "tree":
        return k * 2 * math.ceil(math.log2(n)) * net.alpha + 2 * s / net.bandwidth
    if algorithm == "hierarchical":
        g = min(net.gpus_per_node, n)
        m = math.ceil(n / g)
        b_in = net.bandwidth_intra or net.bandwidth
        intra = 2 * (k * (g - 1) * net.alpha_intra + (g - 1) / g * s / b_in) if g > 1 else 0.0
        inter = (k * 2 * (m - 1) * net.alpha + 2 * (m - 1) / m * (s / g) / net.bandwidth) if m > 1 else 0.0
        return intra + inter
    raise ValueError(f"algorithm must be ring, tree or hierarchical, got {algorithm!r}")


@dataclass(frozen=True)
class Projection:
    ranks: int
    compute_s: float          # per optimizer step (k micro-batches)
    comm_s: float             # one gradient allreduce (all collectives)
    exposed_comm_s: float
    step_s: float
    efficiency: float
    samples_per_s: float
    collectives: int


def project(w: Workload, ranks: int, net: Interconnect, *, algorithm: str = "ring",
            fusion_bytes: float | None = 128 * MIB, fp16: bool = False, overlap: bool = True,
            backward_passes_per_step: int = 1) -> Projection:
    """Step time and scaling efficiency of ``w`` on ``ranks`` GPUs (see the module docstring)."""
    size = w.params * (2 if fp16 else 4)
    k = math.ceil(size / fusion_bytes) if fusion_bytes else w.tensors
    comm = allreduce_time(size, ranks, net, algorithm, k)
    compute = w.micro_batch_seconds * backward_passes_per_step
    if overlap and ranks > 1:
        backward = w.micro_batch_seconds * 2 / 3  # only the last micro-batch's backward overlaps
        last = allreduce_time(size / k, ranks, net, algorithm, 1)  # the final buffer: after it
        exposed = max(comm - backward, last)
    else:
        exposed = comm
    step = compute + exposed
    return Projection(ranks, compute, comm, exposed, step, compute / step,
                      ranks * w.samples_per_micro_batch * backward_passes_per_step / step, k)


def fit_alpha_beta(sizes: list[float], times: list[float], ranks: int) -> tuple[float, float]:
    """alpha and B of the ring model fitted to measured allreduce times, minimising the
    relative error (so small messages, which measure alpha, count as much as large ones)."""
    import numpy as np

    t = np.asarray(times, float)
    a = np.c_[np.full(len(sizes), 2 * (ranks - 1)), 2 * (ranks - 1) / ranks * np.asarray(sizes, float)]
    (alpha, inv_b), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return float(max(alpha, 0.0)), float(1.0 / inv_b) if inv_b > 0 else float("inf")


def with_bandwidth(net: Interconnect, alpha: float, bandwidth: float) -> Interconnect:
    return replace(net, alpha=alpha, bandwidth=bandwidth, note=f"calibrated: alpha {alpha * 1e6:.1f} us, "
                                                               f"{bandwidth / GB:.2f} GB/s")


def fit_probe(output: str) -> tuple[dict, float, float]:
    """``(probe, alpha, B)`` from the output of ``hvd_bert.cluster.allreduce_probe`` (its ``PROBE {...}``
    line: the world size and ``(bytes, seconds)`` points), fitted with :func:`fit_alpha_beta`."""
    import json

    line = next((ln for ln in output.splitlines() if "PROBE " in ln), None)
    if line is None:
        raise ValueError("the allreduce probe printed no PROBE line")
    probe = json.loads(line.split("PROBE ", 1)[1])
    sizes, times = zip(*probe["points"])
    alpha, bw = fit_alpha_beta(list(sizes), list(times), probe["size"])
    return probe, alpha, bw


# NVIDIA's BERT-Large LAMB recipe (recipes/bert-large-phase1.yaml, -phase2.yaml):
# (phase, optimizer steps, global batch, sequence length)
BERT_LARGE_PHASES = (("phase 1", 7038, 65536, 128), ("phase 2", 1563, 32768, 512))


def project_bert_recipe(ranks: int, net: Interconnect, phases=BERT_LARGE_PHASES, **kw):
    """Both phases of the BERT-Large recipe on ``ranks`` GPUs: ``([(phase, steps, global batch,
    seq, sequences per GPU, Projection)], total seconds)``. A phase's compute per micro-batch
    scales the ``bert-large-p1`` workload's sustained TFLOP/s to its sequence length and per-GPU
    batch (6 x parameters x tokens FLOPs per sequence)."""
    base = WORKLOADS["bert-large-p1"]
    tflops = 6 * base.params * 128 * 64 / base.micro_batch_seconds / 1e12
    rows, total = [], 0.0
    for name, steps, gbatch, seq in phases:
        per_gpu = gbatch / ranks
        wl = replace(base, micro_batch_seconds=6 * base.params * seq * per_gpu / (tflops * 1e12),
                     samples_per_micro_batch=round(per_gpu))
        p = project(wl, ranks, net, **kw)
        total += steps * p.step_s
        rows.append((name, steps, gbatch, seq, per_gpu, p))
    return rows, total


def report(w: Workload, net: Interconnect, gpus, *, bert_recipe: bool = False, fusion_mb: float = 128,
           algorithm: str = "ring", fp16: bool = False, overlap: bool = True,
           backward_passes_per_step: int = 1, **kw) -> list[str]:
    """``hvd-bert simulate``'s lines: the workload and network, a row per GPU count, and with
    ``bert_recipe`` both phases of the BERT-Large recipe on the last count."""
    kw = dict(kw, algorithm=algorithm, fp16=fp16, overlap=overlap,
              backward_passes_per_step=backward_passes_per_step)
    lines = [f"workload: {w.name} ({w.params / 1e6:.1f}M parameters, {w.micro_batch_seconds * 1e3:.1f} ms "
             f"per micro-batch{'; ' + w.note if w.note else ''})",
             f"network: {net.note}; {algorithm} allreduce, {'fp16' if fp16 else 'fp32'} gradients, fusion "
             f"{fusion_mb} MiB, {'overlapped with backward' if overlap else 'no overlap'}, "
             f"k={backward_passes_per_step}",
             f"{'GPUs':>6} {'step ms':>9} {'comm ms':>9} {'exposed ms':>10} {'efficiency':>10} "
             f"{'samples/s':>12}"]
    for n in gpus:
        p = project(w, n, net, **kw)
        lines.append(f"{n:>6} {p.step_s * 1e3:>9.1f} {p.comm_s * 1e3:>9.1f} {p.exposed_comm_s * 1e3:>10.1f} "
                     f"{p.efficiency:>10.1%} {p.samples_per_s:>12,.0f}")
    if bert_recipe:
        n = gpus[-1]
        rows, total = project_bert_recipe(n, net, **kw)
        for name, steps, gbatch, seq, per_gpu, p in rows:
            lines.append(f"{name}: {steps} steps of {gbatch} x {seq} ({per_gpu:.1f} seq/GPU): "
                         f"{p.step_s * 1e3:.0f} ms/step, efficiency {p.efficiency:.1%}, "
                         f"{steps * p.step_s / 60:.1f} min")
        lines.append(f"BERT-Large (NVIDIA LAMB recipe) on {n} GPUs: {total / 60:.1f} minutes")
    return lines

