#!/usr/bin/env bash
# qualify.sh SCENARIO...: run `cptest run` for each scenario on the GPU machine, archive the results.
#
# Run from the repository root on the device machine, after .sglang-bundle/c1 and c2 were installed
# by two earlier calls (tools/device/README.md). The first call of a warm machine carries
# .sglang-bundle/c3 and .whl; later calls on the same warm machine carry only .whl.
# Every archive lands in $OUT/results.tar.gz (results/<scenario>/<run>/, as `cptest run` writes
# them); the console log of each run is $OUT/qualify.log. A scenario is only started while at least
# MIN_LEFT_S seconds remain before DEADLINE_S; each run is bounded by RUN_TIMEOUT_S (SIGTERM to
# cptest, which tears its engine tree down and still archives an `unknown` verdict).
set -uo pipefail
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
MIN_LEFT_S=${MIN_LEFT_S:-150}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-330}
OUT=${OUT:-/tmp/qualify-out}
WORK=/tmp/qualify
mkdir -p "$OUT" "$WORK"
LOG="$OUT/qualify.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

pack() {
  say "packing $OUT/results.tar.gz"
  tar -C "$WORK" -czf "$OUT/results.tar.gz" results 2>/dev/null
  ps -eo pid,pgid,stat,etime,args | grep -E 'sglang|cptest' | grep -v grep >> "$LOG"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$LOG" 2>&1
}
trap pack EXIT

source tools/device/cptest-env.sh

for scenario in "$@"; do
  if [ "$(left)" -lt "$MIN_LEFT_S" ]; then say "SKIPPED $scenario: only $(left) s left"; continue; fi
  budget=$(( $(left) - 20 )); [ "$budget" -gt "$RUN_TIMEOUT_S" ] && budget=$RUN_TIMEOUT_S
  say "cptest run $scenario (at most ${budget}s)"
  timeout --signal=TERM --kill-after=20 "$budget" python3 -m cptest run "$scenario" --results "$WORK/results" \
    >> "$LOG" 2>&1
  say "exit $? for $scenario"
done
