# The job steps' container, sourced by the job scripts (after RESULTS is set):
#   CONTAINER_IMAGE   Pyxis (enroot): an image, e.g. /shared/hvd_bert+cpu.sqsh from
#                     `scripts/container.sh squashfs FILE`, or a registry's image
#   CONTAINER_MOUNTS  Pyxis: host:container pairs, comma-separated (default: $RESULTS, same path)
#   CONTAINER         SLURM's own OCI support (oci.conf with runc, no Pyxis): a bundle folder
#                     from `scripts/container.sh bundle DIR` (its mounts are in its config.json).
#                     SLURM 22.05 runs one task per node this way ("unexpected number of tasks");
#                     23.02 and newer, any number.
#   HVD_BERT_IMAGE    no container support in SLURM at all: each task starts its rank in this
#                     podman or Docker image through scripts/container.sh exec, with the paths in
#                     HVD_BERT_MOUNTS (default: $RESULTS) mounted at the same paths
#   APP_DIR           the toolkit's folder as the steps see it: /opt/hvd_bert in the image,
#                     else $HVD_BERT_DIR (the checkout on the nodes)
# It sets container=(the srun options), wrap=(what goes before the task's command) and APP_DIR.
CONTAINER_IMAGE=${CONTAINER_IMAGE:-} CONTAINER=${CONTAINER:-} HVD_BERT_IMAGE=${HVD_BERT_IMAGE:-}
container=() wrap=()
if (( (${#CONTAINER_IMAGE} > 0) + (${#CONTAINER} > 0) + (${#HVD_BERT_IMAGE} > 0) > 1 )); then
    echo "set one of CONTAINER_IMAGE (Pyxis), CONTAINER (an OCI bundle) and HVD_BERT_IMAGE (a wrapper)" >&2
    exit 2
fi
if [[ -n ${CONTAINER_IMAGE:-} ]]; then
    APP_DIR=${APP_DIR:-/opt/hvd_bert}
    container=(--container-image="$CONTAINER_IMAGE" --container-mounts="${CONTAINER_MOUNTS:-$RESULTS:$RESULTS}"
               --container-workdir="$APP_DIR")
elif [[ -n ${CONTAINER:-} ]]; then
    if [[ ! -f $CONTAINER/config.json ]]; then
        echo "CONTAINER=$CONTAINER is not an OCI bundle (no config.json): make one with scripts/container.sh bundle DIR" >&2
        exit 2
    fi
    APP_DIR=${APP_DIR:-/opt/hvd_bert}
    container=(--container="$CONTAINER")
elif [[ -n ${HVD_BERT_IMAGE:-} ]]; then
    APP_DIR=${APP_DIR:-/opt/hvd_bert}
    export HVD_BERT_MOUNTS=${HVD_BERT_MOUNTS:-$RESULTS}
    wrap=(bash "$HVD_BERT_DIR/scripts/container.sh" exec)
fi
APP_DIR=${APP_DIR:-$HVD_BERT_DIR}
