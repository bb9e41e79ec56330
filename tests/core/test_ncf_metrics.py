"""NCF evaluation and epoch data, framework-free: HR@K / NDCG@K against a brute-force
reference, the evaluation users of the ranks, each rank's share of an epoch."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvd_bert.data import ncf as N
from hvd_bert.config import ConfigError
from hvd_bert.data.ncf import EpochData
from hvd_bert.evaluation.ncf import eval_users, hit_rate_ndcg, popularity_scores, rank_of_positive


def brute_force(scores, k):
    """Sort each user's 101 candidates by score, ties placing the held-out item last."""
    hits = ndcg = 0.0
    for row in scores:
        order = sorted(range(len(row)), key=lambda j: (-row[j], j == 0))
        pos = order.index(0)
        if pos < k:
            hits += 1
            ndcg += 1 / math.log2(pos + 2)
    return hits, ndcg, len(scores)


def test_metrics_equal_a_brute_force_reference():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(200, 101))
    scores[::3, 0] += 2.5  # some users with the held-out item near the top
    scores[5, 1:4] = scores[5, 0]  # ties count against the model
    for k in (1, 5, 10, 101):
        got = hit_rate_ndcg(scores, k)
        want = brute_force(scores, k)
        assert got[0] == want[0] and got[2] == want[2]
        assert got[1] == pytest.approx(want[1], rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), min_size=4, max_size=4), min_size=1, max_size=8),
       st.integers(1, 4))
def test_metrics_equal_brute_force_with_many_ties(rows, k):
    scores = np.array(rows, dtype=np.float64)
    got, want = hit_rate_ndcg(scores, k), brute_force(scores, k)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1])


def test_a_constant_model_scores_zero_and_a_perfect_one_scores_one():
    assert hit_rate_ndcg(np.zeros((4, 101)), 10)[:2] == (0.0, 0.0)
    perfect = np.zeros((4, 101))
    perfect[:, 0] = 1
    assert hit_rate_ndcg(perfect, 10) == (4.0, 4.0, 4)
    assert list(rank_of_positive(np.array([[0.5, 0.9, 0.1, 0.5]]))) == [2]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_evaluation_users_partition_all_users(world):
    parts = [eval_users(20, r, world) for r in range(world)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(20))


def small_data(scale=0.02, seed=0):
    users, items, ts = N.synthetic_movielens(int(6040 * scale), 500, int(1_000_209 * scale), seed=seed)
    tu, ti, test, nu, ni = N.leave_one_out(users, items, ts)
    return N.NCFData(tu, ti, test, N.sample_test_negatives(tu, ti, test, ni, 100, seed), nu, ni)


def test_the_ranks_share_of_an_epoch_is_disjoint_and_equal():
    data = small_data()
    world, b, k = 3, 64, 2
    shares = [list(EpochData(data, r, world, b, k, 4, seed=1).epoch(0)) for r in range(world)]
    one = EpochData(data, 0, 1, b, k, 4, seed=1)
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) % k == 0
    steps = len(shares[0]) // k
    assert steps == len(data.train_users) * 5 // (b * k * world)
    # together the ranks see distinct pairs of the one shuffled epoch
    u1, i1, y1 = (np.concatenate(x) for x in zip(*one.epoch(0)))
    for r, share in enumerate(shares):
        u, i, y = (np.concatenate(x) for x in zip(*share))
        np.testing.assert_array_equal(u, u1[r::world][: len(u)])
        np.testing.assert_array_equal(y, y1[r::world][: len(y)])
    assert 0.15 < y1.mean() < 0.25  # 1 positive : 4 negatives
    # the stream resumes mid-epoch at the same micro-batch
    stream = one.stream(one.micro_per_epoch + 3)
    again = list(one.epoch(1))[3]
    for a, b_ in zip(next(stream), again):
        np.testing.assert_array_equal(a, b_)


def test_a_global_batch_larger_than_an_epoch_is_explained():
    data = small_data()
    with pytest.raises(ConfigError, match="larger than an epoch"):
        EpochData(data, 0, 2, 10**7, 1)


def test_popularity_baseline_is_well_below_the_planted_model():
    data = small_data(0.05)
    users = eval_users(data.n_users, 0, 1)
    hr_pop = hit_rate_ndcg(popularity_scores(data, users), 10)[0] / len(users)
    assert 0.2 < hr_pop < 0.6


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 12345])
def test_the_epoch_order_is_a_permutation(n):
    keys = N.epoch_keys(3, 1)
    out = N.permuted(np.arange(n), n, keys)
    assert sorted(out.tolist()) == list(range(n))
    if n > 100:  # shuffled, and another epoch shuffles otherwise
        assert (out != np.arange(n)).mean() > 0.9
        assert (N.permuted(np.arange(n), n, N.epoch_keys(3, 2)) != out).mean() > 0.9


def test_a_whole_epoch_is_every_positive_once_and_k_negatives_per_positive():
    data = small_data()
    lookup = N._positive_lookup(data.train_users, data.train_items, data.n_items)
    n_pos, k = len(data.train_users), 4
    u, i, y = N.epoch_pairs(data.train_users, data.train_items, data.n_items, k,
                            np.arange(n_pos * (1 + k)), N.epoch_keys(0, 0), lookup)
    pos = y == 1
    assert pos.sum() == n_pos
    assert sorted(zip(u[pos].tolist(), i[pos].tolist())) == sorted(zip(data.train_users.tolist(),
                                                                       data.train_items.tolist()))
    np.testing.assert_array_equal(np.bincount(u[~pos], minlength=data.n_users),
                                  k * np.bincount(data.train_users, minlength=data.n_users))
    assert not N._is_positive(lookup, u[~pos], i[~pos], data.n_items).any()  # never a positive
    assert len(np.unique(i[~pos])) > 0.9 * data.n_items  # drawn from the whole catalogue


def test_a_ranks_share_does_not_depend_on_how_it_is_computed():
    """The pairs are a function of their position: computed in small chunks, or resumed
    mid-epoch, they are the same."""
    data = small_data()
    whole = EpochData(data, 1, 2, 32, 1, 4, seed=5)
    small = EpochData(data, 1, 2, 32, 1, 4, seed=5)
    small.CHUNK = 100
    a, b = list(whole.epoch(2)), list(small.epoch(2))
    assert len(a) == len(b) == whole.micro_per_epoch
    for x, z in zip(a, b):
        for p, q in zip(x, z):
            np.testing.assert_array_equal(p, q)
    for p, q in zip(next(iter(whole.epoch(2, start=17))), a[17]):
        np.testing.assert_array_equal(p, q)
