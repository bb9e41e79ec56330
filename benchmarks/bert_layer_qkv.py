"""One BERT-Base encoder layer (batch 8 x 128, fp32, 2 threads, training with dropout),
forward + backward, with the fused query/key/value projection and with three
(``HVD_BERT_FUSED_QKV=0``), alternating in one process; prints the medians and their ratio.

    .venv/bin/python benchmarks/bert_layer_qkv.py [pairs]
"""

import os
import statistics
import sys
import time

import torch

from hvd_bert.config.bert import bert_preset
from hvd_bert.pt.models.bert import BertLayer


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    layer = BertLayer(bert_preset("base")).train()
    x = torch.randn(8, 128, 768, requires_grad=True)
    bias = torch.zeros(8, 1, 1, 128)

    def step():
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        layer(x, bias).sum().backward()

    times = {"1": [], "0": []}
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 16):
        for flag in ("1", "0") if i % 2 else ("0", "1"):
            os.environ["HVD_BERT_FUSED_QKV"] = flag
            step()
            t = time.perf_counter()
            step()
            times[flag].append(time.perf_counter() - t)
    fused, three = (statistics.median(times[f]) * 1e3 for f in ("1", "0"))
    print(f"fused QKV {fused:.1f} ms, three projections {three:.1f} ms, fused speed-up {three / fused:.3f}x")


if __name__ == "__main__":
    main()
