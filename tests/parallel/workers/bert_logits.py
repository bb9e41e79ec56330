"""One framework's BERT logits on a fixed batch, from given or fresh weights.

    python bert_logits.py pt|tf BATCH.npz OUT.npz [--init WEIGHTS.npz] [--export WEIGHTS.npz]
"""

import argparse

import numpy as np

import hvd_bert  # noqa: F401
from hvd_bert.config.bert import bert_preset
from hvd_bert.weights.portable import read_weights, save_weights

ap = argparse.ArgumentParser()
ap.add_argument("framework", choices=["pt", "tf"])
ap.add_argument("batch")
ap.add_argument("out")
ap.add_argument("--init")
ap.add_argument("--export")
args = ap.parse_args()
batch = dict(np.load(args.batch))
config = bert_preset("tiny", vocab_size=1003, hidden_dropout=0.0, attention_dropout=0.0)

if args.framework == "pt":
    import torch

    from hvd_bert.pt.models import bert as B
    torch.manual_seed(1)
    model = B.BertForPreTraining(config).eval()
    if args.init:
        arrays, saved = read_weights(args.init)
        assert saved == config, saved
        B.load_weights(model, arrays)
    with torch.no_grad():
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        mlm, nsp = model(t["input_ids"], t["segment_ids"], t["input_mask"], t["masked_lm_positions"])
    mlm, nsp = mlm.numpy(), nsp.numpy()
else:
    import tensorflow as tf

    from hvd_bert.tf.models import bert as B
    tf.random.set_seed(1)
    model = B.build_model(B.BertForPreTraining(config))
    if args.init:
        arrays, saved = read_weights(args.init)
        assert saved == config, saved
        B.load_weights(model, arrays)
    mlm, nsp = model({k: tf.constant(v) for k, v in batch.items()}, training=False)
    mlm, nsp = mlm.numpy(), nsp.numpy()
if args.export:
    save_weights(args.export, B.export_weights(model), config)
np.savez(args.out, mlm=mlm, nsp=nsp)
