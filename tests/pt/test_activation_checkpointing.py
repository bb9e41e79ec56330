"""``train.activation_checkpointing`` (hvd_bert.pt.models.bert.recompute): layers, every K-th
layer or each attention block recomputed in the backward pass give exactly the gradients of the
plain path in fp32, dropout on (the recomputation draws the same masks), on padded and packed
batches (the dense bias and varlen attention) and with the fused QKV projection; it keeps fewer
activations; the setting is checked in one line, and TensorFlow refuses it up front."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_packed_bert import batch  # noqa: E402

from hvd_bert.config.bert import bert_preset  # noqa: E402
from hvd_bert.config.train import activation_policy  # noqa: E402
from hvd_bert.data.packing import pack_batch  # noqa: E402
from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss  # noqa: E402

VOCAB = 1000


def model_of(seed: int) -> BertForPreTraining:
    torch.manual_seed(seed)
    c = replace(bert_preset("tiny", vocab_size=VOCAB), num_layers=4, hidden_dropout=0.1,
                attention_dropout=0.1)
    return BertForPreTraining(c)


def grads_of(model, b, policy: str, seed: int) -> tuple[float, dict]:
    model.activation_checkpointing(*activation_policy(policy))
    model.zero_grad()
    torch.manual_seed(seed + 1)  # (the dropout masks' stream)
    loss, _ = pretraining_loss(model, {k: torch.from_numpy(v) for k, v in b.items()})
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("packed", ["no", "bias", "varlen"])
@pytest.mark.parametrize("policy", ["layers", "layers:2", "attention"])
def test_recomputed_activations_give_exactly_the_plain_gradients(policy, packed):
    model, b = model_of(3), batch(np.random.default_rng(3))
    if packed != "no":  # (varlen: SDPA's own dropout on nested tensors, recomputed alike)
        b = pack_batch(b, segments=packed == "varlen")
    loss, plain = grads_of(model, b, "off", 3)
    again, recomputed = grads_of(model, b, policy, 3)
    assert again == loss
    assert all(torch.equal(plain[n], recomputed[n]) for n in plain), policy
    assert any(plain[n].abs().sum() > 0 for n in plain)


def saved_bytes(model, b, policy: str) -> int:
    """The bytes of the tensors autograd keeps for the backward pass of one forward."""
    model.activation_checkpointing(*activation_policy(policy))
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pretraining_loss(model, {k: torch.from_numpy(v) for k, v in b.items()})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


def test_checkpointing_keeps_fewer_activations():
    model, b = model_of(4), batch(np.random.default_rng(4))
    off, every, half, attn = (saved_bytes(model, b, p) for p in ("off", "layers", "layers:2", "attention"))
    assert every < half < off and attn < off, (off, every, half, attn)
    assert every < 0.5 * off


@pytest.mark.parametrize("value", ["sometimes", "layers:0", "layers:x", "every"])
def test_a_wrong_setting_is_one_line(value):
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "config", "--job", "pretrain", "--set",
                          f"train.activation_checkpointing={value}"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "give off, layers, layers:K" in res.stderr, res.stderr
    assert res.stderr.strip().count("\n") == 0


def test_tensorflow_refuses_it_up_front():
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "config", "--job", "finetune", "--set",
                          "framework=tf", "--set", "train.activation_checkpointing=layers"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "is PyTorch's" in res.stderr, res.stderr
