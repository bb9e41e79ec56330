"""``hvd_bert.common`` imports no framework, not even indirectly: its modules (and the jobs and
the CLI, which are written against it) are imported one by one in a fresh interpreter, which
must then hold none of torch, tensorflow, horovod, tfrecord (or keras, jax) in ``sys.modules``;
the first module that pulls one in is named."""

import json
import pkgutil
import subprocess
import sys

import hvd_bert.common

MODULES = sorted(f"hvd_bert.common.{m.name}" for m in pkgutil.iter_modules(hvd_bert.common.__path__))
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
    assert "hvd_bert.common.records" in MODULES and "hvd_bert.common.engine" in MODULES
    assert len(MODULES) >= 15


def test_no_module_of_common_nor_the_jobs_imports_a_framework():
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(FRAMEWORKS), json.dumps(MODULES + JOBS)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    offender = json.loads(out.stdout.strip().splitlines()[-1])
    assert offender is None, f"{offender[0]} pulls in {offender[1]}"


def test_the_check_itself_catches_a_framework():
    out = subprocess.run([sys.executable, "-c", CHECK, json.dumps(FRAMEWORKS), json.dumps(["json", "torch"])],
                         capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["torch", ["torch"]]
