"""The PyTorch backend of the jobs (``hvd_bert.jobs``): what a job needs of a framework, in
PyTorch. The jobs are written once against this surface (``hvd_bert.train.backend.Backend``);
``hvd_bert.tf.backend`` is the same surface in TensorFlow.
"""

from __future__ import annotations

import math
import sys
from typing import Iterator

import numpy as np
import torch
import horovod.torch as hvd

from hvd_bert.train.backend import ModelFunctions, threads_per_rank
from hvd_bert.config.bert import BertConfig
from hvd_bert.config import TrainConfig
from hvd_bert.pt import init_horovod

__all__ = ["BACKEND", "PyTorchBackend"]


def _optimizers_without_dynamo() -> None:
    """``torch.optim.Optimizer``'s methods import TorchDynamo on their first call (1.1 s of CPU,
    a quarter of a small job's start-up per rank), only to keep themselves out of
    ``torch.compile``'s tracing. The jobs compile no optimizer code, so they call the methods as
    they are: torch's ``_disable_dynamo`` wrapper takes the function it caches in
    ``__dynamo_disable``. Without that attribute (another torch), or with TorchDynamo already
    imported, nothing changes."""
    if "torch._dynamo" in sys.modules:
        return
    for name in ("__init__", "zero_grad", "state_dict", "load_state_dict", "add_param_group"):
        fn = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if fn is not None and not hasattr(fn, "__dynamo_disable"):
            setattr(fn, "__dynamo_disable", fn)


class PyTorchBackend(ModelFunctions):
    models = "hvd_bert.pt.models"
    horovod = "horovod.torch"
    name, label = "pt", "PyTorch"
    device = torch.device("cpu")  # after init(), on a machine with GPUs: cuda:<local rank>

    # ------------------------------------------------------------------ process
    def init(self, train: TrainConfig) -> tuple[int, int]:
        """Horovod (with the ``horovod.*`` settings) and one share of the cores per local rank."""
        init_horovod(train.horovod, process_sets=train.tensor_parallel > 1)
        _optimizers_without_dynamo()
        if torch.cuda.is_available():
            # Horovod: one GPU per process, chosen by its local rank
            torch.cuda.set_device(hvd.local_rank())
            self.device = torch.device("cuda", hvd.local_rank())
        torch.set_num_threads(threads_per_rank(hvd.local_size()))
        return hvd.rank(), hvd.size()

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_precision(self, mode: str) -> None:
        """PyTorch's precision is the engine's autocast: nothing to set before building."""

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        t = torch.from_numpy(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(t, op=hvd.Sum, name=name).numpy()  # Horovod:

    # ------------------------------------------------------------------ models
    def bert_pretraining(self, config: BertConfig, max_seq_length: int, max_predictions: int,
                         train: TrainConfig | None = None):
        from hvd_bert.pt.models.bert import BertForPreTraining
        if train is None:
            return BertForPreTraining(config).to(self.device)
        from hvd_bert.pt import tensor_parallel as TP
        return TP.build(lambda: BertForPreTraining(config), seed=train.seed, std=config.initializer_range,
                        tp=train.tensor_parallel, device=self.device)

    def compile_layers(self, model) -> None:
        model.compile_layers()

    def load_weights(self, model, arrays: dict, source: str) -> None:
        groups = getattr(model, "tp_groups", None)
        if groups is None:
            return super().load_weights(model, arrays, source)
        from hvd_bert.pt import tensor_parallel as TP
        TP.load_whole(model, arrays, groups, source)  # (every rank its share of the whole tensors)

    def activation_checkpointing(self, model, policy: str) -> None:
        from hvd_bert.config.train import activation_policy

        model.activation_checkpointing(*activation_policy(policy))

    def bert_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int):
        from hvd_bert.pt.models.bert import BertForSequenceClassification
        return BertForSequenceClassification(config, num_labels).to(self.device)

    def bert_token_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int):
        from hvd_bert.pt.models.bert import BertForTokenClassification
        return BertForTokenClassification(config, num_labels).to(self.device)

    def bert_span(self, config: BertConfig, max_seq_length: int):
        from hvd_bert.pt.models.bert import BertForQuestionAnswering
        return BertForQuestionAnswering(config).to(self.device)

    def neumf(self, n_users: int, n_items: int, m):
        from hvd_bert.pt.models.ncf import NeuMF
        return NeuMF(n_users, n_items, m.factors, m.layers, m.dropout).to(self.device)

    def memory_available(self) -> tuple[float, int, str]:
        if self.device.type == "cuda":
            return float(torch.cuda.mem_get_info(self.device)[0]), 1, f"GPU {self.device.index}"
        from hvd_bert.train.backend import host_available
        available, host = host_available()
        return available, hvd.local_size(), host

    def param_count(self, model, share: bool = False) -> int:
        groups = getattr(model, "tp_groups", None)
        if share or groups is None:
            return sum(p.numel() for p in model.parameters())
        from hvd_bert.pt import tensor_parallel as TP
        return sum(math.prod(TP.whole_shape(n, p.shape, groups)) for n, p in model.named_parameters())

    # ------------------------------------------------------------------ training
    def engine(self, model, loss_fn, train: TrainConfig, sync: bool = True):
        from hvd_bert.pt.engine import Engine
        return Engine.from_config(model, train, loss_fn=loss_fn, sync=sync)  # sync: rank 0's weights

    def record_batches(self, folder: str, kind: str, rank: int, size: int, local_batch_size: int, *,
                       seed: int, shuffle_buffer: int, record_striding: bool,
                       start: int, length_grouping: int = 0, pack: bool = False,
                       segments: bool = False) -> Iterator[dict]:
        from hvd_bert.pt.data import ShardedDataset
        stream = ShardedDataset(folder, kind, rank, size, local_batch_size, seed=seed,
                                shuffle_buffer=shuffle_buffer, record_striding=record_striding,
                                length_grouping=length_grouping, pack=pack, segments=segments).stream(start)
        if self.device.type == "cpu":
            return stream
        return ({k: self._on(v) for k, v in b.items()} for b in stream)

    def _on(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on this process's device (the model's)."""
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def ncf_batch(self, users: np.ndarray, items: np.ndarray, labels: np.ndarray) -> dict:
        return {"users": self._on(torch.from_numpy(users.astype(np.int64))),
                "items": self._on(torch.from_numpy(items.astype(np.int64))),
                "labels": self._on(torch.from_numpy(labels))}

    # ------------------------------------------------------------------ scoring (evaluation)
    def scorer(self, model, precision: str = "fp32"):
        """``score(batch of numpy arrays)`` -> the model's outputs as numpy (logits, or SQuAD's
        start and end logits) in eval mode (the training mode is put back after each batch)."""
        from hvd_bert.pt.engine import autocast

        @torch.no_grad()
        def score(b: dict):
            ids, segs, mask = (self._on(torch.from_numpy(b[k]))
                               for k in ("input_ids", "segment_ids", "input_mask"))
            was = model.training
            model.eval()
            with autocast(precision, next(model.parameters()).device.type):
                out = model(ids, segs, mask)
            model.train(was)
            if isinstance(out, tuple):
                return tuple(o.float().cpu().numpy() for o in out)
            return out.float().cpu().numpy()
        return score

    def pretraining_scorer(self, model, precision: str = "fp32"):
        """``score(batch) -> (mlm_logits, nsp_logits)`` as numpy, in eval mode."""
        from hvd_bert.pt.engine import autocast

        @torch.no_grad()
        def score(b: dict):
            t = {k: self._on(torch.from_numpy(v)) for k, v in b.items()}
            was = model.training
            model.eval()
            with autocast(precision, next(model.parameters()).device.type):
                mlm, nsp = model(t["input_ids"], t["segment_ids"], t["input_mask"], t["masked_lm_positions"])
            model.train(was)
            return mlm.float().cpu().numpy(), nsp.float().cpu().numpy()
        return score

    def ncf_scorer(self, model):
        @torch.no_grad()
        def score(users: np.ndarray, items: np.ndarray) -> np.ndarray:
            was = model.training
            model.eval()
            out = model(self._on(torch.from_numpy(users)), self._on(torch.from_numpy(items)))
            out = out.float().cpu().numpy()
            model.train(was)
            return out
        return score


BACKEND = PyTorchBackend()
