"""``hvd-bert k8s render`` (hvd_bert/cluster/k8s.py) against the published schemas, with no
cluster: every rendered resource validates strictly (unknown fields refused, as ``kubeconform
-strict`` does) against the CRDs the operators install, vendored under tests/data/k8s
(README.md there: versions and licences). The CRDs inline the Kubernetes pod template's schema,
so the pods' fields are checked too; their CEL rules (x-kubernetes-validations) are not."""

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvd_bert.cluster import k8s

DATA = Path(__file__).resolve().parents[1] / "data" / "k8s"
CRDS = {("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.yaml",
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
        ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
            "trainer.kubeflow.org_clustertrainingruntimes.yaml"}


def strict(schema):
    """A CRD's openAPIV3Schema as JSON Schema that refuses unknown fields: every object with
    properties and no additionalProperties or x-kubernetes-preserve-unknown-fields gets
    additionalProperties false; int-or-string becomes either."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


_VALIDATORS = {}


def validator(api_version, kind):
    import jsonschema

    key = (api_version, kind)
    if key not in _VALIDATORS:
        crd = yaml.safe_load((DATA / CRDS[key]).read_text())
        version = api_version.split("/")[1]
        (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        assert crd["spec"]["names"]["kind"] == kind and v["served"]
        _VALIDATORS[key] = jsonschema.Draft7Validator(strict(v["schema"]["openAPIV3Schema"]))
    return _VALIDATORS[key]


def errors(resource):
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(resource["apiVersion"], resource["kind"]).iter_errors(resource)]


SPECS = [dict(kind="mpijob", job="pretrain", workers=4, gpus_per_worker=8, config="bert-large-phase1"),
         dict(kind="mpijob", job="finetune", workers=2, slots_per_worker=2, config="squad",
              sets=["data=/data/squad", "init_checkpoint=/runs/bert-phase2"]),
         dict(kind="trainjob", job="pretrain", workers=2, gpus_per_worker=4, config="bert-large-phase2"),
         dict(kind="trainjob", job="finetune", workers=1, config="glue", framework="tf")]


@pytest.mark.parametrize("settings", SPECS, ids=lambda s: f"{s['kind']}-{s['job']}")
def test_every_rendered_resource_validates_strictly_against_its_published_crd(settings):
    resources = k8s.render(k8s.Spec(name="bert-job", image="registry.example.com/hvd_bert:gpu", **settings))
    assert [r["kind"] for r in resources] == (["MPIJob"] if settings["kind"] == "mpijob"
                                              else ["ClusterTrainingRuntime", "TrainJob"])
    for r in resources:
        assert errors(r) == [], r["kind"]
    # what the YAML says is what was validated
    text = k8s.to_yaml(resources)
    assert list(yaml.safe_load_all(text)) == resources


def test_the_strict_check_refuses_an_unknown_or_mistyped_field():
    """The check can fail: a field the CRD does not know, one of the wrong type, a bad enum."""
    (job,) = k8s.render(k8s.Spec("mpijob", "pretrain", "bert-job", "img:1", workers=2, gpus_per_worker=2))
    for path, value in [(("spec", "slotsPerWorkers"), 2), (("spec", "slotsPerWorker"), "two"),
                        (("spec", "mpiImplementation"), "LAM"),
                        (("spec", "mpiReplicaSpecs", "Worker", "template", "spec", "containers", 0,
                          "imagePullPolicy2"), "Always")]:
        bad = copy.deepcopy(job)
        where = bad
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        assert errors(bad), path


def test_the_resources_hold_the_contract_the_job_needs():
    spec = k8s.Spec("mpijob", "pretrain", "bert-p1", "img:1", workers=3, gpus_per_worker=8,
                    config="bert-large-phase1", sets=["data=/data/wiki"], grace_s=300)
    (job,) = k8s.render(spec)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    cmd = launcher["containers"][0]["command"]
    assert cmd[:5] == ["/opt/hvd_bert/.venv/bin/hvd-bert", "pretrain", "-np", "24", "--mpi"]
    assert "train.output_dir=/runs/bert-p1" in cmd and "data=/data/wiki" in cmd and "data=/data" not in cmd
    assert "/opt/hvd_bert/recipes/bert-large-phase1.yaml" in cmd
    assert job["spec"]["slotsPerWorker"] == 8 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "shm", "mountPath": "/dev/shm"} in worker["containers"][0]["volumeMounts"]
    # the grace: the toolkit's, passed to its launcher, and 60 s more for the pods
    assert {"name": "HVD_BERT_STOP_GRACE_S", "value": "300"} in launcher["containers"][0]["env"]
    assert launcher["terminationGracePeriodSeconds"] == worker["terminationGracePeriodSeconds"] == 360
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] == "OnFailure"
    assert "trap '' TERM" in worker["containers"][0]["command"][-1]
    assert job["spec"]["sshAuthMountPath"] == "/home/hvd/.ssh"


@pytest.mark.parametrize("args, says", [
    (["--name", "Bert_Job"], "--name 'Bert_Job' is not a Kubernetes name"),
    (["--gpus-per-worker", "8", "--slots-per-worker", "4"], "give as many slots as GPUs"),
    (["--workers", "0"], "--workers 0 is out of range"),
    (["--set", "no-equals"], "give KEY=VALUE"),
    (["--data-claim", "Data Claim"], "not a PersistentVolumeClaim name"),
    (["--image", "a b"], "give the image's reference"),
    (["--slots-per-worker", "0"], "--slots-per-worker 0 is out of range"),
    (["--shm-gb", "0.00001"], "--shm-gb 1e-05: give the shared memory"),
    # the settings as the launcher will load them: a misspelt key, another job's recipe, no recipe
    (["--set", "train.schedule.total_stepz=3"], "unknown key 'train.schedule.total_stepz'"),
    (["--config", "squad"], "is a recipe for hvd-bert finetune, not pretrain"),
    (["--config", "no-such"], "is not a recipe of this checkout")])
def test_render_refuses_what_cannot_make_a_job_in_one_line(tmp_path, args, says):
    base = {"--name": "bert-job", "--image": "img:1"}
    argv = [a for k, v in base.items() if k not in args for a in (k, v)] + args
    out = tmp_path / "job.yaml"
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "k8s", "render", *argv, "--output", str(out)],
                       capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and says in lines[0], p.stderr
    assert not out.exists()


def test_render_writes_its_file_and_says_how_to_apply_it(tmp_path):
    out = tmp_path / "job.yaml"
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "k8s", "render", "--kind", "trainjob", "--name",
                        "bert-job", "--image", "img:1", "--output", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and f"kubectl apply -f {out}" in p.stdout, p.stderr
    assert [r["kind"] for r in yaml.safe_load_all(out.read_text())] == ["ClusterTrainingRuntime", "TrainJob"]


def test_the_help_example_runs_as_written_and_validates(tmp_path):
    import re
    import shlex

    help_text = subprocess.run([sys.executable, "-m", "hvd_bert", "k8s", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    example = re.search(r"e\.g\. (hvd-bert k8s render .*?);", " ".join(help_text.split())).group(1)
    argv = shlex.split(example)[1:]
    p = subprocess.run([sys.executable, "-m", "hvd_bert", *argv], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = tmp_path / argv[argv.index("--output") + 1]
    (job,) = yaml.safe_load_all(out.read_text())
    assert errors(job) == [] and job["spec"]["slotsPerWorker"] == 8


def test_the_launcher_reads_the_operators_hostfile_and_names_a_bad_one(tmp_path):
    """What the MPI Operator writes at /etc/mpi/hostfile becomes the launch's hosts; a hostfile
    that says something else is one line naming it, before any rank starts."""
    from hvd_bert.cluster.launch import HOSTFILE_ENV, hosts_from_env

    f = tmp_path / "hostfile"
    f.write_text("bert-job-worker-0.bert-job.default.svc slots=8\n"
                 "bert-job-worker-1.bert-job.default.svc slots=8\n")
    assert hosts_from_env({HOSTFILE_ENV: str(f)}) == ("bert-job-worker-0.bert-job.default.svc:8,"
                                                      "bert-job-worker-1.bert-job.default.svc:8")
    assert hosts_from_env({}) is None
    for text in ["node1 slots=two\n", "node1 cpus=2\n", "# nothing\n", "node1 slots=0\n"]:
        f.write_text(text)
        with pytest.raises(ValueError, match="hostfile|names no host"):
            hosts_from_env({HOSTFILE_ENV: str(f)})
    f.write_text("bad line here\n")
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "pretrain", "-np", "2", "--mpi"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, HOSTFILE_ENV: str(f)})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and f"{f}, line 1" in lines[0], p.stderr


def test_the_committed_examples_are_what_the_command_writes_and_validate(tmp_path):
    """k8s/*.yaml: rendered by k8s/render.sh; rendering again (into a copy) gives the same files,
    and each validates against its CRD."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "k8s").mkdir()
    shutil.copy(root / "k8s" / "render.sh", tmp_path / "k8s" / "render.sh")
    hvd = Path(sys.executable).parent / "hvd-bert"
    p = subprocess.run(["bash", str(tmp_path / "k8s" / "render.sh")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "HVD": str(hvd)})
    assert p.returncode == 0, p.stderr
    committed = sorted(f.name for f in (root / "k8s").glob("*.yaml"))
    assert committed == sorted(f.name for f in (tmp_path / "k8s").glob("*.yaml")) and len(committed) == 4
    for name in committed:
        text = (root / "k8s" / name).read_text()
        assert text == (tmp_path / "k8s" / name).read_text(), f"k8s/{name} is stale: run k8s/render.sh"
        for r in yaml.safe_load_all(text):
            assert errors(r) == [], (name, r["kind"])


def test_render_never_writes_over_a_runs_files_and_each_trainjob_has_its_own_runtime(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "ckpt-00000002.pt").write_bytes(b"x")
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "k8s", "render", "--name", "bert-job", "--image",
                        "img:1", "--output", str(run / "config.json")],
                       capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "never writes over a run's files" in lines[0], p.stderr
    assert (run / "config.json").read_text() == "{}"
    # two TrainJobs never share (and overwrite) one runtime: it holds each job's command and volumes
    a = k8s.render(k8s.Spec("trainjob", "pretrain", "job-a", "img:1", workers=4, gpus_per_worker=8))
    b = k8s.render(k8s.Spec("trainjob", "pretrain", "job-b", "img:2", workers=2))
    assert a[0]["metadata"]["name"] != b[0]["metadata"]["name"]
    assert all(j[1]["spec"]["runtimeRef"]["name"] == j[0]["metadata"]["name"] for j in (a, b))
