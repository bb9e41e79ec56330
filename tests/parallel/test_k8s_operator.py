"""The Kubeflow MPI Operator's runtime contract reproduced on the fake cluster, with no API
server: three network namespaces with sshd are the MPIJob's pods (node1 its launcher, node2 and
node3 its workers, named ``<job>-worker-<i>.<job>.<namespace>.svc`` in every node's /etc/hosts),
node1's ``/etc/mpi/hostfile`` is the operator's (``scripts/fake_cluster.sh mpijob``), and the
launcher gets the environment the operator gives it (mpi-operator v0.8.2,
pkg/controller/mpi_job_controller.go: ``ompiEnvVars`` and ``launcherEnvVars``). The launcher's
command is taken verbatim from ``hvd-bert k8s render``'s MPIJob (2 workers x 2 slots): it trains
as the same job launched on bare metal does, step for step; a worker lost mid-run ends it with
the toolkit's exit status 4 and its line, and the launcher started again (the operator's restart
of a failed launcher) resumes from the newest checkpoint and ends where the uninterrupted run
ends. What is not reproduced: the API server, the operator's controller, pods' images and the
SSH keys' mount (the fake cluster's own ssh keys stand in; the image's sshd is checked in
test_container_image.py)."""

import subprocess
import time
from pathlib import Path

import pytest

from bert_jobs import TINY, metrics_of
from conftest import FAKE_CLUSTER, fake_cluster, on_node1
from hvd_bert.cluster import k8s
from hvd_bert.train.checkpoint import checkpoint_path

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parents[2]
JOB, NAMESPACE = "bert-k8s", "default"
# what the operator sets in the launcher container (OpenMPI), beside the manifest's own env
OPERATOR_ENV = {"OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "K_MPI_JOB_ROLE": "launcher"}
# Horovod's fusion buffer takes what is ready within a cycle, so the order of a ring's sums varies
# from run to run in the last bit; without fusion every run sums in one order (test_multinode)
EXACT = {"HOROVOD_FUSION_THRESHOLD": "0"}
STEPS = 40  # (a worker is killed after the checkpoint of step 4: the rest takes some seconds)


@pytest.fixture(scope="module")
def operator(tmp_path_factory):
    cluster = fake_cluster(tmp_path_factory, 3, "hvdk", "10.213.11")
    env = next(cluster)
    try:
        made = subprocess.run(["bash", str(FAKE_CLUSTER), "mpijob", JOB, NAMESPACE, "2"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stdout + made.stderr
        yield env
    finally:
        cluster.close()


def manifest(bert_data, runs):
    """The launcher's command from the rendered MPIJob (the app in this checkout, the data and
    the run folder where this machine has them: the volumes' mount points are the only change)."""
    spec = k8s.Spec("mpijob", "pretrain", JOB, "localhost/hvd_bert:cpu", workers=2, slots_per_worker=2,
                    app=str(REPO), sets=[f"data={bert_data}", f"train.output_dir={runs}", *TINY[1::2],
                                         "train.checkpoint_every=4", "train.batch.global_batch_size=32",
                                         f"train.schedule.total_steps={STEPS}", "train.log_every=1"])
    (job,) = k8s.render(spec)
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    return container["command"], env


def launcher(operator, command, env, timeout=600, wait=True):
    """The launcher pod: node1, the operator's environment and the manifest's, the command as it is."""
    pod_env = [f"{k}={v}" for k, v in {**OPERATOR_ENV, **env, **EXACT}.items()]
    proc = subprocess.Popen([*on_node1(operator), "env", *pod_env, *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=operator)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_the_rendered_launcher_runs_the_job_on_the_operators_workers_as_bare_metal_does(operator, bert_data,
                                                                                        tmp_path):
    command, env = manifest(bert_data, tmp_path / "k8s")
    rc, out, err = launcher(operator, command, env)
    assert rc == 0, out[-3000:] + err[-3000:]
    # the ranks ran on the workers the hostfile names, none on the launcher
    assert "world: 4 ranks on 2 hosts: node2 ranks 0-1, node3 ranks 2-3" in out, out[-3000:]
    k8s_losses = [m["loss"] for m in metrics_of(tmp_path / "k8s")]
    assert len(k8s_losses) == STEPS
    # the same job launched by hand from node1 on the same hosts (-H, no operator, no hostfile)
    bare = [a.replace(f"train.output_dir={tmp_path / 'k8s'}", f"train.output_dir={tmp_path / 'bare'}")
            for a in command]
    bare[bare.index("--mpi")] = "--mpi -H node2:2,node3:2".split()
    bare = [w for a in bare for w in (a if isinstance(a, list) else [a])]
    hand_env = [f"{k}={v}" for k, v in {**env, **EXACT}.items()]
    res = subprocess.run([*on_node1(operator), "env", *hand_env, *bare], capture_output=True, text=True,
                         timeout=600, env=operator)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [m["loss"] for m in metrics_of(tmp_path / "bare")] == k8s_losses

    # a worker lost mid-run: its ranks killed (sshd stays, as a pod's restart would bring it back)
    runs = tmp_path / "lost"
    command, env = manifest(bert_data, runs)
    proc = launcher(operator, command, env, wait=False)
    deadline = time.time() + 300
    while not (checkpoint_path(runs, 4, "shards") / "index.json").exists() and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.05)
    killed = subprocess.run(["bash", str(FAKE_CLUSTER), "kill", "node3", "hvd_bert"], env=operator,
                            capture_output=True, text=True, timeout=60)
    out, err = proc.communicate(timeout=300)
    assert killed.returncode == 0, killed.stderr + out[-2000:] + err[-2000:]
    assert proc.returncode == 4, out[-3000:] + err[-3000:]
    lines = [ln for ln in err.splitlines() if "was lost" in ln]
    assert lines and "the last complete checkpoint is intact: run the same command again" in lines[0], \
        err[-3000:]
    # the operator restarts the failed launcher: the same command, which resumes
    rc, out, err = launcher(operator, command, env)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "resumed from step 4" in out, out[-3000:]
    losses = {m["step"]: m["loss"] for m in metrics_of(runs)}
    assert [losses.get(s) for s in range(1, STEPS + 1)] == k8s_losses
