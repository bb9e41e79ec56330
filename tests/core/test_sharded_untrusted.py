"""A sharded checkpoint is untrusted input (hvd_bert/train/sharded_checkpoint.py): a damaged index
or shard header is refused when the checkpoint is opened, before anything is allocated or read,
and every byte read is checked against its CRC however the read is split. The damages are of
the kinds a hand-edited or corrupted folder shows: wrong types, negative or huge numbers, ranges
outside their tensor or their file, pieces that overlap or leave gaps, another model's shapes."""

import json

import numpy as np
import pytest

from hvd_bert.train import sharded_checkpoint as S
from hvd_bert.train.engine import CheckpointError

from test_sharded_checkpoint import TENSORS, write


def edit_index(folder, change):
    path = folder / S.INDEX
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def first_piece(index, name="model/emb"):
    for f in index["files"].values():
        for e in f["pieces"].values():
            if e["name"] == name:
                return e
    raise AssertionError(name)


def set_piece(key, value, name="model/emb"):
    return lambda index: first_piece(index, name).__setitem__(key, value)


def set_meta(key, value):
    return lambda index: index["meta"].__setitem__(key, value)


def one_piece_file(index, name="model/emb"):
    """The file and key of ``name``'s first piece."""
    for file, f in index["files"].items():
        for key, e in f["pieces"].items():
            if e["name"] == name:
                return file, key
    raise AssertionError(name)


DAMAGES = {
    "negative shape": (set_piece("shape", [-12, -4]), "not a list of counts"),
    "float shape": (set_piece("shape", [12.0, 4]), "not a list of counts"),
    "huge shape": (set_piece("shape", [2**40, 4]), "cover 48 of its 4398046511104 values"),
    "string range": (set_piece("flat", "0:48"), "range"),
    "negative range": (set_piece("flat", [-4, 20]), "range"),
    "range past the tensor": (set_piece("flat", [0, 49]), "range"),
    "bad split": (set_piece("split", [0, 5, 0]), "does not divide"),
    "split index past parts": (set_piece("split", [0, 2, 2]), "split"),
    "split of a missing dim": (set_piece("split", [3, 2, 0]), "split"),
    "no name": (set_piece("name", 7), "no tensor name"),
    "unknown dtype": (set_piece("dtype", "complex512"), "dtype"),
    "no crc": (set_piece("crc32c", None), "CRC"),
    "meta not an object": (lambda i: i.__setitem__("meta", [1, 2]), "meta is not"),
    "meta optimizer_step string": (set_meta("optimizer_step", "7"), "optimizer_step"),
    "meta optimizer_step negative": (set_meta("optimizer_step", -1), "optimizer_step"),
    "meta scaler list": (set_meta("scaler", [1.0]), "scaler"),
    "meta scaler text": (set_meta("scaler", {"scale": "big"}), "scaler"),
    "meta layout negative": (set_meta("layout", {"world_size": -2}), "layout"),
    "files not objects": (lambda i: i["files"].__setitem__(next(iter(i["files"])), 3),
                          "is not {bytes, pieces}"),
    "bytes negative": (lambda i: next(iter(i["files"].values())).__setitem__("bytes", -1), "bytes, pieces"),
    "a piece twice": (lambda i: next(iter(i["files"].values()))["pieces"].__setitem__(
        "9", dict(first_piece(i))), "not what the file holds"),
    "a gap": (lambda i: drop_piece(i), "leave a gap|cover"),
}


def split_pieces(index) -> list:
    """The pieces of the first tensor written in several pieces of one share, by range."""
    by = {}
    for f in index["files"].values():
        for e in f["pieces"].values():
            by.setdefault((e["name"], str(e["split"])), []).append(e)
    return sorted(next(v for v in by.values() if len(v) > 1), key=lambda e: e["flat"][0])


def drop_piece(index):
    gone = split_pieces(index)[0]
    for f in index["files"].values():
        for key, e in list(f["pieces"].items()):
            if e is gone:
                del f["pieces"][key]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_index_is_refused_when_opened(tmp_path, damage):
    change, words = DAMAGES[damage]
    write(tmp_path / "c", 2, 2)
    edit_index(tmp_path / "c", change)
    with pytest.raises(CheckpointError, match=words) as e:
        S.Reader(tmp_path / "c")
    assert "damaged" in str(e.value) or "names the shard" in str(e.value)


def test_pieces_that_overlap_are_refused(tmp_path):
    """Two writers claiming the same values: one piece's range moved into its neighbour's."""
    write(tmp_path / "c", 2, 3)

    def shift(index):
        second = split_pieces(index)[1]
        second["flat"] = [second["flat"][0] - 1, second["flat"][1] - 1]
    edit_index(tmp_path / "c", shift)
    with pytest.raises(CheckpointError, match="overlap"):
        S.Reader(tmp_path / "c")


HEADER_DAMAGES = {
    "negative offset": lambda h, k: h[k].__setitem__("data_offsets", [-8, h[k]["data_offsets"][1]]),
    "offset past the file": lambda h, k: h[k].__setitem__("data_offsets", [0, 10**9]),
    "negative shape": lambda h, k: h[k].__setitem__("shape", [-1]),
    "shape of the wrong size": lambda h, k: h[k].__setitem__("shape", [h[k]["shape"][0] + 1]),
    "unknown dtype": lambda h, k: h[k].__setitem__("dtype", "Q9"),
    "not an object": lambda h, k: h.__setitem__(k, "x"),
}


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGES))
def test_a_damaged_shard_header_is_refused_when_opened(tmp_path, damage):
    """The header is rewritten and the index told the file's new size: only the header's own
    validation can catch it."""
    write(tmp_path / "c", 1, 2)
    shard = tmp_path / "c" / "rank-00000.safetensors"
    data = shard.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    HEADER_DAMAGES[damage](header, next(k for k in header if k != "__metadata__"))
    text = json.dumps(header).encode()
    shard.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    edit_index(tmp_path / "c", lambda i: i["files"]["rank-00000.safetensors"].__setitem__(
        "bytes", shard.stat().st_size))  # (the index agrees with the file's size: only the header is wrong)
    with pytest.raises(CheckpointError, match="rank-00000.safetensors"):
        S.Reader(tmp_path / "c")


def test_a_header_length_past_the_file_is_refused(tmp_path):
    write(tmp_path / "c", 1, 2)
    shard = tmp_path / "c" / "rank-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[:8] = (len(data) * 4).to_bytes(8, "little")
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="cannot be read as safetensors"):
        S.Reader(tmp_path / "c")


def test_an_oversized_index_is_refused_before_it_is_read(tmp_path, monkeypatch):
    write(tmp_path / "c", 1, 1)
    monkeypatch.setattr(S, "MAX_INDEX_BYTES", 64)
    with pytest.raises(CheckpointError, match="more than any index"):
        S.Reader(tmp_path / "c")


@pytest.mark.parametrize("loaded", [(1, 3), (1, 4), (2, 3)])
def test_a_flipped_bit_is_caught_however_the_read_is_split(tmp_path, loaded):
    """Written by 2 ranks, read by layouts whose pieces cut the written ones in parts: the piece
    holding the flipped byte fails its CRC whichever part of it is read."""
    write(tmp_path / "c", 1, 2)
    shard = tmp_path / "c" / "rank-00000.safetensors"
    data = bytearray(shard.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    key = next(k for k in sorted(header) if k != "__metadata__")
    a, _ = header[key]["data_offsets"]
    data[8 + n + a] ^= 0x01  # the piece's first value
    shard.write_bytes(bytes(data))
    index = json.loads((tmp_path / "c" / S.INDEX).read_text())
    name = index["files"]["rank-00000.safetensors"]["pieces"][key]["name"]
    shape = next(s for n_, s, _ in TENSORS if n_ == name)
    r = S.Reader(tmp_path / "c")
    t, d = loaded
    dim = next(dm for n_, _, dm in TENSORS if n_ == name)
    caught = 0
    for ti in range(t):
        split = (dim, t, ti) if dim is not None else None
        for di in range(d):
            for _, p in S.rank_pieces([(name, shape, split)], d, di):
                try:
                    r.read(name, split, p.flat)
                except CheckpointError as e:
                    assert "CRC-32C" in str(e)
                    caught += 1
    assert caught >= 1


def test_another_models_shape_is_refused_by_name(tmp_path):
    write(tmp_path / "c", 1, 2)
    r = S.Reader(tmp_path / "c")
    with pytest.raises(CheckpointError, match=r"model/emb of shape \(12, 4\), this model's is \(24, 4\)"):
        r.read("model/emb", shape=(24, 4))
    with pytest.raises(CheckpointError, match="cannot be read as this model splits it"):
        r.read("model/emb", split=(0, 5, 0))
    np.testing.assert_array_equal(r.read("model/emb", shape=(12, 4)).size, 48)
