"""TensorFlow reader of hvd_bert's TFRecord shards: ``tf.data`` with per-rank file sharding,
the toolkit's windowed shuffle, batching and ``prefetch(AUTOTUNE)``.

It yields the same examples in the same order as ``hvd_bert.pt.data`` for the same files,
seed, rank and world size: files from ``hvd_bert.common.sharding.plan_reads``, record
striding with ``Dataset.shard``, then windows of ``shuffle_buffer`` records sorted by the same
integer keys (``sharding.shuffle_keys``, computed here with int64 ops). It never imports the
``tfrecord`` package (which cannot share a process with TensorFlow).
"""

from __future__ import annotations

from pathlib import Path

import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.common.records import DatasetError, read_sidecar
from hvd_bert.common.sharding import (LEHMER_M, TooFewShardsError, _round_constants, epoch_batches,
                                      plan_reads, stream_seed)

__all__ = ["make_dataset", "feature_spec"]


def feature_spec(meta: dict) -> dict:
    s = meta["max_seq_length"]
    ints = lambda n: tf.io.FixedLenFeature([n], tf.int64)  # noqa: E731
    if meta["kind"] == "bert-pretraining":
        p = meta["max_predictions_per_seq"]
        return {"input_ids": ints(s), "input_mask": ints(s), "segment_ids": ints(s),
                "masked_lm_positions": ints(p), "masked_lm_ids": ints(p),
                "masked_lm_weights": tf.io.FixedLenFeature([p], tf.float32),
                "next_sentence_labels": ints(1)}
    if meta["kind"] == "bert-classification":
        return {"input_ids": ints(s), "input_mask": ints(s), "segment_ids": ints(s), "label_ids": ints(1)}
    raise DatasetError(f"no reader for data of kind {meta['kind']!r}")


def _keys(indices, stream: int):
    k = tf.math.floormod(tf.cast(indices, tf.int64), LEHMER_M)
    for a, c in _round_constants(stream):
        k = tf.math.floormod(k * a + c, LEHMER_M)
    return k


def make_dataset(folder: str | Path, kind: str, rank: int, world_size: int, local_batch_size: int, *,
                 seed: int = 0, epoch: int = 0, shuffle_buffer: int = 1024, record_striding: bool = False,
                 expect: dict | None = None, start_batch: int = 0) -> tuple[tf.data.Dataset, int]:
    """``(dataset, batches)``: one epoch of this rank's batches (dicts of tensors), and how many
    there are (the same on every rank)."""
    folder = Path(folder)
    meta = read_sidecar(folder, kind, expect)
    files = [s["file"] for s in meta["shards"]]
    counts = [s["records"] for s in meta["shards"]]
    if len(files) < world_size and not record_striding:
        raise TooFewShardsError(
            f"{folder} has {len(files)} shard file(s) for {world_size} ranks; prepare it with "
            f"--num-shards {world_size * 4}, or read it with record striding")
    plan = plan_reads(files, rank, world_size, epoch, seed, True, record_striding)
    n_batches = epoch_batches(files, counts, world_size, local_batch_size, epoch, seed, record_striding)
    ds = tf.data.TFRecordDataset([str(folder / f) for f in plan.files])  # in order
    if plan.record_stride > 1:
        ds = ds.shard(plan.record_stride, plan.record_offset)
    if shuffle_buffer > 1:
        stream = stream_seed(seed, epoch, rank)
        ds = ds.enumerate().batch(shuffle_buffer)
        ds = ds.map(lambda idx, recs: tf.gather(recs, tf.argsort(_keys(idx, stream), stable=True)))
        ds = ds.unbatch()
    spec = feature_spec(meta)
    ds = ds.batch(local_batch_size, drop_remainder=True)
    ds = ds.map(lambda recs: tf.io.parse_example(recs, spec), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    ds = ds.take(n_batches).skip(start_batch)
    return ds.prefetch(tf.data.AUTOTUNE), n_batches
