#!/usr/bin/env bash
# suite.sh [cptest suite options] SCENARIO...: `cptest suite` on the GPU machine, archives returned.
#
# Like qualify.sh (same setup: c3, the wheels, cptest on PYTHONPATH, the tiny models), but the
# scenarios go to one `cptest suite`, which packs them onto the machine's GPUs and CPUs (--jobs 1:
# one at a time, the comparison). Bounded by SUITE_DEADLINE_S from the script's start, set-up included
# (SIGTERM then: every running scenario tears down and archives `unknown`, and KILL_AFTER_S later the
# rest is killed, so that the archives are packed inside the call's 600 s). `--placement colocated`
# and the other `cptest suite` options pass through. Returns $OUT/results.tar.gz (results/<scenario>/<run>/ and
# results/_suites/<time>/), $OUT/suite.log (the suite's console), $OUT/suite.json (its --json), and
# $OUT/jit-caches.txt (cache sizes before and after).
set -uo pipefail
T0=$(date +%s)
SUITE_DEADLINE_S=${SUITE_DEADLINE_S:-470}
KILL_AFTER_S=${KILL_AFTER_S:-90}
OUT=${OUT:-/tmp/suite-out}
WORK=/tmp/qualify
mkdir -p "$OUT" "$WORK"
LOG="$OUT/suite.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
caches() { du -s ~/.triton/cache /tmp/torchinductor_"$(id -un)" ~/.cache/flashinfer ~/.cache/tvm-ffi 2>/dev/null; }
pack() {
  say "packing $OUT/results.tar.gz"
  { echo "after:"; caches; } >> "$OUT/jit-caches.txt"
  tar -C "$WORK" -czf "$OUT/results.tar.gz" results 2>/dev/null
  ps -eo pid,pgid,stat,etime,args | grep -E 'sglang|cptest' | grep -v grep >> "$LOG"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$LOG" 2>&1
}
trap pack EXIT
source tools/device/cptest-env.sh
{ echo "before:"; caches; } > "$OUT/jit-caches.txt"
SUITE_TIMEOUT_S=$(( SUITE_DEADLINE_S - ($(date +%s) - T0) ))
say "cptest suite $* (at most ${SUITE_TIMEOUT_S}s)"
timeout --signal=TERM --kill-after="$KILL_AFTER_S" "$SUITE_TIMEOUT_S" python3 -m cptest suite --json \
  --results "$WORK/results" "$@" > "$OUT/suite.json" 2>> "$LOG"
say "suite exit $?"
