"""What a job needs of a framework: the :class:`Backend` protocol that ``hvd_bert.pt.backend``
and ``hvd_bert.tf.backend`` implement, and :func:`get_backend`. The jobs (``hvd_bert.jobs``)
are written once against it; the training itself goes through the engine protocol
(``hvd_bert.train.engine.Engine``).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from hvd_bert.config.bert import BertConfig
from hvd_bert.config import ConfigError, TrainConfig
from hvd_bert.train.engine import Engine

__all__ = ["Backend", "ModelFunctions", "get_backend", "threads_per_rank", "FRAMEWORKS"]

FRAMEWORKS = {"pt": "hvd_bert.pt.backend", "tf": "hvd_bert.tf.backend"}


def threads_per_rank(local_size: int, env=os.environ) -> int:
    """CPU threads for one rank's framework: ``OMP_NUM_THREADS`` when the user (or the launcher,
    as torchrun does) set it, else the machine's cores shared between the ranks on this host."""
    from hvd_bert.core.kernels import env_count

    given = env.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:  # (OpenMP's other forms, "4,2", leave the default)
        return env_count("OMP_NUM_THREADS", 1, 1, 4096, "a count of threads per rank", env)
    return max(1, (os.cpu_count() or 1) // max(1, local_size))


class Backend(Protocol):
    name: str       # "pt" / "tf"
    label: str      # "PyTorch" / "TensorFlow"

    # process
    def init(self, train: TrainConfig) -> tuple[int, int]:
        """``hvd.init()`` with the ``horovod.*`` settings, threads per local rank; ``(rank, size)``."""

    def seed(self, seed: int) -> None: ...

    def set_precision(self, mode: str) -> None:
        """Before building a model (Keras' mixed policy; nothing in PyTorch)."""

    def broadcast_object(self, obj: Any, name: str) -> Any: ...

    def allgather_object(self, obj: Any, name: str) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray: ...

    def summary_writer(self, logdir: Path) -> Any:
        """``add_scalar(tag, value, step)`` / ``close()``, or None."""

    # models
    def bert_pretraining(self, config: BertConfig, max_seq_length: int, max_predictions: int,
                         train: TrainConfig | None = None) -> Any:
        """BERT for pretraining. PyTorch, given ``train``: built on the meta device and only this
        rank's share materialised (``train.tensor_parallel``), initialised from ``train.seed``
        the same whatever the layout (``hvd_bert.pt.tensor_parallel.build``)."""

    def compile_layers(self, model) -> None:
        """Compile each encoder layer of ``model`` in place (PyTorch: ``torch.compile``; the
        parameter names stay). A backend without it raises ConfigError."""

    def activation_checkpointing(self, model, policy: str) -> None:
        """Recompute activations in the backward pass (``train.activation_checkpointing``); a
        backend without it raises ConfigError unless ``policy`` is off."""

    def bert_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int) -> Any:
        """A classifier on the pooled first token; ``num_labels=1``: a regression head."""

    def bert_token_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int) -> Any:
        """A label for every token of the sequence output (NER)."""

    def bert_span(self, config: BertConfig, max_seq_length: int) -> Any:
        """SQuAD's span model: ``(start_logits, end_logits)`` per token."""

    def neumf(self, n_users: int, n_items: int, model_cfg) -> Any: ...

    def memory_available(self) -> tuple[float, int, str]:
        """``(bytes, ranks sharing them, what)``: the memory this rank's state goes to (the host's
        available memory and its local ranks, or this rank's GPU)."""

    def param_count(self, model, share: bool = False) -> int:
        """The model's parameters (the dense model's, under tensor parallelism; ``share``: this
        rank's)."""

    def read_checkpoint_weights(self, path: str | Path) -> tuple[dict, BertConfig | None]: ...

    def load_weights(self, model, arrays: dict, source: str) -> None: ...

    pretraining_loss: Callable
    classification_loss: Callable
    regression_loss: Callable
    token_classification_loss: Callable
    span_loss: Callable
    ncf_loss: Callable

    # training and data
    def engine(self, model, loss_fn: Callable, train: TrainConfig, sync: bool = True) -> Engine:
        """The framework's Engine; ``sync``: broadcast rank 0's weights now (an elastic run
        syncs inside ``elastic_run`` instead)."""

    def elastic_run(self, fn: Callable) -> Callable:
        """Horovod's ``elastic.run`` of the framework (re-initialises Horovod on a reset)."""

    def record_batches(self, folder: str, kind: str, rank: int, size: int, local_batch_size: int, *,
                       seed: int, shuffle_buffer: int, record_striding: bool, start: int,
                       length_grouping: int = 0, pack: bool = False, segments: bool = False) -> Iterator:
        """This rank's batches from global batch ``start`` on; ``length_grouping`` > 0: padded
        to their longest sequence after regrouping that many batches by length
        (``data.padding.length_grouped``); ``pack``: pretraining sequences packed into fewer
        rows (``data.packing``; a backend whose model cannot take them raises ConfigError), with
        ``segments``: carrying their spans for varlen attention."""

    def ncf_batch(self, users: np.ndarray, items: np.ndarray, labels: np.ndarray) -> Any: ...

    # evaluation
    def scorer(self, model, precision: str = "fp32") -> Callable[[dict], Any]:
        """``score(batch of numpy arrays)`` -> a fine-tuning model's outputs as numpy, in
        inference mode: logits ``[B, labels]`` (``[B, 1]`` for regression), or SQuAD's
        ``(start_logits, end_logits)``."""

    def pretraining_scorer(self, model, precision: str = "fp32") -> Callable[[dict], tuple]:
        """``score(batch) -> (mlm_logits [B, P, V], nsp_logits [B, 2])``, in inference mode."""

    def ncf_scorer(self, model) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``score(users, items) -> scores``, in inference mode."""


def host_available() -> tuple[float, str]:
    """The host's available memory (``MemAvailable`` of /proc/meminfo) and its name."""
    import socket

    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    return kib * 1024.0, f"host {socket.gethostname()}"


class ModelFunctions:
    """What both backends take from their ``models`` package the same way (``<models>.bert``
    and ``<models>.ncf`` define the same names in each framework), imported on first use, and
    the object collectives, which Horovod spells the same in both frameworks."""

    models: str  # "hvd_bert.pt.models" / "hvd_bert.tf.models"
    horovod: str  # "horovod.torch" / "horovod.tensorflow"

    def summary_writer(self, logdir: Path):
        """TensorBoard scalars, the same from both frameworks (``train.log.ScalarWriter``)."""
        from hvd_bert.train.log import ScalarWriter
        return ScalarWriter(logdir)

    def _fn(self, module: str, name: str):
        return getattr(importlib.import_module(f"{self.models}.{module}"), name)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return importlib.import_module(self.horovod).broadcast_object(obj, root_rank=0, name=name)  # Horovod:

    def allgather_object(self, obj: Any, name: str) -> list:
        return importlib.import_module(self.horovod).allgather_object(obj, name=name)  # Horovod:

    def elastic_run(self, fn):
        return importlib.import_module(f"{self.horovod}.elastic").run(fn)  # Horovod:

    def read_checkpoint_weights(self, path):
        return self._fn("bert", "read_checkpoint_weights")(path)

    def load_weights(self, model, arrays: dict, source: str) -> None:
        self._fn("bert", "load_weights")(model, arrays, source=source)

    def export_weights(self, model) -> dict:
        """The model's weights as portable numpy arrays (``weights.portable``)."""
        return self._fn("bert", "export_weights")(model)

    @property
    def pretraining_loss(self):
        return self._fn("bert", "pretraining_loss")

    @property
    def classification_loss(self):
        return self._fn("bert", "classification_loss")

    @property
    def regression_loss(self):
        return self._fn("bert", "regression_loss")

    @property
    def token_classification_loss(self):
        return self._fn("bert", "token_classification_loss")

    @property
    def span_loss(self):
        return self._fn("bert", "span_loss")

    @property
    def ncf_loss(self):
        return self._fn("ncf", "ncf_loss")


def get_backend(framework: str) -> Backend:
    """The backend of ``framework`` ("pt" or "tf"), imported on first use (a PyTorch job never
    imports TensorFlow, and the other way round)."""
    if framework not in FRAMEWORKS:
        raise ConfigError(f"framework: expected one of {', '.join(map(repr, FRAMEWORKS))}, got {framework!r}")
    threads_per_rank(1)  # (OMP_NUM_THREADS checked before the framework's OpenMP reads it and complains)
    if framework == "pt":
        from hvd_bert.core.kernels import env_count

        env_count("HVD_BERT_FOREACH_CHUNK", 0, 0, 1 << 40,
                  "a chunk of elements for the CPU's foreach updates (0: whole tensors)")
    return importlib.import_module(FRAMEWORKS[framework]).BACKEND
