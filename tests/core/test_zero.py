"""ZeRO's partition (core/zero.py): shards cover every element once, partial sums of squares
complete every tensor's norm, and N ranks stepping their shards (an allreduce between them,
simulated with threads) give core.optim's step on the whole model."""

import threading

import numpy as np
import pytest

from hvd_bert.core import optim as O
from hvd_bert.core import zero as Z

SHAPES = [(3, 5), (7,), (1,), (4, 4), (2, 3, 2), (9,)]  # 71 elements: tensors span shards


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_the_shards_cover_every_element_once_and_complete_every_norm(world):
    rng = np.random.default_rng(world)
    tensors = [rng.standard_normal(s) for s in SHAPES]
    part = Z.partition([t.size for t in tensors], world)
    shards = [Z.shard_of(tensors, part, r) for r in range(world)]
    assert part.shard * world >= part.total > part.shard * (world - 1)
    back = Z.unshard(shards, part, SHAPES)
    assert all(np.array_equal(a, b) for a, b in zip(back, tensors))
    sums = sum(Z.partial_sq_sums(s, part, r) for r, s in enumerate(shards))
    assert np.allclose(np.sqrt(sums), [np.linalg.norm(t) for t in tensors], rtol=1e-14, atol=0)


def run_ranks(world, fn):
    """``fn(rank, allreduce)`` on ``world`` threads whose ``allreduce`` sums over them."""
    barrier, box, out = threading.Barrier(world), {}, [None] * world

    def allreduce(rank, vec):
        box[rank] = np.asarray(vec, dtype=np.float64)
        barrier.wait()
        total = sum(box[r] for r in range(world))
        barrier.wait()
        return total

    def body(rank):
        out[rank] = fn(rank, lambda v: allreduce(rank, v))
    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


FULL = {"lamb": (O.lamb_step, O.adam_init, dict(weight_decay=0.01, max_grad_norm=1.0)),
        "nvlamb": (O.nvlamb_step, O.adam_init, dict(weight_decay=0.01, max_grad_norm=1.0)),
        "lars": (O.lars_step, O.momentum_init, dict(weight_decay=5e-4, eta=1e-3, momentum=0.9)),
        # (no norms: the shards' steps are the whole model's element for element)
        "sgd": (O.sgd_step, O.momentum_init, dict(weight_decay=1e-4, momentum=0.9, nesterov=True)),
        "adamw": (O.adamw_step, O.adam_init, dict(weight_decay=0.01)),
        "lion": (O.lion_step, O.momentum_init, dict(weight_decay=0.1, beta1=0.9, beta2=0.99))}


@pytest.mark.parametrize("name", sorted(FULL))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_n_ranks_stepping_their_shards_give_the_whole_models_step(name, world):
    rng = np.random.default_rng(7 * world)
    w = [rng.standard_normal(s) for s in SHAPES]
    grads = [[5 * rng.standard_normal(s) for s in SHAPES] for _ in range(3)]  # clipped: norm > 1
    mask = [len(s) > 1 for s in SHAPES]  # no decay / adaptation for the vectors (biases, LayerNorm)
    step, init, hp = FULL[name]
    kw = dict(hp, lr=0.01, decay_mask=mask) if name != "lars" else dict(hp, lr=0.1, adapt_mask=mask)
    if name == "lamb":
        kw["adapt_mask"] = mask
    full, state = list(w), init(w)
    for g in grads:
        full, state, _ = step(full, g, state, **kw)
    part = Z.partition([t.size for t in w], world)

    def rank_fn(rank, allreduce):
        shard, st = Z.shard_of(w, part, rank), {}
        for g in grads:
            shard, st = Z.sharded_step(name, shard, Z.shard_of(g, part, rank), st, part, rank,
                                       allreduce=allreduce, **kw)
        return shard
    got = Z.unshard(run_ranks(world, rank_fn), part, SHAPES)
    # each tensor's largest difference relative to its largest element: float64 throughout, the
    # sums in another order. Measured over 60 seeds x 3 optimizers x 4, 2, 3, 8 ranks (720
    # cases): worst 2.0e-16 (LAMB), 3.2e-17 (LARS); the bound is 20x that.
    worst = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(got, full))
    assert worst < 4e-15, worst


# ---------------------------------------------------------------------- elastic commits
def _recovered(sizes, old_n, lost, new_n):
    """Each old rank's shard of a flat vector 0..total-1, committed as core.zero says, the ranks in
    ``lost`` gone, then every new rank's shard rebuilt from the survivors' commits."""
    old, new = Z.partition(sizes, old_n), Z.partition(sizes, new_n)
    flat = np.arange(old.shard * old_n, dtype=np.float64)
    flat[old.total:] = 0
    commits = [{j: flat[j * old.shard:(j + 1) * old.shard] for j in Z.committed_shards(r, old_n)}
               for r in range(old_n) if r not in lost]
    commits += [None] * (new_n - len(commits))  # (workers that joined hold nothing)
    rows = [Z.commit_row(c and {"world_size": old_n, "step": 7, "shards": c}) for c in commits]
    size, step, holder = Z.recovery(rows)
    assert (size, step) == (old_n, 7)
    shards = []
    for r in range(new_n):
        mine = np.zeros(new.shard)
        for j in range(old_n):
            cut = Z.overlap(old, j, new, r)
            if cut is not None:
                mine[cut[2]:cut[3]] = commits[holder[j]][j][cut[0]:cut[1]]
        shards.append(mine)
    return np.concatenate(shards)[:old.total], flat[:old.total]


@pytest.mark.parametrize("old_n,lost,new_n", [(4, [0], 3), (4, [3], 3), (4, [2], 5), (3, [1], 2), (2, [], 3),
                                              (5, [4], 2)])
def test_the_loss_of_any_one_rank_is_recovered_from_the_commits(old_n, lost, new_n):
    got, want = _recovered([5, 17, 3, 40], old_n, lost, new_n)
    np.testing.assert_array_equal(got, want)


def test_two_lost_neighbours_lose_a_shard():
    with pytest.raises(Z.LostShards, match=r"former ranks \[2\]"):
        _recovered([5, 17, 3, 40], 4, [1, 2], 2)


def test_no_commit_anywhere_is_a_fresh_state():
    assert Z.recovery([Z.commit_row(None)] * 3) is None
