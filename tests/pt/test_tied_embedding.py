"""The tied word embeddings / masked-LM decoder with one gradient buffer
(hvd_bert/pt/kernels/tied_embedding.py), against PyTorch's own autograd through F.embedding and
F.linear on the same model, weights and batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from closeness import assert_close, seed_of
from hvd_bert.config.bert import bert_preset
from hvd_bert.pt.models import bert
from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
from hvd_bert.pt.kernels import tied_embedding as T


def _batch(seed, b=3, s=16, p=4, vocab=100):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, s), generator=g)
    ids[0, :6] = 7  # a token repeated, so the lookup's gradient adds rows onto one
    return {"input_ids": ids, "segment_ids": torch.zeros_like(ids), "input_mask": torch.ones_like(ids),
            "masked_lm_positions": torch.randint(1, s, (b, p), generator=g),
            "masked_lm_ids": torch.randint(5, vocab, (b, p), generator=g),
            "masked_lm_weights": torch.ones(b, p),
            "next_sentence_labels": torch.randint(0, 2, (b, 1), generator=g)}


def _grads(monkeypatch, tied: bool, loss_fn):
    with monkeypatch.context() as m:
        if not tied:
            m.setattr(bert, "tie_for", lambda w: None)
        cfg = bert_preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
        torch.manual_seed(seed_of(0))
        model = BertForPreTraining(cfg).train()
        loss_fn(model).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same(monkeypatch, loss_fn):
    want, got = _grads(monkeypatch, False, loss_fn), _grads(monkeypatch, True, loss_fn)
    assert want.keys() == got.keys()
    for n in want:  # worst case 0.11 of the bound, margin 9x (tests/bounds/MEASURED.md, 8 seeds, Zen 4)
        assert_close(got[n].numpy(), want[n].numpy(), rtol=1e-5, atol=1e-7, err_msg=n,
                     site="pt/tied_embedding::_same")
    return got


@pytest.fixture(autouse=True)
def _eager(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")  # keep the compiled kernel's recompiles for its own tests


def test_the_gradients_are_autograds_through_embedding_and_linear(monkeypatch):
    got = _same(monkeypatch, lambda m: pretraining_loss(m, _batch(seed_of(0)))[0])
    assert got["embeddings.word_embeddings.weight"].abs().sum() > 0


def test_a_loss_summed_over_two_forward_passes(monkeypatch):
    _same(monkeypatch, lambda m: pretraining_loss(m, _batch(seed_of(0)))[0]
          + 0.5 * pretraining_loss(m, _batch(seed_of(1)))[0])


def test_a_loss_without_the_masked_lm_term(monkeypatch):
    def nsp_only(m):
        b = _batch(seed_of(0))
        _, nsp = m(b["input_ids"], b["segment_ids"], b["input_mask"], b["masked_lm_positions"])
        return F.cross_entropy(nsp, b["next_sentence_labels"].view(-1))
    _same(monkeypatch, nsp_only)


def test_gradients_accumulate_over_two_backward_passes(monkeypatch):
    def two(m):
        pretraining_loss(m, _batch(seed_of(0)))[0].backward()  # .grad exists for the second one
        return pretraining_loss(m, _batch(seed_of(1)))[0]
    _same(monkeypatch, two)


def test_the_weight_gets_one_buffer_and_no_zero_fill_of_its_size():
    cfg = bert_preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
    model = BertForPreTraining(cfg).train()
    shape = list(model.embeddings.word_embeddings.weight.shape)
    with torch.profiler.profile(record_shapes=True) as prof:
        pretraining_loss(model, _batch(seed_of(0)))[0].backward()
    big = [(e.name, e.input_shapes) for e in prof.events()
           if e.name in ("aten::zeros", "aten::fill_", "aten::zero_", "aten::add", "aten::copy_")
           and e.input_shapes and shape in e.input_shapes]
    assert big == []


def test_where_it_does_not_serve_it_is_embedding_and_linear():
    w = torch.randn(10, 4, requires_grad=True)
    assert isinstance(T.tie_for(w), T.Tie)
    assert T.tie_for(w.detach()) is None
    with torch.no_grad():
        assert T.tie_for(w) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert T.tie_for(w) is None
    ids = torch.tensor([[1, 2, 2]])
    assert torch.equal(T.lookup(w, ids, None), F.embedding(ids, w))
    x = torch.randn(3, 4)
    assert torch.equal(T.project(x, w, None, None), F.linear(x, w))


def test_a_frozen_word_embedding_gets_no_gradient(monkeypatch):
    monkeypatch.setenv("HVD_BERT_COMPILE", "0")
    cfg = bert_preset("tiny", vocab_size=100)
    model = BertForPreTraining(cfg).train()
    model.embeddings.word_embeddings.weight.requires_grad_(False)
    pretraining_loss(model, _batch(seed_of(0)))[0].backward()
    assert model.embeddings.word_embeddings.weight.grad is None
    assert model.mlm_bias.grad is not None
