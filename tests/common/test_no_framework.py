"""``hvd_bert.common`` imports no framework, not even indirectly: every module of it is
imported in a fresh interpreter, which must then hold none of torch, tensorflow, horovod,
tfrecord (or keras) in ``sys.modules``."""

import json
import pkgutil
import subprocess
import sys

import pytest

import hvd_bert.common

MODULES = sorted(f"hvd_bert.common.{m.name}" for m in pkgutil.iter_modules(hvd_bert.common.__path__))
FRAMEWORKS = ("torch", "tensorflow", "horovod", "tfrecord", "keras", "tf_keras", "jax")


def test_every_module_is_listed():
    assert "hvd_bert.common.records" in MODULES and "hvd_bert.common.engine" in MODULES
    assert len(MODULES) >= 15


JOBS = ["hvd_bert.cli", "hvd_bert.jobs.pretrain", "hvd_bert.jobs.finetune", "hvd_bert.jobs.ncf"]


@pytest.mark.parametrize("module", MODULES + JOBS)
def test_module_imports_no_framework(module):
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            f"top = {{m.split('.')[0] for m in sys.modules}}; "
            f"print(json.dumps(sorted(top & set({list(FRAMEWORKS)!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{module} pulls in a framework"
