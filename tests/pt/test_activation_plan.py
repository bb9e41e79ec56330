"""The activation model of the memory plan (hvd_bert.core.activations) against what PyTorch's
autograd keeps for the backward pass of hvd_bert's BERT (every saved tensor's storage, counted
once, parameters left out), over sizes, sequence lengths, precisions and checkpointing
policies: within 15% (its per-layer terms hold to the byte; the heads' are approximate)."""

import numpy as np
import pytest
import torch

from hvd_bert.config.bert import BertConfig
from hvd_bert.config.train import activation_policy
from hvd_bert.core.activations import ActivationShape, kept_bytes
from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss


def measured(c: BertConfig, b: int, s: int, p: int, policy: str, precision: str) -> int:
    torch.compiler.reset()  # (bias+GELU compiles per shape: many shapes in one process reach dynamo's limit)
    torch.manual_seed(0)
    model = BertForPreTraining(c)
    model.activation_checkpointing(*activation_policy(policy))
    rng = np.random.default_rng(0)
    batch = {"input_ids": torch.from_numpy(rng.integers(5, c.vocab_size, (b, s))),
             "segment_ids": torch.zeros(b, s, dtype=torch.int64),
             "input_mask": torch.ones(b, s, dtype=torch.int64),
             "masked_lm_positions": torch.from_numpy(np.sort(rng.integers(1, s, (b, p)), axis=1)),
             "masked_lm_ids": torch.from_numpy(rng.integers(5, c.vocab_size, (b, p))),
             "masked_lm_weights": torch.ones(b, p),
             "next_sentence_labels": torch.zeros(b, 1, dtype=torch.int64)}
    seen: dict[int, int] = {}

    def keep(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    params = {q.untyped_storage().data_ptr() for q in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            pretraining_loss(model, batch)
    return sum(n for ptr, n in seen.items() if ptr not in params)


# (hidden, layers, heads, intermediate, seq, batch): BERT-tiny and BERT-mini's layer shapes at
# sequence 128 and 512, and one with an MLP of twice the hidden size
SHAPES = [(128, 2, 2, 512, 128, 4), (256, 4, 4, 1024, 128, 2), (128, 2, 2, 512, 512, 1),
          (256, 4, 4, 1024, 512, 1), (128, 3, 4, 256, 64, 8), (192, 2, 3, 768, 96, 3)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("policy", ["off", "layers", "layers:2", "attention"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_plan_s_activations_are_what_autograd_keeps(shape, policy, precision):
    h, layers, heads, inter, s, b = shape
    p, vocab = max(1, s // 7), 1000
    c = BertConfig(vocab_size=vocab, hidden_size=h, num_layers=layers, num_heads=heads,
                   intermediate_size=inter, max_position_embeddings=512)
    got = measured(c, b, s, p, policy, precision)
    every, attention = activation_policy(policy)
    planned = kept_bytes(ActivationShape(h, layers, heads, inter, s, b, p, c.padded_vocab_size), precision,
                         every, attention)
    assert abs(planned - got) <= 0.15 * got, (planned, got, planned / got)
