#!/usr/bin/env bash
# probe-bench.sh: benchmarks/probe_step.py on the GPU machine's CUDA tensors, with no SGLang bundle.
#
# One call, for a session whose device time does not cover the bundle's three calls and a server
# measurement (measure.sh): the machine's own torch runs the benchmark, and cptest's own
# dependencies for it travel as wheels in .benchwhl (carry it; README.md says how to fill it).
# Each line of CONFIGS is one benchmark's arguments, and each is run once with every BOUNDS entry
# (the copy batches' steps and seconds), so old and new bounds run side by side on one machine.
# Result: $OUT/bench.txt (the benchmark's output, each run headed by its arguments) and
# $OUT/manifest.txt (commit, GPU, torch).
set -uo pipefail
OUT=${OUT:-/tmp/probe-bench-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "${SITE:-/tmp/bench-site}" \
  "${BENCH_WHEELS:-.benchwhl}"/*.whl || { echo "wheel install failed"; exit 3; }
export PYTHONPATH="$PWD:${SITE:-/tmp/bench-site}" NO_COLOR=1 PYTHONUNBUFFERED=1
{ echo "commit ${COMMIT:-unknown}"; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } \
  > "$OUT/manifest.txt" 2>&1
CONFIGS=${CONFIGS:-"--graphs --engine-us 1670 --steps 3000
--engine-us 4120 --steps 1500"}
BOUNDS=${BOUNDS:-"64 0.15
256 0.5"}
RUN_S=${RUN_S:-70}
while IFS= read -r config; do
  while read -r every within; do
    args="--layers 4 --batch 64 --device ${DEVICE:-cuda} --pool $config --copy-every $every --copy-within-s $within"
    echo "== $args" | tee -a "$OUT/bench.txt"
    # shellcheck disable=SC2086  # the arguments are words on purpose
    timeout "$RUN_S" python3 benchmarks/probe_step.py $args >> "$OUT/bench.txt" 2>&1
    grep -E "^  (parts|pool hook|chores)" "$OUT/bench.txt" | tail -3
  done <<< "$BOUNDS"
done <<< "$CONFIGS"
