#!/usr/bin/env bash
# replay_check.sh: on the 1-GPU machine (call 3 of three, as measure.sh: carry .sglang-bundle/c3 and
# .whl), the part of issue 13 one GPU can show on real SGLang 0.5.17:
# 1. the probe's GPU tests (the copy paths that replay records now take too);
# 2. `cptest run tools/device/tp1_llama_kv1_graph.cps`: decode CUDA graphs captured on a TP1 server,
#    every replayed decode step recorded (D58), pool samples through a fill-and-drain workload
#    (D59), graph parity against the eager twin (D60);
# 3. if time is left, `cptest rerun` of that archive from a copy of the checkout at another path
#    (issue 12: a rerun that resolves its model by content on another checkout), and its diff.
# Returns $OUT/replay-check.log, run.json, evidence-summary.json, rerun.json (if run),
# archives.tar.gz (the run's archive and the rerun's), manifest.json, SHA256SUMS.
# Run as `COMMIT=<the commit, from here> bash tools/device/replay_check.sh`.
set -uo pipefail
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-/tmp/replay-out}
WORK=/tmp/replay
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/results" "$WORK/elsewhere"
LOG="$OUT/replay-check.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
finish() {
  tar -C "$WORK" -czf "$OUT/archives.tar.gz" results elsewhere/checkout/.cptest/runs 2>/dev/null
  ps -eo pid,pgid,stat,etime,args | grep -E 'sglang|cptest' | grep -v grep >> "$LOG"
  python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-unknown}" --script tools/device/replay_check.sh \
    --what "CUDA-graph replay records, pool samples and graph parity on real SGLang 0.5.17, TP1; portable rerun" \
    >> "$LOG" 2>&1
}
trap finish EXIT
source tools/device/cptest-env.sh

say "probe tests on the GPU"
python3 -m pytest -p no:cacheprovider tests/probe/test_hooks_cuda.py tests/probe/test_hooks.py 2>&1 | tail -n 3 | tee -a "$LOG"

say "cptest run tools/device/tp1_llama_kv1_graph.cps ($(left) s left)"
timeout --signal=TERM --kill-after=60 $(( $(left) - 120 )) python3 -m cptest run tools/device/tp1_llama_kv1_graph.cps \
  --json --results "$WORK/results" > "$OUT/run.json" 2>> "$LOG"
say "run exit $?"
ARCHIVE=$(ls -d "$WORK"/results/tp1_llama_kv1_graph/*/ 2>/dev/null | head -n 1)

say "what the main server's rank file holds"
python3 - "$ARCHIVE" > "$OUT/evidence-summary.json" 2>> "$LOG" <<'PY'
import collections, json, sys
from pathlib import Path
from cptest.evidence import Graph, PoolSample, ProbeNote, Step, read_records
out = {}
for role in ("main", "eager"):
    f = Path(sys.argv[1]) / "evidence" / role / "rank0.jsonl"
    if not f.exists():
        out[role] = "no rank file"
        continue
    recs, dropped = read_records(f)
    steps = [r for r in recs if isinstance(r, Step)]
    replays = [s for s in steps if s.graph_rows is not None]
    pool = [r for r in recs if isinstance(r, PoolSample)]
    out[role] = {
        "records": len(recs), "dropped": dropped, "steps": len(steps),
        "by_mode": dict(collections.Counter(s.mode for s in steps)),
        "replayed_steps": len(replays),
        "graph_rows": dict(collections.Counter(f"{s.rows_in}->{s.graph_rows}" for s in replays).most_common(12)),
        "replays_with_positions": sum(bool(s.seq_positions) for s in replays),
        "first_replay": replays[0].model_dump(mode="json") if replays else None,
        "graph_records": [r.model_dump(mode="json") for r in recs if isinstance(r, Graph)][:8],
        "pool_samples": len(pool),
        "pool_peak": ({**max(pool, key=lambda p: p.used).model_dump(mode="json"),
                       "used": max(p.used for p in pool)} if pool else None),
        "pool_last": {**pool[-1].model_dump(mode="json"), "used": pool[-1].used} if pool else None,
        "notes": [r.message for r in recs if isinstance(r, ProbeNote)][:10],
    }
print(json.dumps(out, indent=1))
PY
head -c 6000 "$OUT/evidence-summary.json" | tee -a "$LOG"

if [ -n "$ARCHIVE" ] && [ "$(left)" -gt 150 ]; then
  say "cptest rerun from a copy of the checkout at another path ($(left) s left)"
  mkdir -p "$WORK/elsewhere/checkout"
  cp -r cptest scenarios tools pyproject.toml "$WORK/elsewhere/checkout/"
  # The archive as published would be: copied in, under results/ of the other checkout.
  mkdir -p "$WORK/elsewhere/checkout/results/tp1_llama_kv1_graph"
  cp -r "$ARCHIVE" "$WORK/elsewhere/checkout/results/tp1_llama_kv1_graph/"
  ( cd "$WORK/elsewhere/checkout" && PYTHONPATH="$WORK/elsewhere/checkout:$PYTHONPATH" \
    timeout --signal=TERM --kill-after=30 $(( $(left) - 30 )) python3 -m cptest rerun \
    "results/tp1_llama_kv1_graph/$(basename "$ARCHIVE")" --json > "$OUT/rerun.json" 2>> "$LOG"
    echo "rerun exit $?" | tee -a "$LOG" )
else
  say "no time left for the rerun ($(left) s)"
fi
say "absolute paths of this machine in the archives' own files (logs are SGLang's words, D43)"
grep -rlE "$PWD|/tmp/replay|/opt/cpt" --exclude-dir=logs "$WORK/results" "$WORK/elsewhere/checkout/.cptest/runs" \
  2>/dev/null | sed "s|$WORK/||" > "$OUT/absolute-paths.txt"
echo "$(wc -l < "$OUT/absolute-paths.txt") file(s) name one" | tee -a "$LOG"
say "done"
