"""The Horovod build itself, in both frameworks and under both controllers: allreduce,
broadcast, and one DistributedOptimizer step with backward_passes_per_step=2 (and fp16
compression) equal to one SGD step on the gathered global batch, computed by hand. One launch
per framework and launcher runs both compressions (module fixture ``basics``)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from closeness import assert_close
from conftest import LAUNCHERS, launch_ranks

sys.path.insert(0, str(Path(__file__).parent / "workers"))
import expect as E  # noqa: E402

# fp16 compression rounds each rank's gradient to 11 significant bits before the sum. Worst case
# over 4 seeds (tests/bounds/MEASURED.md, Zen 4) as a share of the bound: none 0.15 (margin 6.8x;
# at rtol 1e-6, atol 1e-7 it was 0.29), fp16 0.064 (16x)
TOL = {"none": dict(rtol=2e-6, atol=2e-7), "fp16": dict(rtol=2e-3, atol=2e-3)}


@pytest.fixture(scope="module")
def basics(tmp_path_factory):
    """``basics(framework, launcher)``: every rank's results for both compressions, one launch each."""
    done = {}

    def get(framework, launcher):
        if (framework, launcher) not in done:
            out = tmp_path_factory.mktemp(f"basics-{framework}-{launcher}")
            done[framework, launcher] = launch_ranks("hvd_basics.py", [framework, "none,fp16"], out,
                                                     launcher=launcher)
        return done[framework, launcher]
    return get


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_allreduce_broadcast_and_accumulated_step(basics, framework, launcher, compression):
    results = [r[compression] for r in basics(framework, launcher)]
    want_w = E.expected_weights(size=2).ravel()
    for r in results:
        assert r["size"] == 2
        assert r["sum"] == E.expected_allreduce_sum(2)
        assert r["bcast"] == [E.BROADCAST_ROOT_VALUE]
        assert_close(r["w"], want_w, **TOL[compression],
                     site=f"parallel/horovod_basics::test_allreduce_broadcast_and_accumulated_step/{compression}")
        # every rank ends with the same weights, bit for bit
        assert r["gathered"] == [results[0]["w"]] * 2
    # the step really moved the weights, by the global-batch gradient
    assert not np.allclose(want_w, E.W0.ravel())
    if framework == "torch":
        # before the sync step, each rank holds its own (different) local gradient
        g0, g1 = (np.array(r["before_sync_grad"]) for r in results)
        assert not np.allclose(g0, g1)


def test_uncompressed_and_compressed_steps_differ_only_by_rounding(basics):
    exact = basics("torch", "gloo")[0]["none"]["w"]
    fp16 = basics("torch", "gloo")[0]["fp16"]["w"]
    diff = np.abs(np.array(exact) - np.array(fp16))
    assert diff.max() < 2e-3


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_failing_rank_fails_the_run_instead_of_hanging(run_ranks, launcher):
    res = run_ranks("fail_rank.py", launcher=launcher, timeout=120, expect_ok=False)
    assert not res.ok
    assert not res.timed_out, "the launcher should stop the job itself when a rank dies"
    assert "rank 1 failed on purpose" in res.stdout + res.stderr
