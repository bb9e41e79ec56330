"""The batch layout of an elastic run on a new world size: the configured global batch exactly
wherever the world size divides it (k, and where needed the local batch, recomputed), else the
rule the user chose: the nearest global batch, or none (wait for workers)."""

import pytest

from hvd_bert.train.elastic import elastic_layout


def layout(target, local, world, uneven="nearest"):
    lay = elastic_layout(target, local, world, uneven)
    p = lay.plan
    sizes = None if p is None else (p.local_batch_size, p.backward_passes_per_step, p.global_batch_size)
    return sizes, lay.exact


def test_k_is_recomputed_from_the_world_size_and_the_global_batch_kept():
    assert layout(48, 8, 3) == ((8, 2, 48), True)
    assert layout(48, 8, 2) == ((8, 3, 48), True)
    assert layout(48, 8, 6) == ((8, 1, 48), True)
    assert layout(48, 8, 1) == ((8, 6, 48), True)


def test_a_smaller_micro_batch_keeps_the_global_batch_where_k_alone_cannot():
    assert layout(48, 8, 4) == ((6, 2, 48), True)    # 12 per rank: 6 x 2, not 8 x 1.5
    assert layout(48, 32, 3) == ((16, 1, 48), True)  # the share is below the configured micro-batch


@pytest.mark.parametrize("world", range(1, 17))
@pytest.mark.parametrize("target,local", [(48, 8), (64, 32), (4096, 64), (65536, 64), (30, 4)])
def test_every_world_size_that_divides_the_global_batch_makes_it_exactly(target, local, world):
    lay = elastic_layout(target, local, world)
    p = lay.plan
    assert p.world_size == world and p.local_batch_size <= local
    if target % world == 0:
        assert lay.exact and p.global_batch_size == target
        # the largest micro-batch that works: none between it and the configured one divides the share
        share = target // world
        assert not any(share % b == 0 for b in range(p.local_batch_size + 1, min(local, share) + 1))
    else:
        assert not lay.exact
        assert abs(p.global_batch_size - target) < world  # the nearest per-rank share


def test_where_no_layout_is_exact_nearest_trains_on_the_nearest_global_batch():
    assert layout(64, 32, 3) == ((21, 1, 63), False)  # 21 per rank (63) is nearer than 22 (66)
    assert layout(64, 8, 3) == ((7, 3, 63), False)    # 21 = 7 x 3 under a micro-batch of at most 8
    assert layout(10, 8, 4) == ((3, 1, 12), False)    # 8 and 12 tie: the larger micro-batch wins
    lay = elastic_layout(64, 32, 3)
    assert "cannot make the global batch 64 exactly" in lay.describe(3, "nearest")
    assert "peak LR is rescaled" in lay.describe(3, "nearest")


def test_wait_trains_nothing_on_a_world_that_cannot_make_it():
    assert layout(64, 32, 3, "wait") == (None, False)
    assert layout(64, 32, 4, "wait") == ((16, 1, 64), True)  # a world that can: trains
    assert "waiting for workers" in elastic_layout(64, 32, 3, "wait").describe(3, "wait")


@pytest.mark.parametrize("args", [(0, 8, 2), (48, 0, 2), (48, 8, 0)])
def test_sizes_must_be_positive(args):
    with pytest.raises(ValueError, match="positive"):
        elastic_layout(*args)


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="nearest.*wait"):
        elastic_layout(48, 8, 5, "drift")
