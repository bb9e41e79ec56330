#!/usr/bin/env bash
# A cluster of N "nodes" on this one machine, for the multi-node tests and for trying multi-node
# launches by hand (root only). Each node is a network namespace with its own host name (a UTS
# namespace per process started in it), one `eth0` on a private subnet, its own sshd, and its
# own /etc/hosts and /etc/ssh (bind-mounted from /etc/netns/<ns>/, as `ip netns exec` would). The
# nodes' eth0 links meet on a bridge inside one more namespace (the hub); nothing is added to
# this machine's own network namespace, and no address outside the subnet is reachable.
#
#   scripts/fake_cluster.sh install                  # apt: openssh-server, iproute2 (once)
#   scripts/fake_cluster.sh up [N] [--link-rate R]   # N nodes (2), node1..nodeN; R e.g. 200mbit
#   scripts/fake_cluster.sh exec NODE CMD...         # run CMD on NODE (launch jobs from node1),
#                                                    # OMP_NUM_THREADS=1 unless set (shared cores)
#   scripts/fake_cluster.sh shape RATE|off           # reshape every node's link (tc tbf)
#   scripts/fake_cluster.sh kill NODE PATTERN        # kill -9 NODE's processes whose command line
#                                                    # matches PATTERN (a lost worker; sshd stays)
#   scripts/fake_cluster.sh mpijob JOB [NAMESPACE] [SLOTS]
#                                                    # the Kubeflow MPI Operator's contract: node1 is
#                                                    # JOB's launcher pod, node2..N its workers
#                                                    # (JOB-worker-<i>.JOB.NAMESPACE.svc in every
#                                                    # node's /etc/hosts), and node1's /etc/mpi/hostfile
#                                                    # is the operator's ("<worker> slots=SLOTS")
#   scripts/fake_cluster.sh status
#   scripts/fake_cluster.sh down                     # removes everything `up` made
#
# Launching from node1 (the rendezvous and mpirun's daemons must be reachable from the nodes):
#   scripts/fake_cluster.sh exec node1 .venv/bin/horovodrun -np 4 -H node1:2,node2:2 --gloo \
#       --network-interface eth0 .venv/bin/hvd-bert pretrain ...
#   scripts/fake_cluster.sh exec node1 mpirun --allow-run-as-root -np 4 -H node1:2,node2:2 \
#       --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 .venv/bin/hvd-bert pretrain ...
# Every node shares this machine's file system, so paths (the repo, .venv, data) are the same.
set -euo pipefail
P=${FAKE_CLUSTER_PREFIX:-hvdc}              # namespace names: $P-hub, $P-node1, ...
NET=${FAKE_CLUSTER_NET:-10.213.7}           # node i is $NET.i/24
STATE=${FAKE_CLUSTER_STATE:-/run/hvd_bert_cluster}

die() { echo "fake_cluster: $*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || die "$1 needs root (network namespaces, sshd)"; }
nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-node[0-9]+$" | sed "s/^$P-//" | sort -V; }

in_node() {  # in_node NODE CMD...: CMD in NODE's network namespace, with NODE as its host name
    # and NODE's /etc/hosts and /etc/ssh bound over this machine's (in a mount namespace of its
    # own). Not `ip netns exec`: that also remounts /sys, which hides the cgroup mounts slurmd needs.
    local node=$1; shift
    nsenter --net="/run/netns/$P-$node" unshare --mount --uts -- sh -c '
        hostname "$0" && mount --bind "$1/hosts" /etc/hosts && mount --bind "$1/ssh" /etc/ssh &&
        { [ ! -d "$1/mpi" ] || mount --bind "$1/mpi" /etc/mpi; } &&
        shift && exec "$@"' "$node" "/etc/netns/$P-$node" "$@"
}

shape() {  # shape RATE|off: token bucket on every node's outgoing eth0 (and the hub's ports)
    local rate=$1 node burst
    for node in $(nodes); do
        ip netns exec "$P-$node" tc qdisc del dev eth0 root 2>/dev/null || true
        ip netns exec "$P-hub" tc qdisc del dev "v-$node" root 2>/dev/null || true
        [[ $rate == off ]] && continue
        # burst: at least one GSO super-packet (64 KiB) plus headroom, or tbf drops them
        burst=256kb
        ip netns exec "$P-$node" tc qdisc add dev eth0 root tbf rate "$rate" burst $burst latency 200ms
        ip netns exec "$P-hub" tc qdisc add dev "v-$node" root tbf rate "$rate" burst $burst latency 200ms
    done
    echo "$rate" >"$STATE/link-rate"
}

down() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(hub|node[0-9]+)$" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    if [[ -f $STATE/made-etc-mpi ]]; then rmdir /etc/mpi 2>/dev/null || true; fi
    rm -rf "$STATE"
}

up() {
    local n=2 rate="" i node ns
    while [[ $# -gt 0 ]]; do
        case $1 in
        --link-rate) rate=${2:?--link-rate needs a rate, e.g. 200mbit}; shift 2 ;;
        --link-rate=*) rate=${1#*=}; shift ;;
        [0-9]*) n=$1; shift ;;
        *) die "up: unknown argument '$1' (usage: up [N] [--link-rate R])" ;;
        esac
    done
    [[ $n -ge 1 && $n -le 64 ]] || die "up: N must be 1..64, not $n"
    command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || die "no sshd: run '$0 install' (apt-get install openssh-server)"
    down
    mkdir -p "$STATE" /run/sshd
    ssh-keygen -q -t ed25519 -N "" -C "hvd_bert fake cluster" -f "$STATE/id_ed25519"
    ip netns add "$P-hub"
    ip -n "$P-hub" link set lo up
    ip -n "$P-hub" link add br0 type bridge
    ip -n "$P-hub" link set br0 up
    for i in $(seq "$n"); do
        node=node$i ns=$P-$node
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add eth0 type veth peer name "v-$node" netns "$P-hub"
        ip -n "$ns" addr add "$NET.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$P-hub" link set "v-$node" master br0 up
        mkdir -p "/etc/netns/$ns/ssh"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq "$n"); do echo "$NET.$j node$j"; done
        } >"/etc/netns/$ns/hosts"
        local etc=/etc/netns/$ns/ssh
        ssh-keygen -q -t ed25519 -N "" -f "$etc/ssh_host_ed25519_key"
        cp "$STATE/id_ed25519" "$etc/cluster_id_ed25519"
        cp "$STATE/id_ed25519.pub" "$etc/authorized_keys"
        cat >"$etc/sshd_config" <<CONF
ListenAddress $NET.$i
HostKey /etc/ssh/ssh_host_ed25519_key
PidFile $STATE/$node.sshd.pid
AuthorizedKeysFile /etc/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 200:30:400
MaxSessions 200
LogLevel ERROR
CONF
        cat >"$etc/ssh_config" <<CONF
Host *
    IdentityFile /etc/ssh/cluster_id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
CONF
        in_node "$node" /usr/sbin/sshd -f /etc/ssh/sshd_config
    done
    echo "$n" >"$STATE/nodes"
    [[ -n $rate ]] && shape "$rate"
    for i in $(seq "$n"); do  # every node reaches every node over ssh, by name
        for _ in $(seq 50); do
            if in_node node1 ssh "node$i" true 2>/dev/null; then continue 2; fi
            sleep 0.1
        done
        die "node1 cannot ssh to node$i (see: $0 exec node1 ssh -v node$i true)"
    done
    echo "fake_cluster: $n nodes up (node1..node$n at $NET.1-$n${rate:+, links shaped to $rate}); run jobs with: $0 exec node1 CMD"
}

mpijob() {  # mpijob JOB [NAMESPACE] [SLOTS]: the MPI Operator's names, hostfile and mount (v0.8.2)
    local job=${1:?mpijob JOB [NAMESPACE] [SLOTS]} ns=${2:-default} slots=${3:-1} n i node
    n=$(cat "$STATE/nodes")
    [[ $n -ge 2 ]] || die "mpijob needs a launcher and at least one worker: up 2 or more nodes"
    [[ $job =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && $ns =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && $slots =~ ^[1-9][0-9]*$ ]] \
        || die "mpijob: JOB and NAMESPACE must be Kubernetes names and SLOTS a count, not '$job' '$ns' '$slots'"
    if [[ ! -d /etc/mpi ]]; then mkdir /etc/mpi && touch "$STATE/made-etc-mpi"; fi  # (the mount point)
    for node in $(nodes); do
        {
            echo "$NET.1 $job-launcher.$job.$ns.svc $job-launcher"
            for i in $(seq 0 $((n - 2))); do echo "$NET.$((i + 2)) $job-worker-$i.$job.$ns.svc $job-worker-$i"; done
        } >>"/etc/netns/$P-$node/hosts"
    done
    mkdir -p "/etc/netns/$P-node1/mpi"
    for i in $(seq 0 $((n - 2))); do echo "$job-worker-$i.$job.$ns.svc slots=$slots"; done \
        >"/etc/netns/$P-node1/mpi/hostfile"
    echo "fake_cluster: node1 is $job-launcher, node2..node$n are $job-worker-0..$((n - 2)); /etc/mpi/hostfile on node1:"
    sed 's/^/    /' "/etc/netns/$P-node1/mpi/hostfile"
}

case ${1:-} in
install)
    command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] && command -v ip >/dev/null && command -v tc >/dev/null && exit 0
    need_root install
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server openssh-client iproute2 >/dev/null
    ;;
up) need_root up; shift; up "$@" ;;
down) need_root down; down ;;
exec)
    need_root exec
    node=${2:?exec NODE CMD...}; shift 2
    ip netns list | awk '{print $1}' | grep -qx "$P-$node" || die "no node '$node' (is the cluster up? $0 status)"
    # the nodes share this machine's cores: a rank that counted them all as its own (the
    # frameworks' default on a host of its own) would oversubscribe them N times over
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} in_node "$node" "$@"
    ;;
kill)
    need_root kill
    node=${2:?kill NODE PATTERN}; pattern=${3:?kill NODE PATTERN}
    ip netns list | awk '{print $1}' | grep -qx "$P-$node" || die "no node '$node' (is the cluster up? $0 status)"
    killed=""
    for pid in $(ip netns pids "$P-$node"); do  # (the nodes share one process table: select by namespace)
        cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || continue
        [[ $cmd == *sshd* ]] && continue
        if grep -qE -- "$pattern" <<<"$cmd"; then kill -9 "$pid" 2>/dev/null && killed="$killed $pid"; fi
    done
    [[ -n $killed ]] || die "kill: no process on $node matches '$pattern'"
    echo "fake_cluster: killed on $node:$killed"
    ;;
mpijob) need_root mpijob; [[ -d $STATE ]] || die "the cluster is not up"; shift; mpijob "$@" ;;
shape) need_root shape; [[ -d $STATE ]] || die "the cluster is not up"; shape "${2:?shape RATE|off}" ;;
status)
    if [[ -f $STATE/nodes ]]; then
        echo "nodes: $(nodes | tr '\n' ' ')"; echo "link rate: $(cat "$STATE/link-rate" 2>/dev/null || echo unshaped)"
    else
        echo "fake_cluster: not up"
    fi
    ;;
*)
    echo "usage: $0 install | up [N] [--link-rate R] | exec NODE CMD... | kill NODE PATTERN | mpijob JOB [NS] [SLOTS] | shape RATE|off | status | down" >&2
    exit 2
    ;;
esac
