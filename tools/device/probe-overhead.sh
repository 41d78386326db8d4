#!/usr/bin/env bash
# probe-overhead.sh: decode throughput of real SGLang 0.5.17 with and without the cptest probe.
#
# Call 3 of three on the 2-GPU machine (c1 and c2 installed by the two calls before; this call
# carries .sglang-bundle/c3 and .whl). Two identical eager servers (TP1, llama-kv1, triton, every
# CUDA-graph phase disabled, as cptest's evidence runs are) start at once, one per GPU: "on" with
# CPTEST_PROBE_DIR set and the probe's --forward-hooks, "off" with neither (the plugin is then
# inert). The same closed-loop batch (CONC requests of PROMPT tokens, NEW greedy tokens each,
# ignore_eos) runs against each, alternating off/on ROUNDS times; decode throughput is output
# tokens per second of wall time. Result: $OUT/overhead.json and both server logs.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/overhead-out}; W=/tmp/overhead; mkdir -p "$OUT" "$W/probe"
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/overhead.log"; }
cleanup() { for g in ${PG_ON:-} ${PG_OFF:-}; do kill -KILL -- "-$g" 2>/dev/null; done; }
trap cleanup EXIT
bash .sglang-bundle/c3/install-bundle --complete > "$W/install.log" 2>&1 || { tail "$W/install.log"; exit 3; }
SGLENV_QUIET=1 source .sglang-bundle/c3/sglang-env
python3 -m pip install -q --no-index --no-deps --target /opt/cpt-deps .whl/*.whl > /dev/null 2>&1
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info && cp -r cptest /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps" PYTHONUNBUFFERED=1
python3 .sglang-bundle/c3/make-tiny-models .tiny-models --only llama-kv1 > "$W/models.log" 2>&1
HOOKS=$(python3 -c 'from cptest.probe.forward_hooks import spec; print(spec())')
COMMON=(--model-path .tiny-models/llama-kv1 --skip-tokenizer-init --attention-backend triton
  --sampling-backend pytorch --mem-fraction-static 0.3 --max-total-tokens 65536
  --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled --disable-custom-all-reduce
  --host 127.0.0.1)
say "launching on (GPU 0) and off (GPU 1)"
CUDA_VISIBLE_DEVICES=0 CPTEST_PROBE_DIR="$W/probe" setsid python3 -m sglang.launch_server "${COMMON[@]}" \
  --forward-hooks "$HOOKS" --port 31000 > "$OUT/server-on.log" 2>&1 & PG_ON=$!
CUDA_VISIBLE_DEVICES=1 setsid python3 -m sglang.launch_server "${COMMON[@]}" --port 31001 \
  > "$OUT/server-off.log" 2>&1 & PG_OFF=$!
ROUNDS=${ROUNDS:-3} CONC=${CONC:-32} PROMPT=${PROMPT:-128} NEW=${NEW:-128} OUTF="$OUT/overhead.json" \
python3 - <<'EOF' 2>&1 | tee -a "$OUT/overhead.log"
import json, os, statistics, threading, time, urllib.request as u
servers = {"on": "http://127.0.0.1:31000", "off": "http://127.0.0.1:31001"}
deadline = time.monotonic() + 200
for name, base in servers.items():
    while time.monotonic() < deadline:
        try:
            u.urlopen(base + "/health_generate", timeout=5); break
        except OSError:
            time.sleep(1)
    else:
        raise SystemExit(f"{name} not ready")
    print(f"{name} ready", flush=True)
conc, plen, new = (int(os.environ[k]) for k in ("CONC", "PROMPT", "NEW"))

def batch(base, round_no):
    out = [0] * conc
    def one(i):
        req = {"input_ids": [(31 * i + 7 * j + round_no) % 4000 + 3 for j in range(plen)],
               "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}
        r = u.urlopen(u.Request(base + "/generate", json.dumps(req).encode(),
                                {"Content-Type": "application/json"}), timeout=120)
        out[i] = len(json.loads(r.read())["output_ids"])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
    t0 = time.perf_counter(); [t.start() for t in ts]; [t.join() for t in ts]
    return sum(out) / (time.perf_counter() - t0)

batch(servers["on"], 99); batch(servers["off"], 99)   # warm both (first-use allocations)
rates = {"on": [], "off": []}
for r in range(int(os.environ["ROUNDS"])):
    for name in ("off", "on"):
        rates[name].append(batch(servers[name], r))
    print(f"round {r}: off {rates['off'][-1]:.0f} tok/s, on {rates['on'][-1]:.0f} tok/s", flush=True)
med = {k: statistics.median(v) for k, v in rates.items()}
result = {"tokens_per_s": rates, "median": med, "overhead": 1 - med["on"] / med["off"],
          "conc": conc, "prompt": plen, "new_tokens": new, "model": "llama-kv1", "tp": 1,
          "note": "eager decode, every CUDA-graph phase disabled in both servers"}
json.dump(result, open(os.environ["OUTF"], "w"), indent=1)
print(f"probe overhead on eager decode throughput: {100 * result['overhead']:.2f} %")
EOF
say "probe records written: $(cat "$W"/probe/*.jsonl 2>/dev/null | wc -l)"
