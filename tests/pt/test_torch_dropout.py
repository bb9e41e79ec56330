"""The hash-mask dropout (hvd_bert.pt.kernels.dropout) against PyTorch's dropout: the same law (kept
with probability 1 - p, scaled by 1 / (1 - p), masks independent between elements and calls),
the gradient through the recomputed mask, the fused residual, the generator's seed, and the
PyTorch fallback for what the kernel does not serve. BERT's layers use it in training only."""

import math

import pytest
import torch
import torch.nn.functional as F

from closeness import assert_close, seed_of
from hvd_bert.config.bert import bert_preset
from hvd_bert.pt.kernels import dropout as D
from hvd_bert.pt.models.bert import BertForPreTraining, attention


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setenv("HVD_BERT_FAST_DROPOUT", "1")
    assert D.served(torch.zeros(1)), "the dropout kernel did not build here"


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_and_scale_follow_p(p):
    n = 2_000_003  # not a multiple of any vector width; several OpenMP chunks
    y = D.dropout(torch.ones(n), p)
    kept = (y != 0).double()
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(kept.mean().item() - (1 - p)) < 5 * sd
    # worst case 0.048 of the bound, margin 21x (tests/bounds/MEASURED.md, 8 seeds, Zen 4)
    assert_close(y[y != 0].numpy(), 1 / (1 - p), rtol=1e-6,
                 site="pt/torch_dropout::test_kept_fraction_and_scale_follow_p")
    assert abs(y.double().mean().item() - 1.0) < 5 * sd / (1 - p)  # unbiased, like F.dropout


def test_masks_are_independent_between_neighbours_and_calls():
    m1 = (D.dropout(torch.ones(1_000_000), 0.5) != 0).double()
    m2 = (D.dropout(torch.ones(1_000_000), 0.5) != 0).double()
    for a, b in ((m1[:-1], m1[1:]), (m1[:-768], m1[768:]), (m1, m2)):
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 5e-3
    assert not torch.equal(m1, m2)


def test_the_generator_seed_decides_the_mask():
    x = torch.randn(4, 128, 64)
    torch.manual_seed(seed_of(7))
    a = D.dropout(x, 0.1)
    torch.manual_seed(seed_of(7))
    b = D.dropout(x, 0.1)
    torch.manual_seed(seed_of(8))
    c = D.dropout(x, 0.1)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_gradient_is_the_forward_mask_times_the_scale_and_the_residual_gets_all():
    x = torch.randn(3, 77, 50, requires_grad=True)
    r = torch.randn(3, 77, 50, requires_grad=True)
    y = D.dropout_add(x, r, 0.3)
    d = (y - r).detach()  # the dropped-out x
    mask = d != 0  # the bounds below: worst case 0.11 of them, margin 9x (tests/bounds/MEASURED.md)
    assert_close(d[mask].numpy(), (x.detach()[mask] / 0.7).numpy(), rtol=1e-5, atol=1e-5,
                 site="pt/torch_dropout::test_gradient_is_the_forward_mask_times_the_scale_and_the_residual_gets_all")
    g = torch.randn_like(y)
    y.backward(g)
    assert_close(x.grad.numpy(), torch.where(mask, g / 0.7, 0.0).numpy(), rtol=1e-6,
                 site="pt/torch_dropout::test_gradient_is_the_forward_mask_times_the_scale_and_the_residual_gets_all")
    assert torch.equal(r.grad, g)


def test_non_contiguous_input_and_gradient():
    x = torch.randn(64, 96).t().requires_grad_()  # a transposed view
    y = D.dropout(x, 0.2)
    mask = y != 0
    (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    want = torch.where(mask, torch.arange(y.numel(), dtype=y.dtype).view_as(y) / 0.8, 0.0)
    assert_close(x.grad.numpy(), want.numpy(), rtol=1e-6,
                 site="pt/torch_dropout::test_non_contiguous_input_and_gradient")


def test_eval_and_p_zero_are_the_identity_and_bad_p_is_refused():
    x, r = torch.randn(10), torch.randn(10)
    assert D.dropout(x, 0.5, training=False) is x
    assert torch.equal(D.dropout_add(x, r, 0.0), r + x)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\)"):
        D.dropout(x, 1.0)


def test_what_the_kernel_does_not_serve_is_pytorchs_dropout(monkeypatch):
    x = torch.randn(1000, dtype=torch.float64)
    torch.manual_seed(seed_of(3))
    got = D.dropout(x, 0.25)
    torch.manual_seed(seed_of(3))
    assert torch.equal(got, F.dropout(x, 0.25, True))  # fp64: PyTorch's, the same draws
    monkeypatch.setenv("HVD_BERT_FAST_DROPOUT", "0")
    x32 = torch.randn(1000)
    torch.manual_seed(seed_of(3))
    got = D.dropout(x32, 0.25)
    torch.manual_seed(seed_of(3))
    assert torch.equal(got, F.dropout(x32, 0.25, True)) and not D.served(x32)


def test_written_out_attention_is_sdpa_without_dropout_and_keeps_its_law():
    g = torch.Generator().manual_seed(seed_of(0))
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    mask = torch.ones(2, 16)
    mask[1, 12:] = 0
    bias = (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    # the written-out path with p -> 0 through the kernel: the same softmax(q k^T / sqrt(d) + b) v
    got = attention(q, k, v, bias, 1e-9, True)  # worst case 0.16 of the bound: margin 6.4x (MEASURED.md)
    assert_close(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6,
                 site="pt/torch_dropout::test_written_out_attention_is_sdpa_without_dropout_and_keeps_its_law")
    # with dropout the expectation over masks is the same output: the mean over 400 draws is off
    # by 0.0133-0.0153 on average over the 1024 outputs (8 seeds, tests/bounds/measure.py), a
    # law without the 1/(1-p) scale by 0.14-0.17; the bound 0.05 sits 3.3x above the one and
    # 2.8x below the other (the largest single output's error, up to 0.2, is no statistic to bound)
    torch.manual_seed(seed_of(0))
    mean = sum(attention(q, k, v, bias, 0.5, True) for _ in range(400)) / 400
    assert_close((mean - want).abs().mean().item(), 0.0, atol=0.05,
                 site="pt/torch_dropout::test_written_out_attention_is_sdpa_without_dropout_and_keeps_its_law"
                      "/mean-of-400")


def test_a_bert_training_step_uses_the_kernel_and_learns(monkeypatch):
    # (eager bias+GELU: this test's shapes must not use up the compiled kernel's recompiles,
    # which the process shares with tests/pt/test_torch_kernels.py)
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    calls = []
    real = D._run
    monkeypatch.setattr(D, "_run", lambda *a: calls.append(1) or real(*a))
    cfg = bert_preset("tiny", vocab_size=100)
    torch.manual_seed(seed_of(0))
    model = BertForPreTraining(cfg).train()
    ids = torch.randint(5, 100, (4, 32))
    seg, msk = torch.zeros_like(ids), torch.ones_like(ids)
    pos = torch.randint(1, 32, (4, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        mlm, _ = model(ids, seg, msk, pos)
        loss = F.cross_entropy(mlm.flatten(0, 1), torch.gather(ids, 1, pos).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # per layer: attention probabilities, two hidden-state dropouts; and the embeddings' one
    assert len(calls) >= 30 * (3 * cfg.num_layers + 1) * 2  # forward and backward
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    model.eval()
    with torch.no_grad():
        a, _ = model(ids, seg, msk, pos)
        b, _ = model(ids, seg, msk, pos)
    assert torch.equal(a, b)  # no dropout in eval
