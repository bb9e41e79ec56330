#!/usr/bin/env bash
# hvd_bert's image (scripts/build_image.sh) at work, with podman or Docker:
#   scripts/container.sh run [CMD...]    CMD (default: hvd-bert doctor) as the image's non-root
#                                        user; host network; each path in $HVD_BERT_MOUNTS
#                                        mounted at the same path; the work dir is $PWD if mounted
#   scripts/container.sh exec CMD...     CMD as one rank of a job that horovodrun or mpirun starts
#                                        on each host, in place of python (see below): the
#                                        caller's user, and the host's network, host name,
#                                        processes, /tmp and /dev/shm; the launcher's variables
#   scripts/container.sh bundle DIR      an OCI bundle (DIR/rootfs, DIR/config.json) for SLURM's
#                                        own container support: srun --container=DIR (oci.conf:
#                                        `scripts/container.sh oci-conf`)
#   scripts/container.sh oci-conf        the oci.conf that runs such bundles with runc
#   scripts/container.sh squashfs [FILE] the image as `enroot import` makes it (a squashfs root
#                                        file system with /etc/environment and /etc/rc), for Pyxis;
#                                        kept in ~/.cache/hvd_bert/images per image id, linked to FILE
#
# Ranks in containers, two hosts, the same paths everywhere (the run folder and data mounted):
#   export HVD_BERT_MOUNTS=/shared/runs,/shared/data
#   horovodrun -np 4 -H node1:2,node2:2 --gloo scripts/container.sh exec \
#       python -m hvd_bert pretrain --set data=/shared/data --set train.output_dir=/shared/runs/p1
#   mpirun -np 4 -H node1:2,node2:2 -x HVD_BERT_MOUNTS scripts/container.sh exec python -m hvd_bert ...
#
# Settings: HVD_BERT_IMAGE (default localhost/hvd_bert:cpu), HVD_BERT_MOUNTS (comma-separated host
# paths), HVD_BERT_ENGINE (podman or docker; default docker where its engine runs, else podman),
# HVD_BERT_RUNTIME (podman's OCI runtime; default runc where installed), HVD_BERT_SQUASH_OPTIONS
# (mksquashfs's compression, default -comp lz4; enroot's own default is -comp lzo -noD).
set -euo pipefail
IMAGE=${HVD_BERT_IMAGE:-localhost/hvd_bert:cpu}
die() { echo "container: $1" >&2; [[ -z ${2:-} ]] || echo "container: fix: $2" >&2; exit 2; }

# (inside the container) _supervise WRAPPER_PID CMD...: see exec below
if [[ ${1:-} == _supervise ]]; then
    wrapper=$2; shift 2
    "$@" &
    cmd=$!
    trap 'kill -TERM $cmd 2>/dev/null' TERM INT HUP
    while kill -0 "$cmd" 2>/dev/null; do
        if ! kill -0 "$wrapper" 2>/dev/null; then
            kill -TERM "$cmd" 2>/dev/null; sleep 5; kill -KILL "$cmd" 2>/dev/null; break
        fi
        sleep 0.5
    done
    wait "$cmd"
    exit
fi

# shellcheck source=scripts/engine.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/engine.sh"   # engine, limits
need_image() {
    "$engine" image inspect "$IMAGE" >/dev/null 2>&1 \
        || die "no image $IMAGE here" "build it: make image (scripts/build_image.sh), or set HVD_BERT_IMAGE"
}

# The options every container gets: its limits, podman's runtime, and the host paths named in
# HVD_BERT_MOUNTS at the same paths.
common() {
    # shellcheck disable=SC2207  # words on purpose
    opts=(--rm --network host $(limits))
    if [[ $engine == podman ]]; then
        local rt=${HVD_BERT_RUNTIME:-}
        [[ -z $rt ]] && command -v runc >/dev/null && rt=runc
        [[ -n $rt ]] && opts=(--runtime "$rt" "${opts[@]}")
    fi
    local p workdir=""
    IFS=, read -r -a paths <<<"${HVD_BERT_MOUNTS:-}"
    for p in "${paths[@]}"; do
        [[ -z $p ]] && continue
        [[ -e $p ]] || die "HVD_BERT_MOUNTS names $p, which does not exist" "create it, or remove it from HVD_BERT_MOUNTS"
        p=$(realpath "$p")
        opts+=(--volume "$p:$p")
        [[ $PWD == "$p" || $PWD == "$p"/* ]] && workdir=$PWD
    done
    [[ -n $workdir ]] && opts+=(--workdir "$workdir")
    return 0
}

# The image as `enroot import` makes it: its root file system in a squashfs file, with what enroot
# writes from the image's configuration: /etc/environment (its ENV) and /etc/rc, which
# `enroot start` runs (the work dir, then the command given or the image's CMD). Made straight
# from the image's mounted layers, once per image id (cached; the previous one is removed).
squashfs_of_image() {
    command -v mksquashfs >/dev/null || die "mksquashfs is missing" "apt-get install squashfs-tools"
    local id cache sqsh meta mnt
    id=$("$engine" image inspect --format '{{.Id}}' "$IMAGE")
    cache=${HVD_BERT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_bert}/images
    sqsh=$cache/hvd_bert-${id:0:16}.sqsh
    if [[ ! -f $sqsh ]]; then
        mkdir -p "$cache"
        meta=$(mktemp -d)
        "$engine" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d' \
            >"$meta/environment"
        local workdir cmd
        workdir=$("$engine" image inspect --format '{{.Config.WorkingDir}}' "$IMAGE")
        cmd=$("$engine" image inspect --format '{{range .Config.Cmd}}{{printf "%q " .}}{{end}}' "$IMAGE")
        # shellcheck disable=SC2016  # $# and $@ are /etc/rc's own
        printf 'cd %q || exit 1\nif [ $# -gt 0 ]; then exec "$@"; else exec %s; fi\n' "${workdir:-/}" "$cmd" \
            >"$meta/rc"
        if [[ $engine == podman ]]; then  # the layers as they are, no copy
            mnt=$("$engine" image mount "$IMAGE") || die "cannot mount $IMAGE's file system" "run as root"
        else                              # Docker has no image mount: a copy of its file system
            mnt=$meta/rootfs cid=$("$engine" create "$IMAGE")
            mkdir "$mnt" && "$engine" export "$cid" | tar -x -C "$mnt"
            "$engine" rm "$cid" >/dev/null
        fi
        local ok=1
        # shellcheck disable=SC2086  # options are words
        mksquashfs "$mnt" "$sqsh.tmp" ${HVD_BERT_SQUASH_OPTIONS:--comp lz4} -noappend -quiet -no-progress \
            -p "etc/environment f 644 0 0 cat $meta/environment" -p "etc/rc f 644 0 0 cat $meta/rc" \
            -e etc/environment etc/rc >/dev/null || ok=0
        if [[ $engine == podman ]]; then "$engine" image unmount "$IMAGE" >/dev/null; fi
        rm -rf "$meta"
        ((ok)) || { rm -f "$sqsh.tmp"; die "mksquashfs failed" "see its error above (disk space?)"; }
        rm -f "$cache"/hvd_bert-*.sqsh
        mv "$sqsh.tmp" "$sqsh"
    fi
    echo "$sqsh"
}

case ${1:-} in
run)
    shift
    need_image
    common
    tty=()
    [[ -t 0 && -t 1 ]] && tty=(--interactive --tty)
    exec "$engine" run "${opts[@]}" "${tty[@]}" "$IMAGE" "$@"
    ;;
exec)
    shift
    [[ $# -gt 0 ]] || die "exec needs a command" "e.g. scripts/container.sh exec python -m hvd_bert pretrain ..."
    common
    # the launcher's variables (Horovod's rendezvous, OpenMPI's and PMIx's, SLURM's), not the host's
    # PATH, HOME or PYTHONPATH, which name places on the host
    envs=()
    while IFS= read -r name; do envs+=(--env "$name"); done < <(compgen -e | grep -E \
        '^(HOROVOD_|OMPI_|PMIX_|OPAL_|PRTE_|SLURM_|HVD_BERT_|NCCL_|TF_|OMP_NUM_THREADS$|CUDA_VISIBLE_DEVICES$|PYTHONUNBUFFERED$)')
    [[ $PWD == /tmp || $PWD == /tmp/* ]] || opts+=(--volume "$PWD:$PWD")
    # A launcher that gives up on a job kills its ranks' process groups, SIGKILL at the end: the
    # container must not outlive this wrapper. In it, _supervise runs the command and ends it
    # when this wrapper's process (seen through --pid host) is gone; a signal is passed on.
    name=hvd_bert-rank-$(hostname)-$$-$RANDOM
    trap '"$engine" rm -f "$name" >/dev/null 2>&1 || true' EXIT
    "$engine" run "${opts[@]}" --name "$name" --uts host --ipc host --pid host --volume /tmp:/tmp \
        --volume /dev/shm:/dev/shm --user "$(id -u):$(id -g)" --workdir "$PWD" "${envs[@]}" "$IMAGE" \
        bash /opt/hvd_bert/scripts/container.sh _supervise $$ "$@" &
    child=$!
    trap 'kill -TERM $child 2>/dev/null' TERM INT HUP
    rc=0
    while :; do  # (a trapped signal ends wait early: wait again until podman has exited)
        wait "$child" && rc=0 || rc=$?
        kill -0 "$child" 2>/dev/null || break
    done
    exit "$rc"
    ;;
bundle)
    dir=${2:?usage: scripts/container.sh bundle DIR}
    need_image
    command -v runc >/dev/null || die "runc is missing" "apt-get install runc"
    [[ ! -e $dir/rootfs ]] || die "$dir/rootfs exists already" "remove $dir, or name a new folder"
    sqsh=$(squashfs_of_image)
    mkdir -p "$dir"
    dir=$(realpath "$dir")
    tmp=$(mktemp -d "$dir/.bundle.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    unsquashfs -q -n -d "$tmp/rootfs" "$sqsh" >/dev/null
    (cd "$tmp" && runc spec)
    "$engine" image inspect --format '{{json .Config}}' "$IMAGE" >"$tmp/image.json"
    python3 - "$dir" "$tmp" "${HVD_BERT_MOUNTS:-}" <<'PY'
import json, os, sys
d, tmp, mounts = sys.argv[1], sys.argv[2], [m for m in sys.argv[3].split(",") if m]
spec = json.load(open(os.path.join(tmp, "config.json")))
image = json.load(open(os.path.join(tmp, "image.json")))
# SLURM sets the command, the environment and the user of each task; the image gives the rest.
spec["root"] = {"path": os.path.join(d, "rootfs"), "readonly": False}
proc = spec["process"]
proc.update(terminal=False, args=image.get("Cmd") or ["/bin/bash"], env=image.get("Env") or [],
            cwd=image.get("WorkingDir") or "/")
proc["rlimits"] = [{"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 20000}]
# The host's network, host name, processes and IPC (ranks on a node talk over loopback and shared
# memory; PMIx's files live under /tmp): only the mount namespace is the container's own.
spec["linux"]["namespaces"] = [{"type": "mount"}]
spec.pop("hostname", None)
spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in ("/dev/shm", "/sys")]
binds = [("/tmp", "/tmp"), ("/dev/shm", "/dev/shm"), ("/etc/hosts", "/etc/hosts"),
         ("/etc/resolv.conf", "/etc/resolv.conf"), ("/sys", "/sys")]
binds += [(os.path.realpath(m), os.path.realpath(m)) for m in mounts]
for src, dst in binds:
    spec["mounts"].append({"destination": dst, "type": "bind", "source": src, "options": ["rbind", "rw"]})
json.dump(spec, open(os.path.join(tmp, "config.json"), "w"), indent=2)
PY
    mv "$tmp/rootfs" "$dir/rootfs"
    mv "$tmp/config.json" "$dir/config.json"
    rm -rf "$tmp"
    trap - EXIT
    echo "container: OCI bundle of $IMAGE in $dir (srun --container=$dir; oci.conf: $0 oci-conf)"
    ;;
oci-conf)
    # runc's state in /run/hvd_bert-oci; %n.%u.%j.%s.%t names one task's container
    id="%n.%u.%j.%s.%t"
    cat <<CONF
# SLURM's OCI container support with runc (srun --container=BUNDLE): put this file next to
# slurm.conf as oci.conf; the bundle comes from: scripts/container.sh bundle DIR
RunTimeQuery="runc --root=/run/hvd_bert-oci state $id"
RunTimeKill="runc --root=/run/hvd_bert-oci kill -a $id"
RunTimeDelete="runc --root=/run/hvd_bert-oci delete --force $id"
RunTimeRun="runc --root=/run/hvd_bert-oci run $id -b %b"
CONF
    ;;
squashfs)
    need_image
    sqsh=$(squashfs_of_image)
    if [[ -n ${2:-} ]]; then
        out=$(realpath -m "$2")
        ln -f "$sqsh" "$out" 2>/dev/null || cp "$sqsh" "$out"
    else
        out=$sqsh
    fi
    echo "container: $out ($(du -h "$out" | cut -f1)), as enroot import makes it; Pyxis: srun --container-image=$out"
    ;;
*)
    sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
