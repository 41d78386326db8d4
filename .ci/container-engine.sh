#!/usr/bin/env bash
# A real Docker-API container engine for tests and CI: Podman's API service on a unix socket.
#
#   .ci/container-engine.sh start   install podman if missing, start the service, import the test
#                                   image, print the environment (KEY=VALUE lines on stdout)
#   .ci/container-engine.sh env     print the environment of a running service
#   .ci/container-engine.sh stop    remove cptest containers, stop the service by its pid
#
# Use:  set -a; eval "$(.ci/container-engine.sh start)"; set +a      (or: ... start >> "$GITHUB_ENV")
#
# Why Podman: the CPU machines have no Docker daemon, and Podman 4.3 from Debian serves the Docker
# Engine API that the docker SDK speaks, unchanged (its compat API on a unix socket). Progress goes to
# stderr so that stdout stays a clean environment listing.
#
# Environment knobs: CPTEST_ENGINE_DIR (state folder, default /tmp/cptest-engine).
# Files in the state folder: podman.sock, service.pid, service.log, containers.conf,
#   test-images.json ({"<reference>": "sha256:<image id>"}; the tests build their own lock from it).
set -euo pipefail

DIR=${CPTEST_ENGINE_DIR:-/tmp/cptest-engine}
SOCK=$DIR/podman.sock
CONF=$DIR/containers.conf
PIDFILE=$DIR/service.pid
IMAGES=$DIR/test-images.json
TEST_IMAGE=localhost/cptest-busybox:test
# Applets linked in the test image: a shell and sleep for long-running nodes, httpd to serve on
# the host network, kill/ps for signal tests.
APPLETS="sh ash sleep echo cat ls env true false kill ps httpd mkdir rm printf trap"

log() { printf '[container-engine] %s\n' "$*" >&2; }

print_env() {
    echo "DOCKER_HOST=unix://$SOCK"
    echo "CONTAINERS_CONF=$CONF"
    echo "CPTEST_TEST_IMAGES=$IMAGES"
    # With the engine up, tests/run/test_docker.py fails instead of skipping if it cannot reach it.
    echo "CPTEST_REQUIRE_ENGINE=1"
}

answers() {
    # A GET /_ping on the socket that returns "OK": the API is serving, not just bound.
    python3 - "$SOCK" <<'EOF' >/dev/null 2>&1
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
data = b""
while chunk := s.recv(4096):
    data += chunk
sys.exit(0 if data.rstrip().endswith(b"OK") else 1)
EOF
}

install_if_missing() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || missing+=(runc)
    [ -x /bin/busybox ] || missing+=(busybox-static)
    # catatonit is the init that `init=True` containers run as pid 1 (it forwards signals and reaps).
    [ -x /usr/libexec/podman/catatonit ] || [ -x /usr/bin/catatonit ] || missing+=(catatonit)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Recommends (buildah, slirp4netns, fuse-overlayfs ...) are not needed for a rootful service
    # with netns=none, and skipping them saves CI time.
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
}

write_conf() {
    cat >"$CONF" <<'EOF'
[containers]
default_ulimits = []           # the sandbox refuses setrlimit from the OCI runtime
netns = "none"                 # default network; the launcher asks for network_mode="host"
init_path = "/usr/bin/catatonit"
[engine]
cgroup_manager = "cgroupfs"    # cgroup v1 mounts and no systemd on these machines
runtime = "runc"               # crun refuses the hybrid cgroup layout here
events_logger = "file"         # no journald
EOF
}

start_service() {
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && answers; then
        log "service already running (pid $(cat "$PIDFILE"))"
        return 0
    fi
    rm -f "$SOCK"
    # setsid: its own session, so a Ctrl-C in the calling shell does not take it down mid-test.
    CONTAINERS_CONF="$CONF" setsid podman system service --time=0 "unix://$SOCK" \
        >"$DIR/service.log" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 100); do
        if answers; then
            log "service answers on $SOCK (pid $(cat "$PIDFILE"))"
            return 0
        fi
        kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
        sleep 0.2
    done
    log "service did not answer on $SOCK; its log:"
    tail -n 30 "$DIR/service.log" >&2 || true
    exit 3
}

import_test_image() {
    if ! CONTAINERS_CONF="$CONF" podman image exists "$TEST_IMAGE"; then
        local root
        root=$(mktemp -d)
        mkdir -p "$root/bin" "$root/www" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
        cp /bin/busybox "$root/bin/busybox"
        for a in $APPLETS; do ln -s busybox "$root/bin/$a"; done
        echo "cptest-busybox" >"$root/www/index.html"
        echo "root:x:0:0:root:/:/bin/sh" >"$root/etc/passwd"
        echo "root:x:0:" >"$root/etc/group"
        tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$DIR/rootfs.tar" .
        rm -rf "$root"
        CONTAINERS_CONF="$CONF" podman import -q \
            --change 'ENV PATH=/bin' --change 'CMD ["/bin/sh"]' \
            "$DIR/rootfs.tar" "$TEST_IMAGE" >&2
        log "imported $TEST_IMAGE"
    fi
    local id
    id=$(CONTAINERS_CONF="$CONF" podman image inspect --format '{{.Id}}' "$TEST_IMAGE")
    printf '{"%s": "sha256:%s"}\n' "$TEST_IMAGE" "$id" >"$IMAGES"
}

stop_service() {
    if command -v podman >/dev/null && [ -f "$CONF" ]; then
        # Containers outlive the API service (each has its own conmon): remove ours first.
        local ids
        ids=$(CONTAINERS_CONF="$CONF" podman ps -aq --filter label=cptest.launcher=docker || true)
        if [ -n "$ids" ]; then
            # shellcheck disable=SC2086
            CONTAINERS_CONF="$CONF" podman rm -f -t 0 $ids >/dev/null 2>&1 || true
        fi
    fi
    if [ -f "$PIDFILE" ]; then
        local pid
        pid=$(cat "$PIDFILE")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        fi
        rm -f "$PIDFILE"
        log "service stopped (pid $pid)"
    fi
    rm -f "$SOCK"
}

case "${1:-}" in
    start)
        t0=$(date +%s.%N)
        mkdir -p "$DIR"
        install_if_missing
        write_conf
        start_service
        import_test_image
        log "ready in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
        print_env
        ;;
    env)
        answers || { log "no service answers on $SOCK; run: $0 start"; exit 3; }
        print_env
        ;;
    stop)
        stop_service
        ;;
    *)
        echo "usage: $0 start|env|stop" >&2
        exit 2
        ;;
esac
