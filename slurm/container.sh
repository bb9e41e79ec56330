# The job steps' container, sourced by the job scripts (after RESULTS is set):
#   CONTAINER_IMAGE   Pyxis (enroot): an image, e.g. /shared/hvd_bert+cpu.sqsh from
#                     `scripts/container.sh squashfs FILE`, or a registry's image
#   CONTAINER_MOUNTS  Pyxis: host:container pairs, comma-separated (default: $RESULTS, same path)
#   CONTAINER         SLURM's own OCI support (oci.conf with runc, no Pyxis): a bundle folder
#                     from `scripts/container.sh bundle DIR` (its mounts are in its config.json)
#   APP_DIR           the toolkit's folder as the steps see it: /opt/hvd_bert in the image,
#                     else $HVD_BERT_DIR (the checkout on the nodes)
# It sets container=(the srun options) and APP_DIR.
container=()
if [[ -n ${CONTAINER_IMAGE:-} && -n ${CONTAINER:-} ]]; then
    echo "set CONTAINER_IMAGE (Pyxis) or CONTAINER (an OCI bundle), not both" >&2
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
fi
APP_DIR=${APP_DIR:-$HVD_BERT_DIR}
