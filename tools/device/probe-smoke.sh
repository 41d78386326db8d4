#!/usr/bin/env bash
# probe-smoke.sh: run the cptest probe inside real SGLang 0.5.17 ranks on the 2-GPU machine.
#
# Call 3 of three (see tools/device/README.md): c1 and c2 are installed already; this call carries
# .sglang-bundle/c3 and .whl. Run from the repository root:
#   bash tools/device/probe-smoke.sh
# It installs c3, the wheels in .whl and cptest (with its sglang.srt.plugins entry point), makes
# two tiny models, then runs, each with the probe on, CUDA graphs off, a hard deadline and a
# process-group teardown:
#   a   TP2 + DCP2,                        llama-kv1, triton
#   b   TP2 + attn-cp 2 + PCP zigzag,      qwen3-kv2, triton
#   b2  as b with SGLANG_ENABLE_CP_V2=1 (only if time is left; see the README for why)
# Everything lands in ONE file, $OUT/probe-smoke.tar.gz (probe JSONL per rank, server logs,
# responses, nvidia-smi before/after, summary.txt). The whole script stops itself by DEADLINE_S.
set -uo pipefail

T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-510}          # the device call allows 600 s; keep room for the tar
OUT=${OUT:-/tmp/probe-smoke-out}
WORK=/tmp/probe-smoke
REPO=$(pwd)
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK/logs" "$WORK/evidence"
SUMMARY="$WORK/summary.txt"
SERVER_PGID=""

say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUMMARY"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

kill_group() {  # kill_group PGID: TERM, wait up to 10 s, then KILL; never touches other groups
  local g=$1 i
  [ -n "$g" ] || return 0
  kill -TERM -- "-$g" 2>/dev/null || return 0
  for i in $(seq 1 20); do kill -0 -- "-$g" 2>/dev/null || return 0; sleep 0.5; done
  say "process group $g still alive 10 s after SIGTERM; SIGKILL"
  kill -KILL -- "-$g" 2>/dev/null
  sleep 1
}

finish() {
  kill_group "$SERVER_PGID"
  SERVER_PGID=""
  nvidia-smi > "$WORK/nvidia-smi-end.txt" 2>&1
  ps -eo pid,pgid,stat,etime,args > "$WORK/ps-end.txt" 2>&1
  if grep -E 'sglang|launch_server' "$WORK/ps-end.txt" | grep -v grep >/dev/null; then
    say "WARNING: sglang processes still listed at the end (see ps-end.txt)"
  fi
  say "packing $OUT/probe-smoke.tar.gz"
  tar -C "$WORK" -czf "$OUT/probe-smoke.tar.gz" . 2>/dev/null
  ls -la "$OUT"
}
trap finish EXIT

# ---------------------------------------------------------------- 1. install
say "installing c3"
bash .sglang-bundle/c3/install-bundle --complete > "$WORK/logs/install-c3.log" 2>&1 \
  || { say "install-bundle --complete failed (c1/c2 not installed on this machine?)"; tail -20 "$WORK/logs/install-c3.log"; exit 3; }
# shellcheck disable=SC1091
source .sglang-bundle/c3/sglang-env
say "installing .whl and cptest into /opt/cpt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/cpt-deps .whl/*.whl \
  > "$WORK/logs/install-whl.log" 2>&1 || { say "wheel install failed"; cat "$WORK/logs/install-whl.log"; exit 3; }
# cptest is copied with a hand-written dist-info: no build backend (setuptools) is needed there, and
# importlib.metadata finds the entry point in every spawned scheduler through PYTHONPATH.
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info
cp -r "$REPO/cptest" /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps"
export PYTHONUNBUFFERED=1
python3 - <<'EOF' 2>&1 | tee -a "$SUMMARY"
from importlib.metadata import entry_points
import pydantic, lark, cptest.probe.plugin as p
eps = [e.value for e in entry_points(group="sglang.srt.plugins")]
print("entry points:", eps, "| pydantic", pydantic.VERSION, "| lark", lark.__version__, "| targets", len(p.TARGETS))
EOF
say "making tiny models"
python3 -m cptest models make llama-kv1 qwen3-kv2 --models .tiny-models > "$WORK/logs/models.log" 2>&1 \
  || { say "cptest models make failed"; tail -20 "$WORK/logs/models.log"; exit 3; }
nvidia-smi > "$WORK/nvidia-smi-start.txt" 2>&1
HOOKS=$(python3 -c 'from cptest.probe.forward_hooks import spec; print(spec())')

# ---------------------------------------------------------------- 2. one case
# run_case NAME PORT READY_S MODEL [extra sglang args...]; env CASE_ENV="K=V ..." for extra variables
run_case() {
  local name=$1 port=$2 ready_s=$3 model=$4; shift 4
  local dir="$WORK/evidence/$name" log="$WORK/logs/$name-server.log" rc
  mkdir -p "$dir"
  say "case $name: launching ($model, $*), ready within ${ready_s}s"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader > "$dir/gpu-before.csv" 2>&1
  # setsid: the server tree gets its own process group, which kill_group ends as a whole.
  env CPTEST_PROBE_DIR="$dir" ${CASE_ENV:-} setsid python3 -m sglang.launch_server \
    --model-path ".tiny-models/$model" --skip-tokenizer-init --attention-backend triton \
    --sampling-backend pytorch --mem-fraction-static 0.3 --max-total-tokens 32768 \
    --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled \
    --disable-custom-all-reduce --forward-hooks "$HOOKS" \
    --host 127.0.0.1 --port "$port" "$@" > "$log" 2>&1 &
  local pid=$!
  SERVER_PGID=$pid
  CASE_NAME=$name PORT=$port READY_S=$ready_s SRV=$pid OUTF="$dir/requests.json" python3 - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, os, threading, time, urllib.request as u
base = f"http://127.0.0.1:{os.environ['PORT']}"
name, srv = os.environ["CASE_NAME"], int(os.environ["SRV"])
deadline = time.monotonic() + float(os.environ["READY_S"])
ready = False
while time.monotonic() < deadline:
    try:
        os.kill(srv, 0)
    except OSError:
        print(f"{name}: server exited before ready"); break
    try:
        u.urlopen(base + "/health_generate", timeout=10); ready = True; break
    except OSError:
        time.sleep(2)
results = {"ready": ready}
if ready:
    try:
        results["server_info"] = json.loads(u.urlopen(base + "/server_info", timeout=10).read())
    except Exception as e:
        results["server_info_error"] = repr(e)
    lens = [5, 16, 33, 64]          # all >= 2*cp = 4, so zigzag can apply to every request
    out = [None] * len(lens)
    def one(i, n):
        req = {"rid": f"cptest-{i}", "input_ids": [(7 * i + 13 * j) % 1000 + 1 for j in range(n)],
               "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
        try:
            r = u.urlopen(u.Request(base + "/generate", json.dumps(req).encode(),
                                    {"Content-Type": "application/json"}), timeout=60)
            out[i] = {"len": n, "ok": True, "response": json.loads(r.read())}
        except Exception as e:
            out[i] = {"len": n, "ok": False, "error": repr(e)}
    ts = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(lens)]
    [t.start() for t in ts]; [t.join() for t in ts]
    results["requests"] = out
    print(f"{name}: ready; requests ok: {sum(1 for o in out if o and o['ok'])}/{len(out)}; "
          f"output_ids: {[o['response'].get('output_ids') if o and o['ok'] else None for o in out]}")
else:
    print(f"{name}: NOT ready")
json.dump(results, open(os.environ["OUTF"], "w"), indent=1, default=str)
EOF
  say "case $name: SIGTERM to $pid"
  kill -TERM "$pid" 2>/dev/null
  local i
  for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  wait "$pid" 2>/dev/null; rc=$?
  say "case $name: server exit status $rc (137 = SGLang's own SIGKILL of its group, normal)"
  kill_group "$pid"
  SERVER_PGID=""
  sleep 2
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader > "$dir/gpu-after.csv" 2>&1
  echo "$rc" > "$dir/exit-status"
  ls -la "$dir" | tee -a "$SUMMARY"
}

# ---------------------------------------------------------------- 3. cases
if [ "$(left)" -gt 260 ]; then
  run_case a 30000 200 llama-kv1 --tp-size 2 --dcp-size 2
else say "skipping a: $(left)s left"; fi
if [ "$(left)" -gt 190 ]; then
  run_case b 30010 150 qwen3-kv2 --tp-size 2 --attn-cp-size 2 --enable-prefill-cp --cp-strategy zigzag
else say "skipping b: $(left)s left"; fi
if [ "$(left)" -gt 170 ]; then
  CASE_ENV="SGLANG_ENABLE_CP_V2=1" run_case b2 30020 120 qwen3-kv2 \
    --tp-size 2 --attn-cp-size 2 --enable-prefill-cp --cp-strategy zigzag
else say "skipping b2: $(left)s left"; fi

# ---------------------------------------------------------------- 4. summary of the evidence
python3 - "$WORK/evidence" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import collections, sys
from pathlib import Path
from cptest.evidence import read_records
for case in sorted(Path(sys.argv[1]).iterdir()):
    for f in sorted(case.glob("*.jsonl")):
        try:
            recs, dropped = read_records(f)
        except Exception as e:
            print(f"{case.name}/{f.name}: UNREADABLE {e}"); continue
        kinds = collections.Counter(r.kind for r in recs)
        print(f"{case.name}/{f.name}: {dict(kinds)} dropped={dropped}")
        for r in recs:
            if r.kind in ("geometry", "kv_pool", "capacity", "graph") or (r.kind == "probe_note" and r.level != "info"):
                print("   ", r.model_dump_json(exclude={"v"})[:400])
        steps = [r for r in recs if r.kind == "step"]
        for s in steps[:3] + steps[-2:]:
            print("    step", s.step, s.mode, "bs", s.batch_size, "rows_in", s.rows_in, "attn", s.attn_rows,
                  "ffn", s.ffn_rows, "logits", s.logits_rows, "cp", s.cp_active,
                  "seq", dict(list(s.seq_positions.items())[:2]), "kv", dict(list(s.kv_written.items())[:2]))
EOF
say "done"
