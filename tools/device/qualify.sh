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

if [ ! -e /opt/sgl/.bundle-c3.done ]; then
  say "installing c3"
  bash .sglang-bundle/c3/install-bundle --complete > "$WORK/install-c3.log" 2>&1 \
    || { say "install-bundle --complete failed"; tail -20 "$WORK/install-c3.log" | tee -a "$LOG"; exit 3; }
fi
SGLENV_QUIET=1 source .sglang-bundle/c3/sglang-env 2>/dev/null || SGLENV_QUIET=1 source /opt/cpt-env/sglang-env
mkdir -p /opt/cpt-env && cp -f .sglang-bundle/c3/sglang-env /opt/cpt-env/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/cpt-deps \
  .whl/*.whl > "$WORK/install-whl.log" 2>&1 || { say "wheel install failed"; cat "$WORK/install-whl.log"; exit 3; }
# cptest with a hand-written dist-info, so that every scheduler process finds the probe's entry
# point through PYTHONPATH (no build backend needed there).
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info && cp -r cptest /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps" PYTHONUNBUFFERED=1 NO_COLOR=1
if [ ! -d .tiny-models/llama-kv4 ]; then
  say "making tiny models"
  python3 .sglang-bundle/c3/make-tiny-models .tiny-models --only llama-kv1,llama-kv2,llama-kv4,qwen3-kv2 \
    >> "$LOG" 2>&1 || python3 /opt/cpt-env/make-tiny-models .tiny-models >> "$LOG" 2>&1
fi
cp -f .sglang-bundle/c3/make-tiny-models /opt/cpt-env/ 2>/dev/null

for scenario in "$@"; do
  if [ "$(left)" -lt "$MIN_LEFT_S" ]; then say "SKIPPED $scenario: only $(left) s left"; continue; fi
  budget=$(( $(left) - 20 )); [ "$budget" -gt "$RUN_TIMEOUT_S" ] && budget=$RUN_TIMEOUT_S
  say "cptest run $scenario (at most ${budget}s)"
  timeout --signal=TERM --kill-after=20 "$budget" python3 -m cptest run "$scenario" --results "$WORK/results" \
    >> "$LOG" 2>&1
  say "exit $? for $scenario"
done
