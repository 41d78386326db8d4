#!/usr/bin/env bash
# probe-overhead.sh: decode throughput of real SGLang 0.5.17 with and without the cptest probe.
#
# Call 3 of three on the 2-GPU machine (c1 and c2 installed by the two calls before; this call
# carries .sglang-bundle/c3 and .whl). First the probe's GPU test (tests/probe/test_hooks_cuda.py:
# a hooked step returns while its positions are still being computed, and records them right).
# Then four identical eager servers (TP1, llama-kv1, triton, every CUDA-graph phase disabled, as
# cptest's evidence runs are): on each GPU one "on" (CPTEST_PROBE_DIR set, the probe's
# --forward-hooks) and one "off" (neither; the plugin is then inert), so that on and off share a
# GPU. The same closed-loop batch (CONC requests of PROMPT tokens, NEW greedy tokens each,
# ignore_eos) runs ROUNDS times on three pairs, on0 with off1, off0 with on1 and the control off0
# with off1, the two of a pair at the same time (this machine's speed drifts by tens of percent over
# seconds: a pair sees the same drift); every server runs on its own physical cores. Decode
# throughput is output tokens per second of wall time; per round the geometric mean of the two
# on/off ratios cancels the GPUs' difference, and the overhead is 1 - its median over rounds. Last, the "on" servers' evidence is checked: every request's K/V positions written
# exactly once each, from its first uncached position to the last fed-back token.
# Result: $OUT/overhead.json, overhead.log, server-logs.tar.gz, probe-evidence.tar.gz (the probe's
# rank files), manifest.json (environment, commit, file hashes) and SHA256SUMS.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/overhead-out}; W=/tmp/overhead; mkdir -p "$OUT" "$W"
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/overhead.log"; }
PGS=()
cleanup() { for g in "${PGS[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done; }
trap cleanup EXIT
bash .sglang-bundle/c3/install-bundle --complete > "$W/install.log" 2>&1 || { tail "$W/install.log"; exit 3; }
SGLENV_QUIET=1 source .sglang-bundle/c3/sglang-env
python3 -m pip install -q --no-index --no-deps --target /opt/cpt-deps .whl/*.whl > /dev/null 2>&1
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info && cp -r cptest /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps" PYTHONUNBUFFERED=1
say "probe GPU test"
python3 -m pytest -s -p no:cacheprovider tests/probe/test_hooks_cuda.py tests/probe/test_hooks.py \
  tests/probe/test_runtime.py 2>&1 | tail -n 5 | tee -a "$OUT/overhead.log"
say "probe cost per step, CPU tensors and CUDA tensors (decode batch of 64, 4 layers as llama-kv1)"
for dev in ${BENCH_DEVICES:-cpu cuda}; do
  python3 benchmarks/probe_step.py --steps 2000 --layers 4 --batch 64 --device $dev 2>&1 | tee -a "$OUT/overhead.log"
done
python3 -m cptest models make llama-kv1 --models .tiny-models > "$W/models.log" 2>&1
HOOKS=$(python3 -c 'from cptest.probe.forward_hooks import spec; print(spec())')
COMMON=(--model-path .tiny-models/llama-kv1 --skip-tokenizer-init --attention-backend triton
  --sampling-backend pytorch --mem-fraction-static 0.25 --max-total-tokens 65536
  --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled --disable-custom-all-reduce
  --host 127.0.0.1)
# Each server gets its own whole physical cores, the client the rest: on a shared pool the
# servers' busy scheduler threads met on the same cores and whole batches ran a third slower.
read -r -a CPUSETS < <(python3 tools/device/cpusets.py 5)
say "cpu sets (on0 off0 on1 off1 client): ${CPUSETS[*]}"
pinned() {  # cpuset argv...: run argv on those CPUs only
  local cpus=$1; shift
  python3 -c 'import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")}); os.execvp(sys.argv[2], sys.argv[2:])' "$cpus" "$@"
}
launch() {  # name gpu port probe(0/1) cpuset
  local extra=() envs=(CUDA_VISIBLE_DEVICES="$2")
  if [ "$4" = 1 ]; then
    mkdir -p "$W/probe-$1"; envs+=(CPTEST_PROBE_DIR="$W/probe-$1"); extra=(--forward-hooks "$HOOKS")
  fi
  env "${envs[@]}" setsid python3 -c 'import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")}); os.execvp(sys.argv[2], sys.argv[2:])' \
    "$5" python3 -m sglang.launch_server "${COMMON[@]}" "${extra[@]}" --port "$3" > "$W/server-$1.log" 2>&1 & PGS+=($!)
}
say "launching on0/off0 on GPU 0, on1/off1 on GPU 1"
launch on0 0 31000 1 "${CPUSETS[0]}"; launch off0 0 31001 0 "${CPUSETS[1]}"
launch on1 1 31002 1 "${CPUSETS[2]}"; launch off1 1 31003 0 "${CPUSETS[3]}"
ROUNDS=${ROUNDS:-8} CONC=${CONC:-64} PROMPT=${PROMPT:-128} NEW=${NEW:-384} OUTD="$OUT" PROBED="$W" \
pinned "${CPUSETS[4]}" python3 - <<'EOF' 2>&1 | tee -a "$OUT/overhead.log"
import json, math, os, statistics, threading, time, urllib.request as u
from collections import defaultdict
from pathlib import Path
from cptest.evidence import Graph, Step, read_records
servers = {"on0": 31000, "off0": 31001, "on1": 31002, "off1": 31003}
deadline = time.monotonic() + 300
for name, port in servers.items():
    while time.monotonic() < deadline:
        try:
            u.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=5); break
        except OSError:
            time.sleep(1)
    else:
        raise SystemExit(f"{name} not ready")
print("all four ready", flush=True)
conc, plen, new, rounds = (int(os.environ[k]) for k in ("CONC", "PROMPT", "NEW", "ROUNDS"))

def batch(port, round_no):
    out = [0] * conc
    def one(i):
        req = {"input_ids": [(31 * i + 7 * j + round_no) % 4000 + 3 for j in range(plen)],
               "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}
        r = u.urlopen(u.Request(f"http://127.0.0.1:{port}/generate", json.dumps(req).encode(),
                                {"Content-Type": "application/json"}), timeout=300)
        out[i] = len(json.loads(r.read())["output_ids"])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    return sum(out) / (time.perf_counter() - t0)

for port in servers.values():
    batch(port, 99)  # warm every server (first-use allocations, triton JIT)

def pair(a, b, r):
    """Run the batch on two servers at once (one per GPU): whatever slows the machine slows both."""
    got = {}
    ts = [threading.Thread(target=lambda n=n: got.__setitem__(n, batch(servers[n], r))) for n in (a, b)]
    [t.start() for t in ts]; [t.join() for t in ts]
    return got

rates = {k: [] for k in servers}
ratios, control = [], []
for r in range(rounds):
    pairs = [("on0", "off1"), ("off0", "on1"), ("off0", "off1")]
    for a, b in (pairs if r % 2 == 0 else pairs[::-1]):
        got = pair(a, b, r)
        for k, v in got.items():
            rates[k].append(v)
        if a == "off0" and b == "off1":
            control.append(got["off0"] / got["off1"])  # A/A: GPU0 vs GPU1, no probe anywhere
        else:
            on, off = (a, b) if a.startswith("on") else (b, a)
            ratios.append(got[on] / got[off])
    print(f"round {r}: on/off {ratios[-2]:.3f} {ratios[-1]:.3f}; off0/off1 {control[-1]:.3f}", flush=True)
    json.dump({"tokens_per_s": rates, "on_off_ratios": ratios, "off0_off1_ratios": control, "partial": True},
              open(Path(os.environ["OUTD"], "overhead.json"), "w"), indent=1)  # kept if the call is cut short
med = {k: statistics.median(v) for k, v in rates.items()}
# Within a pair the GPUs differ: on0/off1 carries GPU0/GPU1, off0/on1 carries GPU1/GPU0's inverse;
# the geometric mean of the two pair kinds cancels that difference.
g = [math.sqrt(ratios[i] * ratios[i + 1]) for i in range(0, len(ratios), 2)]
result = {"tokens_per_s": rates, "median": med, "on_off_ratios": ratios, "off0_off1_ratios": control,
          "overhead": 1 - statistics.median(g), "overhead_per_round": [1 - x for x in g],
          "overhead_spread": [1 - max(g), 1 - min(g)],
          "control_spread": [min(control), max(control)],
          "conc": conc, "prompt": plen, "new_tokens": new, "rounds": rounds, "model": "llama-kv1", "tp": 1,
          "method": "every round runs three pairs at once on the two GPUs: on0+off1, off0+on1 and the "
                    "control off0+off1; per round the geometric mean of the two on/off ratios cancels "
                    "the GPUs' difference; overhead = 1 - the median over rounds. Each server on its own "
                    "physical cores.",
          "note": "eager decode, every CUDA-graph phase disabled in all four servers"}

time.sleep(1.0)  # an idle server: its scheduler loop runs the probe's chores every 20 ms
evidence = {}
for g in (0, 1):
    steps, eager = [], 0
    for f in Path(os.environ["PROBED"], f"probe-on{g}").glob("rank*.jsonl"):
        recs, _ = read_records(f)
        steps += [r for r in recs if isinstance(r, Step)]
        eager += sum(r.count for r in recs if isinstance(r, Graph) and r.event == "eager")
    first_prefix, written = {}, defaultdict(list)
    for s in sorted(steps, key=lambda s: s.step):
        if s.mode in ("extend", "mixed"):
            for rid, pre in zip(s.seq_positions, s.prefix_lens, strict=False):
                first_prefix.setdefault(rid, pre)
        for rid, rs in s.kv_written.items():
            written[rid] += [p for a, b in rs for p in range(a, b)]
    # A request's K/V: each position once, from its first uncached one to its last token; the
    # overlap scheduler runs a finished request one step more, so that last one may be written too.
    # (health checks and SGLang's start-up warm-up request are not the workload: they stay short)
    work = {rid: sorted(ps) for rid, ps in written.items() if max(ps) >= plen}
    exact = sum(ps == list(range(first_prefix.get(rid, 0), ps[-1] + 1)) and ps[-1] + 1 in (plen + new - 1, plen + new)
                for rid, ps in work.items())
    evidence[f"on{g}"] = {"step_records": len(steps), "eager_steps_counted": eager,
                          "decode_steps": sum(s.mode == "decode" for s in steps),
                          "requests": len(work), "requests_kv_exact": exact}
result["evidence"] = evidence
json.dump(result, open(Path(os.environ["OUTD"], "overhead.json"), "w"), indent=1)
print(json.dumps(evidence))
print(f"per round: {', '.join(f'{100 * x:.2f}' for x in result['overhead_per_round'])} %; "
      f"control off0/off1 {min(control):.3f}..{max(control):.3f}")
print(f"probe overhead on eager decode throughput: {100 * result['overhead']:.2f} %")
EOF
tar -C "$W" -czf "$OUT/probe-evidence.tar.gz" probe-on0 probe-on1
tar -C "$W" -czf "$OUT/server-logs.tar.gz" server-on0.log server-off0.log server-on1.log server-off1.log
say "done"
# the pins of this run, read on this machine (at most 8 files come back: these make 6)
python3 tools/side_run_manifest.py "$OUT" --commit "${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}" \
  --script tools/device/probe-overhead.sh --what "probe overhead on eager decode, SGLang 0.5.17, llama-kv1 TP1"
