#!/usr/bin/env bash
# rerun_elsewhere.sh ARCHIVE: `cptest rerun` of a published archive from a copy of the checkout at
# another path, with an empty model store and an empty baseline cache.
#
# What it shows: an archive carries everything a rerun needs. The other checkout has never seen the
# model, so the rerun must make it again from the archived geometry and find it by its pinned hash;
# no baseline is reused, so every server of the plan runs again; and a plan that would execute
# anything else than the archived one is refused (exit 3) instead of diffed.
# On the GPU machine after the installs, like suite.sh (carry .whl; ARCHIVE is a path in this
# checkout, e.g. results/<scenario>/<run>). Bounded by DEADLINE_S from the script's start.
# Returns $OUT/rerun.json (the rerun's --json), $OUT/rerun.log, $OUT/results.tar.gz (the archive as
# copied in and the rerun's archive) and $OUT/absolute-paths.txt (archive files naming this machine's
# paths, logs aside).
set -uo pipefail
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-/tmp/rerun-out}
WORK=/tmp/rerun-elsewhere
ARCHIVE=${1:?"usage: rerun_elsewhere.sh results/<scenario>/<run>"}
mkdir -p "$OUT"
rm -rf "$WORK"; mkdir -p "$WORK/checkout" "$WORK/models" "$WORK/baselines"
LOG="$OUT/rerun.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
finish() {
  tar -C "$WORK/checkout" -czf "$OUT/results.tar.gz" results runs 2>/dev/null
  grep -rlE "$PWD|/opt/cpt" --exclude-dir=logs "$WORK/checkout/results" "$WORK/checkout/runs" 2>/dev/null \
    | sed "s|$WORK/checkout/||" > "$OUT/absolute-paths.txt"
  say "$(wc -l < "$OUT/absolute-paths.txt") archive file(s) name a path of this machine"
}
trap finish EXIT
source tools/device/cptest-env.sh

# The other checkout: cptest and its scenarios, none of this checkout's results, models or caches.
cp -r cptest scenarios pyproject.toml "$WORK/checkout/"
mkdir -p "$WORK/checkout/$(dirname "$ARCHIVE")"
cp -r "$ARCHIVE" "$WORK/checkout/$ARCHIVE"
say "cptest rerun $ARCHIVE from $WORK/checkout, empty model store and baseline cache ($(left) s left)"
( cd "$WORK/checkout" && PYTHONPATH="$WORK/checkout:$PYTHONPATH" \
  timeout --signal=TERM --kill-after=30 $(( $(left) - 30 )) python3 -m cptest rerun "$ARCHIVE" --json \
    --results runs --models "$WORK/models" --baseline-cache "$WORK/baselines" \
    > "$OUT/rerun.json" 2>> "$LOG"
  echo "rerun exit $?" | tee -a "$LOG" )
say "model store after the rerun: $(ls "$WORK/models" | tr '\n' ' ')"
