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
