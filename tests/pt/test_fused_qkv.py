"""The fused query/key/value projection against three ``torch.nn.functional.linear`` calls,
forward and backward, in double, fp32 training and bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from closeness import assert_close, seed_of
from hvd_bert.config.bert import bert_preset
from hvd_bert.pt.models.bert import BertLayer, qkv_heads

B, S, H, NH = 2, 5, 12, 3


def _linears(dtype):
    torch.manual_seed(seed_of(0))
    return [nn.Linear(H, H).to(dtype) for _ in range(3)]


def _oracle(x, mods):
    return [F.linear(x, m.weight, m.bias).view(B, S, NH, H // NH).transpose(1, 2) for m in mods]


def _grads(fn, x, mods, use=(0, 1, 2)):
    for m in mods:
        m.weight.grad = m.bias.grad = None
    x.grad = None
    outs = fn(x, mods)
    ramp = torch.linspace(-1, 1, outs[0].numel(), dtype=x.dtype).view_as(outs[0])
    weights = [ramp * (i + 1) for i in range(3)]
    sum((outs[i] * weights[i]).sum() for i in use).backward()
    grads = [x.grad] + [g for m in mods for g in (m.weight.grad, m.bias.grad)]
    return [o.detach() for o in outs], [None if g is None else g.clone() for g in grads]


@pytest.mark.parametrize("use", [(0, 1, 2), (0, 2)])
def test_equals_three_linear_projections_in_double(use):
    mods = _linears(torch.float64)
    x = torch.randn(B, S, H, dtype=torch.float64, requires_grad=True)
    out, grads = _grads(lambda x, m: qkv_heads(x, *m, NH), x, mods, use)
    ref, ref_grads = _grads(_oracle, x, mods, use)
    for a, b in zip(out, ref):
        assert a.shape == (B, NH, S, H // NH)
        assert_close(a, b, rtol=1e-12, atol=1e-12,
                     site="pt/fused_qkv::test_equals_three_linear_projections_in_double")
    for a, b in zip(grads, ref_grads):
        if b is None:  # the unused projection: autograd gives nothing, the fused one zeros
            assert a is None or not a.any()
        else:
            assert_close(a, b, rtol=1e-12, atol=1e-12,
                         site="pt/fused_qkv::test_equals_three_linear_projections_in_double")


def test_an_input_without_gradient():
    mods = _linears(torch.float32)
    x = torch.randn(B, S, H)
    sum(t.sum() for t in qkv_heads(x, *mods, NH)).backward()
    assert all(m.weight.grad is not None for m in mods)


def test_the_switch_gives_three_projections(monkeypatch):
    mods = _linears(torch.float64)
    x = torch.randn(B, S, H, dtype=torch.float64, requires_grad=True)
    monkeypatch.setenv("HVD_BERT_FUSED_QKV", "0")
    out = qkv_heads(x, *mods, NH)
    assert all(o.grad_fn.name() != "_QKVBackward" for o in out)
    monkeypatch.setenv("HVD_BERT_FUSED_QKV", "1")
    assert qkv_heads(x, *mods, NH)[0].grad_fn.name() == "_QKVBackward"


def _layer_step(layer, x, flag, monkeypatch, autocast=False):
    monkeypatch.setenv("HVD_BERT_FUSED_QKV", flag)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    torch.manual_seed(seed_of(7))  # the same dropout masks
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        y = layer(x, torch.zeros(x.shape[0], 1, 1, x.shape[1]))
    (y.float() * torch.linspace(0, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach().float(), x.grad.clone(), {n: p.grad.clone() for n, p in layer.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_a_training_layer_fused_equals_unfused(autocast, monkeypatch):
    torch.manual_seed(seed_of(0))
    layer = BertLayer(bert_preset("base", hidden_size=64, num_heads=4, intermediate_size=128)).train()
    x = torch.randn(2, 16, 64, requires_grad=True)
    y1, gx1, g1 = _layer_step(layer, x, "1", monkeypatch, autocast)
    y0, gx0, g0 = _layer_step(layer, x, "0", monkeypatch, autocast)
    # worst case 0.003 of either bound, margin 300x (tests/bounds/MEASURED.md, 8 seeds, Zen 4)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-6)
    site = f"pt/fused_qkv::test_a_training_layer_fused_equals_unfused/{'bf16' if autocast else 'fp32'}"
    assert_close(y1, y0, **tol, site=site)
    assert_close(gx1, gx0, **tol, site=site)
    for n in g0:
        assert g1[n].dtype == torch.float32, n
        assert_close(g1[n], g0[n], **tol, err_msg=n, site=site)
