"""What the memory plan counts (``core.model_size.bert_parameters``) is the PyTorch model's own
parameters, split and whole as its tensor-parallel plan splits them; ``core.optim.state_buffers``
is what the optimizers keep."""

import math

import pytest
import torch

from hvd_bert.config import OptimConfig
from hvd_bert.config.bert import BertConfig
from hvd_bert.core.model_size import bert_parameters
from hvd_bert.core.optim import state_buffers
from hvd_bert.pt.models.bert import BertForPreTraining
from hvd_bert.pt.optim import build_optimizer, init_state
from hvd_bert.pt.tensor_parallel import split_dim


@pytest.mark.parametrize("c", [BertConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                                          intermediate_size=64, max_position_embeddings=32),
                               BertConfig(vocab_size=30522, hidden_size=48, num_layers=3, num_heads=2,
                                          intermediate_size=80, max_position_embeddings=128)])
def test_the_plan_counts_the_model_s_parameters(c):
    with torch.device("meta"):
        model = BertForPreTraining(c)
    split = sum(math.prod(p.shape) for n, p in model.named_parameters() if split_dim(n) is not None)
    whole = sum(math.prod(p.shape) for n, p in model.named_parameters() if split_dim(n) is None)
    assert bert_parameters(c) == (split, whole)


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb", "nvlamb", "lars", "lion"])
def test_state_buffers_are_what_the_optimizer_keeps_per_parameter(name):
    p = torch.nn.Parameter(torch.zeros(3))
    opt = build_optimizer([("w", p)], OptimConfig(name=name, momentum=0.9) if name == "sgd"
                          else OptimConfig(name=name))
    init_state(opt)
    kept = [k for k, v in opt.state[p].items() if isinstance(v, torch.Tensor) and v.shape == p.shape]
    assert len(kept) == state_buffers(name)
