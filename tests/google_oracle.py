"""Google's reference BERT (PyPI ``bert-tensorflow`` 1.0.4, ``bert/modeling.py``) as an oracle,
run in its own process: TF1 code in a ``tf.Graph`` through ``tensorflow.compat.v1``, with a
stand-in for ``tf.contrib.layers.layer_norm`` (variables ``LayerNorm/gamma`` and ``beta``,
epsilon 1e-12, as contrib's).

    python google_oracle.py make DIR          a random BertModel: DIR/bert_config.json, DIR/bert_model.ckpt.*,
                                              DIR/batch.npz and DIR/outputs.npz (sequence and pooled)
    python google_oracle.py outputs CKPT BATCH.npz OUT.npz   restore CKPT into Google's model, run BATCH
"""

import json
import sys
import types
from pathlib import Path

import numpy as np

import hvd_bert  # noqa: F401  (TF_USE_LEGACY_KERAS: tf.compat.v1.layers needs tf-keras)
import tensorflow as tf

v1 = tf.compat.v1
CONFIG = {"vocab_size": 1001, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 3,
          "intermediate_size": 96, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
          "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 40, "type_vocab_size": 2,
          "initializer_range": 0.02}


def _layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
    with v1.variable_scope(scope, default_name="LayerNorm"):
        shape = inputs.shape[-1:]
        beta = v1.get_variable("beta", shape, initializer=v1.zeros_initializer())
        gamma = v1.get_variable("gamma", shape, initializer=v1.ones_initializer())
        mean, var = tf.nn.moments(inputs, [-1], keepdims=True)
        return (inputs - mean) * tf.math.rsqrt(var + 1e-12) * gamma + beta


def modeling():
    contrib = types.ModuleType("tensorflow.contrib")
    contrib.layers = types.SimpleNamespace(layer_norm=_layer_norm)
    sys.modules["tensorflow.contrib"] = contrib
    v1.disable_eager_execution()
    from bert import modeling as m
    return m


def build(m, config, batch):
    ids = v1.placeholder(tf.int32, batch["input_ids"].shape)
    mask = v1.placeholder(tf.int32, batch["input_mask"].shape)
    seg = v1.placeholder(tf.int32, batch["segment_ids"].shape)
    model = m.BertModel(config=config, is_training=False, input_ids=ids, input_mask=mask,
                        token_type_ids=seg, use_one_hot_embeddings=False)
    feed = {ids: batch["input_ids"], mask: batch["input_mask"], seg: batch["segment_ids"]}
    return model, feed


def make(out: Path):
    m = modeling()
    out.mkdir(parents=True, exist_ok=True)
    (out / "bert_config.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(0, CONFIG["vocab_size"], (3, 11)).astype(np.int32),
             "segment_ids": rng.integers(0, 2, (3, 11)).astype(np.int32),
             "input_mask": np.ones((3, 11), np.int32)}
    batch["input_mask"][1, 7:] = 0
    batch["input_mask"][2, 4:] = 0
    np.savez(out / "batch.npz", **batch)
    model, feed = build(m, m.BertConfig.from_dict(CONFIG), batch)
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        for var in v1.global_variables():  # random biases and norms too: every mapping exercised
            sess.run(var.assign(var + rng.normal(0, 0.05, var.shape.as_list()).astype(np.float32)))
        v1.train.Saver().save(sess, str(out / "bert_model.ckpt"), write_meta_graph=False)
        seq, pooled = sess.run([model.get_sequence_output(), model.get_pooled_output()], feed)
    np.savez(out / "outputs.npz", sequence=seq, pooled=pooled)


def outputs(ckpt: Path, batch_file: Path, out: Path):
    m = modeling()
    batch = dict(np.load(batch_file))
    config = m.BertConfig.from_json_file(str(ckpt / "bert_config.json"))
    model, feed = build(m, config, batch)
    with v1.Session() as sess:
        v1.train.Saver().restore(sess, str(ckpt / "bert_model.ckpt"))
        seq, pooled = sess.run([model.get_sequence_output(), model.get_pooled_output()], feed)
    np.savez(out, sequence=seq, pooled=pooled)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        outputs(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
