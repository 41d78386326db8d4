#!/usr/bin/env bash
# moe_check.sh: on the 1-GPU machine (call 3 of three, as replay_check.sh: carry .sglang-bundle/c3 and
# .whl), before any Qwen3-MoE scenario runs on two GPUs (docs/decisions.md D64): does SGLang 0.5.17
# load and serve cptest's tiny Qwen3-MoE, how long does it take to start, and does it compute what the
# checkpoint says?
# 1. `cptest models make qwen3-moe-kv1` into .tiny-models, its tree hash against the one pinned in
#    tests/run/test_model_store.py (written by torch 2.13 on a CPU here; the machine has torch 2.11);
# 2. SGLang TP1 on it (triton attention, CUDA graphs off, as cptest's eager runs; no probe), waiting
#    for /health_generate at most READY_S (300: the fused-MoE Triton kernels may compile for minutes
#    on a cold cache), else it is stopped and what its log says is kept;
# 3. two rounds of concurrent greedy /generate requests by token ids with logprobs (4 of 5-64 ids,
#    8 of 128-1024 ids, 16 new tokens each; tools/device/moe_check.py serve);
# 4. transformers' forward of the same checkpoint on the CPU scores SGLang's tokens: SGLang's
#    log-probabilities against float32 beside transformers' own bfloat16 floor and a model whose
#    experts were zeroed (moe_check.py compare: "consistent" or "INCONSISTENT");
# 5. if WARM=1 (default) and time is left, the same server launched again: startup on a warm cache.
# Returns $OUT/moe-check.log, summary.json (ready seconds, startup phases, the model's tree hash, the
# comparison's verdict), requests.json, compare.json, server-cold.log, server-warm.log (if run),
# jit-caches.txt, manifest.json, SHA256SUMS.
# Run as `COMMIT=<the commit, from here> bash tools/device/moe_check.sh` (timeout_s 600; DEADLINE_S
# 560 by default); READY_S, WARM and PORT may be set.
set -uo pipefail
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
READY_S=${READY_S:-300}
PORT=${PORT:-31500}
OUT=${OUT:-/tmp/moe-out}
WORK=/tmp/moe
MODEL=.tiny-models/qwen3-moe-kv1
PINNED_TREE=7d041f491f37e29b22da264a64493e6c0e3196af7c3c1ceb54dc0ea343671fe2
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/*.json "$WORK"/*.log
LOG="$OUT/moe-check.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
SERVER=""
stop_server() {  # SIGTERM to the server's process group, then SIGKILL what is left of it
  [ -n "$SERVER" ] || return 0
  kill -TERM -- "-$SERVER" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=""
}
finish() {
  stop_server
  ps -eo pid,pgid,stat,etime,args | grep -E 'sglang|cptest' | grep -v grep >> "$LOG"
  python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-unknown}" --script tools/device/moe_check.sh \
    --what "tiny Qwen3-MoE (qwen3-moe-kv1) on real SGLang 0.5.17, TP1: startup, serving, outputs vs transformers" \
    >> "$LOG" 2>&1
}
trap finish EXIT
source tools/device/cptest-env.sh

say "making qwen3-moe-kv1"
python3 -m cptest models make qwen3-moe-kv1 --models .tiny-models --json > "$WORK/models.json" 2>> "$LOG" \
  || { say "cptest models make failed"; tail -20 "$LOG"; exit 3; }
TREE=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["models"][0]["tree_sha256"])' "$WORK/models.json")
if [ "$TREE" = "$PINNED_TREE" ]; then say "tree $TREE: the pinned bytes"
else say "tree $TREE differs from the pinned $PINNED_TREE: the bytes on this machine are not the pinned ones"; fi
jit_caches() {  # as suite.sh's jit-caches.txt, and the Triton cache's fused-MoE files
  { echo "$1:"
    du -s ~/.triton/cache /tmp/torchinductor_"$(id -un)" ~/.cache/flashinfer ~/.cache/tvm-ffi 2>/dev/null
    echo "fused-MoE files in the Triton cache: $(find ~/.triton/cache -type f -iname '*moe*' 2>/dev/null | wc -l)"
  } | tee -a "$OUT/jit-caches.txt" "$LOG"
}

# launch NAME: the server in its own process group (setsid), its log in $OUT/server-NAME.log
launch() {
  local name=$1
  LAUNCH=$(date +%s.%N)
  setsid python3 -m sglang.launch_server --model-path "$MODEL" --tp-size 1 --attention-backend triton \
    --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled \
    --sampling-backend pytorch --mem-fraction-static 0.3 --max-total-tokens 65536 --skip-tokenizer-init \
    --host 127.0.0.1 --port "$PORT" > "$OUT/server-$name.log" 2>&1 &
  SERVER=$!
}
# check NAME UNTIL: wait for readiness (at most READY_S) and send the requests, none past the epoch
# UNTIL (moe_check.py serve)
check() {
  local name=$1 until=$2
  python3 tools/device/moe_check.py serve --port "$PORT" --pid "$SERVER" --launch "$LAUNCH" \
    --ready-s "$READY_S" --until "$until" --out "$WORK/requests-$name.json" 2>&1 | tee -a "$LOG"
  python3 - "$WORK/requests-$name.json" "$OUT/server-$name.log" "$LAUNCH" "$name" > "$WORK/startup-$name.json" 2>> "$LOG" <<'PY'
import json, sys
sys.path.insert(0, "tools/device")
from moe_check import startup_phases
rec = json.load(open(sys.argv[1]))
text = open(sys.argv[2], errors="replace").read()
out = {"run": sys.argv[4], "ready": rec["ready"], "ready_s": rec.get("ready_s"), "why": rec.get("why"),
       **startup_phases(text, float(sys.argv[3]), rec.get("ready_at"))}
print(json.dumps(out))
PY
  say "startup ($name): $(cat "$WORK/startup-$name.json")"
}

nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader | tee -a "$LOG"
jit_caches "before"
# The cold run may use all but the last 110 s (comparison, summary, manifest).
say "launching SGLang TP1 on qwen3-moe-kv1 (cold), ready within ${READY_S}s ($(left) s left)"
launch cold
check cold $(( T0 + DEADLINE_S - 110 ))
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | sed 's/^/gpu while serving: /' | tee -a "$LOG"
stop_server
sleep 3  # the GPU memory of SGLang's killed group
say "log tail (cold):"
tail -n 40 "$OUT/server-cold.log" | tee -a "$LOG"
grep -E "Traceback|Error|error:|MoE|moe|expert|Config file not found|Using default" "$OUT/server-cold.log" \
  | grep -v "^\s*$" | sort | uniq -c | sort -rn | head -n 30 > "$WORK/grep-cold.txt"
cat "$WORK/grep-cold.txt" >> "$LOG"
jit_caches "after the cold run"
cp "$WORK/requests-cold.json" "$OUT/requests.json" 2>/dev/null

BUDGET=$(( $(left) - 30 < 120 ? $(left) - 30 : 120 ))
if ! python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ready"] else 1)' \
    "$WORK/requests-cold.json" 2>/dev/null; then
  say "the server was not ready: nothing to compare"
elif [ "$BUDGET" -lt 20 ]; then
  say "no time left to compare ($(left) s)"
else
  say "comparing SGLang's outputs with transformers' forward of the checkpoint (at most ${BUDGET}s)"
  timeout --signal=TERM --kill-after=10 "$BUDGET" \
    python3 tools/device/moe_check.py compare "$MODEL" "$WORK/requests-cold.json" --out "$OUT/compare.json" 2>&1 \
    | grep -v "^Loading weights" | tee -a "$LOG"
fi

# The warm run: the same launch on the Triton cache the cold one filled (its startup without JIT).
if [ "${WARM:-1}" = 1 ] && [ "$(left)" -gt 150 ]; then
  say "launching the same server again (warm cache; $(left) s left)"
  launch warm
  check warm $(( T0 + DEADLINE_S - 40 ))
  stop_server
  tail -n 15 "$OUT/server-warm.log" >> "$LOG"
  jit_caches "after the warm run"
else
  say "no warm run ($(left) s left)"
fi

python3 - "$WORK" "$OUT" "$TREE" "$PINNED_TREE" > "$OUT/summary.json" 2>> "$LOG" <<'PY'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
def load(p):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
summary = {"tree_sha256": sys.argv[3], "pinned_tree": sys.argv[3] == sys.argv[4],
           "startup": {n: load(work / f"startup-{n}.json") for n in ("cold", "warm")},
           "requests": {}, "compare": None}
rec = load(work / "requests-cold.json") or {}
for name, rnd in (rec.get("rounds") or {}).items():
    reqs = rnd["requests"]
    summary["requests"][name] = {"ok": sum(r["ok"] for r in reqs), "of": len(reqs), "round_s": rnd["s"],
                                 "request_s": [r["s"] for r in reqs],
                                 "errors": [r["error"] for r in reqs if not r["ok"]][:3]}
cmp_ = load(out / "compare.json")
if cmp_:
    summary["compare"] = {k: cmp_[k] for k in ("verdict", "sglang_vs_fp32", "bf16_vs_fp32",
                                               "experts_zeroed_vs_fp32", "argmax_agree")}
print(json.dumps(summary, indent=1))
PY
cat "$OUT/summary.json" | tee -a "$LOG"
say "done"
