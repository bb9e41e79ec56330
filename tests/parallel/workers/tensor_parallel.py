"""One rank of tests/parallel/test_tensor_parallel.py: a small BERT for pretraining, dense on
every rank and split over tensor-parallel groups of T ranks (``hvd_bert.pt.tensor_parallel``),
both from the same weights, forward and backward on the batch of this rank's data-parallel
replica; writes both losses and, per parameter, the largest difference between the dense
gradient and the gathered tensor-parallel one (and its scale).

    python tensor_parallel.py T OUT_DIR
"""

import copy
import json
import os
import sys

import horovod.torch as hvd
import torch

from hvd_bert.config.bert import BertConfig
from hvd_bert.pt import init_horovod
from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
from hvd_bert.pt.tensor_parallel import gather, gather_state_dict, make_groups, split_dim, split_layers

SHIFT = int(os.environ.get("HVD_BERT_TEST_SEED_SHIFT", "0"))


def batch(seed: int, c: BertConfig, b: int = 4, s: int = 16, p: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 11:] = 0  # padding: the attention bias takes part
    return {"input_ids": torch.randint(0, c.vocab_size, (b, s), generator=g),
            "segment_ids": torch.randint(0, 2, (b, s), generator=g), "input_mask": mask,
            "masked_lm_positions": torch.randint(0, 10, (b, p), generator=g),
            "masked_lm_ids": torch.randint(0, c.vocab_size, (b, p), generator=g),
            "masked_lm_weights": torch.ones(b, p),
            "next_sentence_labels": torch.randint(0, 2, (b,), generator=g)}


def main():
    tp, out = int(sys.argv[1]), sys.argv[2]
    init_horovod(process_sets=True)  # (Horovod's dynamic process sets: the groups are added after init)
    r = hvd.rank()
    groups = make_groups(tp)
    c = BertConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                   max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(SHIFT)
    dense = BertForPreTraining(c)  # the same weights on every rank
    split = split_layers(copy.deepcopy(dense), groups)
    data = batch(100 + SHIFT + groups.dp_rank, c)
    losses = []
    for model in (dense, split):
        loss, _ = pretraining_loss(model, data)
        loss.backward()
        losses.append(float(loss.detach()))
    shapes = {n: list(p.shape) for n, p in split.named_parameters()}
    want = dict(dense.named_parameters())
    diffs = {}
    for name, p in split.named_parameters():
        whole = gather(name, p.grad, groups)
        diffs[name] = [float((whole - want[name].grad).abs().max()), float(want[name].grad.abs().max()),
                       split_dim(name)]
    same = all(torch.equal(t, dense.state_dict()[k]) for k, t in gather_state_dict(split, groups).items())
    hvd.barrier()  # (Horovod shuts down when a rank exits: the other group may still be gathering)
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump({"rank": r, "tp_rank": groups.rank, "dp_rank": groups.dp_rank, "losses": losses,
                   "grad_diffs": diffs, "shapes": shapes, "gathered_equals_dense": same}, f)


if __name__ == "__main__":
    main()
