"""HR@10 / NDCG@10 of one fixed NeuMF (the same seed on every rank), users split across the
ranks and summed with Horovod, through the backend's scorer and ``evaluation.ncf.evaluate``.
Writes ``rank<r>.json``.

    python ncf_eval.py pt|tf DATA_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import numpy as np

from hvd_bert.train.backend import get_backend
from hvd_bert.config import TrainConfig
from hvd_bert.config import ModelConfig
from hvd_bert.evaluation.ncf import evaluate
from hvd_bert.data.ncf import load_ncf

framework, data_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
data = load_ncf(data_dir)
backend = get_backend(framework)
rank, size = backend.init(TrainConfig())
backend.seed(3)
model = backend.neumf(data.n_users, data.n_items, ModelConfig(factors=8, layers=(16, 8)))
score = backend.ncf_scorer(model)
res = evaluate(score, data, 10, 37, rank, size, lambda s: backend.allreduce_sum(s, "eval"))
local = evaluate(score, data, 10, 37, rank, size, None)
weights = ([w.detach().numpy() for w in model.parameters()] if framework == "pt"
           else [w.numpy() for w in model.trainable_variables])
res.update(rank=rank, local_users=local["users"], checksum=float(np.sum([np.abs(w).sum() for w in weights])))
(out / f"rank{rank}.json").write_text(json.dumps(res))
