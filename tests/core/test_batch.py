"""Batch arithmetic and accumulation boundaries."""

import pytest

from hvd_bert.core.batch import is_sync_step, optimizer_steps_done, plan_batch


def test_global_is_local_times_k_times_world():
    p = plan_batch(world_size=4, local_batch_size=8, backward_passes_per_step=2)
    assert p.global_batch_size == 64
    assert p.samples_per_rank_per_step == 16
    assert "64 = local batch 8 x backward_passes_per_step 2 x world size 4" in p.describe()


def test_k_defaults_to_one():
    assert plan_batch(world_size=2, local_batch_size=8).backward_passes_per_step == 1


def test_k_is_derived_from_global():
    assert plan_batch(world_size=2, local_batch_size=8, global_batch_size=64).backward_passes_per_step == 4


def test_local_is_derived_from_global():
    assert plan_batch(world_size=2, backward_passes_per_step=4, global_batch_size=64).local_batch_size == 8


def test_inconsistent_triple_names_numbers_and_fix():
    with pytest.raises(ValueError) as e:
        plan_batch(world_size=2, local_batch_size=8, backward_passes_per_step=2, global_batch_size=64)
    msg = str(e.value)
    assert "8 x backward_passes_per_step 2 x 2 data-parallel ranks = 32" in msg and "64" in msg
    assert "drop one" in msg


def test_global_not_divisible_suggests_a_multiple():
    with pytest.raises(ValueError, match=r"local_batch_size 8 x 3 data-parallel ranks = 24"):
        plan_batch(world_size=3, local_batch_size=8, global_batch_size=100)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_non_positive_or_non_int_sizes_rejected(bad):
    with pytest.raises(ValueError, match="positive integer"):
        plan_batch(world_size=2, local_batch_size=bad)


def test_missing_everything_is_an_error():
    with pytest.raises(ValueError, match="give local_batch_size"):
        plan_batch(world_size=2, global_batch_size=64)


def test_sync_steps_fall_on_every_kth_micro_batch():
    assert [is_sync_step(i, 3) for i in range(7)] == [False, False, True, False, False, True, False]
    assert all(is_sync_step(i, 1) for i in range(5))


def test_optimizer_steps_done_counts_full_windows_only():
    # The boundary comes from the micro-batch counter, so with k > 1 steps keep coming.
    assert [optimizer_steps_done(m, 2) for m in range(6)] == [0, 0, 1, 1, 2, 2]


def test_sync_step_rejects_bad_input():
    with pytest.raises(ValueError):
        is_sync_step(-1, 2)
    with pytest.raises(ValueError):
        is_sync_step(0, 0)


@pytest.mark.parametrize("glob, world, local, k", [(32, 2, 16, 1), (4096, 2, 32, 64), (96, 4, 24, 1),
                                                   (7 * 32, 1, 32, 7), (14, 2, 7, 1)])
def test_the_global_batch_alone_derives_the_largest_local_batch_up_to_the_default(glob, world, local, k):
    plan = plan_batch(world_size=world, global_batch_size=glob, largest_local=32)
    assert (plan.local_batch_size, plan.backward_passes_per_step, plan.global_batch_size) == (local, k, glob)


def test_a_global_batch_the_ranks_cannot_share_equally_names_the_fix():
    with pytest.raises(ValueError, match="not a multiple of 4 data-parallel ranks.*use 32"):
        plan_batch(world_size=4, global_batch_size=30, largest_local=32)


def test_the_tp_batch_line_asks_for_a_global_batch_only_when_none_was_given():
    from hvd_bert.train.loop import batch_line

    plan = plan_batch(world_size=2, local_batch_size=8, backward_passes_per_step=1)
    assert "set train.batch.global_batch_size to compare" in batch_line(plan, 2)
    given = batch_line(plan, 2, global_given=True)
    assert "global_batch_size" not in given and "2 data-parallel replicas" in given


def test_a_resume_refused_for_its_global_batch_names_settings_that_make_it():
    """The fix a refused resume names works on this run's data-parallel ranks: a local batch no
    larger than this run's with the accumulation that makes the checkpoint's global batch, or,
    where no local batch on these ranks makes it, the replica counts that can."""
    from hvd_bert.train.engine import META_FORMAT, ResumeError, check_resume

    meta = {"format": META_FORMAT, "step": 2, "micro_step": 4, "skipped_steps": 0, "world_size": 4,
            "data_parallel_size": 4, "backward_passes_per_step": 2, "local_batch_size": 8,
            "global_batch_size": 64, "data": {"micro_step": 4}, "rng": [None] * 4}
    for world, local, words in ((3, 8, "no local batch on 3 data-parallel ranks makes 64: start ranks whose "
                                       "data-parallel replicas number one of [1, 2, 4]"),
                                (2, 24, "--set train.batch.global_batch_size=64 --set "
                                        "train.batch.local_batch_size=16 make it (16 x "
                                        "backward_passes_per_step 2 x 2 data-parallel ranks)")):
        plan = plan_batch(world_size=world, local_batch_size=local)
        with pytest.raises(ResumeError, match="global batch of 64") as e:
            check_resume(meta, "ckpt-00000002.pt", world_size=world, plan=plan, allow_resized=True)
        assert words in str(e.value), str(e.value)
