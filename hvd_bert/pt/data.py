"""PyTorch reader of hvd_bert's TFRecord shards (BERT pretraining, classification).

Files are assigned to ranks by ``hvd_bert.core.sharding`` (whole files, or record striding
when there are fewer files than ranks), read in the toolkit's order (``records.read_ordered``:
the same examples in the same order as the TensorFlow reader for the same files, seed, rank
and world size), decoded and batched in a background thread that runs ahead of the training
step (``prefetch`` batches), so reading and decoding overlap with compute. Every rank yields
the same number of batches per epoch. Data code receives rank and size; it does not call
Horovod.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from hvd_bert.data.kinds import spec_for_meta
from hvd_bert.data.packing import pack_batch
from hvd_bert.data.padding import length_grouped
from hvd_bert.data.records import decode_batch, read_ordered
from hvd_bert.data.sidecar import SidecarWatch
from hvd_bert.data.sidecar import read_sidecar
from hvd_bert.core.sharding import TooFewShardsError, epoch_batches, plan_reads, stream_seed

__all__ = ["ShardedDataset"]

_DONE = object()


class ShardedDataset(torch.utils.data.IterableDataset):
    """Batches of one rank from a prepared data folder.

    Args:
        folder: the prepared folder (with ``dataset.json``).
        kind: ``"bert-pretraining"`` or ``"bert-classification"``.
        rank, world_size: this process's place (from Horovod, passed in).
        local_batch_size: examples per batch on this rank.
        seed: shuffles files per epoch and records within windows.
        shuffle_buffer: records per shuffle window (<= 1: no shuffling of records).
        record_striding: every rank reads every file and keeps every world_size-th record
            (needed when there are fewer files than ranks).
        expect: settings the data must have been prepared with (e.g. ``max_seq_length``).
        prefetch: batches decoded ahead in the background.
        length_grouping: > 0: batches padded to their longest sequence, after regrouping
            this many batches at a time by length (``data.padding.length_grouped``).
        pack: pretraining batches with their sequences packed into fewer rows
            (``data.packing.pack_batch``), in the background thread.
        segments: packed batches carry ``segment_offsets`` (varlen attention).
    """

    def __init__(self, folder: str | Path, kind: str, rank: int, world_size: int, local_batch_size: int,
                 *, seed: int = 0, shuffle_buffer: int = 1024, record_striding: bool = False,
                 expect: dict | None = None, prefetch: int = 4, epoch: int = 0, length_grouping: int = 0,
                 pack: bool = False, segments: bool = False):
        super().__init__()
        self.folder = Path(folder)
        self.watch = SidecarWatch(self.folder)  # (before the read: a change after it is noticed)
        self.meta = read_sidecar(self.folder, kind, expect)
        self.spec = spec_for_meta(self.meta)
        self.files = [s["file"] for s in self.meta["shards"]]
        self.counts = [s["records"] for s in self.meta["shards"]]
        if len(self.files) < world_size and not record_striding:
            raise TooFewShardsError(
                f"{self.folder} has {len(self.files)} shard file(s) for {world_size} ranks; prepare it "
                f"with --num-shards {world_size * 4} (a multiple of the ranks), or read it with "
                f"record striding (every rank reads every file and keeps every {world_size}-th record)")
        self.rank, self.world_size, self.local_batch_size = rank, world_size, local_batch_size
        self.seed, self.shuffle_buffer, self.record_striding = seed, shuffle_buffer, record_striding
        self.prefetch, self.epoch, self.length_grouping = prefetch, epoch, length_grouping
        self.pack, self.segments = pack, segments

    def batches_in_epoch(self, epoch: int) -> int:
        return epoch_batches(self.files, self.counts, self.world_size, self.local_batch_size, epoch,
                             self.seed, self.record_striding)

    def _produce(self, epoch: int, start: int) -> Iterator[dict[str, np.ndarray]]:
        plan = plan_reads(self.files, self.rank, self.world_size, epoch, self.seed, True,
                          self.record_striding)
        n_batches = self.batches_in_epoch(epoch)
        stream = stream_seed(self.seed, epoch, self.rank)
        records = read_ordered(self.folder, plan, self.shuffle_buffer, stream,
                               counts=dict(zip(self.files, self.counts)), before_shard=self.watch.check)
        b = self.local_batch_size
        if self.length_grouping:
            fixed = (decode_batch([next(records) for _ in range(b)], self.spec) for _ in range(n_batches))
            yield from length_grouped(fixed, self.length_grouping, (self.seed, epoch, self.rank), start=start)
            return
        for i in range(n_batches):
            chunk = [next(records) for _ in range(b)]
            if i < start:
                continue  # resuming: records are read, not decoded
            batch = decode_batch(chunk, self.spec)
            yield pack_batch(batch, self.segments) if self.pack else batch

    def epoch_batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of ``epoch`` from batch ``start`` on, decoded in a background thread."""
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        stop = threading.Event()

        def work():
            try:
                for batch in self._produce(epoch, start):
                    while not stop.is_set():
                        try:
                            q.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(_DONE)
            except BaseException as e:  # noqa: BLE001  (re-raised in the consumer)
                q.put(e)

        t = threading.Thread(target=work, name=f"hvd_bert-reader-{self.rank}", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield {k: torch.from_numpy(v) for k, v in item.items()}
        finally:
            stop.set()

    def stream(self, start_batch: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Batches over consecutive epochs from global batch number ``start_batch`` on (the
        data position a checkpoint records)."""
        epoch, skip = self.epoch, start_batch
        while True:
            n = self.batches_in_epoch(epoch)
            if skip >= n:
                skip -= n
            else:
                yield from self.epoch_batches(epoch, skip)
                skip = 0
            epoch += 1

    def __iter__(self):
        return self.epoch_batches(self.epoch)
