#!/usr/bin/env bash
# A real Slurm cluster of two emulated nodes on this host, for the slurm launcher's tests and CI.
#
#   .ci/slurm-cluster.sh start   install Slurm and MUNGE if missing, write the configuration, start
#                                munged, slurmctld and one slurmd per node, wait until both nodes
#                                are idle, print the environment (KEY=VALUE lines on stdout)
#   .ci/slurm-cluster.sh env     print the environment of a running cluster
#   .ci/slurm-cluster.sh stop    cancel every job, stop the daemons by their pids
#
# Use:  set -a; eval "$(.ci/slurm-cluster.sh start)"; set +a
#
# Why this shape (docs/slurm.md): Debian's slurm-wlm 22.05 is built with multiple-slurmd support, so
# one host runs `slurmd -N n1` and `slurmd -N n2`, each on its own port, and Slurm schedules them as
# two nodes (NodeHostname=localhost: the node names n1/n2 resolve nowhere; addresses come from
# `scontrol show node`). No systemd here: every daemon is started by hand, its pid kept. Nothing is
# written outside the state folder except the packages: the configuration is $DIR/slurm.conf,
# named to every client by SLURM_CONF, and MUNGE runs on its own key and socket.
#
# Environment knobs: CPTEST_SLURM_DIR (state folder, default /tmp/cptest-slurm).
set -euo pipefail

DIR=${CPTEST_SLURM_DIR:-/tmp/cptest-slurm}
CONF=$DIR/slurm.conf
MUNGE_SOCK=$DIR/munge/munge.socket.2
NODES=(n1 n2)
PORTS=(17001 17002)
CTLD_PORT=16817

log() { printf '[slurm-cluster] %s\n' "$*" >&2; }

print_env() {
    echo "SLURM_CONF=$CONF"
    # With the cluster up, tests/run/test_slurm.py fails instead of skipping if it cannot use it.
    echo "CPTEST_REQUIRE_SLURM=1"
}

install_if_missing() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v srun >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Recommends pull in mail and documentation packages the daemons never use.
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
}

write_conf() {
    local cpus
    # Every emulated node claims the host's CPUs (slurmd drains a node that claims more than it has).
    cpus=$(nproc)
    mkdir -p "$DIR/state" "$DIR/munge" "$DIR/log"
    for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
    cat >"$CONF" <<EOF
# Written by .ci/slurm-cluster.sh: two emulated nodes on one host (docs/slurm.md).
ClusterName=cptest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# No cgroups to rely on in containers and CI: processes are tracked by their parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# A cancelled step gets SIGTERM, then SIGKILL this many seconds later.
KillWait=5
# Ends left-over steps and nodes quickly in CI instead of the defaults' minutes.
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=2
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[${PORTS[0]}-${PORTS[1]}] CPUs=$cpus State=UNKNOWN
PartitionName=cptest Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    touch "$DIR/plugstack.conf"
}

start_munge() {
    local key=$DIR/munge/munge.key pidfile=$DIR/munge/munged.pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        return 0
    fi
    if [ ! -s "$key" ]; then
        dd if=/dev/urandom of="$key" bs=1 count=1024 status=none
        chmod 600 "$key"
    fi
    chmod 700 "$DIR/munge"
    # --force: as root, and the state folder is not MUNGE's own /run/munge.
    munged --force --key-file="$key" --socket="$MUNGE_SOCK" --pid-file="$pidfile" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    for _ in $(seq 1 50); do [ -S "$MUNGE_SOCK" ] && return 0; sleep 0.1; done
    log "munged did not create $MUNGE_SOCK"; tail -n 20 "$DIR/log/munged.log" >&2 || true
    exit 3
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_daemons() {
    export SLURM_CONF=$CONF
    if ! alive "$DIR/slurmctld.pid"; then
        # -i: ignore state left by an earlier cluster in this folder (jobs, nodes); each start is clean.
        setsid slurmctld -i -f "$CONF" </dev/null >/dev/null 2>&1
    fi
    for n in "${NODES[@]}"; do
        if ! alive "$DIR/slurmd-$n.pid"; then
            setsid slurmd -N "$n" -f "$CONF" </dev/null >/dev/null 2>&1
        fi
    done
    local state=""
    for _ in $(seq 1 150); do
        state=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ' || true)
        if [ "$state" = "n1 idle n2 idle " ]; then
            return 0
        fi
        sleep 0.2
    done
    log "the nodes are not idle after 30 s (sinfo: '$state'); logs:"
    tail -n 15 "$DIR"/log/*.log >&2 || true
    exit 3
}

stop_cluster() {
    export SLURM_CONF=$CONF
    if [ -f "$CONF" ] && alive "$DIR/slurmctld.pid"; then
        scancel --full --quiet --partition=cptest 2>/dev/null || true
    fi
    for pidfile in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
        [ -f "$pidfile" ] || continue
        local pid
        pid=$(cat "$pidfile")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        fi
        rm -f "$pidfile"
        log "stopped $(basename "$pidfile" .pid) (pid $pid)"
    done
}

case "${1:-}" in
    start)
        t0=$(date +%s.%N)
        install_if_missing
        write_conf
        start_munge
        start_daemons
        log "two nodes idle in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s ($CONF)"
        print_env
        ;;
    env)
        SLURM_CONF=$CONF sinfo -h >/dev/null 2>&1 || { log "no cluster answers ($CONF); run: $0 start"; exit 3; }
        print_env
        ;;
    stop)
        stop_cluster
        ;;
    *)
        echo "usage: $0 start|env|stop" >&2
        exit 2
        ;;
esac
