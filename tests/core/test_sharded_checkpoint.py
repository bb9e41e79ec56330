"""Sharded checkpoints (hvd_bert/train/sharded_checkpoint.py): pieces written under one layout
(tensor-parallel degree T, data-parallel writers D) read back under any other, equal to the
whole tensors bit for bit; an incomplete or damaged checkpoint refused in one line."""

import json

import numpy as np
import pytest

from hvd_bert.train import sharded_checkpoint as S
from hvd_bert.train.engine import CheckpointError

# name, whole shape, the dimension tensor parallelism splits (None: whole on every rank)
TENSORS = [("model/emb", (12, 4), None), ("model/qkv.weight", (8, 6), 0), ("model/out.weight", (6, 8), 1),
           ("model/out.bias", (6,), None), ("optim/exp_avg/qkv.weight", (8, 6), 0),
           ("model/scalar", (), None)]


def whole():
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(shape).astype(np.float32) for n, shape, _ in TENSORS}


def share(a, dim, t, i):
    return a if dim is None or t == 1 else np.split(a, t, axis=dim)[i]


def write(folder, t, d):
    """Every rank of a layout of T x D ranks writes its pieces; then the index."""
    arrays = whole()
    folder.mkdir()
    for rank in range(t * d):
        ti, di = rank % t, rank // t
        local = [(n, shape, (dim, t, ti) if dim is not None else None) for n, shape, dim in TENSORS]
        pieces = S.rank_pieces(local, d, di, replica=ti == 0)
        S.write_rank(folder, rank, [(p, share(arrays[p.name], dim, t, ti).reshape(-1)[slice(*p.flat)])
                                    for (i, p), (_, _, dim) in ((ip, TENSORS[ip[0]]) for ip in pieces)])
    S.write_index(folder, t * d, {"step": 7}, timeout_s=5)
    return arrays


@pytest.mark.parametrize("saved", [(1, 1), (2, 2), (1, 3), (2, 1)])
@pytest.mark.parametrize("loaded", [(1, 1), (2, 3), (1, 2), (2, 1)])
def test_any_layout_reads_what_any_layout_wrote(tmp_path, saved, loaded):
    arrays = write(tmp_path / "c", *saved)
    r = S.Reader(tmp_path / "c")
    assert r.meta == {"step": 7}
    t, d = loaded
    for name, shape, dim in TENSORS:
        for ti in range(t):
            split = (dim, t, ti) if dim is not None else None
            want = share(arrays[name], dim, t, ti).reshape(-1)
            np.testing.assert_array_equal(r.read(name, split), want)
            for di in range(d):
                for _, p in S.rank_pieces([(name, shape, split)], d, di):
                    np.testing.assert_array_equal(r.read(name, split, p.flat), want[slice(*p.flat)])


def test_every_value_is_written_once(tmp_path):
    write(tmp_path / "c", 2, 2)
    index = json.loads((tmp_path / "c" / S.INDEX).read_text())
    written = sum(e["flat"][1] - e["flat"][0] for f in index["files"].values() for e in f["pieces"].values())
    assert written == sum(int(np.prod(s)) for _, s, _ in TENSORS)


def test_no_index_is_an_incomplete_checkpoint(tmp_path):
    write(tmp_path / "c", 1, 2)
    (tmp_path / "c" / S.INDEX).unlink()
    assert not S.is_complete(tmp_path / "c")
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        S.Reader(tmp_path / "c")


def test_a_missing_truncated_or_damaged_shard_is_refused(tmp_path):
    write(tmp_path / "c", 1, 2)
    shard = tmp_path / "c" / "rank-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-3])
    with pytest.raises(CheckpointError, match="truncated"):
        S.Reader(tmp_path / "c")
    flipped = bytearray(data)
    flipped[-2] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    r = S.Reader(tmp_path / "c")
    with pytest.raises(CheckpointError, match="damaged"):
        for name, _, _ in TENSORS:
            r.read(name)
    shard.unlink()
    with pytest.raises(CheckpointError, match="names the shard rank-00001.safetensors, which is missing"):
        S.Reader(tmp_path / "c")


def test_the_index_waits_for_every_writer(tmp_path):
    (tmp_path / "c").mkdir()
    with pytest.raises(CheckpointError, match="rank-00001.json were not written"):
        S.write_index(tmp_path / "c", 2, {}, timeout_s=0.1)
    assert not S.is_complete(tmp_path / "c")


def test_convert_streams_a_sharded_checkpoint_tensor_by_tensor(tmp_path):
    """What ``convert`` writes from a sharded checkpoint's lazily read tensors: an .npz that numpy
    reads back, and a safetensors file that the safetensors library reads back, value for value;
    each tensor was read from the checkpoint once per write, when it was written."""
    from safetensors.numpy import load_file

    from hvd_bert.config.bert import BertConfig
    from hvd_bert.weights.hf import write_safetensors
    from hvd_bert.weights.portable import save_weights

    arrays = write(tmp_path / "c", 2, 2)
    lazy = S.LazyTensors(S.Reader(tmp_path / "c"), "model/")
    reads = []
    read = lazy.reader.read
    lazy.reader.read = lambda *a, **k: reads.append(a[0]) or read(*a, **k)
    want = {n[len("model/"):]: a for n, a in arrays.items() if n.startswith("model/")}
    assert sorted(lazy) == sorted(want) and all(lazy.shape_of(k) == want[k].shape for k in want)
    assert reads == []  # (names and shapes come from the index)
    save_weights(tmp_path / "w.npz", lazy, BertConfig(vocab_size=8, hidden_size=4, num_layers=1, num_heads=1,
                                                       intermediate_size=4))
    with np.load(tmp_path / "w.npz") as z:
        for k in want:
            np.testing.assert_array_equal(z[k], want[k])
    assert sorted(reads) == sorted(f"model/{k}" for k in want)
    write_safetensors(tmp_path / "m.safetensors", lazy, sorted(lazy), {"format": "pt"})
    got = load_file(tmp_path / "m.safetensors")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_save_abandoned_by_a_change_of_the_world_stops_waiting_for_the_lost_rank(tmp_path):
    """Rank 0 of 2 writes its share and waits for rank 1's manifest, which never comes (rank 1
    was lost): ``abandon`` (a Horovod elastic reset) ends that wait at once, not after the index's
    600 s, names the incomplete checkpoint, and leaves the complete one before it as it was; the
    next save goes on as usual. (The allgather is one process's: the new world of one rank.)"""
    import time

    from hvd_bert.train.checkpoint import latest_checkpoint
    from hvd_bert.train.sharded_writer import Writer

    arrays = whole()
    pieces = [(S.Piece(n, shape), arrays[n].reshape(-1)) for n, shape, _ in TENSORS]
    writer = Writer(lambda obj, name: [obj])
    writer.save(tmp_path / "ckpt-00000001.shards", tmp_path, 0, 1, pieces, {"step": 1}, keep=3)
    writer.wait()
    cut = tmp_path / "ckpt-00000002.shards"
    cut.mkdir()
    writer.save(cut, tmp_path, 0, 2, pieces, {"step": 2}, keep=3)
    time.sleep(0.3)
    assert writer.thread.is_alive()  # waiting for rank 1's manifest
    t0 = time.monotonic()
    assert writer.abandon() == cut
    assert time.monotonic() - t0 < 5 and writer.thread is None
    assert not S.is_complete(cut)
    assert latest_checkpoint(tmp_path, S.SUFFIX) == tmp_path / "ckpt-00000001.shards"
    assert writer.abandon() is None  # nothing in flight: nothing cut
    (tmp_path / "ckpt-00000003.shards").mkdir()
    writer.save(tmp_path / "ckpt-00000003.shards", tmp_path, 0, 1, pieces, {"step": 3}, keep=3)
    writer.wait()
    assert S.Reader(tmp_path / "ckpt-00000003.shards").meta == {"step": 3}


def test_the_index_stops_waiting_for_a_writer_that_failed(tmp_path):
    """A rank whose shard could not be written (a full disk) leaves ``rank-<r>.failed``: rank 0
    stops waiting for it at once instead of its 600 s (the other ranks wait in a collective)."""
    import time

    folder = tmp_path / "c"
    folder.mkdir()
    S.mark_failed(folder, 1)
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="rank-00001.failed: a rank could not write its shard"):
        S.write_index(folder, 2, {}, timeout_s=600)
    assert time.monotonic() - t0 < 5 and not S.is_complete(folder)
