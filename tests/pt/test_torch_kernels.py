"""The fused bias+GELU equals the unfused composition, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from hvd_bert.pt import kernels as K


def grads_of(fn, x, b):
    x = x.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    y = fn(x, b)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad, b.grad


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_eager_composition_equals_torch_gelu(approximate):
    x, b = torch.randn(64, 48, dtype=torch.float64), torch.randn(48, dtype=torch.float64)
    want = grads_of(lambda x, b: F.gelu(x + b, approximate=approximate), x, b)
    got = grads_of(lambda x, b: K.bias_gelu_eager(x, b, approximate), x, b)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_compiled_equals_unfused_forward_and_backward(approximate, monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    x, b = torch.randn(128, 96), torch.randn(96)
    want = grads_of(lambda x, b: F.gelu(x + b, approximate=approximate), x.double(), b.double())
    with torch._dynamo.config.patch(suppress_errors=False):
        got = grads_of(lambda x, b: K.bias_gelu(x, b, approximate), x, b)
    assert not K._failed, "torch.compile fell back to eager"
    assert approximate in K._compiled
    y, gx, gb = got
    torch.testing.assert_close(y.double(), want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx.double(), want[1], rtol=1e-5, atol=1e-6)
    # the bias gradient sums 128 rows: fp32 summation order shows at ~1e-5 of the terms
    torch.testing.assert_close(gb.double(), want[2], rtol=1e-5, atol=5e-5)


def test_disabled_compile_uses_eager(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    x, b = torch.randn(4, 8), torch.randn(8)
    torch.testing.assert_close(K.bias_gelu(x, b), F.gelu(x + b, approximate="tanh"))


def test_linear_gelu_matches_linear_then_gelu(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    torch.manual_seed(0)
    m = K.LinearGELU(8, 16, approximate="none")
    ref = torch.nn.Linear(8, 16)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(5, 8)
    torch.testing.assert_close(m(x), F.gelu(ref(x)))
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]


def test_bad_form_is_rejected():
    with pytest.raises(ValueError, match="'tanh' or 'none'"):
        K.bias_gelu(torch.ones(1), torch.ones(1), "sigmoid")
