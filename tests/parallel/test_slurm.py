"""The job scripts on a real one-node SLURM cluster started here (Debian's slurmctld, slurmd,
munge; scripts/slurm_local.sh), without a container: the NCF job (its data prepared by one
task, 2 Horovod ranks over PMIx, per-rank logs, evaluation, checkpoints); plain `srun` without
--mpi=pmix is explained. The pretraining phases and their resubmission run on the two-node
cluster (test_multinode.py). The daemons are stopped afterwards."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    inst = subprocess.run(["bash", str(LOCAL), "install"], capture_output=True, text=True, timeout=600)
    if inst.returncode != 0:
        pytest.skip(f"SLURM is not installed and cannot be here: {inst.stderr.strip()}")
    d = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(["bash", str(LOCAL), "start", str(d)], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
    yield env
    subprocess.run(["bash", str(LOCAL), "stop", str(d)], timeout=60)


@pytest.fixture(scope="module")
def data(bert_data):
    """The session's prepared pretraining set (seq 64, 10 predictions, 4 shards, the committed
    vocab: the same shards in every session)."""
    return bert_data


def test_plain_srun_without_pmix_is_explained(cluster, data):
    """Not a cryptic MPI abort. (Phase 1 then 2, the resubmission that resumes, checkpoints and
    per-rank logs: test_multinode.py's two-node test, the same scripts on four ranks.)"""
    bad = subprocess.run(["srun", "-n", "2", sys.executable, "-m", "hvd_bert", "pretrain",
                          "--set", f"data={data}", "--set", "max_seq_length=64",
                          "--set", "max_predictions_per_seq=10"],
                         capture_output=True, text=True, env=cluster, timeout=300)
    assert bad.returncode != 0 and "srun --mpi=pmix" in bad.stderr


def test_ncf_job_prepares_data_trains_and_evaluates(cluster, tmp_path):
    results = tmp_path / "results"
    env = {**cluster, "HVD_BERT_DIR": str(ROOT), "RESULTS": str(results), "PYTHON": sys.executable,
           "SCALE": "0.05", "GLOBAL_BATCH": "8192", "EPOCHS": "2", "FACTORS": "16", "LAYERS": "[32, 16]",
           "LR": "0.01", "EXTRA_ARGS": "--set train.log_every=10"}
    r = subprocess.run(["sbatch", "-W", "-n", "2", f"--output={tmp_path}/ncf-%j.out",
                        str(ROOT / "slurm" / "ncf.sbatch")], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=900)
    out = "".join(p.read_text() for p in tmp_path.glob("ncf-*.out"))
    assert r.returncode == 0, r.stdout + r.stderr + out
    job = re.search(r"(\d+)", r.stdout).group(1)
    run = results / "ncf-pt"
    rank0 = (run / "jobs" / job / "rank-0.log").read_text()
    assert "global batch 8192 = local batch 4096 x backward_passes_per_step 1 x world size 2" in rank0, rank0
    assert (run / "jobs" / job / "rank-1.log").exists()
    assert (results / "ncf-data-ml-1m-x0.05" / "dataset.json").is_file()
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in evals if "hr@10" in e] == [1, 2]
    assert list(run.glob("ckpt-*.shards/index.json")), "no checkpoint"  # (2 ranks: sharded)
