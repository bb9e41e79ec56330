"""The job scripts on a real one-node SLURM cluster started here (Debian's slurmctld, slurmd,
munge; scripts/slurm_local.sh), without a container: phase 1 then phase 2 (after it), 2 Horovod
ranks over PMIx each, checkpoints and per-job logs; a resubmission resumes; plain `srun`
without --mpi=pmix is explained. The daemons are stopped afterwards."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_queue_empty

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


def job_env(cluster, data, results, **extra):
    settings = dict(HVD_BERT_DIR=str(ROOT), RESULTS=str(results), PYTHON=sys.executable, MODEL="tiny",
                    DATA=str(data), SEQ="64", MAX_PRED="10", GLOBAL_BATCH="32", LOCAL_BATCH="8",
                    STEPS="10", CHECKPOINT_EVERY="5", LR="1e-2", EXTRA_ARGS="--set train.log_every=5")
    return {**cluster, **settings, **extra}


def test_phases_resubmission_and_plain_srun(cluster, data, tmp_path):
    results = tmp_path / "results"
    env = job_env(cluster, data, results)
    sub = subprocess.run(["bash", str(ROOT / "slurm" / "submit_pretrain.sh"), "-n", "2",
                          f"--output={tmp_path}/slurm-%j.out"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert sub.returncode == 0, sub.stderr
    p1_id, p2_id = re.findall(r"job (\d+)", sub.stdout)
    wait_queue_empty(env, timeout=600)
    outs = {p.name: p.read_text() for p in tmp_path.glob("slurm-*.out")}
    p1, p2 = results / "bert-tiny-phase1", results / "bert-tiny-phase2"
    rank0 = (p1 / "jobs" / p1_id / "rank-0.log").read_text()
    arithmetic = "global batch 32 = local batch 8 x backward_passes_per_step 2 x world size 2"
    assert arithmetic in rank0, (rank0, outs)
    assert (p1 / "jobs" / p1_id / "rank-1.log").exists()
    assert sorted(p.name for p in p1.glob("ckpt-*.pt")) == ["ckpt-00000005.pt", "ckpt-00000010.pt"]
    metrics = [json.loads(x) for x in (p1 / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [5, 10]
    rank0_p2 = (p2 / "jobs" / p2_id / "rank-0.log").read_text()
    assert "resumed" not in rank0_p2 and (p2 / "ckpt-00000010.pt").exists(), (rank0_p2, outs)
    # phase 2 started from phase 1's weights: its first loss is below phase 1's first
    m2 = [json.loads(x) for x in (p2 / "metrics.jsonl").read_text().splitlines()]
    assert m2[0]["loss"] < metrics[0]["loss"]

    # resubmitting phase 1 with a longer horizon resumes from its newest checkpoint
    env3 = job_env(cluster, data, results, STEPS="15", PHASE="1")
    r = subprocess.run(["sbatch", "-W", "-n", "2", f"--output={tmp_path}/again-%j.out",
                        str(ROOT / "slurm" / "pretrain.sbatch")], capture_output=True, text=True, env=env3,
                       cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr + "".join(p.read_text() for p in tmp_path.glob("again-*"))
    job = re.search(r"(\d+)", r.stdout).group(1)
    assert "resumed from step 10" in (p1 / "jobs" / job / "rank-0.log").read_text()
    assert (p1 / "ckpt-00000015.pt").exists()

    # plain srun (no --mpi=pmix) is explained, not a cryptic MPI abort
    bad = subprocess.run(["srun", "-n", "2", sys.executable, "-m", "hvd_bert", "pretrain",
                          "--set", f"data={data}", "--set", "max_seq_length=64",
                          "--set", "max_predictions_per_seq=10"],
                         capture_output=True, text=True, env=env, timeout=300)
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
    assert list(run.glob("ckpt-*.pt")), "no checkpoint"
