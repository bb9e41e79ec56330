#!/usr/bin/env bash
# Build hvd_bert's image (docker/Dockerfile) with podman, or with Docker where its engine runs.
#   scripts/build_image.sh [cpu|gpu] [--target STAGE]     (make image, make image-gpu)
#   scripts/build_image.sh install      apt: podman, runc, debootstrap, squashfs-tools (root)
# It runs the set-up step here first (seconds once done), then builds from a context of
#   src/     the repository's files (git ls-files: tracked and new, not ignored ones)
#   wheels/  the Python packages of requirements.lock, each checked against its hashes (the
#            wheels downloaded once, cached by the lock) and the cached Horovod wheel
# so the image runs what CI tests, installs offline, and never rebuilds Horovod. It prints the
# image's size and the build's time, and builds nothing when the context's content, the base
# and the flags are those of the image already tagged (a label carries their hash).
#
# The base (cpu): $BASE_IMAGE if set; else python:3.11-slim-bookworm if it is here or can be
# pulled; else a Debian 12 base made here with debootstrap (Python 3.11 from Debian), tagged
# localhost/hvd_bert-base:bookworm and kept. The base (gpu): $BASE_IMAGE, default NVIDIA's
# nvcr.io/nvidia/pytorch:24.10-py3; `--target system` stops before the layers that need CUDA.
#
# Settings: HVD_BERT_IMAGE (the tag, default localhost/hvd_bert:cpu or :gpu), HVD_BERT_ENGINE
# (podman or docker), BASE_IMAGE, HVD_BERT_BASE=debootstrap (skip the pull), HVD_BERT_VENV,
# HVD_BERT_CACHE (as scripts/setup.sh).
set -Eeuo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
CACHE=${HVD_BERT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_bert}
VENV=${HVD_BERT_VENV:-$ROOT/.venv}
PYTHON_BASE=docker.io/library/python:3.11-slim-bookworm
DEBIAN_BASE=localhost/hvd_bert-base:bookworm
NGC_BASE=nvcr.io/nvidia/pytorch:24.10-py3

die() { echo "build_image: $1" >&2; [[ -z ${2:-} ]] || echo "build_image: fix: $2" >&2; exit 2; }

variant=cpu target=""
while [[ $# -gt 0 ]]; do
    case $1 in
    install)  # the apt packages: the engine, runc, debootstrap for the base, squashfs-tools
        missing=()
        for tool in podman:podman runc:runc debootstrap:debootstrap mksquashfs:squashfs-tools; do
            command -v "${tool%%:*}" >/dev/null || [[ -x /usr/sbin/${tool%%:*} ]] || missing+=("${tool#*:}")
        done
        ((${#missing[@]})) || exit 0
        [[ $(id -u) == 0 ]] || die "missing ${missing[*]} and not root" "sudo apt-get install -y ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
            || die "apt-get install ${missing[*]} failed" "read apt's error (run it by hand)"
        exit 0
        ;;
    cpu | gpu) variant=$1; shift ;;
    --target) target=${2:?--target needs a stage: system or toolkit}; shift 2 ;;
    -h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'" "usage: scripts/build_image.sh [cpu|gpu] [--target system|toolkit]" ;;
    esac
done
[[ -z $target || $target == system || $target == toolkit ]] \
    || die "unknown stage '$target'" "use --target system or --target toolkit"
tag=${HVD_BERT_IMAGE:-localhost/hvd_bert:$variant}
[[ -n $target && $target != toolkit ]] && tag=${HVD_BERT_IMAGE:-localhost/hvd_bert:$variant-$target}

# ------------------------------------------------------------------------------ the engine
# shellcheck source=scripts/engine.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/engine.sh"   # engine, limits
exists() { "$engine" image inspect "$1" >/dev/null 2>&1; }
label() { "$engine" image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }

# ------------------------------------------------------------------------------ the base
debian_base() {  # a Debian 12 minbase made with debootstrap, imported as an image, kept
    exists "$DEBIAN_BASE" && return 0
    command -v debootstrap >/dev/null || die "no base image can be pulled and debootstrap is missing" \
        "apt-get install debootstrap (or set BASE_IMAGE to an image with Debian 12 or Python 3.11)"
    [[ $(id -u) == 0 ]] || die "debootstrap needs root" "run as root once, or set BASE_IMAGE"
    local dir start=$SECONDS
    dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd_bert-debootstrap.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
    echo "==> [image] base: debootstrap --variant=minbase bookworm (about a minute)"
    debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >"$dir.log" 2>&1 \
        || { tail -n 20 "$dir.log" >&2; die "debootstrap failed (log: $dir.log)" "check access to deb.debian.org"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . | "$engine" import --quiet --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$DEBIAN_BASE" >/dev/null
    rm -rf "$dir" "$dir.log"
    trap - EXIT
    echo "    $DEBIAN_BASE made in $((SECONDS - start)) s"
}
pull() { timeout 60 "$engine" pull -q "$1" >/dev/null 2>&1; }
base=${BASE_IMAGE:-}
if [[ -z $base && $variant == cpu ]]; then
    if [[ ${HVD_BERT_BASE:-} != debootstrap ]] && { exists "$PYTHON_BASE" || { ! exists "$DEBIAN_BASE" && pull "$PYTHON_BASE"; }; }; then
        base=$PYTHON_BASE
    else
        debian_base
        base=$DEBIAN_BASE
    fi
elif [[ -z $base ]]; then
    base=$NGC_BASE
fi
if ! exists "$base" && ! pull "$base"; then
    die "the base image $base is not here and cannot be pulled" \
        "log in to its registry (NGC: $engine login nvcr.io), or set BASE_IMAGE to an image you have"
fi
base_id=$("$engine" image inspect --format '{{.Id}}' "$base")

# ------------------------------------------------------------------------------ the context
echo "==> [image] the set-up step here (Horovod's wheel, built or cached, goes into the image)"
HVD_BERT_SETUP_UNTIL=horovod bash "$ROOT/scripts/setup.sh" >/dev/null \
    || die "the set-up step failed" "run: bash scripts/setup.sh, and read its error"
ctx=$CACHE/image-context/$variant
rm -rf "$ctx" && mkdir -p "$ctx/src" "$ctx/wheels/python" "$ctx/wheels/cache"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [[ -e $f ]] && printf '%s\0' "$f"; done | tar --null -T - -c) | tar -x -C "$ctx/src"
lock=$ROOT/requirements.lock
pip_version=$(sed -n 's/^PIP_VERSION=\([^ ]*\).*/\1/p' "$ROOT/scripts/setup.sh")
args=(--build-arg "BASE_IMAGE=$base")
if [[ $variant == gpu ]]; then
    # torch's CUDA build from its index (its version pinned by requirements.txt, not the CPU venv)
    args+=(--build-arg HVD_BERT_GPU=1 --build-arg "TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cu126}")
fi
[[ -n $target ]] && args+=(--target "$target")
# the content: the files (not their times), the wheels' versions, the base, the flags
# (kept under $CACHE/image-content/ by its hash, so that a rebuild can say what changed)
manifests=$CACHE/image-content
mkdir -p "$manifests"
manifest=$manifests/.new.$$
{
    (cd "$ctx/src" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    echo "pip==$pip_version"   # (the wheels' versions: the lock, among the files)
    echo "$base_id ${args[*]}"
} >"$manifest"
content=$(sha256sum <"$manifest" | cut -c1-16)
mv -f "$manifest" "$manifests/$content"
ls -t "$manifests" | tail -n +9 | while read -r f; do rm -f "$manifests/$f"; done   # the newest 8
was=""
exists "$tag" && was=$(label "$tag" hvd_bert.content)
if [[ $was == "$content" ]]; then
    echo "==> [image] $tag is up to date (content $content): nothing to build"
    echo "    size: $("$engine" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')"
    exit 0
elif [[ -n $was && -f $manifests/$was ]]; then
    # what differs from the content the tagged image was built from: files, versions, the base
    echo "==> [image] $tag was built from other content ($was); what changed:"
    { diff <(sort "$manifests/$was") <(sort "$manifests/$content") || true; } | awk '
        /^[<>] [0-9a-f]+  \.\// { f[substr($0, 69)] = 1; next }
        /^[<>] / { v[++n] = $0 }
        END { for (p in f) files = files " " p
              if (files != "") print "    files:" files
              for (i = 1; i <= n; i++) print "    " (substr(v[i], 1, 1) == "<" ? "was " : "now ") substr(v[i], 3) }' \
        | head -n 20
fi

# ------------------------------------------------------------------------------ the build
# (the GPU image installs from the package indexes: torch's CUDA build, mpi4py and Horovod with
# NCCL built against the base's MPI and CUDA; the CPU image from the wheels gathered here)
[[ $variant == gpu ]] || {
wh=$CACHE/wheelhouse/$( (cat "$lock"; echo "pip==$pip_version") | sha256sum | cut -c1-16)
if [[ ! -f $wh/.complete ]]; then
    echo "==> [image] wheels for the image's packages (once per set of versions): $wh"
    rm -rf "$wh" && mkdir -p "$wh"
    # every file checked against the lock's hashes as it comes in (the image then installs these)
    { "$VENV/bin/python" -m pip download -q -d "$wh" --require-hashes -r "$lock" \
        && "$VENV/bin/python" -m pip download -q -d "$wh" --no-deps "pip==$pip_version"; } >"$wh.log" 2>&1 \
        || { tail -n 20 "$wh.log" >&2; die "pip could not download the wheels (log: $wh.log)" "check access to PyPI"; }
    # mpi4py as a wheel built here against this machine's Debian OpenMPI, which is the image's
    # (system.sh installs the same packages on a Debian 12 base); pip's cache has it after setup.sh
    rm -f "$wh"/mpi4py-*
    "$VENV/bin/python" -m pip wheel -q --no-deps --no-binary mpi4py -w "$wh" \
        "$(grep -ioE '^mpi4py==[^ ]+' "$lock")" >>"$wh.log" 2>&1 \
        || { tail -n 20 "$wh.log" >&2; die "could not build mpi4py's wheel (log: $wh.log)" "read its error"; }
    touch "$wh/.complete" && rm -f "$wh.log"
fi
cp -al "$wh"/. "$ctx/wheels/python/"
if [[ -d $CACHE/wheels ]]; then cp -al "$CACHE/wheels" "$ctx/wheels/cache/"; fi
}

echo "==> [image] $engine build $tag from $base"
start=$SECONDS
old=$("$engine" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
extra=()
# shellcheck disable=SC2207  # words on purpose
[[ $engine == podman ]] && extra+=(--format docker --layers $(limits))
[[ $engine == docker ]] && export DOCKER_BUILDKIT=1
"$engine" build "${extra[@]}" "${args[@]}" --label "hvd_bert.content=$content" -f "$ctx/src/docker/Dockerfile" \
    -t "$tag" "$ctx" || die "the image build failed" "read the build's error above"
# the image this one replaces, unless a container still uses it (its shared layers stay)
if [[ -n $old && $old != "$("$engine" image inspect --format '{{.Id}}' "$tag")" ]]; then
    "$engine" rmi "$old" >/dev/null 2>&1 || true
fi
size=$("$engine" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')
echo "==> [image] $tag built in $((SECONDS - start)) s ($SECONDS s in all, with the base, the set-up and the wheels); size $size"
if [[ -z $target || $target == toolkit ]]; then
    echo "    try: HVD_BERT_IMAGE=$tag scripts/container.sh run hvd-bert doctor"
fi
