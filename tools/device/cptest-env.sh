# cptest-env.sh: sourced by qualify.sh and suite.sh on the GPU machine (needs `say`, WORK and LOG).
# Completes the bundle (c3), sources its sglang-env, installs the wheels (.whl) and cptest (with a
# hand-written dist-info, so that every scheduler process finds the probe's entry point through
# PYTHONPATH; no build backend needed there), and makes the tiny models the scenarios name.
if [ ! -e /opt/sgl/.bundle-c3.done ]; then
  say "installing c3"
  bash .sglang-bundle/c3/install-bundle --complete > "$WORK/install-c3.log" 2>&1 \
    || { say "install-bundle --complete failed"; tail -20 "$WORK/install-c3.log" | tee -a "$LOG"; exit 3; }
fi
SGLENV_QUIET=1 source .sglang-bundle/c3/sglang-env 2>/dev/null || SGLENV_QUIET=1 source /opt/cpt-env/sglang-env
mkdir -p /opt/cpt-env && cp -f .sglang-bundle/c3/sglang-env /opt/cpt-env/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /opt/cpt-deps \
  .whl/*.whl > "$WORK/install-whl.log" 2>&1 || { say "wheel install failed"; cat "$WORK/install-whl.log"; exit 3; }
rm -rf /opt/cpt && mkdir -p /opt/cpt/cptest-0.1.0.dist-info && cp -r cptest /opt/cpt/
printf 'Metadata-Version: 2.1\nName: cptest\nVersion: 0.1.0\n' > /opt/cpt/cptest-0.1.0.dist-info/METADATA
printf '[sglang.srt.plugins]\ncptest_probe = cptest.probe.plugin:register\n' \
  > /opt/cpt/cptest-0.1.0.dist-info/entry_points.txt
export PYTHONPATH="$PYTHONPATH:/opt/cpt:/opt/cpt-deps" PYTHONUNBUFFERED=1 NO_COLOR=1
# The scenarios' synthetic models are written by each run into the model store; the scripts that
# start SGLang by hand use the same tiny models through names linked in .tiny-models/ (one maker:
# `cptest models make`, docs/decisions.md D43).
if [ ! -e .tiny-models/llama-kv4 ]; then
  say "making tiny models"
  python3 -m cptest models make llama-kv1 llama-kv2 llama-kv4 qwen3-kv2 --models .tiny-models >> "$LOG" 2>&1 \
    || { say "cptest models make failed"; tail -20 "$LOG"; exit 3; }
fi
