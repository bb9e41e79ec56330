"""Real multi-process Horovod runs: ``run_ranks(worker, *args, launcher=...)`` starts
``python tests/parallel/workers/<worker>`` on 2 processes with horovodrun (Gloo) or mpirun
and returns each rank's JSON result. A rank that fails, or a run that outlives its timeout,
fails the test with the ranks' output."""

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvd_bert.cluster import launch

WORKERS = Path(__file__).parent / "workers"
FAKE_CLUSTER = Path(__file__).resolve().parents[2] / "scripts" / "fake_cluster.sh"
VOCAB_1500 = Path(__file__).resolve().parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"
LAUNCHERS = ["gloo", "mpi"]


def launch_ranks(worker, args, out, np=2, launcher="gloo", timeout=240, expect_ok=True, env=None):
    """``worker`` on ``np`` ranks writing ``out/rank<r>.json``: each rank's result, in rank order
    (or, with ``expect_ok=False``, the :class:`launch.RunResult`). Module fixtures use it to run
    several scenarios in one launch; tests use :func:`run_ranks`."""
    out.mkdir(parents=True, exist_ok=True)
    res = launch.run([str(WORKERS / worker), *map(str, args), str(out)], np=np,
                     launcher=launcher, timeout=timeout, env=dict(os.environ, **(env or {})))
    if not expect_ok:
        return res
    assert res.ok, res.explain()
    results = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == list(range(np)), (
        f"expected one result per rank, got {[r['rank'] for r in results]}\n{res.explain()}")
    return results


@pytest.fixture
def run_ranks(tmp_path):
    def run(worker, *args, np=2, launcher="gloo", timeout=240, expect_ok=True, env=None, tag=""):
        out = tmp_path / f"out-{launcher}-{worker.replace('.py', '')}{tag}"
        return launch_ranks(worker, args, out, np=np, launcher=launcher, timeout=timeout,
                            expect_ok=expect_ok, env=env)
    return run


@pytest.fixture(scope="session")
def bert_data(tmp_path_factory):
    """A small prepared pretraining set (seq 64, 10 predictions, 4 shards) from part of the
    built-in corpus, made once per session by `hvd-bert prepare-bert`, the same in every session:
    with a fixed vocab (trained once on this text by `prepare-bert`; a vocab trained afresh
    differs from run to run, tokenizers#1794), the shards are bit-identical."""
    root = tmp_path_factory.mktemp("pretrain")
    from hvd_bert.data.corpus import write_stdlib_corpus
    text = write_stdlib_corpus(root / "c.txt", max_bytes=150_000)
    subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", str(text), "--output",
                    str(root / "data"), "--num-shards", "4", "--vocab", str(VOCAB_1500),
                    "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "2"],
                   check=True, capture_output=True, timeout=300)
    return root / "data"


@pytest.fixture(scope="session")
def phase_one(bert_data, tmp_path_factory):
    """A 20-step PyTorch phase-1 run on ``bert_data`` (``p1/``) and its portable .npz
    (``p1.npz``, by `hvd-bert convert`), made once for the pretraining and fine-tuning tests."""
    from bert_jobs import pretrain
    root = tmp_path_factory.mktemp("phase1")
    pretrain("pt", bert_data, root / "p1", "--set", "train.schedule.total_steps=20")
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(root / "p1"), "--output",
                          str(root / "p1.npz")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return root


def fake_cluster(tmp_path_factory, nodes: int, prefix: str, net: str):
    """A module fixture's body: ``nodes`` fake nodes of scripts/fake_cluster.sh under their own
    prefix and subnet (a user's own fake cluster is left alone); yields the environment that
    names them, and removes everything afterwards, passed or failed, checking nothing is left."""
    if not launch.is_root():
        pytest.skip("the fake cluster needs root (network namespaces)")
    env = dict(os.environ, FAKE_CLUSTER_PREFIX=prefix, FAKE_CLUSTER_NET=net,
               FAKE_CLUSTER_STATE=str(tmp_path_factory.mktemp("cluster") / "state"))
    up = subprocess.run(["bash", str(FAKE_CLUSTER), "up", str(nodes)], env=env, capture_output=True,
                        text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = subprocess.run(["bash", str(FAKE_CLUSTER), "down"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"{prefix}-" not in left and not list(Path("/etc/netns").glob(f"{prefix}-*")), left
        assert not Path(env["FAKE_CLUSTER_STATE"]).exists()


def on_node1(cluster) -> list[str]:
    """The command prefix that runs a command on the fake cluster's node1."""
    names = ("FAKE_CLUSTER_PREFIX", "FAKE_CLUSTER_NET", "FAKE_CLUSTER_STATE")
    return ["env", *[f"{k}={cluster[k]}" for k in names], "bash", str(FAKE_CLUSTER), "exec", "node1"]


def wait_queue_empty(env: dict, prefix: list[str] = (), timeout: float = 900) -> None:
    """Wait until SLURM's queue is empty (``prefix``: where squeue runs, e.g. :func:`on_node1`);
    a job that failed while its dependent waits forever fails the test at once."""
    end, q = time.time() + timeout, ""
    while time.time() < end:
        res = subprocess.run([*prefix, "squeue", "-h", "-o", "%i %T %r"], capture_output=True, text=True,
                             env=env, timeout=60)
        q = res.stdout.strip() if res.returncode == 0 else f"squeue failed: {res.stderr.strip()}"
        if not q:
            return
        if "DependencyNeverSatisfied" in q:
            pytest.fail(f"a job failed and its dependent waits forever: {q}")
        time.sleep(2)
    pytest.fail(f"jobs still queued after {timeout} s (id, state, reason): {q}")


BUILD_IMAGE = Path(__file__).resolve().parents[2] / "scripts" / "build_image.sh"
CONTAINER = Path(__file__).resolve().parents[2] / "scripts" / "container.sh"
IMAGE = "localhost/hvd_bert:cpu"


@pytest.fixture(scope="session")
def image():
    """hvd_bert's CPU image, built by scripts/build_image.sh (`make test` builds it before the
    suite; here it is then found up to date in seconds). One build at a time on this machine."""
    if not launch.is_root():
        pytest.skip("the image tests need root (podman with runc, debootstrap)")
    inst = subprocess.run(["bash", str(BUILD_IMAGE), "install"], capture_output=True, text=True, timeout=600)
    if inst.returncode != 0:
        pytest.skip(f"podman, runc, debootstrap are not installed and cannot be here: {inst.stderr.strip()}")
    with image_build_lock():
        res = build_image()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return IMAGE


@contextlib.contextmanager
def image_build_lock():
    """One build of the image at a time on this machine (the workers share its tag)."""
    with open("/tmp/hvd_bert-image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_image(timeout=3600):
    return subprocess.run(["bash", str(BUILD_IMAGE), "cpu"], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def mount_point(tmp_path):
    """``mount(*args, where=NAME)``: a mount made under ``tmp_path`` (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs or a read-only bind needs root")
    made = []

    def mount(*args, where="mnt"):
        point = tmp_path / where
        point.mkdir(exist_ok=True)
        subprocess.run(["mount", *args, str(point)], check=True, timeout=30)
        made.append(point)
        return point
    yield mount
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], timeout=30)


@pytest.fixture(scope="session")
def _finished_template(bert_data, tmp_path_factory):
    from one_process import pretrain

    run = tmp_path_factory.mktemp("finished") / "run"
    res = pretrain(bert_data, run)
    assert res.returncode == 0, res.stderr
    return run


@pytest.fixture
def finished_run(_finished_template, tmp_path):
    """A finished 2-step one-process PyTorch pretraining run (``one_process.pretrain``), a copy of
    its own for each test (one run for the worker's session)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(_finished_template, run, symlinks=True)
    return run


@pytest.fixture
def silent_port():
    """A loopback port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]
