"""The fused bias+GELU (the C loop on a CPU, torch.compile elsewhere) equals PyTorch's GELU,
forward and backward."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from closeness import assert_close, seed_of
from hvd_bert.pt.kernels import gelu as K
from hvd_bert.pt.kernels.build import CKernels


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
        assert_close(g, w, rtol=1e-12, atol=1e-12,
                     site="pt/torch_kernels::test_eager_composition_equals_torch_gelu")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_compiled_equals_unfused_forward_and_backward(approximate, monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    x, b = torch.randn(128, 96), torch.randn(96)
    want = grads_of(lambda x, b: F.gelu(x + b, approximate=approximate), x.double(), b.double())
    with torch._dynamo.config.patch(suppress_errors=False):
        got = grads_of(lambda x, b: K.bias_gelu_compiled(x, b, approximate), x, b)
    assert not K._failed, "torch.compile fell back to eager"
    assert approximate in K._compiled
    y, gx, gb = got
    # fp32 against double; worst case over 8 seeds (tests/bounds/MEASURED.md, Zen 4) as a share
    # of each bound: y 0.25 (margin 4.0x), gx 0.23 (4.4x), gb 0.18 (5.6x); the bias gradient sums
    # 128 rows, so fp32 summation order shows at ~1e-5 of the terms
    assert_close(y.double(), want[0], rtol=1e-5, atol=1e-6,
                 site="pt/torch_kernels::test_compiled_equals_unfused_forward_and_backward/y")
    assert_close(gx.double(), want[1], rtol=3e-5, atol=3e-6,
                 site="pt/torch_kernels::test_compiled_equals_unfused_forward_and_backward/gx")
    assert_close(gb.double(), want[2], rtol=2e-5, atol=1e-4,
                 site="pt/torch_kernels::test_compiled_equals_unfused_forward_and_backward/gb")


def test_disabled_compile_uses_eager(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    x, b = torch.randn(4, 8), torch.randn(8)
    assert_close(K.bias_gelu(x, b), F.gelu(x + b, approximate="tanh"), rtol=1.3e-6, atol=1e-5,
                 site="pt/torch_kernels::test_disabled_compile_uses_eager")


def test_linear_gelu_matches_linear_then_gelu(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    torch.manual_seed(seed_of(0))
    m = K.LinearGELU(8, 16, approximate="none")
    ref = torch.nn.Linear(8, 16)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(5, 8)
    assert_close(m(x), F.gelu(ref(x)), rtol=1.3e-6, atol=1e-5,  # (torch.testing's float32 default)
                 site="pt/torch_kernels::test_linear_gelu_matches_linear_then_gelu")
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]


def test_bad_form_is_rejected():
    with pytest.raises(ValueError, match="'tanh' or 'none'"):
        K.bias_gelu(torch.ones(1), torch.ones(1), "sigmoid")


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(128, 96), (3, 37, 100), (1, 5), (7, 3072)])
def test_the_c_kernel_equals_torch_gelu_in_double(approximate, shape, monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    g = torch.Generator().manual_seed(seed_of(sum(shape)))
    x, b = 3 * torch.randn(*shape, generator=g), torch.randn(shape[-1], generator=g)
    assert K.c_served(x, b)
    calls = []
    real = K._CBiasGELU.apply
    monkeypatch.setattr(K._CBiasGELU, "apply", lambda *a: calls.append(1) or real(*a))
    y, gx, gb = grads_of(lambda x, b: K.bias_gelu(x, b, approximate), x, b)
    assert calls == [1]
    want = grads_of(lambda x, b: F.gelu(x + b, approximate=approximate), x.double(), b.double())
    # fp32 bounds: the tanh form's derivative has 1 - tanh^2, which cancels for large |x|; PyTorch's
    # own fp32 F.gelu backward is 1.04e-6 off the double one on these inputs, and the kernel with
    # AVX-512's libmvec tanhf (Zen 4) 1.23e-6. Worst case over 8 seeds (tests/bounds/MEASURED.md,
    # Zen 4) as a share of each bound: y 0.21 (margin 4.9x), gx 0.19 (5.2x), gb 0.19 (5.2x)
    assert_close(y.double(), want[0], rtol=3e-5, atol=3e-6,
                 site="pt/torch_kernels::test_the_c_kernel_equals_torch_gelu_in_double/y")
    assert_close(gx.double(), want[1], rtol=3e-5, atol=6e-6,
                 site="pt/torch_kernels::test_the_c_kernel_equals_torch_gelu_in_double/gx")
    rows = x.numel() // shape[-1]  # the bias gradient sums this many fp32 terms per column
    assert_close(gb.double(), want[2], rtol=2e-5, atol=1e-6 * rows,
                 site="pt/torch_kernels::test_the_c_kernel_equals_torch_gelu_in_double/gb")


def test_the_c_kernel_takes_a_non_contiguous_input(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    x, b = torch.randn(64, 40).t(), torch.randn(64)  # a transposed view
    want = grads_of(lambda x, b: F.gelu(x + b, approximate="tanh"), x.double(), b.double())
    for got, w in zip(grads_of(K.bias_gelu, x, b), want):
        assert_close(got.double(), w, rtol=1e-5, atol=2e-5,
                     site="pt/torch_kernels::test_the_c_kernel_takes_a_non_contiguous_input")


def test_what_the_c_kernel_does_not_serve(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    x, b = torch.randn(4, 8), torch.randn(8)
    assert K.c_served(x, b)
    assert not K.c_served(x.double(), b.double())
    assert not K.c_served(x.bfloat16(), b)
    assert not K.c_served(x, torch.randn(4))
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    assert not K.c_served(x, b)


def test_the_c_kernel_falls_back_to_compile_with_one_warning_without_a_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("HVD_BERT_CACHE", str(tmp_path))
    k = K._C  # a fresh, unbuilt copy: the build is tried again with this CC
    monkeypatch.setattr(K, "_C", CKernels(k.name, k.source, k.declare, k.what, k.fallback))
    x, b = torch.randn(16, 24), torch.randn(24)
    with pytest.warns(UserWarning, match="C bias\\+GELU kernel could not be built"):
        assert not K.c_served(x, b)
    assert not list(tmp_path.rglob("*.so")), "a failed build left a file behind"
    with torch._dynamo.config.patch(suppress_errors=False):
        got = grads_of(K.bias_gelu, x, b)
    want = grads_of(lambda x, b: F.gelu(x + b, approximate="tanh"), x.double(), b.double())
    for g, w in zip(got, want):
        assert_close(g.double(), w, rtol=1e-5, atol=5e-5,
                     site="pt/torch_kernels::test_the_c_kernel_falls_back_to_compile_with_one_warning_without_a_compiler")


def test_a_damaged_cached_kernel_is_rebuilt_not_loaded(monkeypatch, tmp_path):
    """A cached library cut short (a full disk, a copy interrupted) or emptied crashed the process
    in the loader (a bus error, every run): the cache keeps each library's SHA-256, and one that no
    longer matches is built again."""
    monkeypatch.setenv("HVD_BERT_COMPILE", "1")
    monkeypatch.setenv("HVD_BERT_CACHE", str(tmp_path))
    k = K._C
    x, b = torch.randn(16, 24), torch.randn(24)
    want = grads_of(lambda x, b: F.gelu(x + b, approximate="tanh"), x.double(), b.double())
    def replaced(p, data):  # (a new file: this process has the old one mapped, as a finished run had)
        p.with_name("tmp").write_bytes(data)
        p.with_name("tmp").replace(p)

    for damage in (lambda p: replaced(p, p.read_bytes()[:1000]), lambda p: replaced(p, b"")):
        monkeypatch.setattr(K, "_C", CKernels(k.name, k.source, k.declare, k.what, k.fallback))
        assert K.c_served(x, b)  # (built into this cache)
        (so,) = tmp_path.rglob("*.so")
        damage(so)
        monkeypatch.setattr(K, "_C", CKernels(k.name, k.source, k.declare, k.what, k.fallback))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no fallback warning: rebuilt, not given up)
            assert K.c_served(x, b)
        got = grads_of(K.bias_gelu, x, b)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5)
