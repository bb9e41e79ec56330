"""BERT in TensorFlow/Keras, the same architecture and computation as ``hvd_bert.pt.models.bert``
(one :class:`BertConfig`), free of parallelism: the engine applies Horovod from outside.

Speed-ups as in PyTorch: the intermediate layer's bias + GELU is one XLA-fused kernel
(``hvd_bert.tf.kernels.DenseGELU``), and the masked-LM head runs only at the masked
positions. Mixed precision follows the Keras policy (``engine.set_precision_policy``): the
layers compute in float16/bfloat16, the variables, LayerNorm statistics, softmax and logits
stay float32.

Weights move between the frameworks through the portable names of
``hvd_bert.weights.portable``: :func:`export_weights` / :func:`load_weights` map every
Keras variable to its PyTorch ``state_dict`` name (Dense kernels are transposed).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.portable import WeightsError, fit_for_model, read_run_bert_config, read_weights
from hvd_bert.weights.published import read_published
from hvd_bert.tf.kernels import DenseGELU, bias_gelu

__all__ = ["BertForPreTraining", "BertForSequenceClassification", "BertForQuestionAnswering",
           "pretraining_loss", "classification_loss", "regression_loss", "span_loss", "export_weights",
           "BertForTokenClassification", "token_classification_loss",
           "load_weights", "read_checkpoint_weights", "build_model"]

_NEG = -10000.0  # attention bias at padded positions (Google's value; finite in float16)


def _init(c: BertConfig):
    return tf.keras.initializers.TruncatedNormal(stddev=c.initializer_range)


def _ln(c: BertConfig, name: str):
    # float32 statistics under a mixed policy
    return tf.keras.layers.LayerNormalization(epsilon=c.layer_norm_eps, dtype="float32", name=name)


class BertEmbeddings(tf.keras.layers.Layer):
    def __init__(self, c: BertConfig, **kw):
        super().__init__(**kw)
        self.word_embeddings = tf.keras.layers.Embedding(c.padded_vocab_size, c.hidden_size,
                                                         embeddings_initializer=_init(c), name="word")
        self.position_embeddings = tf.keras.layers.Embedding(c.max_position_embeddings, c.hidden_size,
                                                             embeddings_initializer=_init(c), name="position")
        self.token_type_embeddings = tf.keras.layers.Embedding(c.type_vocab_size, c.hidden_size,
                                                               embeddings_initializer=_init(c), name="type")
        self.LayerNorm = _ln(c, "LayerNorm")
        self.dropout = tf.keras.layers.Dropout(c.hidden_dropout)

    def call(self, input_ids, segment_ids, training=False):
        pos = tf.range(tf.shape(input_ids)[1])
        x = (tf.cast(self.word_embeddings(input_ids), tf.float32)
             + tf.cast(self.position_embeddings(pos), tf.float32)[None]
             + tf.cast(self.token_type_embeddings(segment_ids), tf.float32))
        return tf.cast(self.dropout(self.LayerNorm(x), training=training), self.compute_dtype)


class BertLayer(tf.keras.layers.Layer):
    def __init__(self, c: BertConfig, **kw):
        super().__init__(**kw)
        self.c = c
        h = c.hidden_size

        def dense(units, name):
            return tf.keras.layers.Dense(units, kernel_initializer=_init(c), name=name)

        self.query, self.key, self.value = dense(h, "query"), dense(h, "key"), dense(h, "value")
        self.attention_output = dense(h, "attention_output")
        self.attention_LayerNorm = _ln(c, "attention_LayerNorm")
        self.intermediate = DenseGELU(c.intermediate_size, approximate=c.gelu,
                                      kernel_initializer=_init(c), name="intermediate")
        self.output_dense = dense(h, "output")
        self.output_LayerNorm = _ln(c, "output_LayerNorm")
        self.dropout = tf.keras.layers.Dropout(c.hidden_dropout)
        self.attention_dropout = tf.keras.layers.Dropout(c.attention_dropout)

    def call(self, x, attn_bias, training=False):
        c = self.c
        b, s = tf.shape(x)[0], tf.shape(x)[1]

        def heads(t):
            return tf.transpose(tf.reshape(t, [b, s, c.num_heads, c.head_size]), [0, 2, 1, 3])

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.cast(scores, tf.float32) * (1.0 / math.sqrt(c.head_size)) + attn_bias
        probs = self.attention_dropout(tf.nn.softmax(scores, axis=-1), training=training)
        ctx = tf.matmul(tf.cast(probs, v.dtype), v)
        ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [b, s, c.hidden_size])
        attn = self.dropout(self.attention_output(ctx), training=training)
        x = tf.cast(self.attention_LayerNorm(tf.cast(x, tf.float32) + tf.cast(attn, tf.float32)),
                    self.compute_dtype)
        out = self.dropout(self.output_dense(self.intermediate(x)), training=training)
        return tf.cast(self.output_LayerNorm(tf.cast(x, tf.float32) + tf.cast(out, tf.float32)),
                       self.compute_dtype)


class BertModel(tf.keras.Model):
    """The encoder (embeddings, layers, pooler) the task models share."""

    def __init__(self, c: BertConfig, pooler: bool = True, **kw):
        super().__init__(**kw)
        self.config = c
        self.embeddings = BertEmbeddings(c, name="embeddings")
        self.encoder_layers = [BertLayer(c, name=f"layer_{i}") for i in range(c.num_layers)]
        self.pooler = tf.keras.layers.Dense(c.hidden_size, activation="tanh", kernel_initializer=_init(c),
                                            name="pooler") if pooler else None

    def encode(self, input_ids, segment_ids, input_mask, training=False):
        x = self.embeddings(input_ids, segment_ids, training=training)
        attn_bias = (1.0 - tf.cast(input_mask, tf.float32))[:, None, None, :] * _NEG
        for layer in self.encoder_layers:
            x = layer(x, attn_bias, training=training)
        return x

    def pool(self, x):
        return self.pooler(x[:, 0])


class BertForPreTraining(BertModel):
    """``call(batch)`` returns ``(mlm_logits [B, P, V], nsp_logits [B, 2])`` in float32, the
    MLM logits only at ``masked_lm_positions``; the decoder is tied to the word embeddings."""

    def __init__(self, c: BertConfig, **kw):
        super().__init__(c, **kw)
        self.mlm_transform = tf.keras.layers.Dense(c.hidden_size, kernel_initializer=_init(c),
                                                   use_bias=True, name="mlm_transform")
        self.mlm_LayerNorm = _ln(c, "mlm_LayerNorm")
        self.nsp = tf.keras.layers.Dense(2, kernel_initializer=_init(c), name="nsp")
        self.mlm_bias = self.add_weight(name="mlm_bias", shape=(c.padded_vocab_size,), initializer="zeros")

    def call(self, batch, training=False):
        x = self.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"], training=training)
        pooled = self.pool(x)
        m = tf.gather(x, batch["masked_lm_positions"], batch_dims=1)  # only the masked positions
        t = self.mlm_transform
        if not t.built:
            t.build(m.shape)
        m = bias_gelu(tf.matmul(m, tf.cast(t.kernel, m.dtype)), tf.cast(t.bias, m.dtype),
                      self.config.gelu)
        m = tf.cast(self.mlm_LayerNorm(tf.cast(m, tf.float32)), self.compute_dtype)
        emb = tf.cast(self.embeddings.word_embeddings.embeddings, m.dtype)
        # under a mixed policy the variable reads in the compute dtype: add it in float32
        mlm = tf.cast(tf.matmul(m, emb, transpose_b=True), tf.float32) + tf.cast(self.mlm_bias, tf.float32)
        return mlm, tf.cast(self.nsp(pooled), tf.float32)


class BertForSequenceClassification(BertModel):
    """A classifier on the pooled first token; ``call(batch)`` returns float32 logits."""

    def __init__(self, c: BertConfig, num_labels: int, **kw):
        super().__init__(c, **kw)
        self.num_labels = num_labels
        self.dropout = tf.keras.layers.Dropout(c.hidden_dropout)
        self.classifier = tf.keras.layers.Dense(num_labels, kernel_initializer=_init(c), name="classifier")

    def call(self, batch, training=False):
        x = self.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"], training=training)
        return tf.cast(self.classifier(self.dropout(self.pool(x), training=training)), tf.float32)


class BertForQuestionAnswering(BertModel):
    """SQuAD's span head on every token (as ``hvd_bert.pt.models.bert.BertForQuestionAnswering``):
    ``call(batch)`` returns float32 ``(start_logits, end_logits)``, each ``[B, S]``; no pooler."""

    def __init__(self, c: BertConfig, **kw):
        super().__init__(c, pooler=False, **kw)
        self.qa_outputs = tf.keras.layers.Dense(2, kernel_initializer=_init(c), name="qa_outputs")

    def call(self, batch, training=False):
        x = self.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"], training=training)
        logits = tf.cast(self.qa_outputs(x), tf.float32)
        return logits[..., 0], logits[..., 1]


class BertForTokenClassification(BertModel):
    """A label for every token (as ``hvd_bert.pt.models.bert.BertForTokenClassification``):
    ``call(batch)`` returns float32 logits ``[B, S, num_labels]``; no pooler."""

    def __init__(self, c: BertConfig, num_labels: int, **kw):
        super().__init__(c, pooler=False, **kw)
        self.num_labels = num_labels
        self.dropout = tf.keras.layers.Dropout(c.hidden_dropout)
        self.classifier = tf.keras.layers.Dense(num_labels, kernel_initializer=_init(c), name="classifier")

    def call(self, batch, training=False):
        x = self.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"], training=training)
        return tf.cast(self.classifier(self.dropout(x, training=training)), tf.float32)


def build_model(model: tf.keras.Model, seq_len: int = 8, predictions: int = 2) -> tf.keras.Model:
    """Create the model's variables by calling it once on a dummy batch."""
    z = tf.zeros([1, seq_len], tf.int32)
    batch = {"input_ids": z, "segment_ids": z, "input_mask": tf.ones([1, seq_len], tf.int32),
             "masked_lm_positions": tf.zeros([1, predictions], tf.int32)}
    model(batch, training=False)
    return model


def pretraining_loss(model: BertForPreTraining, batch: dict, training: bool = True):
    """``(loss, {mlm_loss, nsp_loss, mlm_accuracy})``: as ``hvd_bert.pt.models.bert.pretraining_loss``."""
    mlm, nsp = model(batch, training=training)
    w = tf.cast(batch["masked_lm_weights"], tf.float32)
    ids = tf.cast(batch["masked_lm_ids"], tf.int32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=mlm)
    denom = tf.maximum(tf.reduce_sum(w), 1.0)
    mlm_loss = tf.reduce_sum(ce * w) / denom
    nsp_labels = tf.reshape(tf.cast(batch["next_sentence_labels"], tf.int32), [-1])
    nsp_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp))
    correct = tf.cast(tf.equal(tf.argmax(mlm, -1, output_type=tf.int32), ids), tf.float32)
    return mlm_loss + nsp_loss, {"mlm_loss": tf.stop_gradient(mlm_loss),
                                 "nsp_loss": tf.stop_gradient(nsp_loss),
                                 "mlm_accuracy": tf.reduce_sum(correct * w) / denom}


def classification_loss(model: BertForSequenceClassification, batch: dict, training: bool = True):
    logits = model(batch, training=training)
    labels = tf.reshape(tf.cast(batch["label_ids"], tf.int32), [-1])
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    acc = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))
    return loss, {"accuracy": acc}


def regression_loss(model: BertForSequenceClassification, batch: dict, training: bool = True):
    """Mean squared error of a one-output head (STS-B)."""
    pred = tf.reshape(model(batch, training=training), [-1])
    gold = tf.reshape(tf.cast(batch["label_values"], tf.float32), [-1])
    return tf.reduce_mean(tf.square(pred - gold)), {}


def token_classification_loss(model: BertForTokenClassification, batch: dict, training: bool = True):
    """As ``hvd_bert.pt.models.bert.token_classification_loss``: the cross-entropy over the
    labelled positions (``label_ids`` -1 elsewhere) and their accuracy."""
    logits = model(batch, training=training)
    labels = tf.cast(batch["label_ids"], tf.int32)
    keep = tf.cast(labels >= 0, tf.float32)
    n = tf.maximum(tf.reduce_sum(keep), 1.0)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.maximum(labels, 0), logits=logits)
    hit = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    return tf.reduce_sum(ce * keep) / n, {"accuracy": tf.reduce_sum(hit * keep) / n}


def span_loss(model: BertForQuestionAnswering, batch: dict, training: bool = True):
    """The mean of the start and end cross-entropies (as ``hvd_bert.pt.models.bert.span_loss``)."""
    start, end = model(batch, training=training)
    s = tf.reshape(tf.cast(batch["start_positions"], tf.int32), [-1])
    e = tf.reshape(tf.cast(batch["end_positions"], tf.int32), [-1])
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits
    loss = (tf.reduce_mean(ce(labels=s, logits=start)) + tf.reduce_mean(ce(labels=e, logits=end))) / 2
    hit = tf.logical_and(tf.equal(tf.argmax(start, -1, output_type=tf.int32), s),
                         tf.equal(tf.argmax(end, -1, output_type=tf.int32), e))
    return loss, {"span_accuracy": tf.reduce_mean(tf.cast(hit, tf.float32))}


# ---------------------------------------------------------------------- portable weights
def _dense(prefix: str, layer) -> dict:
    return {f"{prefix}.weight": (layer.kernel, True), f"{prefix}.bias": (layer.bias, False)}


def _norm(prefix: str, layer) -> dict:
    return {f"{prefix}.weight": (layer.gamma, False), f"{prefix}.bias": (layer.beta, False)}


def weight_map(model: BertModel) -> dict[str, tuple[tf.Variable, bool]]:
    """Portable name -> (Keras variable, transposed?) for every variable of a built model."""
    if not model.built:
        raise ValueError("build the model first (hvd_bert.tf.models.bert.build_model)")
    e = model.embeddings
    out = {"embeddings.word_embeddings.weight": (e.word_embeddings.embeddings, False),
           "embeddings.position_embeddings.weight": (e.position_embeddings.embeddings, False),
           "embeddings.token_type_embeddings.weight": (e.token_type_embeddings.embeddings, False),
           **_norm("embeddings.LayerNorm", e.LayerNorm)}
    for i, layer in enumerate(model.encoder_layers):
        p = f"layers.{i}"
        for name in ("query", "key", "value", "attention_output", "intermediate"):
            out.update(_dense(f"{p}.{name}", getattr(layer, name)))
        out.update(_dense(f"{p}.output", layer.output_dense))
        out.update(_norm(f"{p}.attention_LayerNorm", layer.attention_LayerNorm))
        out.update(_norm(f"{p}.output_LayerNorm", layer.output_LayerNorm))
    if model.pooler is not None:
        out.update(_dense("pooler", model.pooler))
    if isinstance(model, BertForPreTraining):
        out.update(_dense("mlm_transform", model.mlm_transform))
        out.update(_norm("mlm_LayerNorm", model.mlm_LayerNorm))
        out["mlm_bias"] = (model.mlm_bias, False)
        out.update(_dense("nsp", model.nsp))
    if isinstance(model, (BertForSequenceClassification, BertForTokenClassification)):
        out.update(_dense("classifier", model.classifier))
    if isinstance(model, BertForQuestionAnswering):
        out.update(_dense("qa_outputs", model.qa_outputs))
    return out


def export_weights(model: BertModel) -> dict[str, np.ndarray]:
    """The model's variables as float32 arrays under the portable (PyTorch) names and layouts."""
    return {k: (v.numpy().T if t else v.numpy()).astype(np.float32)
            for k, (v, t) in weight_map(model).items()}


def load_weights(model: BertModel, arrays: dict[str, np.ndarray], *, source: str = "weights") -> None:
    """Load portable weights, checked name by name (a classifier takes a pretraining
    checkpoint's encoder; its classifier keeps its initialisation)."""
    wm = weight_map(model)
    expected = {k: tuple(v.shape[::-1]) if t else tuple(v.shape) for k, (v, t) in wm.items()}
    task_model = isinstance(model, (BertForSequenceClassification, BertForQuestionAnswering,
                                    BertForTokenClassification))
    fitted = fit_for_model(arrays, expected, classifier=task_model, source=source)
    for k, a in fitted.items():
        var, t = wm[k]
        var.assign(a.T if t else a)


def read_checkpoint_weights(path: str | Path, model: BertModel | None = None):
    """Portable weights from a ``.npz``, or from a TensorFlow checkpoint folder
    ``ckpt-*.tf`` / a run folder (its newest one). A TensorFlow checkpoint is read into a
    model built from the run's ``bert_config.json`` (or ``model`` if given)."""
    from hvd_bert.train.checkpoint import SHARDED, latest_checkpoint

    p = Path(path).expanduser()
    from hvd_bert.tf.google_ckpt import read_google

    published = read_published(p, _load_bin_with_torch, read_google)  # Hugging Face, Google
    if published is not None:
        return published
    if p.suffix == ".npz":
        return read_weights(p)
    if p.suffix == ".pt":
        raise WeightsError(f"{p} is a PyTorch checkpoint: drop --framework tf (or give --framework pt) to "
                           f"read it with PyTorch, or convert it for TensorFlow with `hvd-bert convert {p} "
                           f"--output weights.npz` and give the .npz")
    if p.is_dir() and p.suffix not in (".tf", f".{SHARDED}"):
        found = latest_checkpoint(p, ("tf", SHARDED))
        if found is None:
            raise WeightsError(f"{p} has no ckpt-*.tf or ckpt-*.shards checkpoint; give a checkpoint or a "
                               f".npz")
        p = found
    if p.suffix == f".{SHARDED}" and p.is_dir():  # either framework's: tensor by tensor
        from hvd_bert.train.sharded_checkpoint import model_weights

        return model_weights(p)
    if not (p / "ckpt.index").is_file():
        raise WeightsError(f"{p} is not a TensorFlow checkpoint written by hvd_bert (no ckpt.index)")
    config = read_run_bert_config(p.parent)
    if model is None:
        if config is None:
            raise WeightsError(f"{p.parent} has no bert_config.json to rebuild the model from")
        model = build_model(_run_model(p, config))
    try:
        tf.train.Checkpoint(model=model).read(str(p / "ckpt")).expect_partial()
    except (tf.errors.OpError, ValueError) as e:
        raise WeightsError(f"cannot read {p}: {e}") from None
    return export_weights(model), config


def _run_model(ckpt: Path, config: BertConfig) -> BertModel:
    """The model a run's checkpoint holds, to read it into: a fine-tuned run's (its task record
    says its head: a classifier of its labels, a regression head, a tagger, a SQuAD span head),
    else BERT for pretraining."""
    from hvd_bert.data.finetune import CLASSIFICATION, REGRESSION, SQUAD, TOKENS, read_task_record

    task = read_task_record(ckpt) or {}
    kind, labels = task.get("task"), task.get("labels") or []
    if kind == SQUAD:
        return BertForQuestionAnswering(config)
    if kind == TOKENS:
        return BertForTokenClassification(config, len(labels))
    if kind in (CLASSIFICATION, REGRESSION):
        return BertForSequenceClassification(config, 1 if kind == REGRESSION else len(labels))
    return BertForPreTraining(config)


def _load_bin_with_torch(path):
    """A ``pytorch_model.bin`` is a PyTorch pickle: only PyTorch reads it (``weights_only=True``:
    tensors and plain values, never code)."""
    import torch  # a dependency of the toolkit; only this file format needs it here

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state["model"] if isinstance(state.get("model"), dict) else state  # NVIDIA's layout
        return {k: v.float().numpy() for k, v in state.items()}
    except Exception as e:  # noqa: BLE001
        raise WeightsError(f"{path} cannot be read as a PyTorch state_dict with weights_only=True "
                           f"({type(e).__name__}); save the model as safetensors instead") from None
