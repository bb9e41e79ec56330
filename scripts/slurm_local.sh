#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, in a folder of its own (for the tests and for
# trying the job scripts): Debian's slurmctld, slurmd and munge, no cgroups, root as
# SlurmUser, the node at 127.0.0.1 with this machine's CPUs.
#   scripts/slurm_local.sh install          # apt packages (root), once
#   scripts/slurm_local.sh start DIR        # prints: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh stop DIR
set -euo pipefail
cmd=${1:-}
case $cmd in
install)
    if command -v slurmctld >/dev/null && command -v munged >/dev/null && \
       ls /usr/lib/*/slurm-wlm/mpi_pmix*.so >/dev/null 2>&1; then exit 0; fi
    [[ $(id -u) == 0 ]] || { echo "slurm_local: install needs root: apt-get install -y slurm-wlm munge libpmix2" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge libpmix2 >/dev/null
    ;;
start)
    d=$(realpath -m "${2:?folder}")
    mkdir -p "$d/state" "$d/spool" "$d/munge"
    chmod 700 "$d/munge"
    [[ -f $d/munge/munge.key ]] || { dd if=/dev/urandom of="$d/munge/munge.key" bs=1 count=1024 2>/dev/null
                                    chmod 400 "$d/munge/munge.key"; }
    munged --force -S "$d/munge/munge.sock" --key-file="$d/munge/munge.key" \
        --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed"
    host=$(hostname)
    port=${SLURM_LOCAL_PORT:-$((17000 + RANDOM % 2000 * 2))}
    cat >"$d/slurm.conf" <<CONF
ClusterName=hvdbert
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc --all) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    export SLURM_CONF=$d/slurm.conf
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 60); do
        if sinfo -h -o %T 2>/dev/null | grep -q idle; then echo "export SLURM_CONF=$SLURM_CONF"; exit 0; fi
        sleep 0.5
    done
    echo "slurm_local: the node did not become idle; see $d/slurmctld.log and $d/slurmd.log" >&2
    exit 1
    ;;
stop)
    d=$(realpath -m "${2:?folder}")
    for pid in "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/munged.pid"; do
        [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true
    done
    ;;
*)
    echo "usage: $0 install | start DIR | stop DIR" >&2
    exit 2
    ;;
esac
