"""hvd_bert.data.records codes ``tf.train.Example`` by hand; TensorFlow's own protobuf is the
oracle: the same example gives the same bytes as TF's deterministic serialization, TF parses
ours, ours decodes TF's, and TF's TFRecord reader reads our files (CRCs included)."""

import numpy as np
import pytest

import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.data.example_proto import serialize_example as _serialize
from hvd_bert.data.records import decode_example, iter_records, write_examples

CASES = [
    {"input_ids": (np.arange(128), "int"), "weights": (np.linspace(0, 1, 20), "float")},
    {"big": ([0, 1, 127, 128, 300, 2**21, 2**40, 2**63 - 1], "int"), "neg": ([-1, -5, -(2**63)], "int")},
    {"text": ("héllo wörld", "byte"), "label": ([3], "int"), "z": ([0.0, -1.5, 3.25e10], "float")},
]


def tf_example(ex):
    feats = {}
    for name, (values, kind) in ex.items():
        if kind == "int":
            feats[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
        elif kind == "float":
            feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))
        else:
            feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[values.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feats))


@pytest.mark.parametrize("ex", CASES)
def test_bytes_equal_tensorflows_deterministic_serialization(ex):
    assert _serialize(ex) == tf_example(ex).SerializeToString(deterministic=True)


@pytest.mark.parametrize("ex", CASES)
def test_decoding_tensorflows_bytes(ex):
    data = tf_example(ex).SerializeToString()
    spec = {k: (kind, len(v)) for k, (v, kind) in ex.items() if kind != "byte"}
    got = decode_example(data, spec)
    for k, (kind, _) in spec.items():
        want = np.asarray(ex[k][0], dtype=np.int64 if kind == "int" else np.float32)
        np.testing.assert_array_equal(got[k], want)


def test_tensorflows_reader_reads_our_files(tmp_path):
    path = tmp_path / "a.tfrecord"
    assert write_examples(path, [dict(CASES[0]), dict(CASES[0])]) == 2
    spec = {"input_ids": tf.io.FixedLenFeature([128], tf.int64),
            "weights": tf.io.FixedLenFeature([20], tf.float32)}
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert len(rows) == 2
    np.testing.assert_array_equal(rows[1]["input_ids"].numpy(), np.arange(128))
    # and ours reads TensorFlow's writer, CRCs verified
    with tf.io.TFRecordWriter(str(tmp_path / "b.tfrecord")) as w:
        w.write(tf_example(CASES[1]).SerializeToString())
    (_, rec), = list(iter_records(tmp_path / "b.tfrecord"))
    assert decode_example(rec, {"big": ("int", 8)})["big"][-1] == 2**63 - 1
