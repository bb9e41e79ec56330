"""Two nodes for real: network and UTS namespaces made by scripts/fake_cluster.sh, each with its
own sshd, host name and /etc/hosts, joined by veth links on a bridge. Launches start on node1
(as on a real cluster's first node) and reach node2 over ssh; ranks on node2 are other hosts to
Horovod, Gloo and OpenMPI. Run alone with ``pytest -m multinode tests/parallel``."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bert_jobs import metrics_of
from conftest import CONTAINER, FAKE_CLUSTER, WORKERS, fake_cluster, on_node1, wait_queue_empty
from hvd_bert.cluster import launch

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parents[2]
HOSTS = "node1:2,node2:2"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two fake nodes, their own prefix and subnet (a user's own fake cluster is left alone),
    removed after the module, passed or failed."""
    yield from fake_cluster(tmp_path_factory, 2, "hvdt", "10.213.9")


def run_across(cluster, argv, launcher="gloo", env=None, timeout=300):
    return launch.run(argv, np=4, launcher=launcher, hosts=HOSTS, nic="eth0", prefix=on_node1(cluster),
                      env=dict(os.environ, **(env or {})), timeout=timeout)


def ranks_of(out):
    return sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_ranks_on_two_hosts_know_their_local_and_cross_rank(cluster, tmp_path, launcher):
    """(Hierarchical allreduce, which Horovod 0.28 has only with NCCL, is switched off at init on
    this CPU build: the pretraining runs across the nodes below ask for it and train bit for bit
    as on one node.)"""
    res = run_across(cluster, [str(WORKERS / "hosts.py"), str(tmp_path)], launcher)
    assert res.ok, res.explain()
    rs = ranks_of(tmp_path)
    assert [r["rank"] for r in rs] == [0, 1, 2, 3], res.explain()
    assert [r["host"] for r in rs] == ["node1", "node1", "node2", "node2"]
    assert all(r["hosts"] == ["node1", "node1", "node2", "node2"] for r in rs)
    assert [(r["local_rank"], r["cross_rank"]) for r in rs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert all(r["size"] == 4 and r["local_size"] == 2 and r["cross_size"] == 2 for r in rs)
    assert all(r["exact"] for r in rs)  # integer-valued floats: exact in any order
    assert all(r["noisy"] == rs[0]["noisy"] for r in rs)  # one result, bit for bit, on every rank


def test_a_rank_on_each_host_is_told_apart_from_the_local_run(cluster, tmp_path):
    """The same worker on one host: local rank equals rank, cross size 1 (what every run so far saw)."""
    res = launch.run([str(WORKERS / "hosts.py"), str(tmp_path)], np=4, timeout=300)
    assert res.ok, res.explain()
    rs = ranks_of(tmp_path)
    assert [(r["local_rank"], r["cross_rank"], r["cross_size"]) for r in rs] == [(i, 0, 1) for i in range(4)]


# ----------------------------------------------------------------------------- SLURM on two nodes
SLURM_LOCAL = REPO / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def slurm2(cluster, tmp_path_factory):
    """One slurmd per fake node (slurmctld on node1), with SLURM's OCI container support (runc);
    commands are given from node1."""
    inst = subprocess.run(["bash", str(SLURM_LOCAL), "install"], capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr
    d = tmp_path_factory.mktemp("slurm2")
    start = subprocess.run(["bash", str(SLURM_LOCAL), "start", str(d), "--fake-cluster", "--oci"],
                           env=cluster, capture_output=True, text=True, timeout=120)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield dict(cluster, SLURM_CONF=str(d / "slurm.conf"))
    finally:
        subprocess.run(["bash", str(SLURM_LOCAL), "stop", str(d)], timeout=60)


def from_node1(env, cmd, timeout, cwd=None):
    return subprocess.run([*on_node1(env), *cmd], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=cwd)


def test_slurm_job_scripts_on_two_nodes(slurm2, bert_data, tmp_path):
    """slurm/pretrain.sbatch phase 1 then 2 and a resubmission, each with -N 2
    --ntasks-per-node=1: two ranks over PMIx, one on each node (two on each: the image test
    below runs this script so; slurm/ncf.sbatch runs in test_slurm.py, on one node)."""
    results = tmp_path / "results"
    env = dict(slurm2, HVD_BERT_DIR=str(REPO), RESULTS=str(results), PYTHON=sys.executable, MODEL="tiny",
               DATA=str(bert_data), SEQ="64", MAX_PRED="10", GLOBAL_BATCH="32", LOCAL_BATCH="8", STEPS="10",
               CHECKPOINT_EVERY="5", LR="1e-2", EXTRA_ARGS="--set train.log_every=5")
    two_nodes = ["-N", "2", "--ntasks-per-node=1"]
    sub = from_node1(env, ["bash", str(REPO / "slurm" / "submit_pretrain.sh"), *two_nodes,
                           f"--output={tmp_path}/slurm-%j.out"], 60, cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    p1_id, p2_id = re.findall(r"job (\d+)", sub.stdout)
    wait_queue_empty(env, on_node1(env))
    outs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    p1, p2 = results / "bert-tiny-phase1", results / "bert-tiny-phase2"
    rank0 = (p1 / "jobs" / p1_id / "rank-0.log").read_text()
    assert "world: 2 ranks on 2 hosts: node1 rank 0, node2 rank 1" in rank0, (rank0, outs)
    assert "global batch 32 = local batch 8 x backward_passes_per_step 2 x world size 2" in rank0
    assert "2 node(s), 2 task(s)" in outs and "recipes/bert-large-phase1.yaml" in outs
    logs = sorted(p.name for p in (p1 / "jobs" / p1_id).glob("rank-*.log"))
    assert logs == [f"rank-{i}.log" for i in range(2)]
    assert [m["step"] for m in metrics_of(p1)] == [5, 10]
    # (2 ranks: sharded by default, each node's rank writing its share into the shared folder)
    assert sorted(p.name for p in p1.glob("ckpt-*")) == ["ckpt-00000005.shards", "ckpt-00000010.shards"]
    rank0_p2 = (p2 / "jobs" / p2_id / "rank-0.log").read_text()
    assert "resumed" not in rank0_p2, (rank0_p2, outs)
    assert (p2 / "ckpt-00000010.shards" / "index.json").is_file()
    assert metrics_of(p2)[0]["loss"] < metrics_of(p1)[0]["loss"]  # phase 2 from phase 1's weights

    # a resubmission of phase 1 with a longer horizon resumes from its newest checkpoint
    again = from_node1(dict(env, STEPS="15", PHASE="1"),
                       ["sbatch", "-W", *two_nodes, f"--output={tmp_path}/again-%j.out",
                        str(REPO / "slurm" / "pretrain.sbatch")], 900, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr + "".join(
        p.read_text() for p in tmp_path.glob("again-*"))
    job = re.search(r"(\d+)", again.stdout).group(1)
    assert "resumed from step 10" in (p1 / "jobs" / job / "rank-0.log").read_text()
    assert [m["step"] for m in metrics_of(p1)] == [5, 10, 15]


def test_a_shaped_link_is_what_simulate_calibrate_measures(cluster):
    """tc tbf at 200 Mbit/s (25 MB/s) on every node's link. In the 4-rank ring (node1's ranks 0, 1,
    node2's 2, 3) one edge leaves each node, and each edge carries 2 (N-1)/N = 1.5 times the
    tensor: a 16 MiB allreduce cannot take less than 1.5 x 16.8 MB / 25 MB/s = 1.0 s (unshaped,
    the veth links do it in tens of ms)."""
    script = ["bash", str(FAKE_CLUSTER)]
    shaped = subprocess.run([*script, "shape", "200mbit"], env=cluster, capture_output=True, text=True,
                            timeout=60)
    assert shaped.returncode == 0, shaped.stderr
    try:
        res = subprocess.run([*on_node1(cluster), sys.executable, "-m", "hvd_bert", "simulate", "--calibrate",
                              "--calibrate-hosts", HOSTS, "--calibrate-nic", "eth0", "--workload", "ncf",
                              "--algorithm", "ring", "--gpus", "4"], env=cluster, capture_output=True,
                             text=True, timeout=600)
    finally:
        subprocess.run([*script, "shape", "off"], env=cluster, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"4-rank allreduce across {HOSTS}" in res.stdout
    ms = float(re.search(r"16384 KiB +([\d.]+) ms", res.stdout).group(1))
    assert ms >= 0.9 * 1.5 * 16 * 2**20 / 25e6 * 1e3, res.stdout
    assert "fitted ring model" in res.stdout


def test_doctor_checks_both_hosts_and_reduces_across_them(cluster):
    res = subprocess.run([*on_node1(cluster), sys.executable, "-m", "hvd_bert", "doctor", "--hosts", HOSTS],
                         env=cluster, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    for needle in ("node1                  ssh OK; node1", "node2                  ssh OK; node2",
                   "10.213.9.0/24 on every host (interface eth0)", "OK: 4 ranks on 2 hosts agree",
                   "the hosts are ready: 4 ranks"):
        assert needle in res.stdout, res.stdout


# ----------------------------------------------------------------------------- ranks in the image
IN_IMAGE = "/opt/hvd_bert/.venv/bin/python"  # exists only in the image (not on this machine)


def sbatch_job(data, out, steps, app=REPO):
    """What slurm/pretrain.sbatch runs with MODEL=tiny DATA SEQ=64 MAX_PRED=10 GLOBAL_BATCH=32
    LOCAL_BATCH=8 LR=1e-2 STEPS EXTRA_ARGS='--set train.log_every=1' (phase 1); ``app``: where
    the toolkit is (/opt/hvd_bert in the image)."""
    return ["-m", "hvd_bert", "pretrain", "--framework", "pt", "--config",
            str(Path(app) / "recipes" / "bert-large-phase1.yaml"), "--set", "model=tiny",
            "--set", f"data={data}",
            "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10",
            "--set", "train.batch.global_batch_size=32", "--set", "train.batch.local_batch_size=8",
            "--set", "train.optim.lr=1e-2", "--set", f"train.schedule.total_steps={steps}",
            "--set", "progress=false", "--set", f"train.output_dir={out}", "--set", "train.log_every=1"]


@pytest.mark.container
def test_every_rank_in_the_image_on_two_nodes_trains_as_on_bare_metal(slurm2, image, bert_data,
                                                                      tmp_path):
    """The same 4-rank job (2 nodes x 2 ranks) on bare metal, then with every rank in the image by
    the routes a cluster offers: horovodrun, mpirun and srun starting each rank through
    scripts/container.sh, and SLURM's own `srun --container` (slurm/pretrain.sbatch with
    CONTAINER=an OCI bundle of the image, run by runc). The ranks' interpreter exists only in the
    image; the losses of every step equal bare metal's, bit for bit."""
    assert not Path(IN_IMAGE).exists()
    # Horovod's fusion buffer takes what is ready within a cycle: its contents, and so where a
    # ring's chunks split the gradients and the order of their sums, vary from run to run (a
    # last-bit difference). Without fusion every run sums in one order, and equality is exact.
    exact = {"HOROVOD_FUSION_THRESHOLD": "0"}
    steps, ref = 4, {}
    # bare metal on one node, then on two: the same ranks in the same ring, the same sums; the
    # setting that Horovod 0.28 ignores without NCCL is said to be ignored, not silently dropped
    one = launch.run(sbatch_job(bert_data, tmp_path / "one-node", steps), np=4, timeout=600,
                     env=dict(os.environ, **exact))
    assert one.ok, one.explain()
    for launcher in ("gloo", "mpi"):  # (Gloo's allreduce and MPI's differ in the last bits)
        hierarchical = ["--set", "train.horovod.hierarchical_allreduce=true"] if launcher == "gloo" else []
        job = [*sbatch_job(bert_data, tmp_path / f"bare-{launcher}", steps), *hierarchical]
        bare = run_across(slurm2, job, launcher, env=exact, timeout=600)
        assert bare.ok, bare.explain()
        ref[launcher] = [m["loss"] for m in metrics_of(tmp_path / f"bare-{launcher}")]
        assert len(ref[launcher]) == steps
        if hierarchical:
            assert "hierarchical allreduce ignored" in bare.stdout
            assert ref[launcher] == [m["loss"] for m in metrics_of(tmp_path / "one-node")]
        out = tmp_path / f"image-{launcher}"
        res = launch.run(["exec", IN_IMAGE, *sbatch_job(bert_data, out, steps, "/opt/hvd_bert")], np=4,
                         launcher=launcher, hosts=HOSTS, nic="eth0", prefix=on_node1(slurm2),
                         python=str(CONTAINER), cwd=str(tmp_path), timeout=600,
                         env=dict(os.environ, HVD_BERT_MOUNTS=f"{tmp_path},{bert_data}", **exact))
        assert res.ok, res.explain()
        assert "world: 4 ranks on 2 hosts: node1 ranks 0-1, node2 ranks 2-3" in res.stdout, res.stdout[-3000:]
        assert [m["loss"] for m in metrics_of(out)] == ref[launcher], launcher

    # SLURM: every task's rank through the wrapper (HVD_BERT_IMAGE), 2 nodes x 2 tasks; then
    # SLURM's own `srun --container` with an OCI bundle. SLURM 22.05 (Debian 12's) runs one task
    # per node that way ("unexpected number of tasks 2 > 1") and gives the container the step's
    # environment only: no SLURM_PROCID, no PMIx wiring, so no rank can find another. It runs
    # the job script's step on one task, against the same 1-rank job on bare metal.
    env = dict(slurm2, HVD_BERT_DIR=str(REPO), MODEL="tiny", DATA=str(bert_data), SEQ="64", MAX_PRED="10",
               GLOBAL_BATCH="32", LOCAL_BATCH="8", STEPS=str(steps), LR="1e-2",
               EXTRA_ARGS="--set train.log_every=1", HVD_BERT_MOUNTS=f"{tmp_path},{bert_data}", **exact)
    env.pop("PYTHON", None)
    one = subprocess.run([sys.executable, *sbatch_job(bert_data, tmp_path / "bare-1", steps)],
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ref["1 rank"] = [m["loss"] for m in metrics_of(tmp_path / "bare-1")]
    bundle = tmp_path / "bundle"
    made = subprocess.run(["bash", str(CONTAINER), "bundle", str(bundle)], capture_output=True, text=True,
                          timeout=900)
    assert made.returncode == 0, made.stderr
    routes = (("wrapper", {"HVD_BERT_IMAGE": image}, ["-N", "2", "--ntasks-per-node=2"], "mpi"),
              ("oci", {"CONTAINER": str(bundle)}, ["-N", "1", "-n", "1"], "1 rank"))
    for name, how, layout, want in routes:
        results = tmp_path / f"results-{name}"
        job = from_node1(dict(env, RESULTS=str(results), **how),
                         ["sbatch", "-W", *layout, f"--output={tmp_path}/{name}-%j.out",
                          str(REPO / "slurm" / "pretrain.sbatch")], 900, cwd=tmp_path)
        outs = "".join(p.read_text() for p in tmp_path.glob(f"{name}-*.out"))
        run = results / "bert-tiny-phase1"
        logs = "".join(p.read_text() for p in sorted(run.glob("jobs/*/rank-*.log"))) if run.exists() else ""
        assert job.returncode == 0, job.stdout + job.stderr + outs + logs[-3000:]
        if name == "wrapper":
            assert "world: 4 ranks on 2 hosts: node1 ranks 0-1, node2 ranks 2-3" in logs, logs[-3000:]
        assert [m["loss"] for m in metrics_of(run)] == ref[want], name
    shutil.rmtree(bundle)  # (4 GB: not left in pytest's kept folders)
