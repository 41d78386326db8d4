#!/usr/bin/env bash
# podman_try.sh: does a container engine run on the GPU machine? (issue 12: "try Podman there once,
# only if it is cheap, and record what happened either way"; what happened: docs/measurements.md)
#
# Carry .podman-debs (Debian bookworm's podman 4.3.1, conmon, crun, runc, busybox-static and the
# libraries they link, ~20 MiB: tools/device/podman-debs.sh fetches them). Nothing is unpacked into
# /: the packages go to /opt/podman, and a library from .podman-debs/extra is used only when the
# machine's own loader cache lacks it. Every step runs under a timeout and its exit code, time and
# output are logged; a failing step does not stop the later ones.
#
# Steps: the machine (kernel, runtime, namespaces a container needs); `podman info`; a busybox image
# imported from a tarball (no registry is reachable) and run with crun and with runc; the machine's
# own root (read-only) as a container's root with the NVIDIA device nodes passed in (nvidia-smi and
# torch inside); podman's Docker-API service answering /_ping and /version on a unix socket (what
# cptest's docker launcher talks to).
# Returns $OUT/podman.log, $OUT/steps.json (step -> rc, seconds), $OUT/manifest.json, SHA256SUMS.
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/podman-out}
mkdir -p "$OUT"
LOG="$OUT/podman.log"
P=/opt/podman
STEPS=()
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
step() {  # name timeout_s argv...
  local name=$1 limit=$2; shift 2
  local t=$(date +%s%N)
  say "== $name: $*"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t) / 1000000 ))
  say "-- $name: rc $rc, ${ms} ms"
  STEPS+=("\"$name\": {\"rc\": $rc, \"ms\": $ms}")
  return $rc
}
finish() {
  (IFS=,; echo "{${STEPS[*]}}") > "$OUT/steps.json"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-unknown}" --script tools/device/podman_try.sh \
    --what "Podman 4.3.1 (Debian bookworm debs) on the GPU machine: info, import, run (crun, runc), GPU devices, Docker API" \
    >> "$LOG" 2>&1
}
trap finish EXIT

say "the machine"
step uname 10 uname -a
step os-release 10 cat /etc/os-release
step id 10 id
step caps 10 grep -i '^cap\|^nonewprivs\|^seccomp' /proc/self/status
step cgroups 10 sh -c 'mount | grep -i cgroup; cat /proc/self/cgroup'
step dev-nvidia 10 sh -c 'ls -l /dev/nvidia*'
step unshare-user 20 unshare --user --map-root-user true
step unshare-mount-pid 20 unshare --mount --pid --fork true
step unshare-net 20 unshare --net true

say "unpacking $(ls .podman-debs/*.deb | wc -l) packages into $P"
rm -rf "$P" && mkdir -p "$P/missing-libs"
for f in .podman-debs/*.deb; do dpkg -x "$f" "$P"; done
mkdir -p /tmp/podman-extra && for f in .podman-debs/extra/*.deb; do dpkg -x "$f" /tmp/podman-extra; done
# a library from extra only where the loader cache has none of that soname (the packages' soname
# links), copied under that name
for so in $(find /tmp/podman-extra -name 'lib*.so.*' -type l -printf '%f\n' | sort -u); do
  ldconfig -p | grep -q "^[[:space:]]*$so " || { cp -L "$(find /tmp/podman-extra -name "$so" | head -1)" "$P/missing-libs/$so"; say "missing here, from extra: $so"; }
done
export PATH="$P/usr/bin:$P/usr/sbin:$P/bin:$PATH"
export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/missing-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in podman conmon crun runc; do step "ldd-$b" 10 sh -c "ldd \$(command -v $b) | grep 'not found' || echo 'all libraries found'"; done
# podman and conmon start the runtime with a clean environment: wrappers carry the library path
mkdir -p "$P/wrap"
for b in usr/bin/conmon usr/bin/crun usr/sbin/runc; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$LD_LIBRARY_PATH" "$P/$b" > "$P/wrap/${b##*/}"
  chmod +x "$P/wrap/${b##*/}"
done

mkdir -p "$P/etc/containers"
# as .ci/container-engine.sh configures CI's service: no default rlimits (a sandbox may refuse the
# runtime's setrlimit), no network by default, cgroupfs, file events
cat > "$P/etc/containers/containers.conf" <<EOF
[containers]
default_ulimits = []
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "crun"
conmon_path = ["$P/wrap/conmon"]
helper_binaries_dir = ["$P/usr/lib/podman"]
[engine.runtimes]
crun = ["$P/wrap/crun"]
runc = ["$P/wrap/runc"]
[network]
default_rootless_network_cmd = "slirp4netns"
EOF
cat > "$P/etc/containers/storage.conf" <<EOF
[storage]
driver = "vfs"
runroot = "/tmp/podman-run"
graphroot = "/tmp/podman-root"
EOF
# the signature policy is read from $HOME/.config/containers first, else /etc/containers (not written)
mkdir -p "$HOME/.config/containers"
echo '{"default": [{"type": "insecureAcceptAnything"}]}' | tee "$P/etc/containers/policy.json" > "$HOME/.config/containers/policy.json"
echo 'unqualified-search-registries = []' > "$P/etc/containers/registries.conf"
export CONTAINERS_CONF="$P/etc/containers/containers.conf" CONTAINERS_STORAGE_CONF="$P/etc/containers/storage.conf" \
  CONTAINERS_REGISTRIES_CONF="$P/etc/containers/registries.conf"
PODMAN=(podman)  # local images only: no pull, so no signature policy is consulted

say "podman itself"
step version 30 podman version
step info 60 podman info

say "an image from a tarball (busybox-static), run with crun and runc"
rm -rf /tmp/bb-root && mkdir -p /tmp/bb-root/bin /tmp/bb-root/tmp
cp "$P/bin/busybox" /tmp/bb-root/bin/ && ln -s busybox /tmp/bb-root/bin/sh
step import 60 sh -c "tar -C /tmp/bb-root -cf - . | podman import - localhost/cptest-try:busybox"
step images 30 podman images --digests
step run-crun 60 "${PODMAN[@]}" run --rm --network none --runtime crun localhost/cptest-try:busybox /bin/busybox echo hello from crun
step run-runc 60 "${PODMAN[@]}" run --rm --network none --runtime runc localhost/cptest-try:busybox /bin/busybox echo hello from runc
step run-cgroupns-host 60 "${PODMAN[@]}" run --rm --network none --runtime runc --cgroupns host localhost/cptest-try:busybox /bin/busybox uname -a

say "the GPU inside a container: busybox plus the machine's /usr, /etc and /opt read-only, the NVIDIA device nodes"
# (the machine's root itself as --rootfs: runc mounts a cgroup tree over its /sys/fs/cgroup, which
# failed in the CI sandbox; the busybox image with binds is what a cptest image would look like)
rm -rf /tmp/gpu-root && cp -a /tmp/bb-root /tmp/gpu-root && mkdir -p /tmp/gpu-root/usr /tmp/gpu-root/etc /tmp/gpu-root/opt
for l in lib lib64 lib32 sbin; do [ -L "/$l" ] && ln -s "$(readlink "/$l")" "/tmp/gpu-root/$l"; done
step import-gpu 60 sh -c "tar -C /tmp/gpu-root -cf - . | podman import - localhost/cptest-try:gpu"
DEVS=()
for d in /dev/nvidia*; do [ -c "$d" ] && DEVS+=(--device "$d"); done
BINDS=(-v /usr:/usr:ro -v /etc:/etc:ro -v /opt:/opt:ro)
step gpu-ls 60 "${PODMAN[@]}" run --rm --network none --runtime runc "${BINDS[@]}" "${DEVS[@]}" \
  localhost/cptest-try:gpu /bin/busybox sh -c 'ls -l /dev | grep -i nvidia; ls /usr/local/nvidia 2>&1 | head'
step gpu-nvidia-smi 90 "${PODMAN[@]}" run --rm --network none --runtime runc "${BINDS[@]}" "${DEVS[@]}" \
  --env PATH="$PATH" localhost/cptest-try:gpu nvidia-smi -L
step gpu-torch 120 "${PODMAN[@]}" run --rm --network none --runtime runc "${BINDS[@]}" "${DEVS[@]}" \
  --env PATH="$PATH" --env HOME=/tmp --env PYTHONPATH="${PYTHONPATH:-}" localhost/cptest-try:gpu \
  python3 -c 'import torch; print("cuda", torch.cuda.is_available(), torch.cuda.device_count()); print((torch.ones(4, device="cuda") * 2).sum().item())'

say "podman's Docker-API service (what cptest's docker launcher talks to)"
rm -f /tmp/podman.sock
podman system service --time 60 unix:///tmp/podman.sock >> "$LOG" 2>&1 &
SVC=$!
for i in $(seq 20); do [ -S /tmp/podman.sock ] && break; sleep 0.5; done
step api-ping 20 curl -s --unix-socket /tmp/podman.sock http://d/_ping
step api-version 20 curl -s --unix-socket /tmp/podman.sock http://d/version
step api-images 20 curl -s --unix-socket /tmp/podman.sock http://d/images/json
kill "$SVC" 2>/dev/null
say "done"
