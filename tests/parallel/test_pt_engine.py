"""The PyTorch engine under real `horovodrun -np 2`: accumulation equivalence with one
process on the global batch, fp16 compression, overflow skipping, kill-and-resume.
(Horovod's own suite has no test of PyTorch gradient accumulation.)"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "workers"))
import pt_setup as S  # noqa: E402

LOCAL_B, STEPS = 4, 5


@pytest.mark.parametrize("optim", ["sgd", "lamb", "nvlamb", "lars"])
@pytest.mark.parametrize("k", [1, 3])
def test_two_ranks_with_accumulation_equal_one_process_on_the_global_batch(run_ranks, optim, k):
    ranks = run_ranks("pt_engine.py", "train", optim, k, STEPS)
    want = S.reference_run(optim, world=2, local_b=LOCAL_B, k=k, steps=STEPS)
    assert ranks[0]["params"] == ranks[1]["params"]  # identical on both ranks
    np.testing.assert_allclose(ranks[0]["params"], want, rtol=2e-5, atol=2e-6)
    assert not np.allclose(want, S.flat_params(S.make_model()))  # training moved them
    assert [s["step"] for s in ranks[0]["steps"]] == list(range(1, STEPS + 1))
    if k > 1:  # before the sync step the ranks hold different local gradients
        assert not np.allclose(ranks[0]["local_grad"], ranks[1]["local_grad"])


def test_gradient_predivide_factor_gives_the_same_average(run_ranks):
    ranks = run_ranks("pt_engine.py", "train", "lamb", 2, STEPS, "horovod.gradient_predivide_factor=2.0")
    want = S.reference_run("lamb", world=2, local_b=LOCAL_B, k=2, steps=STEPS)
    np.testing.assert_allclose(ranks[0]["params"], want, rtol=2e-5, atol=2e-6)


def test_accumulation_is_not_a_no_op():
    """The reference itself distinguishes k: 2 ranks x 4 x 3 is not 2 ranks x 4 x 1."""
    a = S.reference_run("lamb", 2, LOCAL_B, 3, STEPS)
    b = S.reference_run("lamb", 2, LOCAL_B, 1, STEPS)
    assert not np.allclose(a, b)


def test_fp16_compression_stays_close_to_uncompressed(run_ranks):
    exact = run_ranks("pt_engine.py", "train", "lamb", 2, STEPS)[0]["params"]
    fp16 = run_ranks("pt_engine.py", "train", "lamb", 2, STEPS, "horovod.compression=fp16")
    assert fp16[0]["params"] == fp16[1]["params"]
    diff = np.abs(np.array(exact) - np.array(fp16[0]["params"]))
    # fp16 keeps ~3 decimal digits of each gradient; LAMB normalises the update per layer.
    assert 0 < diff.max() < 5e-3


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_inf_on_one_rank_skips_the_step_on_both(run_ranks, precision):
    ranks = run_ranks("pt_engine.py", "inf", "lamb", 2, STEPS, f"precision.mode={precision}")
    for r in ranks:
        steps = r["steps"]
        assert [s["skipped"] for s in steps] == [False, False, True, False, False]
        skipped = steps[2]
        assert not skipped["changed"], "parameters moved on a skipped step"
        assert skipped["step"] == 2  # the schedule did not advance ...
        assert steps[3]["lr"] == skipped["lr"]  # ... the next step uses the same LR
        assert steps[-1]["step"] == STEPS - 1
        if precision == "fp16":
            assert [s["scale"] for s in steps[1:4]] == [65536.0, 32768.0, 32768.0]
    assert ranks[0]["params"] == ranks[1]["params"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_sigterm_saves_and_resume_continues_bit_identically(run_ranks, tmp_path, precision):
    """Dropout on, per-rank RNG streams: resuming restores parameters, optimizer and scaler
    state, the data position and every rank's RNG, so the trajectory is the same to the bit."""
    args = ("resume", "lamb", 2, 6, f"precision.mode={precision}")
    full = run_ranks("pt_engine.py", *args, tag="full", env={"HVD_BERT_TEST_CKPT": str(tmp_path / "a")})
    ckpt = tmp_path / "b"
    stopped = run_ranks("pt_engine.py", *args, tag="stopped",
                        env={"HVD_BERT_TEST_CKPT": str(ckpt), "HVD_BERT_TEST_KILL_AT": "3"})
    assert [(r["stopped"], r["steps"]) for r in stopped] == [(True, 3), (True, 3)]
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000002.pt", "ckpt-00000003.pt"]
    resumed = run_ranks("pt_engine.py", *args, tag="resumed", env={"HVD_BERT_TEST_CKPT": str(ckpt)})
    assert [r["steps"] for r in resumed] == [6, 6]
    assert [h["step"] for h in resumed[0]["history"]] == [4, 5, 6]  # it went on from step 3
    for r in (0, 1):
        assert resumed[r]["params"] == full[r]["params"]
    assert full[0]["params"] == full[1]["params"]
    assert full[0]["params"] != stopped[0]["params"]
    losses_full = {h["step"]: h["loss"] for h in full[0]["history"]}
    assert all(losses_full[h["step"]] == h["loss"] for h in resumed[0]["history"])
