"""scripts/patch_horovod.py on the real Horovod 0.28.1 sdist, scripts/setup.sh's errors, and
benchmarks/gpu_check.sh's refusals of bad arguments."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HVD_BERT_CACHE", Path.home() / ".cache" / "hvd_bert"))
SDIST = CACHE / "sdist" / "horovod-0.28.1.tar.gz"


@pytest.fixture
def horovod_tree(tmp_path):
    if not SDIST.is_file():
        pytest.skip(f"no Horovod sdist at {SDIST} (scripts/setup.sh keeps it there)")
    with tarfile.open(SDIST) as t:
        t.extractall(tmp_path, filter="data")
    return tmp_path / "horovod-0.28.1"


def patch(tree):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "patch_horovod.py"), str(tree)],
                          capture_output=True, text=True)


def test_patch_applies_the_four_changes_once(horovod_tree):
    p = patch(horovod_tree)
    assert p.returncode == 0, p.stderr
    torch_cmake = (horovod_tree / "horovod/torch/CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in torch_cmake and "set(CMAKE_CXX_STANDARD 14)" not in torch_cmake
    assert "list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)" in torch_cmake
    tf_cmake = (horovod_tree / "horovod/tensorflow/CMakeLists.txt").read_text()
    xla = '\nlist(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")'
    assert xla not in tf_cmake
    for f in ("__init__.py", "callbacks.py"):
        text = (horovod_tree / "horovod/tensorflow/keras" / f).read_text()
        assert "from tensorflow.keras import backend as K" in text
        assert "\n    from keras import backend as K" not in text
    again = patch(horovod_tree)
    assert again.returncode != 0 and "already patched" in again.stderr


def test_patch_refuses_source_it_does_not_know(horovod_tree):
    f = horovod_tree / "horovod/tensorflow/CMakeLists.txt"
    f.write_text(f.read_text().replace("xla_mpi_ops.cc", "xla_ops_renamed.cc"))
    p = patch(horovod_tree)
    assert p.returncode != 0
    assert "horovod/tensorflow/CMakeLists.txt" in p.stderr and "is this Horovod 0.28.1?" in p.stderr
    # nothing was written: the torch file is untouched too
    assert "CMAKE_CXX_STANDARD 14" in (horovod_tree / "horovod/torch/CMakeLists.txt").read_text()


def test_patch_refuses_a_folder_that_is_not_an_sdist(tmp_path):
    p = patch(tmp_path)
    assert p.returncode != 0 and "not an unpacked Horovod sdist" in p.stderr


def test_setup_names_the_failed_step_and_the_fix(tmp_path):
    env = dict(os.environ, HVD_BERT_VENV=str(tmp_path / "venv"), HVD_BERT_PYTHON="python3.99-missing",
               HVD_BERT_SKIP_APT="1")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 1
    assert "step 'virtual environment" in p.stderr and "no python3.99-missing on PATH" in p.stderr
    assert "fix: install Python 3.11" in p.stderr


@pytest.mark.parametrize("args, says", [
    (["--bogus"], "unknown argument --bogus"),
    (["--horovod-sdist"], "--horovod-sdist '' is not a file"),
    (["--smoke", "--horovod-sdist", "/no/such/horovod.tar.gz"], "'/no/such/horovod.tar.gz' is not a file"),
    (["--smoke", "--only", "bert,gpu"], "--only takes bert, profile, job, ncf, ckpt, attn and sync, comma-"),
    (["--smoke", "--only"], "--only needs a part"),
])
def test_gpu_check_refuses_bad_arguments_before_writing(tmp_path, args, says):
    out = tmp_path / "results"
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), *args], capture_output=True,
                       text=True, env=dict(os.environ, OUT=str(out)), timeout=60)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and says in p.stderr
    assert not out.exists()


def test_the_docs_count_horovods_changes_as_the_patch_says_them():
    """docs/development.md quotes the patch's own log line: the same numbers of changes, edits
    and files as scripts/patch_horovod.py's EDITS."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("patch_horovod", ROOT / "scripts" / "patch_horovod.py")
    patch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patch)
    changes, edits = len({e[3] for e in patch.EDITS}), len(patch.EDITS)
    files = len({e[0] for e in patch.EDITS})
    docs = (ROOT / "docs" / "development.md").read_text()
    assert f'"applied {changes} changes ({edits} edits in {files} files)"' in docs


def _requirements(path):
    from packaging.requirements import Requirement

    out = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(Requirement(line))
    return out


def test_the_lock_files_agree_with_the_requirements_and_pin_every_package_with_hashes():
    """requirements-dev.lock pins every package of requirements.txt and requirements-dev.txt at a
    version their specifiers allow, each with its hashes; requirements.lock is exactly its
    run-time part (scripts/lock.py's, the same versions and hashes). A requirement changed
    without `make lock` fails here."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lock as lockscript
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from hvd_bert.cluster.lock import norm, read_lock

    dev, run = read_lock(ROOT / "requirements-dev.lock"), read_lock(ROOT / "requirements.lock")
    assert len(dev) > 100 and len(run) > 50
    for name, locked in (("requirements.txt", run), ("requirements.txt", dev), ("requirements-dev.txt", dev)):
        for req in _requirements(ROOT / name):
            pin = locked.get(norm(req.name))
            assert pin is not None, f"{name}: {req.name} is not in the lock: run make lock"
            assert req.specifier.contains(pin.version, prereleases=True), \
                f"{name} asks for {req}, the lock pins {pin.version}: run make lock"
    assert not [n for n, p in dev.items() if not p.hashes], "every pin has its hashes"
    assert all(dev[n].version == p.version and dev[n].hashes == p.hashes for n, p in run.items())
    assert (ROOT / "requirements.lock").read_text() == lockscript.runtime_part(ROOT / "requirements-dev.lock")


def test_the_venv_holds_what_the_lock_pins():
    """The set-up installed this venv from the lock, and recorded which (what doctor prints)."""
    from hvd_bert.cluster.lock import differences, digest, installed_lock, read_lock

    got = installed_lock()
    if got is None:
        pytest.skip("this interpreter's environment was not set up by scripts/setup.sh")
    name, sha = got
    assert name == "requirements-dev.lock" and sha[:16] == digest(ROOT / name)
    assert differences(read_lock(ROOT / name)) == []
