# The container engine and the limits a container may have, for scripts/build_image.sh and
# scripts/container.sh (sourced; they define die()).
#   engine: HVD_BERT_ENGINE, else docker where its engine answers, else podman
engine=${HVD_BERT_ENGINE:-}
if [[ -z $engine ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null; then engine=podman
    else die "neither podman nor a running Docker engine" \
        "as root on Debian: apt-get install podman runc (or start Docker), then rerun"; fi
fi
command -v "$engine" >/dev/null || die "HVD_BERT_ENGINE=$engine is not installed" "install it or unset HVD_BERT_ENGINE"

# Raising a limit above the caller's is refused, and runc here also refused the caller's own
# process limit (96369): both are capped at values known to work (nofile 1024:20000, nproc 32768).
limits() {
    local n u
    n=$(ulimit -Hn); [[ $n == unlimited || $n -gt 20000 ]] && n=20000
    u=$(ulimit -Hu); [[ $u == unlimited || $u -gt 32768 ]] && u=32768
    echo "--ulimit nofile=$((n < 1024 ? n : 1024)):$n --ulimit nproc=$u:$u"
}
