#!/usr/bin/env bash
# One idempotent set-up step for hvd_bert, used by `make setup`, `make test`, `make demo`
# and the container images. On a fresh Debian machine, as root, it:
#   1. installs OpenMPI and the build tools from apt (skipped when present),
#   2. creates a virtual environment in the repo (.venv, or $HVD_BERT_VENV),
#   3. installs every Python package from a lock file with its hashes (requirements-dev.lock, or
#      requirements.lock with HVD_BERT_DEV=0; skipped when the lock is unchanged),
#   4. builds Horovod 0.28.1 from the PyPI sdist with scripts/patch_horovod.py, caching the
#      wheel outside the repo keyed by the Horovod, torch, TensorFlow and Python versions,
#   5. installs hvd_bert itself (editable) and checks that Horovod loads in both frameworks.
# A second run on the same machine takes seconds. Any failure names the step and the fix.
#
# Settings (environment): HVD_BERT_VENV (venv path), HVD_BERT_CACHE (wheel cache,
# default ~/.cache/hvd_bert), HVD_BERT_PYTHON (interpreter, default python3.11),
# HVD_BERT_TORCH_INDEX (extra pip index for torch's CPU build, for machines where plain
# `pip install torch==2.13.0` would take a CUDA build, e.g. https://download.pytorch.org/whl/cpu),
# HVD_BERT_SKIP_APT=1 (never call apt-get; fail with the package list instead),
# HVD_BERT_GPU=1 (build Horovod with NCCL for GPU tensors; the GPU image sets it),
# HVD_BERT_DEV=0 (requirements.lock: leave out the test and lint tools; the images set it),
# HVD_BERT_LOCK_HASHES=0 (the lock's versions without its hashes: the images, whose wheels were
# checked against them when gathered),
# HVD_BERT_SETUP_UNTIL=horovod (stop after step 4; the images install the toolkit in a later layer).
# pip's own settings apply (PIP_NO_INDEX, PIP_FIND_LINKS, PIP_CONSTRAINT: the images install
# offline from the wheels scripts/build_image.sh gathers).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)  # also when reached by a symlink
VENV=${HVD_BERT_VENV:-$ROOT/.venv}
CACHE=${HVD_BERT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_bert}
PYTHON=${HVD_BERT_PYTHON:-python3.11}
# One source of truth for the framework versions: requirements.txt (the images' build
# arguments rewrite it). Horovod's version is this script's (the patch is made for it).
HOROVOD_VERSION=${HVD_BERT_HOROVOD_VERSION:-0.28.1}
pin() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$ROOT/requirements.txt"; }
TORCH_VERSION=$(pin torch)
TF_VERSION=$(pin tensorflow-cpu)
[[ -n $TORCH_VERSION && -n $TF_VERSION ]] || { echo "setup: requirements.txt must pin torch== and tensorflow-cpu==" >&2; exit 1; }
PIP_VERSION=26.3  # the pip that installs the lock (not itself in it)
GPU=${HVD_BERT_GPU:-0}  # 1: Horovod with NCCL for GPU tensors (needs CUDA and NCCL, as in NGC images)
APT_PACKAGES=(libopenmpi-dev openmpi-bin cmake g++ make)

STEP="start"
step() { STEP=$1; echo "==> [setup] $1"; }
die() {
    echo "setup: step '$STEP' failed: $1" >&2
    echo "setup: fix: $2" >&2
    exit 1
}
trap 'echo "setup: step '"'"'$STEP'"'"' failed (command on line $LINENO exited non-zero); see the output above" >&2' ERR

pip_() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

# ---------------------------------------------------------------------------------------
step "system packages (OpenMPI, cmake, g++)"
missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
if ((${#missing[@]})); then
    if [[ ${HVD_BERT_SKIP_APT:-0} == 1 ]]; then
        die "missing ${missing[*]}" "install them: apt-get install -y ${APT_PACKAGES[*]}"
    fi
    if [[ $(id -u) != 0 ]]; then
        die "missing ${missing[*]} and not root" "run: sudo apt-get install -y ${APT_PACKAGES[*]}, then this script again"
    fi
    command -v apt-get >/dev/null 2>&1 || die "no apt-get on this machine" \
        "install OpenMPI (mpirun, mpicc), cmake, g++ and make with the system's package manager"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed" "check the network and the apt sources, then rerun"
    apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null \
        || die "apt-get install failed" "run: apt-get install -y ${APT_PACKAGES[*]} and read its error"
fi
echo "    $(mpirun --version 2>/dev/null | head -n 1)"

# ---------------------------------------------------------------------------------------
step "virtual environment ($VENV)"
command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH" \
    "install Python 3.11 (with venv), or set HVD_BERT_PYTHON to a Python 3.11 interpreter"
if [[ ! -x $VENV/bin/python ]]; then
    "$PYTHON" -m venv "$VENV" || die "could not create the venv" "install python3.11-venv, or remove $VENV and rerun"
fi
pyver=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[[ $pyver == 3.11 ]] || die "the venv has Python $pyver, hvd_bert is pinned to 3.11" \
    "remove $VENV and set HVD_BERT_PYTHON to a Python 3.11 interpreter"

# ---------------------------------------------------------------------------------------
step "Python packages (torch $TORCH_VERSION, tensorflow-cpu $TF_VERSION, tf-keras, mpi4py, ...)"
# Every package from a lock file, pinned with its hashes (scripts/lock.py writes them, `make lock`):
# requirements-dev.lock (the run-time and the test tools), or requirements.lock (HVD_BERT_DEV=0).
lock=$ROOT/requirements-dev.lock
[[ ${HVD_BERT_DEV:-1} == 0 ]] && lock=$ROOT/requirements.lock
[[ -f $lock ]] || die "no $(basename "$lock")" "restore it from git, or write it: make lock"
lock_sha=$(sha256sum "$lock" | cut -d' ' -f1)
deps_key="$(basename "$lock") $lock_sha ${HVD_BERT_LOCK_HASHES:-1} $GPU"
deps_stamp=$VENV/.hvd_bert_deps
if [[ $(cat "$deps_stamp" 2>/dev/null) != "$deps_key" ]]; then
    pip_ install -q "pip==$PIP_VERSION" || die "could not install pip $PIP_VERSION" "check network access to PyPI"
    extra=()
    [[ -n ${HVD_BERT_TORCH_INDEX:-} ]] && extra+=(--extra-index-url "$HVD_BERT_TORCH_INDEX")
    # mpi4py is compiled against the system OpenMPI (mpicc), not taken as a binary wheel from
    # PyPI (HVD_BERT_MPI4PY_SOURCE=0: the images' wheels hold one built against the same OpenMPI).
    [[ ${HVD_BERT_MPI4PY_SOURCE:-1} == 0 ]] || extra+=(--no-binary mpi4py)
    from=$lock
    if [[ ${HVD_BERT_LOCK_HASHES:-1} == 0 || $GPU == 1 ]]; then
        # the lock's versions without its hashes: the images install offline from wheels that
        # scripts/build_image.sh checked against the hashes when it gathered them (mpi4py's is
        # built there from its checked sdist); the GPU image takes torch's CUDA build of the
        # same version from TORCH_INDEX
        from=$(mktemp "${TMPDIR:-/tmp}/hvd_bert-lock.XXXXXX")
        sed -e 's/ *\\$//' -e '/^ *--hash=/d' -e '/^ *#/d' "$lock" >"$from"
        [[ $GPU == 1 ]] && sed -i "s/^torch==.*/torch==$TORCH_VERSION/" "$from"
    else
        extra+=(--require-hashes)
    fi
    pip_ install -q "${extra[@]}" --requirement="$from" \
        || die "pip could not install $(basename "$lock")" \
            "read pip's error above; for torch's CPU build set HVD_BERT_TORCH_INDEX=https://download.pytorch.org/whl/cpu"
    [[ $from == "$lock" ]] || rm -f "$from"
    echo "$(basename "$lock") $lock_sha" >"$VENV/.hvd_bert_lock"  # (what hvd-bert doctor names)
    echo "$deps_key" >"$deps_stamp"
fi
echo "    $(basename "$lock") ${lock_sha:0:16}"

# ---------------------------------------------------------------------------------------
step "Horovod $HOROVOD_VERSION (patched build, cached)"
key="horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-tf$TF_VERSION-py$pyver-$(uname -m)"
if [[ $GPU == 1 ]]; then key="$key-nccl"; fi
patch_sum=$(sha256sum "$ROOT/scripts/patch_horovod.py" | cut -c1-8)
wheel_dir=$CACHE/wheels/$key-$patch_sum
hvd_stamp=$VENV/.hvd_bert_horovod
if [[ $(cat "$hvd_stamp" 2>/dev/null) != "$key-$patch_sum" ]]; then
    wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
    if [[ -z $wheel ]]; then
        echo "    no cached wheel in $wheel_dir: building (6-10 minutes on 2 cores)"
        build=$(mktemp -d "${TMPDIR:-/tmp}/hvd_bert_horovod.XXXXXX")
        sdist=$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz
        if [[ ! -f $sdist ]]; then
            mkdir -p "$CACHE/sdist"
            pip_ download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$build" \
                || die "could not download the Horovod $HOROVOD_VERSION sdist" "check network access to PyPI"
            mv "$build/horovod-$HOROVOD_VERSION.tar.gz" "$sdist"
        fi
        tar -xzf "$sdist" -C "$build"
        "$VENV/bin/python" "$ROOT/scripts/patch_horovod.py" "$build/horovod-$HOROVOD_VERSION" \
            || die "patching Horovod failed" "see the message above; scripts/patch_horovod.py expects the $HOROVOD_VERSION sdist"
        (
            cd "$build/horovod-$HOROVOD_VERSION"
            export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
                HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
                MAKEFLAGS="-j$(nproc)" TF_USE_LEGACY_KERAS=1
            if [[ $GPU == 1 ]]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
            "$VENV/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$build/wheel" . >"$build/build.log" 2>&1
        ) || { tail -n 40 "$build/build.log" >&2; die "the Horovod build failed (log: $build/build.log)" \
            "read the compiler error above; the build needs torch and TensorFlow installed, cmake, g++ and mpicc"; }
        mkdir -p "$wheel_dir"
        built=$(ls "$build"/wheel/horovod-*.whl)
        cp "$built" "$wheel_dir/.tmp.whl" && mv "$wheel_dir/.tmp.whl" "$wheel_dir/$(basename "$built")"
        rm -rf "$build"
        wheel=$(ls "$wheel_dir"/horovod-*.whl | head -n 1)
    fi
    pip_ install -q --no-deps --force-reinstall "$wheel" || die "could not install $wheel" \
        "remove $wheel_dir to rebuild it"
    echo "$key-$patch_sum" >"$hvd_stamp"
fi

if [[ ${HVD_BERT_SETUP_UNTIL:-} == horovod ]]; then
    echo "==> [setup] stopped after Horovod (HVD_BERT_SETUP_UNTIL=horovod)"
    exit 0
fi

# ---------------------------------------------------------------------------------------
step "hvd_bert (editable install)"
if ! "$VENV/bin/python" -P -c 'import hvd_bert, sys; sys.exit(0 if hvd_bert.__file__.startswith(sys.argv[1]) else 1)' \
        "$ROOT/hvd_bert" 2>/dev/null; then
    pip_ install -q --no-deps --no-build-isolation -e "$ROOT" || die "could not install hvd_bert" "read pip's error above"
fi

# ---------------------------------------------------------------------------------------
step "check: Horovod loads in both frameworks"
# (once per set of versions, Horovod build and checkout: loading TensorFlow takes seconds, and
# every make target runs this step)
check_key="$deps_key $(cat "$hvd_stamp") $ROOT"
check_stamp=$VENV/.hvd_bert_checked
if [[ $(cat "$check_stamp" 2>/dev/null) == "$check_key" ]]; then
    echo "    passed before for these versions (${check_stamp#"$PWD"/})"
    echo "==> [setup] ready: activate with 'source ${VENV#"$PWD"/}/bin/activate' or run '$VENV/bin/hvd-bert doctor'"
    exit 0
fi
check_log=$(mktemp "${TMPDIR:-/tmp}/hvd_bert_check.XXXXXX")
if ! TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -P - 2>"$check_log" <<'PY'
import horovod.torch as ht
import horovod.tensorflow as htf
import horovod.tensorflow.keras  # noqa: F401  (tf-keras callbacks, needs the patch)
assert ht.gloo_built() and ht.mpi_built(), "torch: Horovod built without Gloo or MPI"
assert htf.gloo_built() and htf.mpi_built(), "tensorflow: Horovod built without Gloo or MPI"
import hvd_bert  # noqa: F401  (installed, not just on the current folder's path)
PY
then
    cat "$check_log" >&2
    die "Horovod or hvd_bert does not load" \
        "remove the cached wheel ($CACHE/wheels) and the venv's stamps ($VENV/.hvd_bert_*), then rerun"
fi
rm -f "$check_log"
echo "$check_key" >"$check_stamp"
echo "==> [setup] ready: activate with 'source ${VENV#"$PWD"/}/bin/activate' or run '$VENV/bin/hvd-bert doctor'"
