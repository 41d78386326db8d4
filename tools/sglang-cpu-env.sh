#!/usr/bin/env bash
# A separate virtual environment with SGLang 0.5.17's Python source, for the tests that run SGLang's
# own code on this CPU machine (tests/sglang_src/): its ServerArgs, its process-group construction,
# its prefill CP splits and DCP index math. Not cptest's environment: SGLang pins transformers and
# friends that cptest does not want.
#
#   tools/sglang-cpu-env.sh [VENV]        (default: .venv-sglang)
#
# Prints `CPTEST_SGLANG_PYTHON=<VENV>/bin/python` on its last line (for `eval`). Idempotent: a venv
# whose stamp matches this script, the requirements file and the wheel's hash is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

VENV="${1:-.venv-sglang}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
REQUIREMENTS=tools/sglang-cpu-requirements.txt
# The GPU machine's wheel (its bundle's lock names the same hash). cp312 only matters for the three
# Rust extensions in it, which nothing here imports; the Python source is byte-identical to cp311's.
WHEEL=sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl
WHEEL_SHA256=fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093

stamp="$(cat "$0" "$REQUIREMENTS" | sha256sum | cut -c1-16)-$WHEEL_SHA256"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.cptest-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "CPTEST_SGLANG_PYTHON=$VENV/bin/python"
  exit 0
fi

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
py="$VENV/bin/python"
# Quiet pip still warns about the machine's empty extra index folders; keep real errors.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
quiet "$py" -m pip install -q --upgrade pip==26.3 setuptools==84.2.1 >&2
quiet "$py" -m pip install -q -r "$REQUIREMENTS" >&2

download="$(mktemp -d)"
trap 'rm -rf "$download"' EXIT
quiet "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_34_x86_64 -d "$download" sglang==0.5.17 >&2
echo "$WHEEL_SHA256  $download/$WHEEL" | sha256sum -c --quiet -
# Unpacked, not installed: pip refuses a cp312 wheel for this interpreter. The dist-info comes along,
# so the venv still says which sglang it holds; its console scripts are not needed here.
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$py" -m zipfile -e "$download/$WHEEL" "$site"

# SGLang imports, and reports its version, in the driver the tests use.
version="$(echo '{"op": "version"}' | "$py" tests/sglang_src/driver.py)"
case "$version" in
  *'"0.5.17"'*) ;;
  *) echo "sglang-cpu-env: the driver answered $version, not sglang 0.5.17" >&2; exit 1 ;;
esac
echo "$stamp" > "$VENV/.cptest-stamp"
echo "CPTEST_SGLANG_PYTHON=$VENV/bin/python"
