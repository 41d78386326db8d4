#!/usr/bin/env bash
# docker_check.sh: an SGLang scenario through `cptest run --launcher docker` on the GPU machine
# (issue 12; docs/decisions.md D68). Runs: results/_docker-check (3-pass-8-of-8: PASS 8 of 8, 2026-12-02).
#
# Calls on one warm `nvidia-h200` machine: c1, c2 (install-bundle), then `bash tools/device/podman_try.sh`
# carrying .podman-debs (leaves podman under /opt/podman), then this script carrying
# .sglang-bundle/c3 and .whl (the three together exceed a call's 64 MiB). Steps:
# 1. cptest-env.sh: the bundle completed, cptest installed with its entry point under /opt/cpt.
# 2. podman's Docker-API service on a unix socket (DOCKER_HOST), configured as podman_try.sh left it,
#    with catatonit as the containers' init (the launcher asks for init=True).
# 3. An SGLang image made on the machine from its own install (no registry is reachable): the
#    interpreter's prefix, the bundle's target, /opt/cpt and /opt/cpt-deps, /usr (the driver's
#    /usr/local/nvidia left out: it is bound at run time, `driver_mounts`), /etc; imported through
#    podman with PATH, PYTHONPATH and LD_LIBRARY_PATH set; its ID pinned in a lock of this run
#    (CPTEST_IMAGE_LOCK) as the sglang engine's image. Size and seconds are logged.
# 4. `cptest run tools/device/tp1_llama_kv1_graph.cps --launcher docker` (the scenario
#    replay_check.sh ran with the process launcher: PASS 8 of 8 in run16-17), then `cptest check`.
# Returns $OUT/docker-check.log, run.json, check.txt, archive.tar.gz, lock.json, manifest.json.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/docker-check-out}
WORK=/tmp/docker-check
DEADLINE_S=${DEADLINE_S:-560}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/docker-check.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
SVC=""
finish() {
  [ -n "$SVC" ] && kill "$SVC" 2>/dev/null
  tar -C "$WORK" -czf "$OUT/archive.tar.gz" results 2>/dev/null
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-unknown}" \
    --script tools/device/docker_check.sh \
    --what "an SGLang 0.5.17 scenario through cptest's docker launcher on Podman, image made on the machine" >> "$LOG" 2>&1
}
trap finish EXIT
source tools/device/cptest-env.sh

P=/opt/podman
[ -x "$P/usr/bin/podman" ] || { say "no podman under $P: run tools/device/podman_try.sh first (same warm machine)"; exit 3; }
export PATH="$P/usr/bin:$P/usr/sbin:$P/bin:$PATH"
export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/missing-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
grep -q init_path "$P/etc/containers/containers.conf" \
  || sed -i "s|^\[containers\]|[containers]\ninit_path = \"$P/usr/bin/catatonit\"|" "$P/etc/containers/containers.conf"
# The first run (results/_docker-check/1-no-init) failed at container create: podman 4.3's Docker-API
# handler looked for the init at its built-in /usr/libexec/podman/catatonit, not at init_path.
mkdir -p /usr/libexec/podman && ln -sf "$P/usr/bin/catatonit" /usr/libexec/podman/catatonit
export CONTAINERS_CONF="$P/etc/containers/containers.conf" CONTAINERS_STORAGE_CONF="$P/etc/containers/storage.conf" \
  CONTAINERS_REGISTRIES_CONF="$P/etc/containers/registries.conf"
# podman_try.sh left vfs storage: every container then copies the whole image (gigabytes here).
# Native overlay (rootful, kernel 6.18) shares the layer; tried first in its own graph root, vfs kept
# when it fails. The backing file system and free space are logged either way. The first run wrote
# the image to the machine's disk (ext4 on a virtio disk): the import took 324 s. The graph root and
# podman's copy of the import stream now live in memory (/dev/shm; the machine has 128 GiB).
MEMROOT=/dev/shm
[ "$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)" -ge 40 ] 2>/dev/null || MEMROOT=/tmp
mkdir -p "$MEMROOT/podman-tmp" && export TMPDIR="$MEMROOT/podman-tmp"
say "memory: $(free -g | awk '/^Mem/{print $2 " GiB, " $7 " GiB available"}'); /dev/shm $(df -h --output=size,avail /dev/shm | tail -1)"
say "storage: $(findmnt -n -o FSTYPE,SOURCE --target /tmp 2>/dev/null); free $(df -h --output=avail /tmp | tail -1)"
cat > "$WORK/storage-overlay.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$MEMROOT/podman-run-overlay"
graphroot = "$MEMROOT/podman-overlay"
EOF
if CONTAINERS_STORAGE_CONF="$WORK/storage-overlay.conf" timeout 60 podman info --format '{{.Store.GraphDriverName}}' \
    2>> "$LOG" | grep -qx overlay; then
  export CONTAINERS_STORAGE_CONF="$WORK/storage-overlay.conf"
  say "storage driver: overlay"
else
  say "storage driver: vfs (overlay refused; see above)"
fi
rm -f /tmp/podman.sock
podman system service --time 0 unix:///tmp/podman.sock >> "$WORK/service.log" 2>&1 &
SVC=$!
for _ in $(seq 40); do [ -S /tmp/podman.sock ] && break; sleep 0.5; done
export DOCKER_HOST=unix:///tmp/podman.sock
say "podman service: $(curl -s --unix-socket /tmp/podman.sock http://d/_ping)"

say "making the image from this machine's install"
PREFIX=$(python3 -c 'import sys; print(sys.prefix)')
BASE=$(python3 -c 'import sys; print(sys.base_prefix)')
SGL=$(python3 -c 'import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))')
say "interpreter $(command -v python3) prefix $PREFIX base $BASE; sglang under $SGL"
DIRS=(usr etc)
for d in "$PREFIX" "$BASE" "$SGL" /opt/cpt /opt/cpt-deps /opt/cpt-env; do
  case "$d" in /usr|/usr/*) ;; *) [ -d "$d" ] && DIRS+=("${d#/}");; esac
done
for l in bin lib lib64 sbin; do [ -L "/$l" ] && DIRS+=("$l"); done
say "image contents: ${DIRS[*]} ($(du -shc --exclude=usr/local/nvidia "${DIRS[@]/#//}" 2>/dev/null | tail -1))"
du -sh --exclude=usr/local/nvidia "${DIRS[@]/#//}" /usr/* /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null \
  | sort -h | tail -12 >> "$LOG"
REF=localhost/sglang-machine:0.5.17
t=$(date +%s)
# The import takes most of a call (322 s for 16 GB: results/_docker-check/2-import-then-out-of-time):
# a second call on the same warm machine reuses the image the first one made (podman's storage is
# in /dev/shm, kept while the machine stays warm).
if timeout 60 podman image exists "$REF" 2>> "$LOG"; then
  say "image $REF already on this machine (an earlier call made it): not made again"
else
  tar -C / --exclude=usr/local/nvidia --exclude='*/__pycache__' -cf - "${DIRS[@]}" 2>> "$WORK/tar.log" \
    | timeout $(( $(left) - 200 )) podman import --change "ENV PATH=$PATH" --change "ENV PYTHONPATH=${PYTHONPATH:-}" \
        --change "ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib" - "$REF" >> "$LOG" 2>&1 \
    || { say "podman import failed"; exit 3; }
fi
ID=$(python3 -c 'import docker, sys; print(docker.DockerClient(base_url=sys.argv[1]).images.get(sys.argv[2]).attrs["Id"])' \
  "$DOCKER_HOST" "$REF")
say "image $REF ready in $(( $(date +%s) - t )) s: $ID"
python3 - "$REF" "$ID" > "$OUT/lock.json" <<'PY'
import json, sys
ref, digest = sys.argv[1], sys.argv[2]
print(json.dumps({"lock_version": 1, "images": {ref: {
    "digest": digest if digest.startswith("sha256:") else f"sha256:{digest}", "status": "pinned",
    "engine": "sglang", "driver_mounts": ["/usr/local/nvidia"],
    "note": "made on the GPU machine from its own install by tools/device/docker_check.sh"}}}, indent=1))
PY
export CPTEST_IMAGE_LOCK="$OUT/lock.json"

say "cptest run --launcher docker ($(left) s left)"
timeout --signal=TERM --kill-after=60 $(( $(left) - 60 )) python3 -m cptest run tools/device/tp1_llama_kv1_graph.cps \
  --launcher docker --json --results "$WORK/results" > "$OUT/run.json" 2>> "$LOG"
say "cptest run: exit $?"
head -c 3000 "$OUT/run.json" | tee -a "$LOG"; echo
ARCHIVE=$(find "$WORK/results" -name manifest.json -newer "$OUT/lock.json" -printf '%h\n' | head -1)
if [ -n "$ARCHIVE" ]; then
  python3 -m cptest check "$ARCHIVE" > "$OUT/check.txt" 2>&1; say "cptest check: exit $?"
  head -40 "$ARCHIVE"/logs/main*.log 2>/dev/null | grep "^\[cptest\]" | tee -a "$LOG"
fi
say "done"
