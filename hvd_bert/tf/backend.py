"""The TensorFlow backend of the jobs (``hvd_bert.jobs``): the surface of
``hvd_bert.pt.backend`` in TensorFlow/Keras (custom-loop engine, ``tf.data`` reader,
``tf.summary`` writer)."""

from __future__ import annotations

from typing import Iterator

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS and quiet start-up before TensorFlow)
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_bert.train.backend import ModelFunctions, threads_per_rank
from hvd_bert.config.bert import BertConfig
from hvd_bert.config import TrainConfig
from hvd_bert.config.base import ConfigError
from hvd_bert.tf import init_horovod

__all__ = ["BACKEND", "TensorFlowBackend", "set_threads"]


def set_threads(local_size: int) -> None:
    """One process per CPU slot: split the cores between the local ranks (or OMP_NUM_THREADS)."""
    n = threads_per_rank(local_size)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, n)))
    except RuntimeError:  # already initialised in this process
        pass


class TensorFlowBackend(ModelFunctions):
    models = "hvd_bert.tf.models"
    horovod = "horovod.tensorflow"
    name, label = "tf", "TensorFlow"

    # ------------------------------------------------------------------ process
    def init(self, train: TrainConfig) -> tuple[int, int]:
        init_horovod(train.horovod)
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:  # Horovod: one GPU per process, chosen by its local rank, memory grown as needed
            gpu = gpus[hvd.local_rank() % len(gpus)]
            tf.config.experimental.set_memory_growth(gpu, True)
            tf.config.set_visible_devices(gpu, "GPU")
        set_threads(hvd.local_size())
        return hvd.rank(), hvd.size()

    def seed(self, seed: int) -> None:
        # Python, numpy and TF seeds: unseeded Keras initialisers draw from all of them
        tf.keras.utils.set_random_seed(seed)

    def set_precision(self, mode: str) -> None:
        from hvd_bert.tf.engine import set_precision_policy
        set_precision_policy(mode)  # before the model is built

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        t = tf.constant(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(t, op=hvd.Sum, name=name).numpy()  # Horovod:

    # ------------------------------------------------------------------ models
    def bert_pretraining(self, config: BertConfig, max_seq_length: int, max_predictions: int, train=None):
        from hvd_bert.tf.models.bert import BertForPreTraining, build_model
        return build_model(BertForPreTraining(config), max_seq_length, max_predictions)

    def compile_layers(self, model) -> None:
        raise ConfigError("compile_layers is PyTorch's (torch.compile): use framework=pt or "
                          "compile_layers=false")

    def activation_checkpointing(self, model, policy: str) -> None:
        if policy != "off":
            raise ConfigError(f"train.activation_checkpointing={policy} is PyTorch's here (the Keras BERT's "
                              f"layers keep their activations): use framework=pt or "
                              f"train.activation_checkpointing=off")

    def bert_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int):
        from hvd_bert.tf.models.bert import BertForSequenceClassification, build_model
        return build_model(BertForSequenceClassification(config, num_labels), max_seq_length)

    def bert_token_classifier(self, config: BertConfig, num_labels: int, max_seq_length: int):
        from hvd_bert.tf.models.bert import BertForTokenClassification, build_model
        return build_model(BertForTokenClassification(config, num_labels), max_seq_length)

    def bert_span(self, config: BertConfig, max_seq_length: int):
        from hvd_bert.tf.models.bert import BertForQuestionAnswering, build_model
        return build_model(BertForQuestionAnswering(config), max_seq_length)

    def neumf(self, n_users: int, n_items: int, m):
        from hvd_bert.tf.models.ncf import NeuMF
        model = NeuMF(n_users, n_items, m.factors, m.layers, m.dropout)
        model({"users": tf.zeros([1], tf.int32), "items": tf.zeros([1], tf.int32)})  # build
        return model

    def memory_available(self) -> tuple[float, int, str]:
        from hvd_bert.train.backend import host_available
        available, host = host_available()
        return available, hvd.local_size(), host

    def param_count(self, model, share: bool = False) -> int:  # (no tensor parallelism: the same)
        return sum(int(tf.size(v)) for v in model.trainable_variables)

    # ------------------------------------------------------------------ training
    def elastic_run(self, fn):
        """Horovod's ``elastic.run``, with every TensorFlow op error that comes from a Horovod op
        taken as a lost worker: Horovod's own wrapper only recognises an ``UnknownError`` naming
        ``HorovodAllreduce``/``Allgather``/``Broadcast`` (not the grouped allreduce of the
        engine's step) and returns None for others."""
        import horovod.tensorflow.elastic as hvd_elastic
        from horovod.common.exceptions import HorovodInternalError
        import sys

        def body(state, *args, **kwargs):
            try:
                return fn(state, *args, **kwargs)
            except tf.errors.OpError as e:
                if "Horovod" not in str(e):
                    raise
                print(f"elastic: a collective failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                      f"going back to the last commit", file=sys.stderr, flush=True)
                raise HorovodInternalError(e) from e
        return hvd_elastic.run(body)

    def engine(self, model, loss_fn, train: TrainConfig, sync: bool = True):
        from hvd_bert.tf.engine import Engine
        return Engine.from_config(model, train, loss_fn=loss_fn, sync=sync)  # sync: rank 0's weights

    def record_batches(self, folder: str, kind: str, rank: int, size: int, local_batch_size: int, *,
                       seed: int, shuffle_buffer: int, record_striding: bool,
                       start: int, length_grouping: int = 0, pack: bool = False,
                       segments: bool = False) -> Iterator[dict]:
        from hvd_bert.tf.data import stream
        if pack:
            raise ConfigError("packed sequences are PyTorch's only (the Keras BERT has no packed layout): "
                              "run with --framework pt, or without pack_sequences")
        return stream(folder, kind, rank, size, local_batch_size, seed=seed, shuffle_buffer=shuffle_buffer,
                      record_striding=record_striding, start_batch=start, length_grouping=length_grouping)

    def ncf_batch(self, users: np.ndarray, items: np.ndarray, labels: np.ndarray) -> dict:
        return {"users": tf.constant(users), "items": tf.constant(items), "labels": tf.constant(labels)}

    # ------------------------------------------------------------------ scoring (evaluation)
    def scorer(self, model, precision: str = "fp32"):
        """``score(batch of numpy arrays)`` -> the model's outputs as numpy (logits, or SQuAD's
        start and end logits; the Keras policy sets the precision)."""

        @tf.function(reduce_retracing=True, autograph=False)  # batches may be short or trimmed
        def outputs(batch):
            return model(batch, training=False)

        def score(b):
            out = outputs({k: tf.constant(v) for k, v in b.items() if k in ("input_ids", "segment_ids",
                                                                              "input_mask")})
            return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()
        return score

    def pretraining_scorer(self, model, precision: str = "fp32"):
        """``score(batch) -> (mlm_logits, nsp_logits)`` as numpy (the Keras policy sets the
        precision)."""

        @tf.function(reduce_retracing=True, autograph=False)
        def logits(batch):
            return model(batch, training=False)

        def score(b):
            mlm, nsp = logits({k: tf.constant(v) for k, v in b.items()})
            return mlm.numpy(), nsp.numpy()
        return score

    def ncf_scorer(self, model):
        score = tf.function(lambda u, i: model({"users": u, "items": i}, training=False),
                            reduce_retracing=True, autograph=False)
        return lambda users, items: score(tf.constant(users.astype(np.int32)),
                                          tf.constant(items.astype(np.int32))).numpy()


BACKEND = TensorFlowBackend()
