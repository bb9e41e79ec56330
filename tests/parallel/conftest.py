"""Real multi-process Horovod runs: ``run_ranks(worker, *args, launcher=...)`` starts
``python tests/parallel/workers/<worker>`` on 2 processes with horovodrun (Gloo) or mpirun
and returns each rank's JSON result. A rank that fails, or a run that outlives its timeout,
fails the test with the ranks' output."""

import json
import os
from pathlib import Path

import pytest

from hvd_bert import launch

WORKERS = Path(__file__).parent / "workers"
LAUNCHERS = ["gloo", "mpi"]


@pytest.fixture
def run_ranks(tmp_path):
    def run(worker, *args, np=2, launcher="gloo", timeout=240, expect_ok=True, env=None, tag=""):
        out = tmp_path / f"out-{launcher}-{worker.replace('.py', '')}{tag}"
        out.mkdir(exist_ok=True)
        res = launch.run([str(WORKERS / worker), *map(str, args), str(out)], np=np,
                         launcher=launcher, timeout=timeout, env=dict(os.environ, **(env or {})))
        if not expect_ok:
            return res
        assert res.ok, res.explain()
        results = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")),
                         key=lambda r: r["rank"])
        assert [r["rank"] for r in results] == list(range(np)), (
            f"expected one result per rank, got {[r['rank'] for r in results]}\n{res.explain()}")
        return results
    return run
