"""An engine's declared state (hvd_bert/train/sharded_state.py), framework-free: ranks that
declare numpy tensors under one layout (tensor-parallel degree T, data-parallel replicas D, a
ZeRO shard of the optimizer state or not) save through the layer, and ranks of another layout
load it back bit for bit; every value is written exactly once; the loss scale has one schema,
and checkpoints written before it (PyTorch's GradScaler state, TensorFlow's) still load."""

import json
import math

import numpy as np
import pytest

from hvd_bert.core.zero import partition
from hvd_bert.train import sharded_checkpoint as S, sharded_state as SS
from hvd_bert.train.engine import CheckpointError

# name, whole shape, tensor-parallel dim (None: whole on every rank of a group)
PARAMS = [("emb", (10, 4), None), ("qkv", (8, 6), 0), ("out", (6, 8), 1), ("bias", (6,), None)]
BUFFERS = ("exp_avg", "exp_avg_sq")


def whole(seed):
    rng = np.random.default_rng(seed)
    out = {f"model/{n}": rng.standard_normal(s).astype(np.float32) for n, s, _ in PARAMS}
    out.update({f"optim/{b}/{n}": rng.standard_normal(s).astype(np.float32)
                for b in BUFFERS for n, s, _ in PARAMS})
    return out


def share_of(a, dim, t, i):
    return a if dim is None or t == 1 else np.split(a, t, axis=dim)[i]


class Rank:
    """One rank of a layout: its shares of the model, and of the optimizer state either whole
    (ZeRO stage 0) or its ZeRO partition's pieces; numpy arrays a load puts values into."""

    def __init__(self, values, rank, t, d, zero, step=0, scale=None):
        self.ti, self.di = rank % t, rank // t
        self.t, self.d, self.zero, self.rank = t, d, zero, rank
        split = {n: (dim, t, self.ti) if dim is not None and t > 1 else None for n, _, dim in PARAMS}
        self.model = {n: share_of(values[f"model/{n}"], dim, t, self.ti).copy() for n, _, dim in PARAMS}
        self.tensors, self.optim = [], {}
        for n, shape, _ in PARAMS:
            self.tensors.append(self._declared(f"model/{n}", shape, split[n], self.model, n, "model"))
        sizes = [math.prod(self.model[n].shape) for n, _, _ in PARAMS]
        for b in BUFFERS:
            if zero:
                for i, off, _, k in partition(sizes, d).pieces(self.di):
                    n = PARAMS[i][0]
                    full = share_of(values[f"optim/{b}/{n}"], PARAMS[i][2], t, self.ti).reshape(-1)
                    self.optim[(b, n)] = full[off:off + k].copy()
                    self.tensors.append(self._declared(f"optim/{b}/{n}", PARAMS[i][1], split[n], self.optim,
                                                       (b, n), b, held=(off, off + k)))
            else:
                for n, shape, dim in PARAMS:
                    self.optim[(b, n)] = share_of(values[f"optim/{b}/{n}"], dim, t, self.ti).copy()
                    self.tensors.append(self._declared(f"optim/{b}/{n}", shape, split[n], self.optim,
                                                       (b, n), b))
        self.restored = None
        self.state = SS.EngineState(
            self.tensors, optimizer_step=step, loss_scale=scale or {"scale": 1024.0, "good_steps": 3},
            layout={"world_size": t * d, "zero_stage": 1 if zero else 0, "tensor_parallel": t}, rank=rank,
            world_size=t * d, writers=d, writer=self.di, replica=self.ti == 0,
            restore=lambda s, ls: setattr(self, "restored", (s, ls)))

    @staticmethod
    def _declared(name, shape, split, store, key, group, held=None):
        def put(v):
            store[key][...] = v.reshape(store[key].shape)
        base = held[0] if held else 0  # (read takes positions in the share; the store holds the range)
        return SS.Declared(name, shape, split,
                           read=lambda lo, hi: store[key].reshape(-1)[lo - base:hi - base].copy(),
                           put=put, group=group, held=held)


def save(folder, t, d, zero, seed=0, **kw):
    values = whole(seed)
    folder.mkdir()
    for r in range(t * d):
        S.write_rank(folder, r, SS.pieces_of(Rank(values, r, t, d, zero, **kw).state))
    first = Rank(values, 0, t, d, zero, **kw).state
    meta = {"step": 9, "optimizer_step": first.optimizer_step, "loss_scale": first.loss_scale,
            "layout": first.layout}
    S.write_index(folder, t * d, meta, timeout_s=5)
    return values


@pytest.mark.parametrize("saved", [(1, 1, False), (2, 2, True), (1, 3, True), (2, 1, False), (2, 3, False)])
@pytest.mark.parametrize("loaded", [(1, 1, False), (2, 2, False), (1, 2, True), (2, 3, True)])
def test_a_declared_state_loads_under_any_layout(tmp_path, saved, loaded):
    values = save(tmp_path / "c", *saved, step=7)
    t, d, zero = loaded
    for r in range(t * d):
        rank = Rank(whole(seed=1), r, t, d, zero)  # (other values: the load must replace every one)
        SS.load(rank.state, tmp_path / "c", lambda obj, name: [obj])
        for n, _, dim in PARAMS:
            np.testing.assert_array_equal(rank.model[n], share_of(values[f"model/{n}"], dim, t, rank.ti))
        for (b, n), got in rank.optim.items():
            dim = dict((p, d_) for p, _, d_ in PARAMS)[n]
            want = share_of(values[f"optim/{b}/{n}"], dim, t, rank.ti).reshape(-1)
            np.testing.assert_array_equal(got.reshape(-1), want[_held(rank, b, n)])
        assert rank.restored == (7, {"scale": 1024.0, "good_steps": 3})


def _held(rank, b, n):
    t = next(x for x in rank.tensors if x.name == f"optim/{b}/{n}")
    return slice(*t.span())


def test_every_value_is_written_exactly_once(tmp_path):
    for layout in [(2, 2, True), (2, 3, False), (1, 3, True)]:
        folder = tmp_path / "-".join(map(str, layout))
        save(folder, *layout)
        index = json.loads((folder / S.INDEX).read_text())
        written = {}
        for f in index["files"].values():
            for p in f["pieces"].values():
                key = (p["name"], tuple(p["split"]) if p["split"] else None)
                written[key] = written.get(key, 0) + p["flat"][1] - p["flat"][0]
        for name, shape, dim in PARAMS:
            t = layout[0] if dim is not None else 1
            for prefix in ["model/"] + [f"optim/{b}/" for b in BUFFERS]:
                total = sum(v for (nm, _), v in written.items() if nm == prefix + name)
                assert total == math.prod(shape), (layout, prefix + name, total)
                assert t == 1 or all(k[1] is not None for k in written if k[0] == prefix + name)


@pytest.mark.parametrize("old, want", [
    ({"scale": 512.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
      "_growth_tracker": 5},
     {"scale": 512.0, "good_steps": 5}),          # PyTorch's GradScaler state
    ({}, {"scale": 1.0, "good_steps": 0}),       # a disabled GradScaler's
    ({"loss_scale": 64.0, "good_steps": 2}, {"scale": 64.0, "good_steps": 2})])  # TensorFlow's
def test_checkpoints_written_before_the_one_loss_scale_schema_still_load(old, want):
    assert SS.loss_scale_of({"scaler": old}, "index.json") == want
    assert SS.loss_scale_of({"loss_scale": want}, "index.json") == want


@pytest.mark.parametrize("bad", [{"scale": -1.0, "good_steps": 0}, {"scale": float("inf"), "good_steps": 0},
                                 {"scale": 2.0, "good_steps": -3}, {"scale": 2.0}, [1, 2],
                                 {"scale": True, "good_steps": 0}])
def test_a_loss_scale_that_is_not_a_scale_is_refused(tmp_path, bad):
    with pytest.raises(CheckpointError, match="loss scale"):
        SS.loss_scale_of({"loss_scale": bad}, "index.json")
    values = whole(0)
    rank = Rank(values, 0, 1, 1, False)
    folder = tmp_path / "c"
    folder.mkdir()
    S.write_rank(folder, 0, SS.pieces_of(rank.state))
    S.write_index(folder, 1, {"step": 1, "loss_scale": bad}, timeout_s=5)
    with pytest.raises(CheckpointError, match="loss_scale"):  # (the index's check, before any read)
        S.Reader(folder)


def test_one_rank_saves_and_loads_through_the_layer(tmp_path):
    """The layer's own save (background writer, index, metadata keys) and load, on one rank."""
    from hvd_bert.train.sharded_writer import Writer

    values = whole(0)
    rank = Rank(values, 0, 1, 1, True, step=4, scale={"scale": 8.0, "good_steps": 1})
    writer = Writer(lambda obj, name: [obj])
    path = SS.save(rank.state, writer, tmp_path, 5, {"step": 5}, keep=2, barrier=lambda: None)
    writer.wait()
    meta = json.loads((path / S.INDEX).read_text())["meta"]
    assert meta == {"step": 5, "optimizer_step": 4, "loss_scale": {"scale": 8.0, "good_steps": 1},
                    "layout": {"world_size": 1, "zero_stage": 1, "tensor_parallel": 1}}
    back = Rank(whole(1), 0, 1, 1, False)
    assert SS.load(back.state, path, lambda obj, name: [obj]) == meta
    assert back.restored == (4, {"scale": 8.0, "good_steps": 1})
    for n, _, _ in PARAMS:
        np.testing.assert_array_equal(back.model[n], values[f"model/{n}"])
