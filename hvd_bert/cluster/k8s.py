"""``hvd-bert k8s render``: a pretraining or fine-tuning job as Kubernetes resources, for the
Kubeflow MPI Operator (``MPIJob``, ``kubeflow.org/v2beta1``) or Kubeflow Trainer v2 (a
``ClusterTrainingRuntime`` with ``mlPolicy.mpi`` and a ``TrainJob``, ``trainer.kubeflow.org/v1alpha1``).

Why a command and not a kustomize overlay: the resources are derived from a few numbers that
must agree (ranks = workers x slots, ``-np``, the GPU limits, the grace period against the
toolkit's stop grace), which an overlay's patches cannot check; the command checks them in one
line before writing, needs no kubectl on the machine that renders, and is what the tests render.

The operator's contract (REFERENCE section 11, mpi-operator v0.8.2): the workers run ``sshd`` (the
image's non-root configuration, port 2222); the operator mounts the SSH keys at
``sshAuthMountPath`` (the image user's ``~/.ssh``) and a hostfile at ``/etc/mpi/hostfile``
(``<job>-worker-<i>.<job>.<namespace>.svc slots=N``), and points OpenMPI at it
(``OMPI_MCA_orte_default_hostfile``); the launcher runs the toolkit's own launcher,
``hvd-bert pretrain -np N --mpi``, which reads that hostfile (``launch.hosts_from_env``), so
its exit statuses and lines are the toolkit's (0 done, 3 stopped with a checkpoint, 4 a rank
lost, 5 a stall). Preemption: the launcher restarts (``restartPolicy: OnFailure`` within
``backoffLimit``) and resumes from the newest checkpoint in the run folder, as a requeued SLURM
job does. On SIGTERM the launcher's job saves and stops within the toolkit's grace
(``HVD_BERT_STOP_GRACE_S``); the pods' ``terminationGracePeriodSeconds`` is that grace plus a
margin, and the workers' sshd ignores SIGTERM so that their ranks can save first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Spec", "render", "SpecError", "KINDS", "JOBS", "APP", "SSH_PORT", "GRACE_MARGIN_S"]

KINDS = ("mpijob", "trainjob")
JOBS = ("pretrain", "finetune")
APP = "/opt/hvd_bert"             # the image's checkout and venv
USER = "hvd"                      # the image's user (docker/system.sh), uid 1000
SSH_PORT = 2222                   # the image's sshd for a non-root worker (docker/sshd_config)
GRACE_MARGIN_S = 60               # the pods' termination grace beyond the toolkit's stop grace
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class SpecError(ValueError):
    """A setting that cannot make a valid job: one line, exit status 2."""


@dataclass
class Spec:
    kind: str
    job: str
    name: str
    image: str
    workers: int = 2
    gpus_per_worker: int = 0
    slots_per_worker: int | None = None   # ranks per worker: its GPUs by default, else 1
    namespace: str = "default"
    config: str | None = None             # a recipe: a file in the image, or a name under recipes/
    sets: list[str] = field(default_factory=list)
    framework: str = "pt"
    data_claim: str = "hvd-bert-data"
    runs_claim: str = "hvd-bert-runs"
    shm_gb: float = 16.0
    grace_s: int = 600                    # the toolkit's stop grace (HVD_BERT_STOP_GRACE_S)
    backoff_limit: int = 6                # launcher restarts (preemptions) before the job fails
    app: str = APP

    @property
    def slots(self) -> int:
        return self.slots_per_worker if self.slots_per_worker is not None else max(1, self.gpus_per_worker)

    @property
    def ranks(self) -> int:
        return self.workers * self.slots

    def check(self) -> None:
        if self.kind not in KINDS:
            raise SpecError(f"--kind {self.kind!r}: give one of {', '.join(KINDS)}")
        if self.job not in JOBS:
            raise SpecError(f"--job {self.job!r}: give one of {', '.join(JOBS)}")
        longest = len(self.name) + len("-launcher-xxxxx")
        if not _NAME.match(self.name) or longest > 63:
            raise SpecError(f"--name {self.name!r} is not a Kubernetes name this job can use: lower-case "
                            f"letters, digits and '-', starting with a letter, at most "
                            f"{63 - len('-launcher-xxxxx')} characters (its pods' names add a suffix)")
        if not _NAME.match(self.namespace) or len(self.namespace) > 63:
            raise SpecError(f"--namespace {self.namespace!r} is not a Kubernetes namespace name")
        for what, claim in (("--data-claim", self.data_claim), ("--runs-claim", self.runs_claim)):
            if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", claim) or len(claim) > 253:
                raise SpecError(f"{what} {claim!r} is not a PersistentVolumeClaim name")
        if not self.image or re.search(r"\s", self.image):
            raise SpecError(f"--image {self.image!r}: give the image's reference, e.g. "
                            f"registry.example.com/hvd_bert:cpu")
        bounds = (("--workers", self.workers, 1, 10000), ("--gpus-per-worker", self.gpus_per_worker, 0, 64),
                  ("--slots-per-worker", self.slots, 1, 1024), ("--grace-s", self.grace_s, 1, 86400),
                  ("--backoff-limit", self.backoff_limit, 0, 1000))
        for what, v, low, high in bounds:
            if not low <= v <= high:
                raise SpecError(f"{what} {v} is out of range: give {low} to {high}")
        if self.gpus_per_worker and self.slots != self.gpus_per_worker:
            raise SpecError(f"--slots-per-worker {self.slots} with --gpus-per-worker {self.gpus_per_worker}: "
                            f"each rank takes one GPU, so give as many slots as GPUs (or leave "
                            f"--slots-per-worker out)")
        if not 1 / 16 <= self.shm_gb <= 4096:
            raise SpecError(f"--shm-gb {self.shm_gb:g}: give the shared memory of a worker in GiB, 0.0625 "
                            f"(64 MiB, a container's default) to 4096")
        if self.framework not in ("pt", "tf"):
            raise SpecError(f"--framework {self.framework!r}: give pt or tf")
        for s in self.sets:
            if "=" not in s:
                raise SpecError(f"--set {s!r}: give KEY=VALUE")


def _recipe(spec: Spec) -> list[str]:
    if not spec.config:
        return []
    name = spec.config.removesuffix(".yaml")
    path = spec.config if "/" in spec.config else f"{spec.app}/recipes/{name}.yaml"
    return ["--config", path]


def launcher_command(spec: Spec) -> list[str]:
    """What the launcher runs: the toolkit's own launcher on every worker's slots (mpirun reads
    the operator's hostfile), the job's recipe and settings, its run folder on the runs volume."""
    keys = {s.split("=", 1)[0] for s in spec.sets}
    sets = [] if "data" in keys else ["--set", "data=/data"]
    sets += ["--set", f"train.output_dir=/runs/{spec.name}", "--set", "progress=false"]
    for s in spec.sets:
        sets += ["--set", s]
    return [f"{spec.app}/.venv/bin/hvd-bert", spec.job, "-np", str(spec.ranks), "--mpi", "--framework",
            spec.framework, *_recipe(spec), *sets]


def _volumes(spec: Spec, worker: bool) -> tuple[list, list]:
    vols = [{"name": "data", "persistentVolumeClaim": {"claimName": spec.data_claim, "readOnly": True}},
            {"name": "runs", "persistentVolumeClaim": {"claimName": spec.runs_claim}}]
    mounts = [{"name": "data", "mountPath": "/data", "readOnly": True},
              {"name": "runs", "mountPath": "/runs"}]
    if worker:  # (the ranks' shared memory: NCCL and the data loaders; the 64 MiB default is too small)
        size = f"{round(spec.shm_gb * 1024)}Mi"  # (a whole quantity Kubernetes reads)
        vols.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return vols, mounts


def _pod(spec: Spec, name: str, command: list[str], worker: bool, env: list | None = None) -> dict:
    vols, mounts = _volumes(spec, worker)
    container = {"name": name, "image": spec.image, "command": command, "volumeMounts": mounts,
                 "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}}
    if env:
        container["env"] = env
    if worker:
        limits = {"nvidia.com/gpu": spec.gpus_per_worker} if spec.gpus_per_worker else {}
        if limits:
            container["resources"] = {"limits": limits}
        container["readinessProbe"] = {"tcpSocket": {"port": SSH_PORT}, "initialDelaySeconds": 2,
                                       "periodSeconds": 5}
    else:
        container["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}}
    return {"spec": {"terminationGracePeriodSeconds": spec.grace_s + GRACE_MARGIN_S,
                     "securityContext": {"fsGroup": 1000}, "containers": [container], "volumes": vols}}


def worker_command(spec: Spec) -> list[str]:
    """sshd as the image's user, in the foreground, SIGTERM ignored by the shell that holds it (so
    that the ranks it serves save within the grace when the job stops; the pod ends after it)."""
    return ["/bin/bash", "-c", f"trap '' TERM; /usr/sbin/sshd -De -f {spec.app}/docker/sshd_config & wait"]


def _launcher_env(spec: Spec) -> list[dict]:
    return [{"name": "HVD_BERT_STOP_GRACE_S", "value": str(spec.grace_s)},
            {"name": "TF_USE_LEGACY_KERAS", "value": "1"}]


def mpijob(spec: Spec) -> dict:
    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/name": "hvd-bert", "hvd-bert/job": spec.job}},
        "spec": {
            "slotsPerWorker": spec.slots, "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": f"/home/{USER}/.ssh", "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": spec.backoff_limit},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                             "template": _pod(spec, "launcher", launcher_command(spec), False,
                                              _launcher_env(spec))},
                "Worker": {"replicas": spec.workers, "restartPolicy": "Always",
                           "template": _pod(spec, "worker", worker_command(spec), True)}}}}


def trainjob(spec: Spec) -> list[dict]:
    """A ClusterTrainingRuntime (the image's sshd on the nodes, the launcher apart) and a TrainJob
    on it whose trainer runs the launcher command."""
    runtime = f"{spec.name}-runtime"  # (its own: the runtime holds this job's command, image and volumes)
    node = _pod(spec, "node", worker_command(spec), True)
    launcher = _pod(spec, "node", launcher_command(spec), False, _launcher_env(spec))
    return [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime, "labels": {"trainer.kubeflow.org/framework": "hvd-bert"}},
        "spec": {
            "mlPolicy": {"numNodes": spec.workers,
                         "mpi": {"numProcPerNode": spec.slots, "mpiImplementation": "OpenMPI",
                                 "sshAuthMountPath": f"/home/{USER}/.ssh", "runLauncherAsNode": False}},
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                "replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": node}}},
                    {"name": "launcher", "dependsOn": [{"name": "node", "status": "Ready"}],
                     "template": {
                         "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                         "spec": {"backoffLimit": spec.backoff_limit, "template": launcher}}}]}}}},
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
         "metadata": {"name": spec.name, "namespace": spec.namespace},
         "spec": {"runtimeRef": {"name": runtime, "kind": "ClusterTrainingRuntime",
                                 "apiGroup": "trainer.kubeflow.org"},
                  "trainer": {"numNodes": spec.workers, "image": spec.image,
                              "command": launcher_command(spec)}}}]


def check_settings(spec: Spec, root) -> None:
    """The job's recipe and settings as its launcher will load them, loaded here first (the
    image's recipes/ are this checkout's): a ConfigError names a misspelt key, a value out of
    range or a recipe of another job, before anything is written."""
    from pathlib import Path

    from hvd_bert import config as C

    recipe = None
    if spec.config:
        (_, path) = _recipe(spec)
        local = Path(root) / Path(path).relative_to(spec.app) if path.startswith(spec.app + "/") else None
        if local is None or not local.is_file():
            raise SpecError(f"--config {spec.config}: {path} is not a recipe of this checkout (the image's "
                            f"{spec.app} is this checkout): give a name under recipes/ (e.g. "
                            f"bert-large-phase1), or a path under {spec.app}/")
        recipe = str(local)
    sets = [s for i, s in enumerate(launcher_command(spec)) if i and launcher_command(spec)[i - 1] == "--set"]
    C.load_config(C.JOB_CONFIGS[spec.job], recipe, sets)


def render(spec: Spec) -> list[dict]:
    """The resources of ``spec`` (checked first: a SpecError names the setting and the fix)."""
    spec.check()
    return [mpijob(spec)] if spec.kind == "mpijob" else trainjob(spec)


def to_yaml(resources: list[dict]) -> str:
    import yaml

    return "---\n".join(yaml.safe_dump(r, sort_keys=False, default_flow_style=False) for r in resources)
