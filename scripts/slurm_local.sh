#!/usr/bin/env bash
# A SLURM cluster on this machine, in a folder of its own (for the tests and for trying the job
# scripts): Debian's slurmctld, slurmd and munge, no cgroups, root as SlurmUser.
#   scripts/slurm_local.sh install          # apt packages (root), once
#   scripts/slurm_local.sh start DIR        # one node at 127.0.0.1 with this machine's CPUs;
#                                           # prints: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh start DIR --fake-cluster
#       one slurmd per node of a running scripts/fake_cluster.sh cluster (node1..nodeN, each
#       with this machine's CPUs), slurmctld on node1; submit from a node, e.g.
#       scripts/fake_cluster.sh exec node1 env SLURM_CONF=DIR/slurm.conf sbatch -N 2 ...
#   scripts/slurm_local.sh start DIR ... --oci
#       also SLURM's OCI container support (oci.conf from scripts/container.sh oci-conf, runc):
#       srun --container=BUNDLE runs each task in an image's bundle (scripts/container.sh bundle)
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
    fake="" oci=""
    for opt in "${@:3}"; do
        case $opt in
        --fake-cluster) fake=$opt ;;
        --oci) oci=$opt ;;
        *) echo "slurm_local: unknown option '$opt' (--fake-cluster, --oci)" >&2; exit 2 ;;
        esac
    done
    mkdir -p "$d/state" "$d/spool" "$d/munge"
    chmod 700 "$d/munge"
    [[ -f $d/munge/munge.key ]] || { dd if=/dev/urandom of="$d/munge/munge.key" bs=1 count=1024 2>/dev/null
                                    chmod 400 "$d/munge/munge.key"; }
    munged --force -S "$d/munge/munge.sock" --key-file="$d/munge/munge.key" \
        --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed"
    host=$(hostname) ctld_addr=127.0.0.1
    port=${SLURM_LOCAL_PORT:-$((17000 + RANDOM % 2000 * 2))}
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if [[ -n $fake ]]; then
        fc="$here/fake_cluster.sh"
        state=${FAKE_CLUSTER_STATE:-/run/hvd_bert_cluster}
        [[ -f $state/nodes ]] || { echo "slurm_local: no fake cluster is up (scripts/fake_cluster.sh up N)" >&2; exit 1; }
        n=$(cat "$state/nodes")
        net=${FAKE_CLUSTER_NET:-10.213.7}
        host=node1 ctld_addr=$net.1
        nodes="NodeName=DEFAULT CPUs=$(nproc --all) State=UNKNOWN"
        for i in $(seq "$n"); do nodes+=$'\n'"NodeName=node$i NodeAddr=$net.$i"; done
        partition="PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    else
        nodes="NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc --all) State=UNKNOWN"
        partition="PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
    fi
    cat >"$d/slurm.conf" <<CONF
ClusterName=hvdbert
SlurmctldHost=$host($ctld_addr)
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
$nodes
$partition
CONF
    export SLURM_CONF=$d/slurm.conf
    rm -f "$d/oci.conf"
    if [[ -n $oci ]]; then bash "$(dirname "${BASH_SOURCE[0]}")/container.sh" oci-conf >"$d/oci.conf"; fi
    if [[ -n $fake ]]; then
        # The nodes share this machine's /tmp, where PMIx would put every node's files for a
        # step under the same name: each node's slurmd sees its own folder at $d/pmix instead.
        echo "PMIxCliTmpDirBase=$d/pmix" >"$d/mpi.conf"
        mkdir -p "$d/pmix"
        bash "$fc" exec node1 slurmctld -f "$SLURM_CONF"
        for i in $(seq "$n"); do
            mkdir -p "$d/spool/node$i" "$d/pmix-node$i"
            bash "$fc" exec "node$i" sh -c 'mount --bind "$1" "$2" && exec slurmd -f "$3" -N "$4"' \
                sh "$d/pmix-node$i" "$d/pmix" "$SLURM_CONF" "node$i"
        done
        want=$n
        ask=(bash "$fc" exec node1 sinfo -h -N -o %T)
    else
        mkdir -p "$d/spool/$host"
        slurmctld -f "$SLURM_CONF"
        slurmd -f "$SLURM_CONF"
        want=1
        ask=(sinfo -h -N -o %T)
    fi
    for _ in $(seq 60); do
        if [[ $("${ask[@]}" 2>/dev/null | grep -c idle) -ge $want ]]; then echo "export SLURM_CONF=$SLURM_CONF"; exit 0; fi
        sleep 0.5
    done
    echo "slurm_local: the nodes did not become idle; see $d/slurmctld.log and $d/slurmd-*.log" >&2
    exit 1
    ;;
stop)
    d=$(realpath -m "${2:?folder}")
    for pid in "$d"/slurmd-*.pid "$d/slurmctld.pid" "$d/munge/munged.pid"; do
        [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true
    done
    ;;
*)
    echo "usage: $0 install | start DIR | stop DIR" >&2
    exit 2
    ;;
esac
