#!/usr/bin/env bash
# measure.sh: the probe's cost in alternating windows and the workload client's fidelity, on the
# 2-GPU machine with SGLang 0.5.17 (call 3 of three, as qualify.sh: carry .sglang-bundle/c3 and .whl).
#
# 1. The probe's GPU tests and its CPU cost per decode step (benchmarks/probe_step.py, CPU and CUDA
#    tensors) on this machine.
# 2. Three servers of the tiny llama-kv1 (TP1, triton, eager, as cptest's evidence runs), each on
#    its own physical cores: p0 (GPU 0) and p1 (GPU 1) with the probe on and a run-time switch
#    (CPTEST_PROBE_SWITCH), f (GPU 1) without the probe and with a word-level tokenizer
#    (tiny_tokenizer.py) so that sglang.bench_serving can read its stream.
# 3. probe_windows.py on p0 and p1 (opposite ABBA patterns), then fidelity.py on f.
# Environment: COHORTS (9), WINDOW_S (1.5), BLOCKS (3 a cohort), CONTROL_EVERY (3: every third block a
# control; a cohort must outlast its blocks: under decode graphs 7000 steps take ~13 s), ROUNDS (6),
# SKIP_FIDELITY=1 (windows only, no server f), SKIP_TESTS=1 (no GPU tests or benchmark: a second call on the same machine), SKIP_SCORING=1 (no
# scoring_check.py against p0 at the end; p0 and p1 are stopped after the windows), SKIP_WINDOWS=1 (no p0/p1, no windows), KEEPALIVE_TOO=1 (a
# second fidelity pass with cptest's client keeping connections alive), GC_VARIANT=1 (a third client
# each fidelity round: cptest's with Python's cyclic collector off), PAIRED=1 (fidelity.py --paired:
# both clients at once, each on half of the client's CPU set, D65; ROUNDS=0 runs no pair against
# bench_serving), CONTROL_ROUNDS=N (after it, N paired rounds of cptest's client against itself),
# TRACE=1 (paired: each request's phases to its first chunk in both clients, fidelity.py --trace),
# FIDELITY_DEADLINE_S and CONTROL_DEADLINE_S (paired: start no pair of rounds after this many
# seconds of that fidelity.py),
# GRAPHS_P0=1 (p0 runs with decode CUDA graphs, SGLang's default, instead of eager: the probe's
# cost under replay next to p1's eager), GRAPHS_P1=1 (the same for p1: two servers under replay),
# P0_ENV / P1_ENV (more VAR=value words for that probed server, e.g. P1_ENV=CPTEST_PROBE_READ_EVERY=0:
# two servers that differ in one probe knob, each measured against itself in its windows),
# P0_PRELOAD / P1_PRELOAD (a folder, from the repository root, first on that server's PYTHONPATH:
# tools/device/finish_profile with P0_ENV=CPTEST_FINPROF_OUT=<dir> profiles its batches' finishing).
# On a 1-GPU machine all three servers share GPU 0.
# Run it as `COMMIT=<the commit, from here> bash tools/device/measure.sh`: the machine's copy of .git
# may be stale, so its own `git rev-parse` named an older commit in the first three runs' manifests.
# Returns $OUT/measure.log, windows.json, fidelity.json, probe-check.json (every probe line of p0/p1
# read back by cptest's reader), server-logs.tar.gz, manifest.json, SHA256SUMS.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/measure-out}
WORK=/tmp/measure
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK"/probe-* "$WORK"/server-*.log "$WORK"/switch-* "$WORK/fidelity"  # an earlier call's, same machine
LOG="$OUT/measure.log"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
# A `timeout` around an earlier call ends this script alone (bash takes SIGTERM without its EXIT
# trap), so that call's servers may still answer on these ports: the windows would measure them.
for port in 31000 31001 31002; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "port $port answers: a server of an earlier call is still up; stop it (or use a fresh machine) first"
    exit 3
  fi
done
PGS=()
finish() {
  for g in "${PGS[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  sleep 3
  for g in "${PGS[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  tar -C "$WORK" -czf "$OUT/server-logs.tar.gz" server-p0.log server-p1.log server-f.log 2>/dev/null
  python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
    --script tools/device/measure.sh \
    --what "probe overhead in run-time windows and client fidelity vs bench_serving, SGLang 0.5.17, llama-kv1 TP1" \
    >> "$LOG" 2>&1
}
trap finish EXIT
source tools/device/cptest-env.sh

say "probe tests on the GPU"
# the whole output beside the log (a failure's assertion comes back with it), its summary in the log
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -p no:cacheprovider tests/probe/test_hooks_cuda.py tests/probe/test_hooks.py \
  tests/probe/test_runtime.py tests/test_record_ranges.py > "$OUT/gpu-tests.log" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] || tail -n 3 "$OUT/gpu-tests.log" | tee -a "$LOG"
[ "${SKIP_TESTS:-0}" = 1 ] || for dev in cpu cuda; do
  python3 benchmarks/probe_step.py --steps 4000 --layers 4 --batch 64 --device $dev 2>&1 | tee -a "$LOG"
done

python3 tools/device/tiny_tokenizer.py .tiny-models/llama-kv1 .tiny-models/llama-kv1-tok >> "$LOG" 2>&1
HOOKS=$(python3 -c 'from cptest.probe.forward_hooks import spec; print(spec())')
COMMON=(--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.2
  --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled
  --disable-custom-all-reduce --host 127.0.0.1)
read -r -a CPUSETS < <(python3 tools/device/cpusets.py 4)
say "cpu sets (p0 p1 f client): ${CPUSETS[*]}"
launch() {  # name gpu port cpuset model probe(0/1) [extra args...]
  local name=$1 gpu=$2 port=$3 cpus=$4 model=$5 probe=$6; shift 6
  local envs=(CUDA_VISIBLE_DEVICES="$gpu") extra=("$@")
  if [ "$probe" = 1 ]; then
    mkdir -p "$WORK/probe-$name"
    envs+=(CPTEST_PROBE_DIR="$WORK/probe-$name" CPTEST_PROBE_SWITCH="$WORK/switch-$name" SGLANG_LOG_MS=1)
    local knobs_var="${name^^}_ENV" knobs=()
    read -r -a knobs <<< "${!knobs_var:-}"
    envs+=("${knobs[@]}")
    [ ${#knobs[@]} -eq 0 ] || say "$name: probe knobs ${knobs[*]}"
    # P0_PRELOAD / P1_PRELOAD: a folder put first on that server's PYTHONPATH, for a diagnostic's
    # sitecustomize (tools/device/finish_profile)
    local preload_var="${name^^}_PRELOAD"
    [ -z "${!preload_var:-}" ] || envs+=(PYTHONPATH="$PWD/${!preload_var}:$PYTHONPATH")
    extra+=(--forward-hooks "$HOOKS")
  fi
  env "${envs[@]}" setsid python3 -c 'import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")}); os.execvp(sys.argv[2], sys.argv[2:])' \
    "$cpus" python3 -m sglang.launch_server --model-path "$model" "${extra[@]}" --port "$port" \
    > "$WORK/server-$name.log" 2>&1 & PGS+=($!); PG_OF[$name]=$!
}
declare -A PG_OF
# One GPU (the 1-GPU kind): all three servers share GPU 0; tiny models leave it nearly empty.
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
G1=$([ "${NGPU:-0}" -ge 2 ] && echo 1 || echo 0)
say "launching p0 (GPU 0), p1 and f (GPU $G1; $NGPU GPU(s) here)"
# a cohort of 64 x (128 + 7000) tokens must fit the pool whole: no retraction inside a window
P0_GRAPHS=()  # the later flag wins: SGLang's default decode graphs on p0 (GRAPHS_P0=1)
[ "${GRAPHS_P0:-0}" = 1 ] && P0_GRAPHS=(--cuda-graph-backend-decode full)
P1_GRAPHS=()
[ "${GRAPHS_P1:-0}" = 1 ] && P1_GRAPHS=(--cuda-graph-backend-decode full)
if [ "${SKIP_WINDOWS:-0}" != 1 ]; then
  launch p0 0 31000 "${CPUSETS[0]}" .tiny-models/llama-kv1 1 "${COMMON[@]}" "${P0_GRAPHS[@]}" --skip-tokenizer-init --max-total-tokens 524288
  launch p1 "$G1" 31001 "${CPUSETS[1]}" .tiny-models/llama-kv1 1 "${COMMON[@]}" "${P1_GRAPHS[@]}" --skip-tokenizer-init --max-total-tokens 524288
fi
[ "${SKIP_FIDELITY:-0}" = 1 ] || launch f "$G1" 31002 "${CPUSETS[2]}" .tiny-models/llama-kv1-tok 0 "${COMMON[@]}" --disable-radix-cache --max-total-tokens 131072
pinned() { python3 -c 'import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")}); os.execvp(sys.argv[2], sys.argv[2:])' "$@"; }

if [ "${SKIP_WINDOWS:-0}" != 1 ]; then
  say "probe windows on p0 and p1"
  pinned "${CPUSETS[3]}" python3 tools/device/probe_windows.py --out "$OUT" \
    --server "p0:31000:$WORK/switch-p0:$WORK/server-p0.log" --server "p1:31001:$WORK/switch-p1:$WORK/server-p1.log" \
    --window-s "${WINDOW_S:-1.5}" --cohorts "${COHORTS:-9}" --blocks-per-cohort "${BLOCKS:-3}" \
    --control-every "${CONTROL_EVERY:-3}" 2>&1 | tee -a "$LOG"
  if [ "${SKIP_SCORING:-0}" = 1 ]; then
    # nothing else talks to p0 and p1: stopped, so that the fidelity pairs run on a machine like a
    # SKIP_WINDOWS call's (idle servers still poll on their cores) and the two can be pooled
    say "stopping p0 and p1 (no scoring check)"
    for name in p0 p1; do kill -TERM -- "-${PG_OF[$name]}" 2>/dev/null; done
    sleep 5
  fi
fi

if [ "${SKIP_FIDELITY:-0}" != 1 ]; then
  for i in $(seq 150); do curl -sf localhost:31002/health_generate > /dev/null && break; sleep 2; done
  if [ "${PAIRED:-0}" = 1 ]; then
    # the two clients' CPU sets: the client set halved, whether p0 and p1 run or not, so that every
    # paired run (against bench_serving, and the control) gives each client the same CPUs
    PCPUS=$(python3 -c 'import sys; c = sys.argv[1].split(","); h = len(c) // 2; print(",".join(c[:h]) + "|" + ",".join(c[h:]))' "${CPUSETS[3]}")
    if [ "${ROUNDS:-24}" -gt 0 ]; then
      say "paired fidelity on f (clients on $PCPUS)"
      python3 tools/device/fidelity.py tools/device/fidelity_llama_kv1.cps --port 31002 --out "$WORK/fidelity" \
        --paired --cpus "$PCPUS" --rounds "${ROUNDS:-24}" ${FIDELITY_DEADLINE_S:+--deadline-s "$FIDELITY_DEADLINE_S"} \
        ${TRACE:+--trace} 2>&1 \
        | grep -v "^benchmark_args=\|^Namespace(\|^Starting warmup\|^Warmup completed\|^#\|^=\|^[A-Z].*: *[0-9.]*$" | tee -a "$LOG"
      cp "$WORK/fidelity/fidelity-paired.json" "$OUT/" 2>/dev/null
    fi
    if [ "${CONTROL_ROUNDS:-0}" -gt 0 ]; then
      say "paired control on f: cptest's client against itself"
      python3 tools/device/fidelity.py tools/device/fidelity_llama_kv1.cps --port 31002 --out "$WORK/fidelity-control" \
        --paired --control --cpus "$PCPUS" --rounds "$CONTROL_ROUNDS" \
        ${CONTROL_DEADLINE_S:+--deadline-s "$CONTROL_DEADLINE_S"} 2>&1 | tee -a "$LOG"
      cp "$WORK/fidelity-control/fidelity-control.json" "$OUT/" 2>/dev/null
    fi
  else
  say "fidelity on f"
  pinned "${CPUSETS[3]}" python3 tools/device/fidelity.py tools/device/fidelity_llama_kv1.cps --port 31002 \
    --out "$WORK/fidelity" --rounds "${ROUNDS:-6}" ${GC_VARIANT:+--gc-variant} 2>&1 | grep -v "^benchmark_args=\|^Namespace(" | tee -a "$LOG"
  cp "$WORK/fidelity/fidelity.json" "$OUT/" 2>/dev/null
  if [ "${KEEPALIVE_TOO:-0}" = 1 ]; then
    say "fidelity on f, cptest's client keeping connections alive"
    pinned "${CPUSETS[3]}" python3 tools/device/fidelity.py tools/device/fidelity_llama_kv1.cps --port 31002 \
      --out "$WORK/fidelity-keepalive" --rounds "${ROUNDS:-6}" --keepalive 2>&1 \
      | grep -v "^benchmark_args=\|^Namespace(" | tee -a "$LOG"
    cp "$WORK/fidelity-keepalive/fidelity.json" "$OUT/fidelity-keepalive.json" 2>/dev/null
  fi
  fi
fi

if [ "${SKIP_SCORING:-0}" != 1 ] && [ "${SKIP_WINDOWS:-0}" != 1 ]; then
  say "teacher-forced scoring against p0 (tools/device/scoring_check.py)"
  pinned "${CPUSETS[3]}" python3 tools/device/scoring_check.py tools/device/fidelity_llama_kv1.cps --port 31000 \
    --out "$OUT" --requests 64 2>&1 | tail -n 40 | tee -a "$LOG"
fi

say "reading the probe's rank files back"
python3 - "$WORK" > "$OUT/probe-check.json" 2>> "$LOG" <<'PY'
import json, sys
from pathlib import Path
from cptest.errors import CptestError
from cptest.evidence import ProbeNote, Step, read_records
out = {}
for d in sorted(Path(sys.argv[1]).glob("probe-p*")):
    for f in sorted(d.glob("rank*.jsonl")):
        try:
            recs, dropped = read_records(f)
        except CptestError as e:  # a long side run outgrows the evidence bound: say so, read the rest
            out[f"{d.name}/{f.name}"] = {"bytes": f.stat().st_size, "not_read": e.render()}
            continue
        steps = [r for r in recs if isinstance(r, Step)]
        text = f.read_text()
        out[f"{d.name}/{f.name}"] = {
            "bytes": len(text), "records": len(recs), "truncated_lines_dropped": dropped,
            "steps": len(steps), "decode_steps": sum(s.mode == "decode" for s in steps),
            "packed_lines": text.count('"pos":"'), "block_lines": text.count('"kind":"steps"'),
            "notes": [r.message for r in recs if isinstance(r, ProbeNote)][:6]}
print(json.dumps(out, indent=1))
PY
cat "$OUT/probe-check.json" | head -40 | tee -a "$LOG"
say "done"
