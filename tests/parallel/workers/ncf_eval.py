"""HR@10 / NDCG@10 of one fixed NeuMF (the same seed on every rank), users split across the
ranks and summed with Horovod. Writes ``rank<r>.json``.

    python ncf_eval.py pt|tf DATA_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np

import hvd_bert  # noqa: F401
from hvd_bert.common.ncf_data import load_ncf

framework, data_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
data = load_ncf(data_dir)
if framework == "pt":
    import horovod.torch as hvd
    import torch

    from hvd_bert.pt.ncf import NeuMF, evaluate
    hvd.init()
    torch.manual_seed(3)
    model = NeuMF(data.n_users, data.n_items, 8, (16, 8))

    def allreduce(s):
        return hvd.allreduce(torch.from_numpy(s), op=hvd.Sum, name="eval").numpy()
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvd_bert.tf.ncf import NeuMF, evaluate
    hvd.init()
    tf.keras.utils.set_random_seed(3)
    model = NeuMF(data.n_users, data.n_items, 8, (16, 8))

    def allreduce(s):
        return hvd.allreduce(tf.constant(s), op=hvd.Sum, name="eval").numpy()
res = evaluate(model, data, 10, 37, hvd.rank(), hvd.size(), allreduce)
local = evaluate(model, data, 10, 37, hvd.rank(), hvd.size(), None)
res.update(rank=hvd.rank(), local_users=local["users"], checksum=float(np.sum([float(np.sum(
    np.abs(w.detach().numpy() if framework == "pt" else w.numpy()))) for w in (
    model.parameters() if framework == "pt" else model.trainable_variables)])))
(out / f"rank{hvd.rank()}.json").write_text(json.dumps(res))
