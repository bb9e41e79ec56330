"""What ZeRO and tensor parallelism cost and save (REFERENCE section 9), on top of
:mod:`hvd_bert.core.cost_model`'s alpha-beta collectives: memory per rank, the step time of a
layout, and from which model size each layout is needed on a given cluster
(``hvd-bert simulate --model-size``).

Per parameter a rank holds weights W, gradients G and optimizer state O bytes (mixed
precision: 2, 2 and 12 with the fp32 master weights; fp32: 4, 4 and 8). Over N data-parallel
ranks and a tensor-parallel group of T (the layer stack split T ways):

    stage 0   (W + G + O) / T          one allreduce of the gradients, overlapped with backward
    stage 1   (W + G + O/N) / T        a reduce-scatter (half an allreduce) overlapped, then an
                                       allgather of the updated weights after the step, exposed
    stage 2   (W + G/N + O/N) / T      k allreduces (one per micro-batch, bucket by bucket during
                                       the backward pass: hvd_bert's stage 2) and the allgather

Tensor parallelism divides the compute by T and adds, per layer and micro-batch, two
allreduces of the activations (batch x seq x hidden, 2 bytes) in the forward pass and two in
the backward, inside the group and on the critical path (Shoeybi et al. 2019); the group's
links are the node's when T fits in a node. Activations per rank are hvd_bert's BERT's own
(:mod:`hvd_bert.core.activations`, the same model as a job's memory plan line), with a fused
attention kernel as a GPU runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hvd_bert.core.cost_model import Interconnect, Workload, allreduce_time

__all__ = ["Layout", "Shape", "BERT_SHAPES", "state_bytes_per_param", "activation_bytes", "project_layout",
           "largest_model", "report_model_size", "LAYOUTS", "bert_parameters", "RankMemory", "rank_memory",
           "memory_plan_line", "phase_bytes"]

GB = 1e9


@dataclass(frozen=True)
class Layout:
    zero_stage: int = 0
    tensor_parallel: int = 1

    def __str__(self) -> str:
        tp = f", TP {self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        return f"stage {self.zero_stage}{tp}"


LAYOUTS = (Layout(0), Layout(1), Layout(2), Layout(1, 2), Layout(1, 4), Layout(1, 8))


@dataclass(frozen=True)
class Shape:
    """A transformer stack's activation shape: what tensor parallelism splits and reduces."""

    hidden: int
    layers: int
    heads: int
    seq: int
    micro_batch: int


BERT_SHAPES = {"bert-large-p1": Shape(1024, 24, 16, 128, 64), "bert-large-p2": Shape(1024, 24, 16, 512, 16),
               "bert-base-p1": Shape(768, 12, 12, 128, 64)}


def state_bytes_per_param(layout: Layout, dp: int, mixed: bool = True) -> float:
    """Weights, gradients and optimizer state per parameter on one rank (module docstring)."""
    w, g, o = (2.0, 2.0, 12.0) if mixed else (4.0, 4.0, 8.0)
    if layout.zero_stage >= 1:
        o /= dp
    if layout.zero_stage >= 2:
        g /= dp
    return (w + g + o) / layout.tensor_parallel


def activation_bytes(shape: Shape, tp: int = 1, mixed: bool = True) -> float:
    """A GPU rank's activations at a step's peak (``core.activations``: hvd_bert's BERT, bf16
    autocast unless ``mixed`` is off, a fused attention kernel, an MLP 4 times the hidden size)."""
    from hvd_bert.core.activations import ActivationShape, step_peak_bytes

    x = ActivationShape(shape.hidden, shape.layers, shape.heads, 4 * shape.hidden, shape.seq,
                        shape.micro_batch)
    return step_peak_bytes(x, "bf16" if mixed else "fp32", tp=tp, flash=True)


@dataclass(frozen=True)
class LayoutProjection:
    layout: Layout
    memory_bytes: float       # per rank: model state + activations
    step_s: float
    efficiency: float         # compute / step
    extra_comm_s: float       # exposed communication beyond stage 0's
    samples_per_s: float      # the whole cluster: ranks / T groups, each on a micro-batch x k


def _group_net(net: Interconnect, tp: int) -> Interconnect:
    """The links a tensor-parallel group uses: the node's when it fits in one."""
    if tp <= net.gpus_per_node and net.bandwidth_intra:
        return Interconnect(net.alpha_intra, net.bandwidth_intra, 1)
    return Interconnect(net.alpha, net.bandwidth, 1)


def project_layout(w: Workload, shape: Shape | None, ranks: int, net: Interconnect, layout: Layout, *,
                   algorithm: str = "hierarchical", mixed: bool = True, k: int = 1, fp16: bool = False,
                   fusion_bytes: float | None = 128 * 2**20) -> LayoutProjection:
    """Memory per rank and step time of ``w`` laid out as ``layout`` on ``ranks`` GPUs. The
    gradients' collectives are costed as ``cost_model.project`` costs them (``fp16``: halved;
    fused into ``fusion_bytes`` buffers, the last of which runs after the backward pass), so
    stage 0 here is the scaling table's step."""
    tp = layout.tensor_parallel
    dp = max(1, ranks // tp)
    grad_bytes = w.params / tp * (2 if fp16 else 4)
    buffers = math.ceil(grad_bytes / fusion_bytes) if fusion_bytes else w.tensors
    compute = w.micro_batch_seconds / tp * k
    backward = w.micro_batch_seconds / tp * 2 / 3
    ar = allreduce_time(grad_bytes, dp, net, algorithm, buffers)
    last = allreduce_time(grad_bytes / buffers, dp, net, algorithm, 1)  # the final buffer, after backward
    half, last_half = ar / 2, last / 2  # a reduce-scatter or an allgather: half an allreduce's hops and bytes
    base = max(ar - backward, last)
    if layout.zero_stage == 0:
        exposed = base
    elif layout.zero_stage == 1:
        exposed = max(half - backward, last_half) + half
    else:
        exposed = k * max(ar - backward, last) + half
    tp_comm = 0.0
    if tp > 1 and shape is not None:
        act = shape.micro_batch * shape.seq * shape.hidden * 2
        tp_comm = 4 * shape.layers * k * allreduce_time(act, tp, _group_net(net, tp), "ring")
    step = compute + exposed + tp_comm
    mem = w.params * state_bytes_per_param(layout, dp, mixed)
    if shape is not None:
        mem += activation_bytes(shape, tp, mixed)
    return LayoutProjection(layout, mem, step, compute / step, exposed + tp_comm - base,
                            dp * w.samples_per_micro_batch * k / step)


def phase_bytes(layout: Layout, dp: int, params: float, activations: float = 0.0,
                mixed: bool = True) -> dict[str, float]:
    """One rank's memory in each phase of a run, in bytes: on the device, ``build`` (the weights
    of its share), ``load`` (its state, read piece by piece) and ``step`` (its state and the
    activations: the device's peak); in host memory, ``save`` (a sharded checkpoint's staging
    copy: 1/N of the fp32 weights and optimizer moments of its share) and ``commit`` (an elastic
    commit: the fp32 weights, and the moments whole at stage 0 or its shard and its ring
    neighbour's under ZeRO)."""
    share = params / layout.tensor_parallel
    w = 2.0 if mixed else 4.0
    moments = 8.0  # (LAMB's or Adam's two fp32 moments)
    state = share * state_bytes_per_param(layout, dp, mixed) * layout.tensor_parallel
    return {"build": share * w, "load": state, "step": state + activations,
            "save": share * (4.0 + moments) / dp,
            "commit": share * (4.0 + (moments if layout.zero_stage == 0 else 2 * moments / dp))}


def largest_model(layout: Layout, dp: int, device_bytes: float, activations: float = 0.0,
                  mixed: bool = True) -> float:
    """The most parameters whose state (and ``activations``) fit in ``device_bytes`` per rank."""
    return max(device_bytes - activations, 0.0) / state_bytes_per_param(layout, dp, mixed)


def _params(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def report_model_size(w: Workload, shape: Shape | None, ranks: int, net: Interconnect, *,
                      device_gb: float = 80.0, algorithm: str = "hierarchical", mixed: bool = True,
                      k: int = 1, layouts=LAYOUTS, fp16: bool = False,
                      fusion_bytes: float | None = 128 * 2**20) -> list[str]:
    """``hvd-bert simulate --model-size``'s lines: per layout, memory per rank, whether it fits,
    step time, efficiency and the cluster's samples/s for ``w`` (a tensor-parallel group of T
    shares one micro-batch, so T divides the data-parallel width); then the largest model each
    layout holds."""
    dev = device_gb * GB
    if shape is None:  # tensor parallelism's cost is its activations' allreduces: no shape, no TP rows
        layouts = [lay for lay in layouts if lay.tensor_parallel == 1]
    lines = [f"model size: {w.name} ({w.params / 1e9:.2f}B parameters), {ranks} GPUs of {device_gb:g} GB, "
             f"{'mixed precision' if mixed else 'fp32'}, k={k}" +
             ("" if shape else "; a custom workload has no layer shape: no activations, no tensor "
                               "parallelism"),
             f"{'layout':>13} {'GB/rank':>8} {'fits':>5} {'step ms':>9} {'efficiency':>10} "
             f"{'extra comm ms':>14} {'samples/s':>11}"]
    for lay in layouts:
        if ranks % lay.tensor_parallel:
            continue
        p = project_layout(w, shape, ranks, net, lay, algorithm=algorithm, mixed=mixed, k=k, fp16=fp16,
                           fusion_bytes=fusion_bytes)
        fits = "yes" if p.memory_bytes <= dev else "no"
        lines.append(f"{str(lay):>13} {p.memory_bytes / GB:>8.1f} {fits:>5} {p.step_s * 1e3:>9.1f} "
                     f"{p.efficiency:>10.1%} {p.extra_comm_s * 1e3:>14.1f} {p.samples_per_s:>11,.0f}")
    parts = []
    for lay in layouts:
        if ranks % lay.tensor_parallel:
            continue
        act = activation_bytes(shape, lay.tensor_parallel, mixed) if shape else 0.0
        n = largest_model(lay, max(1, ranks // lay.tensor_parallel), dev, act, mixed)
        parts.append(f"{lay}: {_params(n)}")
    lines.append("largest model that fits (model state" + (" + these activations" if shape else "") +
                 "): " + "; ".join(parts))
    host = []
    for lay in layouts:
        if ranks % lay.tensor_parallel == 0:
            ph = phase_bytes(lay, max(1, ranks // lay.tensor_parallel), w.params, mixed=mixed)
            host.append(f"{lay}: save {ph['save'] / GB:.2f}, commit {ph['commit'] / GB:.2f}")
    lines.append("per rank, the device's peak is the step (building holds the weights, loading the state, "
                 "both less); host GB a sharded save stages and an elastic commit keeps: " + "; ".join(host))
    fit0 = largest_model(Layout(0), ranks, dev, activation_bytes(shape, 1, mixed) if shape else 0.0, mixed)
    fitting = [project_layout(w, shape, ranks, net, lay, algorithm=algorithm, mixed=mixed, k=k, fp16=fp16,
                           fusion_bytes=fusion_bytes)
               for lay in layouts if ranks % lay.tensor_parallel == 0]
    fitting = [p for p in fitting if p.memory_bytes <= dev]
    best = max(fitting, key=lambda p: p.samples_per_s) if fitting else None
    need = ("no layout here fits it" if best is None
            else f"the layout with the most samples/s that fits it is {best.layout}")
    zero = (f"ZeRO is needed from {_params(fit0)} parameters on this cluster (beyond stage 0's memory)"
            if fit0 > 0 else "stage 0 holds no model here: the activations alone fill a GPU's memory")
    lines.append(f"{w.name}: {need}; {zero}")
    return lines



# ---------------------------------------------------------------------- one job's memory, before it runs
def bert_parameters(c) -> tuple[int, int]:
    """``(split, whole)``: the parameters of hvd_bert's BERT for pretraining (``c``: a
    BertConfig) that tensor parallelism splits (each layer's query, key, value, first MLP
    projection, their biases, and the two row-parallel weights) and those every rank holds whole
    (embeddings, LayerNorms, the row-parallel biases, pooler and heads)."""
    h, i, L = c.hidden_size, c.intermediate_size, c.num_layers
    split = L * (4 * h * h + 3 * h + 2 * h * i + i)
    layer_whole = L * (2 * h + 4 * h)  # (attention and MLP output biases, two LayerNorms)
    embeddings = (c.padded_vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    # pooler, MLM transform, its LayerNorm and output bias, NSP
    heads = (h * h + h) * 2 + 2 * h + c.padded_vocab_size + 2 * h + 2
    return split, layer_whole + embeddings + heads


@dataclass(frozen=True)
class RankMemory:
    """What one rank holds of a training run's state, in bytes (fp32 weights, gradients and
    optimizer state, as hvd_bert's engines keep them)."""

    weights: float
    gradients: float
    optimizer_state: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_state


def rank_memory(split: int, whole: int, *, buffers: int, zero_stage: int, tensor_parallel: int,
                data_parallel: int, bytes_per_value: int = 4, masters: bool = False) -> RankMemory:
    """One rank's share: ``split`` parameters over the tensor-parallel group, ``whole`` on every
    rank; gradients over the data-parallel ranks at stage 2, the optimizer's ``buffers`` at 1.
    ``masters`` (``train.precision.weights=bf16``): 2-byte weights and gradients, and fp32
    masters counted with the optimizer state (DeepSpeed's 2 + 2 + (4 + 4 buffers) / N at stage
    2; its gradient shard is fp32)."""
    params = split / tensor_parallel + whole
    state_split = data_parallel if zero_stage >= 1 else 1
    if masters:
        g = params * 4 / data_parallel if zero_stage >= 2 else params * 2
        return RankMemory(params * 2, g, params * 4 * (buffers + 1) / state_split)
    w = params * bytes_per_value
    g = w / data_parallel if zero_stage >= 2 else w
    o = w * buffers / state_split
    return RankMemory(w, g, o)


def memory_plan_line(m: RankMemory, ranks_here: int, available: float, where: str, activations: float = 0.0,
                     about: str = "") -> tuple[str, bool]:
    """``(line, fits)``: the training state a rank will hold and its activations at a step's peak
    (``core.activations``; ``about``: what they are of), what the ranks on this host (or device)
    need together and what it has available."""
    from hvd_bert.core.text import size_text as gib

    total = m.total + activations
    need = total * ranks_here
    line = (f"memory plan per rank: weights {gib(m.weights)}, gradients {gib(m.gradients)}, optimizer state "
            f"{gib(m.optimizer_state)}, activations {gib(activations)}{about} = {gib(total)}; {ranks_here} "
            f"rank{'s' if ranks_here > 1 else ''} on {where} need {gib(need)} of its {gib(available)} "
            f"available")
    return line, need <= available
