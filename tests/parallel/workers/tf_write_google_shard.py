"""Write a pretraining shard with TensorFlow's own writer and tf.train.Example (as Google's and
NVIDIA's scripts do), plus an hvd_bert sidecar, to check that the PyTorch reader reads it."""

import json
import sys
from pathlib import Path

import hvd_bert  # noqa: F401
import tensorflow as tf

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
S, P, N = 16, 3, 10
ints = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))  # noqa: E731
with tf.io.TFRecordWriter(str(out / "google-00000.tfrecord")) as w:
    for i in range(N):
        feats = {"input_ids": ints([2] + [10 + i] * (S - 2) + [3]), "input_mask": ints([1] * S),
                 "segment_ids": ints([0] * 8 + [1] * 8), "masked_lm_positions": ints([1, 2, 0]),
                 "masked_lm_ids": ints([10 + i, 10 + i, 0]),
                 "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 1.0, 0.0])),
                 "next_sentence_labels": ints([i % 2])}
        w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
(out / "dataset.json").write_text(json.dumps({
    "kind": "bert-pretraining", "max_seq_length": S, "max_predictions_per_seq": P,
    "shards": [{"file": "google-00000.tfrecord", "records": N}]}))
