"""The Keras ``model.fit`` path under real `horovodrun -np 2` (hvd.DistributedOptimizer with the
toolkit's optimizer wrapper and callbacks): it equals one process on the global batch, counts
optimizer steps rather than micro-batches, and resumes. The custom-loop engine is tested with
the PyTorch one by the shared contract (test_engine_contract.py). Every optimizer and k runs in
one 2-rank launch, and their references in one process (module fixture ``fits``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from closeness import assert_close
from conftest import launch_ranks

WORKER = Path(__file__).parent / "workers" / "keras_fit.py"
STEPS = 5


OPTIMS, KS = ["sgd", "lamb", "nvlamb", "lars"], [1, 2]
PAIRS = ",".join(f"{o}:{k}" for o in OPTIMS for k in KS)


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """``(every rank's runs, the references)``, each keyed ``OPTIM:K``: one 2-rank launch of
    every pair, and one process computing every pair's single-process reference."""
    root = tmp_path_factory.mktemp("keras-fit")
    ranks = launch_ranks("keras_fit.py", ["fit", PAIRS, STEPS], root / "fit", timeout=400)
    (root / "ref").mkdir()
    subprocess.run([sys.executable, str(WORKER), "reference", PAIRS, str(STEPS), str(root / "ref")],
                   check=True, timeout=300, env=dict(os.environ, HVD_BERT_TEST_WORLD="2"))
    ref = json.loads((root / "ref" / "rank0.json").read_text())["runs"]
    return [r["runs"] for r in ranks], {pair: run["params"] for pair, run in ref.items()}


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("k", KS)
def test_two_ranks_with_accumulation_equal_one_process(fits, optim, k):
    runs, refs = fits
    ranks = [r[f"{optim}:{k}"] for r in runs]
    want = refs[f"{optim}:{k}"]
    assert ranks[0]["params"] == ranks[1]["params"]
    # fp32: summing k micro-batch means vs one full-batch mean rounds differently; LARS's
    # excluded tensors take raw lr * g steps at lr 2.0, which shows it at ~4e-6. Worst case over
    # 4 seeds (tests/bounds/MEASURED.md, Zen 4) as a share of the bound: LARS 0.20 (margin 5.0x;
    # at atol 5e-6 it was 0.76 on the suite's own seed), the others 0.01 (100x)
    assert_close(ranks[0]["params"], want, rtol=2e-5, atol=2e-5 if optim == "lars" else 5e-6,
                 site=f"parallel/keras_fit::test_two_ranks_with_accumulation_equal_one_process/{optim}")
    if optim != "sgd":
        # the optimizer applied STEPS updates, not one per micro-batch
        assert ranks[0]["applied"] == STEPS


def test_stop_and_resume_continues_the_same_trajectory(run_ranks, tmp_path):
    path = "fit"
    full = run_ranks("keras_fit.py", path, "lamb", 2, 6, tag="full")
    ckpt = str(tmp_path / "ckpt")
    first = run_ranks("keras_fit.py", f"{path}-resume", "lamb", 2, 6, tag="first",
                      env={"HVD_BERT_TEST_CKPT": ckpt, "HVD_BERT_TEST_STOP_AT": "3"})
    assert first[0]["params"] != full[0]["params"]
    assert sorted(os.listdir(ckpt)) == ["ckpt-00000003.tf"]
    second = run_ranks("keras_fit.py", f"{path}-resume", "lamb", 2, 6, tag="second",
                       env={"HVD_BERT_TEST_CKPT": ckpt})
    for r in (0, 1):
        np.testing.assert_array_equal(second[r]["params"], full[0]["params"])
    assert second[0]["start_micro"] == 6
