"""Everything outside the two backends imports no framework, not even indirectly: the core
(math, config, data, weights, evaluation, the training run), the jobs, the cluster helpers and
the CLI are imported one by one in a fresh interpreter, which must then hold none of torch,
tensorflow, horovod, tfrecord (or keras, jax) in ``sys.modules``; the first module that pulls
one in is named. (Doctor's worker, a script Horovod's ranks run, imports Horovod by design;
the allreduce probe imports it only when it runs.)"""

import json
import pkgutil
import subprocess
import sys

import hvd_bert

RANK_SCRIPTS = {"hvd_bert.cluster.doctor_worker", "hvd_bert.__main__"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(hvd_bert.__path__, "hvd_bert.")
                 if not m.name.startswith(("hvd_bert.pt", "hvd_bert.tf")) and m.name not in RANK_SCRIPTS)
JOBS = ["hvd_bert.jobs.pretrain", "hvd_bert.jobs.finetune", "hvd_bert.jobs.ncf", "hvd_bert.cli"]
FRAMEWORKS = ("torch", "tensorflow", "horovod", "tfrecord", "keras", "tf_keras", "jax")

CHECK = """
import importlib, json, sys
frameworks = set(json.loads(sys.argv[1]))
for name in json.loads(sys.argv[2]):
    importlib.import_module(name)
    pulled = sorted({m.split('.')[0] for m in sys.modules} & frameworks)
    if pulled:
        print(json.dumps([name, pulled]))
        break
else:
    print(json.dumps(None))
"""


def test_every_module_is_listed():
    for name in ("hvd_bert.data.records", "hvd_bert.train.engine", "hvd_bert.core.optim", "hvd_bert.config",
                 "hvd_bert.weights.hf", "hvd_bert.evaluation.squad", "hvd_bert.cluster.horovod"):
        assert name in MODULES
    assert len(MODULES) >= 40


def test_no_module_outside_the_backends_imports_a_framework():
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(FRAMEWORKS), json.dumps(MODULES + JOBS)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    offender = json.loads(out.stdout.strip().splitlines()[-1])
    assert offender is None, f"{offender[0]} pulls in {offender[1]}"


def test_the_check_itself_catches_a_framework():
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(FRAMEWORKS), json.dumps(["json", "torch"])],
                         capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["torch", ["torch"]]
