"""TensorFlow reader of hvd_bert's TFRecord shards: ``tf.data`` with per-rank file sharding,
the toolkit's windowed shuffle, batching and ``prefetch(AUTOTUNE)``.

It yields the same examples in the same order as ``hvd_bert.pt.data`` for the same files,
seed, rank and world size: files from ``hvd_bert.core.sharding.plan_reads``, record
striding with ``Dataset.shard``, then windows of ``shuffle_buffer`` records sorted by the same
integer keys (``sharding.shuffle_keys``, computed here with int64 ops).
"""

from __future__ import annotations

from pathlib import Path

import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.data.kinds import spec_for_meta
from hvd_bert.data.records import CorruptRecordError, DatasetError, iter_records
from hvd_bert.data.sidecar import SidecarWatch, read_sidecar
from hvd_bert.core.sharding import (LEHMER_M, TooFewShardsError, round_constants, epoch_batches,
                                      plan_reads, stream_seed)

__all__ = ["make_dataset", "feature_spec", "stream"]


def feature_spec(meta: dict) -> dict:
    """``tf.io`` parsing spec from the folder's feature layout (``data.kinds``)."""
    kinds = {"int": tf.int64, "float": tf.float32}
    return {name: tf.io.FixedLenFeature([n], kinds[kind]) for name, (kind, n) in spec_for_meta(meta).items()}


def _keys(indices, stream: int):
    k = tf.math.floormod(tf.cast(indices, tf.int64), LEHMER_M)
    for a, c in round_constants(stream):
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


def _checked(folder: Path, ds, watch=None):
    it = iter(ds)
    while True:
        if watch is not None:
            watch.check()
        try:
            batch = next(it)
        except StopIteration:
            return
        except tf.errors.DataLossError as e:  # TF names the offset but not the file
            raise DatasetError(corruption_message(folder, e.message)) from None
        yield batch


def stream(folder: str | Path, kind: str, rank: int, world_size: int, local_batch_size: int, *,
           seed: int = 0, shuffle_buffer: int = 1024, record_striding: bool = False,
           expect: dict | None = None, start_batch: int = 0, length_grouping: int = 0):
    """This rank's batches over consecutive epochs from global batch number ``start_batch`` on
    (the data position a checkpoint records), as ``hvd_bert.pt.data.ShardedDataset.stream``;
    ``length_grouping`` > 0: padded to their longest sequence after regrouping by length
    (``data.padding.length_grouped``, on the decoded batches: the same batches as PyTorch's)."""
    from hvd_bert.data.padding import length_grouped

    folder, epoch, skip = Path(folder), 0, start_batch
    watch = SidecarWatch(folder)  # (each batch: the data was not prepared again under the job)
    while True:
        ds, n = make_dataset(folder, kind, rank, world_size, local_batch_size, seed=seed, epoch=epoch,
                             shuffle_buffer=shuffle_buffer, record_striding=record_striding,
                             expect=expect)
        if skip >= n:
            skip -= n
        elif length_grouping:
            fixed = ({k: v.numpy() for k, v in b.items()} for b in _checked(folder, ds, watch))
            for b in length_grouped(_counted(fixed, n, folder, kind, expect), length_grouping,
                                    (seed, epoch, rank), start=skip):
                yield {k: tf.constant(v) for k, v in b.items()}
            skip = 0
        else:
            yield from _counted(_checked(folder, ds.skip(skip), watch), n - skip, folder, kind, expect)
            skip = 0
        epoch += 1


def _counted(batches, n: int, folder: Path, kind: str, expect):
    """``batches``, which must be ``n``: fewer means the shards hold fewer records than the
    sidecar says (tf.data would end the epoch early and train on silently)."""
    got = 0
    for b in batches:
        got += 1
        yield b
    if got < n:
        from hvd_bert.data.sidecar import shard_count_error

        meta = read_sidecar(folder, kind, expect)
        raise DatasetError(shard_count_error(folder, meta) or f"{folder}'s shards hold fewer records than "
                           f"{folder / 'dataset.json'} says: prepare the data again")


def corruption_message(folder: str | Path, tf_message: str) -> str:
    """The file and record that TensorFlow's reader found corrupt, found again by scanning the
    folder's shards with hvd_bert's own reader (only on this error path)."""
    folder = Path(folder)
    for shard in sorted(folder.glob("*.tfrecord")):
        try:
            for _ in iter_records(shard):
                pass
        except CorruptRecordError as e:
            return str(e)
    return f"a record in {folder} is corrupt ({tf_message.strip()}); prepare the data again"
