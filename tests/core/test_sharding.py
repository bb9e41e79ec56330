"""Shard assignment: properties (hypothesis) and the named edge cases."""

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hvd_bert.core.sharding import (TooFewShardsError, assign_files, assign_records,
                                      epoch_permutation, plan_reads, split_evenly)

sizes = st.integers(min_value=1, max_value=9)


@settings(max_examples=200, deadline=None)
@given(world=sizes, extra=st.integers(0, 40), epoch=st.integers(0, 1000), seed=st.integers(0, 2**31))
def test_every_file_goes_to_exactly_one_rank(world, extra, epoch, seed):
    files = [f"shard-{i:05d}" for i in range(world + extra)]
    per_rank = [assign_files(files, r, world, epoch, seed) for r in range(world)]
    counts = collections.Counter(f for part in per_rank for f in part)
    assert sorted(counts) == files and set(counts.values()) == {1}
    lens = [len(p) for p in per_rank]
    assert max(lens) - min(lens) <= 1


@settings(max_examples=200, deadline=None)
@given(world=sizes, n=st.integers(0, 200), epoch=st.integers(0, 50), seed=st.integers(0, 2**31))
def test_every_record_goes_to_exactly_one_rank(world, n, epoch, seed):
    parts = [assign_records(n, r, world, epoch, seed) for r in range(world)]
    allidx = np.concatenate(parts) if parts else np.array([])
    assert sorted(allidx.tolist()) == list(range(n))
    lens = [len(p) for p in parts]
    assert max(lens) - min(lens) <= 1


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 100), parts=sizes)
def test_split_evenly_covers_in_order(n, parts):
    ranges = [split_evenly(n, parts, i) for i in range(parts)]
    assert [i for r in ranges for i in r] == list(range(n))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def test_assignment_is_deterministic_and_reshuffled_per_epoch():
    files = [f"f{i}" for i in range(32)]
    a = assign_files(files, 1, 4, epoch=3, seed=7)
    assert a == assign_files(files, 1, 4, epoch=3, seed=7)
    assert a != assign_files(files, 1, 4, epoch=4, seed=7)
    assert a != assign_files(files, 1, 4, epoch=3, seed=8)


def test_no_shuffle_is_round_robin():
    files = list("abcdefg")
    assert assign_files(files, 0, 3, shuffle=False) == ["a", "d", "g"]
    assert assign_files(files, 2, 3, shuffle=False) == ["c", "f"]


def test_fewer_files_than_ranks_says_what_to_do():
    with pytest.raises(TooFewShardsError) as e:
        assign_files(["a", "b"], 0, 4)
    msg = str(e.value)
    assert "2 shard file(s) for 4 ranks" in msg and "record_striding" in msg and "--num-shards" in msg


def test_record_striding_when_asked_for():
    files = ["a", "b"]
    plans = [plan_reads(files, r, 4, epoch=1, seed=0, record_striding=True) for r in range(4)]
    assert all(sorted(p.files) == files for p in plans)
    assert len({p.files for p in plans}) == 1  # the same order on every rank
    assert [(p.record_stride, p.record_offset) for p in plans] == [(4, 0), (4, 1), (4, 2), (4, 3)]


def test_plan_reads_default_is_whole_files():
    p = plan_reads(list("abcd"), 1, 2, epoch=0, seed=0)
    assert (p.record_stride, p.record_offset) == (1, 0) and len(p.files) == 2


def test_empty_input_and_bad_rank_are_errors():
    with pytest.raises(ValueError, match="no input files"):
        plan_reads([], 0, 1)
    with pytest.raises(ValueError, match="rank must be in"):
        assign_files(["a"], 1, 1)


def test_permutation_depends_only_on_inputs():
    assert np.array_equal(epoch_permutation(10, 2, 3), epoch_permutation(10, 2, 3))
    assert np.array_equal(epoch_permutation(5, 2, 3, shuffle=False), np.arange(5))


def test_an_epoch_without_a_batch_for_every_rank_is_found_before_the_first_step_with_the_fix():
    """Small data (3 records in 8 shards, 5 of them empty): some epoch gives a rank nothing;
    the check over the run's epochs finds it before training, and names fewer ranks or more
    data (a smaller batch cannot help at batch 1)."""
    from hvd_bert.core.sharding import ShardingError, check_epochs

    files, counts = [f"s{i}" for i in range(8)], [1, 1, 1, 0, 0, 0, 0, 0]
    with pytest.raises(ShardingError, match=r"use fewer ranks .* or more data"):
        check_epochs(files, counts, 2, 1, micro_steps=200)
    check_epochs(files[:3], counts[:3], 1, 1, micro_steps=200)  # one rank reads all three
    with pytest.raises(ShardingError, match="smaller train.batch.local_batch_size"):
        check_epochs(["a", "b"], [4, 4], 2, 8, micro_steps=10)
