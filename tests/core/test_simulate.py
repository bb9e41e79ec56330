"""The alpha-beta projection against REFERENCE.md section 5's worked example."""

import dataclasses
import math

import pytest

from hvd_bert.core import cost_model as S

SIZE = 340e6 * 4  # BERT-Large, fp32 bytes
N = 1472
FLAT = S.INTERCONNECTS["flat-12.5"]


def test_flat_ring_bandwidth_term():
    no_latency = dataclasses.replace(FLAT, alpha=0.0)
    assert S.allreduce_time(SIZE, N, no_latency) == pytest.approx(0.2175, abs=5e-4)
    assert S.allreduce_time(SIZE / 2, N, no_latency) == pytest.approx(0.1087, abs=5e-4)


def test_fusion_pays_latency_per_collective():
    k = math.ceil(SIZE / (128 * S.MIB))
    assert k == 11
    assert S.allreduce_time(SIZE, N, FLAT, "ring", k) == pytest.approx(0.3793, abs=5e-4)
    assert S.allreduce_time(SIZE, N, FLAT, "ring", 398) == pytest.approx(6.07, abs=0.01)


def test_hierarchical_with_nvswitch():
    net = S.INTERCONNECTS["dgx2h"]
    assert S.allreduce_time(SIZE, N, net, "hierarchical") == pytest.approx(0.0449, abs=3e-4)
    assert S.allreduce_time(SIZE / 2, N, net, "hierarchical") == pytest.approx(0.0229, abs=3e-4)


def test_tree_latency_grows_with_log_n():
    t1 = S.allreduce_time(1.0, 1024, FLAT, "tree")
    r1 = S.allreduce_time(1.0, 1024, FLAT, "ring")
    assert t1 == pytest.approx(2 * 10 * FLAT.alpha, rel=1e-3) and t1 < r1 / 50


def test_one_rank_costs_nothing_and_efficiency_is_one():
    p = S.project(S.WORKLOADS["bert-large-p1"], 1, FLAT)
    assert p.comm_s == 0 and p.efficiency == 1.0


@pytest.mark.parametrize("change", [dict(fp16=True), dict(backward_passes_per_step=4), dict(overlap=True)])
def test_each_technique_raises_efficiency(change):
    w = S.WORKLOADS["vgg-16"]
    net = S.INTERCONNECTS["pascal-roce25"]
    base = dict(algorithm="ring", fp16=False, overlap=False, backward_passes_per_step=1)
    assert S.project(w, 512, net, **{**base, **change}).efficiency > S.project(w, 512, net, **base).efficiency


def test_no_fusion_is_slower_than_fusion():
    w = S.WORKLOADS["resnet-101"]
    net = S.INTERCONNECTS["flat-12.5"]
    assert S.project(w, 512, net, fusion_bytes=None).comm_s > S.project(w, 512, net).comm_s


def test_fit_recovers_alpha_and_bandwidth():
    net = S.Interconnect(20e-6, 3e9)
    sizes = [2**k for k in range(10, 26, 2)]
    times = [S.allreduce_time(s, 2, net) for s in sizes]
    alpha, bw = S.fit_alpha_beta(sizes, times, 2)
    assert alpha == pytest.approx(20e-6, rel=1e-6) and bw == pytest.approx(3e9, rel=1e-6)


def test_the_probe_output_is_read_and_fitted_in_one_place():
    """What `simulate --calibrate` and benchmarks/shaped_link.py both read: the probe's PROBE line
    among the launcher's other output."""
    import json

    true = S.Interconnect(50e-6, 1.5e9)
    points = [(s, S.allreduce_time(s, 4, true)) for s in (2**10, 2**14, 2**18, 2**22)]
    out = f"[1]<stderr>:noise\n[0]<stdout>:PROBE {json.dumps({'size': 4, 'points': points})}\n"
    probe, alpha, bw = S.fit_probe(out)
    assert probe["size"] == 4
    assert alpha == pytest.approx(50e-6, rel=1e-6) and bw == pytest.approx(1.5e9, rel=1e-6)
    with pytest.raises(ValueError, match="no PROBE line"):
        S.fit_probe("mpirun: nothing measured\n")


# ---------------------------------------------------------------------- model size (ZeRO, TP)
from hvd_bert.core import model_size as M  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_bytes_per_parameter_are_reference_section_9s(n):
    assert M.state_bytes_per_param(M.Layout(0), n) == 16
    assert M.state_bytes_per_param(M.Layout(1), n) == pytest.approx(4 + 12 / n)
    assert M.state_bytes_per_param(M.Layout(2), n) == pytest.approx(2 + 14 / n)
    assert M.state_bytes_per_param(M.Layout(0), n, mixed=False) == 16
    assert M.state_bytes_per_param(M.Layout(1), n, mixed=False) == pytest.approx(8 + 8 / n)
    assert M.state_bytes_per_param(M.Layout(1, 4), n) == pytest.approx((4 + 12 / n) / 4)


def test_the_issue_s_example_a_1_3b_lamb_model_needs_about_21_gb_for_its_state():
    assert 1.3e9 * M.state_bytes_per_param(M.Layout(0), 8, mixed=False) / 1e9 == pytest.approx(20.8)


def test_activations_are_the_job_plan_s_and_tensor_parallelism_splits_the_mlp_and_attention():
    """simulate --model-size counts a GPU rank's activations as a job's plan does
    (core.activations: bf16 autocast, a fused attention kernel keeping 4 bytes per head and
    token): each of the 24 layers keeps 32 s b h + 4 s b i / T + 4 a s b / T + 16 s b + its bf16
    weight copies 2 (7 h^2 + 2 h i) / T; the heads 8 s b h + 26 s b (no masked positions here);
    one layer more and the gradient 8 s b h at the peak."""
    shape = M.Shape(hidden=1024, layers=24, heads=16, seq=128, micro_batch=64)
    s, b, h, a, i = 128, 64, 1024, 16, 4096

    def layer(t):
        copies = 2 * (7 * h * h + 2 * h * i) / t
        return 32 * s * b * h + 4 * s * b * i / t + 4 * a * s * b / t + 16 * s * b + copies

    for t in (1, 8):  # (the heads: also the pooler's and transform's bf16 copy, 2 h^2)
        want = 25 * layer(t) + 8 * s * b * h + 26 * s * b + 2 * h * h + 8 * s * b * h
        assert M.activation_bytes(shape, t) == pytest.approx(want)
    assert M.activation_bytes(shape, 8) < 0.7 * M.activation_bytes(shape)  # (s b h terms counted whole)


def test_each_stage_holds_a_bigger_model_and_costs_an_allgather_more():
    net, w = S.INTERCONNECTS["dgx2h"], S.WORKLOADS["bert-large-p1"]
    shape = M.BERT_SHAPES["bert-large-p1"]
    sizes = [M.largest_model(lay, 64, 80e9) for lay in M.LAYOUTS]
    assert sizes[0] < sizes[1] < sizes[2] and sizes[3] < sizes[4] < sizes[5]
    p = {lay: M.project_layout(w, shape, 64, net, lay) for lay in M.LAYOUTS}
    assert p[M.Layout(0)].extra_comm_s == 0
    # the allgather of the weights after the step: half an allreduce's time, exposed (the fp32
    # gradients in 128 MiB buffers, as the scaling table costs them; the reduce-scatter's last
    # buffer after the backward pass is half the allreduce's)
    buffers = -(-w.params * 4 // (128 * 2**20))
    half = S.allreduce_time(w.params * 4, 64, net, "hierarchical", buffers) / 2
    last = S.allreduce_time(w.params * 4 / buffers, 64, net, "hierarchical", 1)
    assert p[M.Layout(1)].extra_comm_s == pytest.approx(half - last / 2, rel=1e-6)
    # stage 0 is the scaling table's step
    table = S.project(w, 64, net, algorithm="hierarchical")
    assert p[M.Layout(0)].step_s == pytest.approx(table.step_s, rel=1e-9)
    assert p[M.Layout(1)].memory_bytes < p[M.Layout(0)].memory_bytes
    # tensor parallelism: 4 allreduces of the activations per layer, so less efficient with T
    effs = [p[M.Layout(1, t)].efficiency for t in (2, 4, 8)]
    assert effs == sorted(effs, reverse=True)


def test_simulate_model_size_names_the_layout_a_big_model_needs(capsys):
    from hvd_bert.cli import main
    assert main(["simulate", "--model-size", "--params", "8.3e9", "--micro-batch-seconds", "3",
                 "--gpus", "512"]) == 0
    out = capsys.readouterr().out
    assert "stage 0    132.8    no" in out
    assert "the layout with the most samples/s that fits it is stage 1;" in out
    assert "ZeRO is needed from 5.0B parameters" in out
    assert main(["simulate", "--model-size", "--gpus", "1472"]) == 0
    out = capsys.readouterr().out
    assert "stage 1, TP 8" in out and "it is stage 0;" in out


def test_each_phase_s_memory_and_the_step_is_the_device_s_peak():
    """fp32 LAMB, 1e9 parameters, 8 ranks: stage 0 holds 16 GB at the step; a sharded save stages
    1/8 of the 12 bytes of fp32 weights and moments; an elastic commit keeps the weights and the
    moments whole at stage 0, and 2/8 of the moments under ZeRO."""
    p = 1e9
    ph0 = M.phase_bytes(M.Layout(0), 8, p, mixed=False)
    assert ph0["step"] == 16e9 and ph0["build"] == 4e9 and ph0["save"] == 1.5e9 and ph0["commit"] == 12e9
    ph2 = M.phase_bytes(M.Layout(2), 8, p, mixed=False)
    assert ph2["step"] == pytest.approx(4e9 + 4e9 / 8 + 8e9 / 8) and ph2["commit"] == pytest.approx(4e9 + 2e9)
    for ph in (ph0, ph2, M.phase_bytes(M.Layout(1, 4), 8, p, activations=1e9)):
        assert ph["step"] >= max(ph["build"], ph["load"]) and ph["build"] < ph["load"]
