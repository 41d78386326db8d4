#!/usr/bin/env bash
# suite.sh [cptest suite options] SCENARIO...: `cptest suite` on the GPU machine, archives returned.
#
# Like qualify.sh (same setup: c3, the wheels, cptest on PYTHONPATH, the tiny models), but the
# scenarios go to one `cptest suite`, which packs them onto the machine's GPUs and CPUs (--jobs 1:
# one at a time, the comparison). Bounded by SUITE_TIMEOUT_S (SIGTERM: every running scenario tears
# down and archives `unknown`). Returns $OUT/results.tar.gz (results/<scenario>/<run>/ and
# results/_suites/<time>/), $OUT/suite.log (the suite's console), $OUT/suite.json (its --json), and
# $OUT/jit-caches.txt (cache sizes before and after).
set -uo pipefail
T0=$(date +%s)
SUITE_TIMEOUT_S=${SUITE_TIMEOUT_S:-540}
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
if [ ! -e /opt/sgl/.bundle-c3.done ]; then
  say "installing c3"
  bash .sglang-bundle/c3/install-bundle --complete > "$WORK/install-c3.log" 2>&1 \
    || { say "install-bundle --complete failed"; tail -20 "$WORK/install-c3.log" | tee -a "$LOG"; exit 3; }
fi
SGLENV_QUIET=1 source .sglang-bundle/c3/sglang-env 2>/dev/null || SGLENV_QUIET=1 source /opt/cpt-env/sglang-env
mkdir -p /opt/cpt-env && cp -f .sglang-bundle/c3/sglang-env .sglang-bundle/c3/make-tiny-models /opt/cpt-env/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/cpt-deps \
  .whl/*.whl > "$WORK/install-whl.log" 2>&1 || { say "wheel install failed"; cat "$WORK/install-whl.log"; exit 3; }
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info && cp -r cptest /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps" PYTHONUNBUFFERED=1 NO_COLOR=1
if [ ! -d .tiny-models/llama-kv4 ]; then
  say "making tiny models"
  python3 /opt/cpt-env/make-tiny-models .tiny-models --only llama-kv1,llama-kv2,llama-kv4,qwen3-kv2 >> "$LOG" 2>&1
fi
{ echo "before:"; caches; } > "$OUT/jit-caches.txt"
say "cptest suite $*"
timeout --signal=TERM --kill-after=150 "$SUITE_TIMEOUT_S" python3 -m cptest suite --json --results "$WORK/results" "$@" \
  > "$OUT/suite.json" 2>> "$LOG"
say "suite exit $?"
