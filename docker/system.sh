#!/usr/bin/env bash
# The image's system layer, the same on every base (docker/Dockerfile, run as root): OpenMPI and
# the build tools scripts/setup.sh needs, Python 3.11 with venv and headers when the base has
# none (Debian 12 ships 3.11; Ubuntu bases take it from the deadsnakes archive), and the
# image's non-root user (uid and gid $1), who owns /opt/hvd_bert; ssh as the Kubeflow MPI
# Operator's pods use it (a worker's sshd as that user, docker/sshd_config; the launcher's ssh
# to port 2222 with the key the operator mounts at /home/hvd/.ssh).
set -euo pipefail
uid=${1:?usage: system.sh UID}
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
packages=(libopenmpi-dev openmpi-bin openssh-client openssh-server cmake g++ make ca-certificates)
if ! command -v python3.11 >/dev/null; then
    # shellcheck disable=SC1091
    . /etc/os-release
    if [[ $ID == ubuntu ]] && ! apt-cache show python3.11-venv >/dev/null 2>&1; then
        apt-get install -y -qq --no-install-recommends software-properties-common gpg-agent >/dev/null
        add-apt-repository -y ppa:deadsnakes/ppa
        apt-get update -qq
    fi
    packages+=(python3.11 python3.11-venv python3.11-dev)
fi
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
rm -rf /var/lib/apt/lists/*
python3.11 -c 'import venv, ensurepip' || { echo "system.sh: python3.11 has no venv/ensurepip" >&2; exit 1; }

# The image's user. A base that already has this uid (some NGC releases ship one) keeps it
# under its own name: the uid is what file ownership on bind mounts is about.
if ! getent passwd "$uid" >/dev/null; then
    getent group "$uid" >/dev/null || groupadd --gid "$uid" hvd
    useradd --create-home --uid "$uid" --gid "$uid" --shell /bin/bash hvd
fi
mkdir -p /opt/hvd_bert
chown "$uid:$uid" /opt/hvd_bert

# ssh between the pods of an MPIJob: the operator mounts the job's key at /home/hvd/.ssh (the
# MPIJob's sshAuthMountPath), the pods' host keys are that key and change with every job (no
# known_hosts to keep), and the workers' sshd listens on 2222 (docker/sshd_config). The packaged
# server's own host keys and service are not used.
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
cat >>/etc/ssh/ssh_config <<'CONF'

Host *
    Port 2222
    IdentityFile ~/.ssh/id_rsa
    IdentityFile /home/hvd/.ssh/id_rsa
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONF
