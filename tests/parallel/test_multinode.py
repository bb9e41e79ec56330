"""Two nodes for real: network and UTS namespaces made by scripts/fake_cluster.sh, each with its
own sshd, host name and /etc/hosts, joined by veth links on a bridge. Launches start on node1
(as on a real cluster's first node) and reach node2 over ssh; ranks on node2 are other hosts to
Horovod, Gloo and OpenMPI. Run alone with ``pytest -m multinode tests/parallel``."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from bert_jobs import TINY, metrics_of
from conftest import WORKERS
from hvd_bert import launch

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "fake_cluster.sh"
HOSTS = "node1:2,node2:2"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two fake nodes, their own prefix and subnet (a user's own fake cluster is left alone),
    removed after the module, passed or failed."""
    if not launch.is_root():
        pytest.skip("the fake cluster needs root (network namespaces)")
    env = dict(os.environ, FAKE_CLUSTER_PREFIX="hvdt", FAKE_CLUSTER_NET="10.213.9",
               FAKE_CLUSTER_STATE=str(tmp_path_factory.mktemp("cluster") / "state"))
    up = subprocess.run(["bash", str(SCRIPT), "up", "2"], env=env, capture_output=True, text=True,
                        timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "hvdt-" not in left and not list(Path("/etc/netns").glob("hvdt-*")), left
        assert not Path(env["FAKE_CLUSTER_STATE"]).exists()


def on_node1(cluster):
    names = ("FAKE_CLUSTER_PREFIX", "FAKE_CLUSTER_NET", "FAKE_CLUSTER_STATE")
    return ["env", *[f"{k}={cluster[k]}" for k in names], "bash", str(SCRIPT), "exec", "node1"]


def run_across(cluster, argv, launcher="gloo", env=None, timeout=300):
    return launch.run(argv, np=4, launcher=launcher, hosts=HOSTS, nic="eth0", prefix=on_node1(cluster),
                      env=dict(os.environ, **(env or {})), timeout=timeout)


def ranks_of(out):
    return sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_ranks_on_two_hosts_know_their_local_and_cross_rank(cluster, tmp_path, launcher):
    results = {}
    for hierarchical in ("0", "1"):
        out = tmp_path / f"h{hierarchical}"
        out.mkdir()
        res = run_across(cluster, [str(WORKERS / "hosts.py"), str(out)], launcher,
                         env={"HOROVOD_HIERARCHICAL_ALLREDUCE": hierarchical})
        assert res.ok, res.explain()
        rs = ranks_of(out)
        assert [r["rank"] for r in rs] == [0, 1, 2, 3], res.explain()
        assert [r["host"] for r in rs] == ["node1", "node1", "node2", "node2"]
        assert all(r["hosts"] == ["node1", "node1", "node2", "node2"] for r in rs)
        assert [(r["local_rank"], r["cross_rank"]) for r in rs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
        assert all(r["size"] == 4 and r["local_size"] == 2 and r["cross_size"] == 2 for r in rs)
        assert all(r["exact"] for r in rs)  # integer-valued floats: exact in any order
        assert all(r["noisy"] == rs[0]["noisy"] for r in rs)  # one result, bit for bit, on every rank
        results[hierarchical] = rs[0]["noisy"]
    # Horovod 0.28 has hierarchical allreduce only with NCCL; on this CPU build the setting is
    # switched off at init, so both runs reduce the same way and agree bit for bit.
    assert results["0"] == results["1"]


def test_a_rank_on_each_host_is_told_apart_from_the_local_run(cluster, tmp_path):
    """The same worker on one host: local rank equals rank, cross size 1 (what every run so far saw)."""
    res = launch.run([str(WORKERS / "hosts.py"), str(tmp_path)], np=4, timeout=300)
    assert res.ok, res.explain()
    rs = ranks_of(tmp_path)
    assert [(r["local_rank"], r["cross_rank"], r["cross_size"]) for r in rs] == [(i, 0, 1) for i in range(4)]


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_pretrain_across_two_nodes_matches_the_same_run_on_one_node(cluster, bert_data, tmp_path, framework):
    job = ["-m", "hvd_bert", "pretrain", "--framework", framework, "--set", f"data={bert_data}", *TINY,
           "--set", "train.schedule.total_steps=4", "--set", "train.log_every=1", "--set", "dropout=0.0"]
    across = run_across(cluster, [*job, "--set", f"train.output_dir={tmp_path / 'two'}",
                                  "--set", "train.horovod.hierarchical_allreduce=true"], timeout=600)
    assert across.ok, across.explain()
    assert "hierarchical allreduce ignored" in across.stdout  # said, not silently dropped
    one = launch.run([*job, "--set", f"train.output_dir={tmp_path / 'one'}"], np=4, timeout=600)
    assert one.ok, one.explain()
    two_m, one_m = metrics_of(tmp_path / "two"), metrics_of(tmp_path / "one")
    assert [m["step"] for m in two_m] == [m["step"] for m in one_m] == [1, 2, 3, 4]
    for a, b in zip(two_m, one_m):
        # the same ranks in the same ring order: the same sums; only the host placement differs
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), (a, b)
