"""hvd_bert's image for real (scripts/build_image.sh; podman with runc here): what it holds
(the versions CI tests and the cached Horovod wheel, not a rebuild of it), a second build that
builds nothing, the 2-rank demo pretraining inside it as the image's non-root user into a run
folder bind-mounted from the host and resumed by a second container, and the squashfs file that
`enroot import` would make, unpacked and running `hvd-bert doctor`. `hvd-bert doctor` in the
image itself runs in the README's container block (tests/readme); ranks in containers on two
nodes, by horovodrun, mpirun and SLURM's `srun --container`, in test_multinode.py."""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from bert_jobs import metrics_of
from conftest import BUILD_IMAGE, CONTAINER, build_image, image_build_lock

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[2]
UID = 1000  # the image's user (docker/Dockerfile's USER_UID)


def in_image(*cmd, mounts=(), timeout=600, env=None):
    env = dict(os.environ, HVD_BERT_MOUNTS=",".join(map(str, mounts)), **(env or {}))
    return subprocess.run(["bash", str(CONTAINER), "run", *cmd], capture_output=True, text=True, env=env,
                          timeout=timeout)


def site_packages(*parts):
    return "/".join(["lib", "python3.11", "site-packages", *parts])


def test_a_second_build_builds_nothing_and_the_image_runs_what_ci_tests(image):
    # the two builds back to back, under the lock: another worker's test may build in between
    # (a rebuild says what changed)
    with image_build_lock():
        first, again = build_image(), build_image(timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert again.returncode == 0 and "is up to date" in again.stdout and "build" not in again.stderr, \
        again.stdout + again.stderr
    # the same versions as the set-up's venv here, and Horovod's own library from the cached
    # wheel, byte for byte (a rebuild would differ)
    lib = site_packages("horovod", "torch", "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so")
    res = in_image("bash", "-c", f"python -m pip freeze --all && sha256sum /opt/hvd_bert/.venv/{lib}")
    assert res.returncode == 0, res.stderr
    host = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "freeze", "--all"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    inside = res.stdout.splitlines()
    for pkg in ("torch==", "tensorflow-cpu==", "tf-keras==", "numpy==", "mpi4py==", "tokenizers=="):
        assert [x for x in inside if x.startswith(pkg)] == [x for x in host if x.startswith(pkg)], pkg
    assert not [x for x in inside if x.startswith(("pytest==", "transformers=="))]  # no test tools
    sha = subprocess.run(["sha256sum", str(ROOT / ".venv" / lib)], capture_output=True, text=True,
                         check=True).stdout.split()[0]
    assert inside[-1].split()[0] == sha


@pytest.fixture
def shared(bert_data):
    """A host folder the image's user owns (as a user's own folder is theirs), outside pytest's
    root-only temporary folder, with the session's prepared data in it."""
    d = Path(tempfile.mkdtemp(prefix="hvd_bert-image-"))
    shutil.copytree(bert_data, d / "data")
    for p in [d, *d.rglob("*")]:
        os.chown(p, UID, UID)
    yield d
    shutil.rmtree(d)


def test_the_demo_pretrains_in_the_image_as_its_user_into_the_host_folder_and_resumes(image, shared):
    run = shared / "runs" / "demo"
    demo = ["make", "demo", f"DATA={shared / 'data'}", f"RUN={run}"]
    args = ("ARGS=--set max_seq_length=64 --set max_predictions_per_seq=10 --set train.log_every=3 "
            "--set train.checkpoint_every=3 --set train.schedule.total_steps={}")
    first = in_image(*demo, args.format(6), mounts=[shared])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "global batch" in first.stdout and "world size 2" in first.stdout, first.stdout
    ckpts = sorted(run.glob("ckpt-*"))
    assert [p.name for p in ckpts] == ["ckpt-00000003.shards", "ckpt-00000006.shards"]  # (2 ranks: sharded)
    for p in [run, *run.rglob("*")]:
        st = p.stat()
        # written by the image's user, not root, and readable by every host user
        assert (st.st_uid, st.st_gid) == (UID, UID), p
        assert st.st_mode & stat.S_IROTH, (p, oct(st.st_mode))
    second = in_image(*demo, args.format(9), mounts=[shared])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed from step 6" in second.stdout, second.stdout
    assert [m["step"] for m in metrics_of(run)] == [3, 6, 9]


def test_the_squashfs_enroot_would_import_unpacks_to_a_root_that_runs_doctor(image, tmp_path):
    sqsh = tmp_path / "hvd_bert+cpu.sqsh"
    made = subprocess.run(["bash", str(CONTAINER), "squashfs", str(sqsh)], capture_output=True, text=True,
                          timeout=900)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "root"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(root), str(sqsh)], check=True, capture_output=True,
                   timeout=900)
    env = dict(line.split("=", 1) for line in (root / "etc" / "environment").read_text().splitlines())
    assert env["PATH"].startswith("/opt/hvd_bert/.venv/bin:") and env["HVD_BERT_DEV"] == "0"
    # as `enroot start` runs it: the root file system, its environment, /etc/rc with the command
    limits = ["--ulimit", "nofile=1024:20000", "--ulimit", "nproc=32768:32768"]
    res = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--network", "host", *limits,
                          "--user", str(UID), "--env-file", str(root / "etc" / "environment"),
                          "--rootfs", str(root), "/bin/sh", "/etc/rc", "hvd-bert", "doctor"],
                         capture_output=True, text=True, timeout=600)
    out = res.stdout
    for needle in ("torch                  2.13.0", "tensorflow             2.21.0 + tf-keras 2.21.0",
                   "horovod                0.28.1", "Open MPI", "[X] MPI [X] Gloo",
                   "torch / gloo           OK", "tensorflow / gloo      OK"):
        assert needle in out, f"{needle!r} missing from:\n{out}\n{res.stderr}"
    for fw in ("torch", "tensorflow"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(f"{fw} / mpi"))
        assert "OK: 2 ranks agree" in line, out
    assert res.returncode == 0 and "everything works: 4 distributed runs passed" in out, out + res.stderr


def test_the_gpu_image_shares_the_cpu_images_stages_up_to_the_layers_that_need_cuda(image):
    """The GPU image's NGC base cannot be pulled here: its `system` stage (everything but the
    packages, which need torch's CUDA build and NCCL) on this machine's Debian base."""
    base = "localhost/hvd_bert-base:bookworm"
    if subprocess.run(["podman", "image", "exists", base]).returncode != 0:
        base = "docker.io/library/python:3.11-slim-bookworm"  # the CPU image's other base
    res = subprocess.run(["bash", str(BUILD_IMAGE), "gpu", "--target", "system"], capture_output=True,
                         text=True, env=dict(os.environ, BASE_IMAGE=base), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = in_image("bash", "-c", 'id -u; python3.11 -c "import venv, ensurepip"; command -v mpicc; '
                   'echo "$HVD_BERT_GPU"; ls -A /opt/hvd_bert | wc -l', timeout=300,
                   env={"HVD_BERT_IMAGE": "localhost/hvd_bert:gpu-system"})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(UID), "/usr/bin/mpicc", "1", "0"]


def test_the_image_serves_as_an_mpi_operator_worker_and_launcher(image, tmp_path):
    """The image as the Kubeflow MPI Operator runs it (no cluster: one container, no network but
    its own loopback): the worker command `hvd-bert k8s render` writes starts sshd as the image's
    user on port 2222 with the job's key mounted where the MPIJob's sshAuthMountPath puts it
    (/home/hvd/.ssh: id_rsa, id_rsa.pub, authorized_keys); the launcher's ssh reaches it with no
    host-key prompt, and what mpirun needs on a worker (orted, mpirun, the venv's Horovod) is on
    the session's PATH. A SIGTERM to the worker's first process leaves sshd serving (the ranks
    save first)."""
    from hvd_bert.cluster import k8s

    keys = tmp_path / "ssh"
    keys.mkdir()
    made = subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-m", "PEM", "-f",
                           str(keys / "id_rsa")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    shutil.copy(keys / "id_rsa.pub", keys / "authorized_keys")
    for p in [keys, *keys.iterdir()]:
        os.chown(p, UID, UID)
    (job,) = k8s.render(k8s.Spec("mpijob", "pretrain", "bert-job", image, workers=1))
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    script = (f"{worker[0]} {worker[1]} {shlex_quote(worker[2])} & pid=$!; "
              "for i in $(seq 100); do ssh -o BatchMode=yes localhost true 2>/dev/null && break; sleep 0.1; "
              "done; "
              "kill -TERM $pid; sleep 0.5; "
              "ssh -o BatchMode=yes localhost 'echo USER=$(id -un); command -v orted mpirun; "
              "/opt/hvd_bert/.venv/bin/python -c \"import horovod; print(horovod.__version__)\"'")
    engine = "podman" if shutil.which("podman") else "docker"
    # the limits and runtime scripts/container.sh gives every container here (scripts/engine.sh)
    engine_sh = ROOT / "scripts" / "engine.sh"
    limits = subprocess.run(["bash", "-c", f"die() {{ exit 1; }}; source {engine_sh}; limits"],
                            capture_output=True, text=True, check=True).stdout.split()
    runtime = ["--runtime", "runc"] if engine == "podman" and shutil.which("runc") else []
    res = subprocess.run([engine, "run", *runtime, *limits, "--rm", "--network", "none",
                          "--user", f"{UID}:{UID}", "-v", f"{keys}:/home/hvd/.ssh:ro", image,
                          "bash", "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout.split()
    assert "USER=hvd" in out and "/usr/bin/orted" in out and "/usr/bin/mpirun" in out, res.stdout + res.stderr
    assert "0.28.1" in out, res.stdout + res.stderr


def shlex_quote(s):
    import shlex

    return shlex.quote(s)
