"""The Keras BERT and NeuMF models in one process: every variable has a portable name, the
vocabulary is padded, and the models run under the mixed-precision policies the jobs set
(float32 losses and logits, float32 variables)."""

import numpy as np
import pytest

import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.config.bert import bert_preset
from hvd_bert.tf.models import bert as B
from hvd_bert.tf.engine import set_precision_policy
from hvd_bert.tf.models.ncf import NeuMF, ncf_loss


@pytest.fixture
def policy():
    yield set_precision_policy
    set_precision_policy("fp32")


def batch(b=3, s=16, p=4, vocab=1000, seed=0):
    rng = np.random.default_rng(seed)
    return {"input_ids": tf.constant(rng.integers(0, vocab, (b, s)), tf.int32),
            "segment_ids": tf.zeros((b, s), tf.int32), "input_mask": tf.ones((b, s), tf.int32),
            "masked_lm_positions": tf.constant(rng.integers(0, s, (b, p)), tf.int32),
            "masked_lm_ids": tf.constant(rng.integers(0, vocab, (b, p)), tf.int32),
            "masked_lm_weights": tf.ones((b, p)), "next_sentence_labels": tf.zeros((b, 1), tf.int32),
            "label_ids": tf.constant([[0], [1], [2]], tf.int32)}


def test_every_variable_has_a_portable_name_and_the_vocab_is_padded():
    c = bert_preset("tiny", vocab_size=1001)
    m = B.build_model(B.BertForPreTraining(c))
    mapped = {v.ref() for v, _ in B.weight_map(m).values()}
    assert all(v.ref() in mapped for v in m.trainable_variables)
    assert len(mapped) == len(m.trainable_variables)
    w = B.export_weights(m)
    assert w["embeddings.word_embeddings.weight"].shape == (1008, 128)
    assert w["layers.0.intermediate.weight"].shape == (512, 128)  # PyTorch's [out, in]


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_bert_runs_under_mixed_precision(policy, mode):
    policy(mode)
    c = bert_preset("tiny", vocab_size=1000)
    m = B.build_model(B.BertForPreTraining(c))
    with tf.GradientTape() as tape:
        loss, metrics = B.pretraining_loss(m, batch())
    grads = tape.gradient(loss, m.trainable_variables)
    assert loss.dtype == tf.float32 and np.isfinite(loss.numpy())
    assert 6.0 < float(loss) < 9.0  # about ln(1000) + ln(2) at initialisation
    assert all(v.dtype == tf.float32 for v in m.trainable_variables)
    assert all(g is not None for g in grads)
    cls = B.build_model(B.BertForSequenceClassification(c, 3))
    loss, _ = B.classification_loss(cls, batch())
    assert loss.dtype == tf.float32 and np.isfinite(loss.numpy())


@pytest.mark.parametrize("mode", ["fp32", "bf16"])
def test_neumf_runs_under_each_policy(policy, mode):
    policy(mode)
    m = NeuMF(50, 40, 8, (16, 8))
    b = {"users": tf.constant([0, 1, 2]), "items": tf.constant([3, 4, 5]),
         "labels": tf.constant([1.0, 0.0, 0.0])}
    loss = ncf_loss(m, b)
    assert loss.dtype == tf.float32 and 0.5 < float(loss) < 0.9  # ln 2 at a near-zero init


def test_neumf_embeddings_start_different():
    m = NeuMF(50, 50, 8, (16, 8))  # four embedding tables of the same shape
    m({"users": tf.constant([0]), "items": tf.constant([0])})
    tables = [e.embeddings.numpy() for e in (m.mf_user, m.mf_item, m.mlp_user, m.mlp_item)]
    assert all(not np.array_equal(a, b) for i, a in enumerate(tables) for b in tables[i + 1:])
    assert all(0.005 < t.std() < 0.015 for t in tables)
