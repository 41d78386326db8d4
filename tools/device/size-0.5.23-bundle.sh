#!/usr/bin/env bash
# size-0.5.23-bundle.sh [WORK]: measure what an offline SGLang 0.5.23 bundle for the GPU machine
# would weigh (docs/sglang-0.5.23-bundle.md holds the results and the reasoning).
#
# Steps, all in WORK (default /tmp/sgl523; never inside the repository; ~4.5 GB of disk):
#   1. a Python 3.12 venv with a current pip (PY312 = the python3.12 to use)
#   2. resolve sglang==0.5.23 for CPython 3.12 manylinux x86_64 (pip install --dry-run --report)
#   3. download all wheels of the closure, checked against the report's sha256
#   4. classify each wheel against the GPU machine (the image's packages, as recorded in
#      .library/device/KINDS.md and in this project's server logs) and the 0.5.17 bundle lock
#   5. strip sglang-kernel as make-bundle does (flash_ops, flashmla_ops, infllm_ops, sm100/)
#   6. estimate xz -9 sizes: each wheel's unpacked bytes (members in zip order) are sampled,
#      SAMPLES windows of SAMPLE_MIB MiB (a wheel smaller than SAMPLES*SAMPLE_MIB is taken whole),
#      each window compressed with `xz -9 -T1`; ratio x unpacked size = estimate. Also times
#      `xz -dc` of the samples (user CPU seconds: contention on a shared machine does not count).
#   7. compress every byte of each such wheel with `zstd -3` (fast: all content, not samples) and
#      scale it per wheel by xz -9 / zstd -3 measured on that wheel's sample windows: the xz -9
#      estimate the docs use (step 6's window-only estimate misses most of torch's fatbinaries).
# Output: WORK/classes.tsv, WORK/sizes.tsv, WORK/zstd3.json, WORK/summary.txt (printed).
# Env: PY312, SAMPLES (default 3), SAMPLE_MIB (default 1; 8 is closer to xz -9's 64 MiB dictionary but
# takes ~1 h on 2 shared cores), JOBS (parallel xz, default nproc).
set -euo pipefail

WORK="${1:-/tmp/sgl523}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LOCK017="${LOCK017:-$ROOT/../shared/device/sglang-0.5.17.lock}"
[ -f "$LOCK017" ] || LOCK017="$ROOT/shared/device/sglang-0.5.17.lock"
[ -f "$LOCK017" ] || { echo "size-0.5.23-bundle: sglang-0.5.17.lock not found (set LOCK017)" >&2; exit 2; }
case "$WORK/" in "$ROOT"/*) echo "size-0.5.23-bundle: WORK must be outside the repository" >&2; exit 2 ;; esac
PY312="${PY312:-$(command -v python3.12 || ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}"
[ -x "$PY312" ] || { echo "size-0.5.23-bundle: no python3.12 (set PY312)" >&2; exit 2; }
export SAMPLES="${SAMPLES:-3}" SAMPLE_MIB="${SAMPLE_MIB:-1}" JOBS="${JOBS:-$(nproc)}"
# PyPI only: no local find-links or extra indexes from this machine's pip configuration.
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$WORK/dl"
cd "$WORK"
[ -x venv/bin/python ] || { "$PY312" -m venv venv && venv/bin/python -m pip install -q -U pip; }
PLATS=(--only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for n in $(seq 5 39); do PLATS+=(--platform "manylinux_2_${n}_x86_64"); done  # nccl 2.30.7 is manylinux_2_18

if [ ! -s report.json ]; then
  echo "== resolving sglang==0.5.23"
  venv/bin/python -m pip install -q --dry-run --ignore-installed --report report.json \
    --target "$WORK/t" "${PLATS[@]}" sglang==0.5.23
fi
venv/bin/python - <<'EOF'
import json
r = json.load(open("report.json"))
with open("reqs.txt", "w") as f:
    for it in r["install"]:
        m, h = it["metadata"], it["download_info"]["archive_info"]["hashes"]["sha256"]
        f.write(f"{m['name']}=={m['version']} --hash=sha256:{h}\n")
EOF
echo "== downloading $(wc -l < reqs.txt) wheels (pip skips verified ones)"
venv/bin/python -m pip download -q --no-deps --require-hashes "${PLATS[@]}" -d dl -r reqs.txt

echo "== classifying, sampling"
LOCK017="$LOCK017" venv/bin/python - <<'EOF'
import json, os, re, zipfile, fnmatch
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.specifiers import SpecifierSet
from pip._vendor.packaging.utils import canonicalize_name as cn
from pip._vendor.packaging.version import Version

# The GPU machine's Python packages. Versions: KINDS.md's pip list (2026-11) for the named ones;
# the CUDA wheels are torch 2.11.0's own pins (its METADATA and cuda-toolkit 13.0.2's extras),
# confirmed for NCCL by this project's SGLang logs ("sglang is using nccl==2.28.9").
KNOWN = {
    "accelerate": "1.15.0", "cupy-cuda13x": "14.2.0", "huggingface-hub": "1.33.0", "jax": "0.11.2",
    "numpy": "2.5.2", "safetensors": "0.8.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0",
    "transformers": "5.17.0", "triton": "3.6.0",
    "cuda-toolkit": "13.0.2", "nvidia-cublas": "13.1.0.3", "nvidia-cuda-cupti": "13.0.85",
    "nvidia-cuda-nvrtc": "13.0.88", "nvidia-cuda-runtime": "13.0.96", "nvidia-cufft": "12.0.0.61",
    "nvidia-cufile": "1.15.1.6", "nvidia-curand": "10.4.0.35", "nvidia-cusolver": "12.0.4.66",
    "nvidia-cusparse": "12.6.3.3", "nvidia-nvjitlink": "13.0.88", "nvidia-nvtx": "13.0.85",
    "nvidia-cudnn-cu13": "9.19.0.56", "nvidia-cusparselt-cu13": "0.8.0",
    "nvidia-nccl-cu13": "2.28.9", "nvidia-nvshmem-cu13": "3.4.5",
}
# KINDS.md's "Python packages already there" (names only; version not read).
NAMES = set(cn(x) for x in """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox
etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
STRIP = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops*.so", "sgl_kernel/infllm_ops*.so", "sgl_kernel/sm100/*")

lock = {}
for line in open(os.environ["LOCK017"]):
    if line.strip() and not line.startswith("#"):
        spec = line.split()[0]; n, v = spec.split("==")
        lock[cn(n)] = v

r = json.load(open("report.json"))
items = {cn(it["metadata"]["name"]): it for it in r["install"]}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# extras requested of each package, to a fixed point
extras = {n: set() for n in items}
reqs = {}
changed = True
while changed:
    changed = False
    specs = {n: [] for n in items}
    for n, it in items.items():
        for s in it["metadata"].get("requires_dist", []) or []:
            q = Requirement(s)
            ok = (q.marker is None) or any(q.marker.evaluate({**env, "extra": e}) for e in (extras[n] or {""}))
            if not ok or cn(q.name) not in items:
                continue
            specs[cn(q.name)].append((n, str(q.specifier)))
            new = set(q.extras) - extras[cn(q.name)]
            if new:
                extras[cn(q.name)] |= new; changed = True
specs["sglang"].append(("(requested)", "==0.5.23"))

rows = []
for n, it in sorted(items.items()):
    v = it["metadata"]["version"]
    fn = it["download_info"]["url"].rsplit("/", 1)[1]
    size = os.path.getsize(os.path.join("dl", fn))
    ss = [s for _, s in specs[n]]
    both = SpecifierSet(",".join(x for x in ss if x))
    # an exact pin, or a compatible-release pin of three or more parts (~=13.4.4), that the
    # machine's unread version is unlikely to meet; plain ranges are taken as met
    pinned = any(re.match(r"^===?[^*]*$", x) or re.match(r"^~=\d+\.\d+\.\d+", x)
                 for x in ",".join(ss).split(",") if x)
    if n in KNOWN:
        mv = KNOWN[n]
        if both.contains(Version(mv), prereleases=True):
            cls, why = "machine", f"machine {mv} satisfies '{both}'"
        else:
            cls, why = "send", f"machine {mv} fails '{both}'"
    elif n in NAMES:
        if pinned:
            cls, why = "send?", f"machine has it, version not read; needs '{both}'"
        else:
            cls, why = "machine?", f"machine has it, version not read; needs '{both or 'any'}'"
    else:
        cls, why = "send", "machine lacks it"
    in017 = "same" if lock.get(n) == v else (f"0.5.17 had {lock[n]}" if n in lock else "")
    rows.append((n, v, cls, size, in017, why, fn, ";".join(f"{a}:{b or 'any'}" for a, b in specs[n])))
with open("classes.tsv", "w") as f:
    f.write("name\tversion\tclass\twheel_bytes\tin_0.5.17_bundle\twhy\tfile\trequired_by\n")
    for row in rows:
        f.write("\t".join(map(str, row)) + "\n")

# sample windows from the unpacked bytes of every wheel that may be sent
W = int(os.environ["SAMPLE_MIB"]) << 20; K = int(os.environ["SAMPLES"])
os.makedirs("samples", exist_ok=True)
meta = {}
for n, v, cls, size, in017, why, fn, _ in rows:
    if cls not in ("send", "send?"):
        continue
    z = zipfile.ZipFile(os.path.join("dl", fn))
    mem = [i for i in z.infolist() if not i.is_dir()
           and not (n == "sglang-kernel" and any(fnmatch.fnmatch(i.filename, g) for g in STRIP))]
    total = sum(i.file_size for i in mem)
    meta[n] = {"raw": total, "files": len(mem), "wheel": size}
    if total <= K * W:
        wins = [(0, total)]
    else:
        step = total / K
        wins = [(int(step * (j + 0.5) - W / 2), W) for j in range(K)]
    out = []
    for j, (start, length) in enumerate(wins):
        p = f"samples/{n}.{j}.bin"
        if not (os.path.exists(p) and os.path.getsize(p) == length):
            with open(p, "wb") as o:
                pos, need = 0, length
                for i in mem:
                    if need <= 0: break
                    end = pos + i.file_size
                    if end > start and pos < start + length:
                        data = z.read(i)
                        a = max(0, start - pos); b = min(i.file_size, start + length - pos)
                        o.write(data[a:b]); need -= b - a
                    pos = end
        out.append(p)
    meta[n]["samples"] = out
json.dump(meta, open("samples/meta.json", "w"), indent=1)
EOF

echo "== xz -9 on the samples ($JOBS at a time)"
ls samples/*.bin | while read -r f; do [ -s "$f.xz" ] || echo "$f"; done \
  | xargs -r -P "$JOBS" -I{} sh -c 'xz -9 -T1 -k -c "$1" > "$1.xz.tmp" && mv "$1.xz.tmp" "$1.xz"' _ {}
echo "== timing xz -dc of all samples (user CPU seconds)"
/usr/bin/time -f "%U %e" -o dtime.txt sh -c 'for f in samples/*.bin.xz; do xz -dc "$f"; done > /dev/null'

venv/bin/python - <<'EOF'
import json, os
meta = json.load(open("samples/meta.json"))
rows = [l.rstrip("\n").split("\t") for l in open("classes.tsv")][1:]
cls = {r[0]: r for r in rows}
MiB = 1 << 20
out = []
raw_s = xz_s = 0
for n, m in meta.items():
    raw = sum(os.path.getsize(p) for p in m["samples"]); xz = sum(os.path.getsize(p + ".xz") for p in m["samples"])
    raw_s += raw; xz_s += xz
    est = m["raw"] * xz / raw if raw else 0
    out.append((n, cls[n][1], cls[n][2], m["wheel"], m["raw"], est, xz / raw if raw else 0, cls[n][4], cls[n][5]))
out.sort(key=lambda r: -r[5])
with open("sizes.tsv", "w") as f:
    f.write("name\tversion\tclass\twheel_MiB\tunpacked_MiB\txz9_est_MiB\txz9_ratio\tin_0.5.17_bundle\twhy\n")
    for r in out:
        f.write(f"{r[0]}\t{r[1]}\t{r[2]}\t{r[3]/MiB:.1f}\t{r[4]/MiB:.1f}\t{r[5]/MiB:.1f}\t{r[6]:.3f}\t{r[7]}\t{r[8]}\n")
user, wall = map(float, open("dtime.txt").read().split())
speed = raw_s / MiB / user
lines = [f"closure: {len(rows)} wheels, {sum(int(r[3]) for r in rows)/MiB:.1f} MiB as wheels"]
for c in ("machine", "machine?", "send?", "send"):
    sel = [r for r in rows if r[2] == c]
    lines.append(f"class {c:9s}: {len(sel):3d} wheels, {sum(int(r[3]) for r in sel)/MiB:8.1f} MiB as wheels")
for label, keep in (("send only (pip-faithful, machine versions as known)", ("send",)),
                    ("send + send? (pinned, machine version not read)", ("send", "send?"))):
    sel = [r for r in out if r[2] in keep]
    lines.append(f"{label}: {len(sel)} wheels, wheel {sum(r[3] for r in sel)/MiB:.1f} MiB, "
                 f"unpacked {sum(r[4] for r in sel)/MiB:.1f} MiB, xz -9 est {sum(r[5] for r in sel)/MiB:.1f} MiB")
lines.append(f"samples: {raw_s/MiB:.1f} MiB -> {xz_s/MiB:.1f} MiB xz -9 (ratio {xz_s/raw_s:.3f}); "
             f"xz -dc {speed:.1f} MiB/s of output per CPU second ({user:.1f} s user, {wall:.1f} s wall)")
open("summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

echo "== zstd -3 over all unpacked bytes of each wheel that may be sent"
venv/bin/python - <<'EOF'
import fnmatch, json, os, subprocess, threading, zipfile
STRIP = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops*.so", "sgl_kernel/infllm_ops*.so", "sgl_kernel/sm100/*")
meta = json.load(open("samples/meta.json"))
rows = {l.split("\t")[0]: l.rstrip("\n").split("\t") for l in open("classes.tsv")}
out, M = {}, 1 << 20
for n, m in meta.items():
    z = zipfile.ZipFile(os.path.join("dl", rows[n][6]))
    p = subprocess.Popen(["zstd", "-3", "-T1", "-q", "-c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    cnt = [0]
    def rd():
        for b in iter(lambda: p.stdout.read(M), b""):
            cnt[0] += len(b)
    t = threading.Thread(target=rd); t.start()
    for i in z.infolist():
        if not i.is_dir() and not (n == "sglang-kernel" and any(fnmatch.fnmatch(i.filename, g) for g in STRIP)):
            p.stdin.write(z.read(i))
    p.stdin.close(); p.wait(); t.join()
    zs = sum(len(subprocess.run(["zstd", "-3", "-q", "-c", s], capture_output=True, check=True).stdout) for s in m["samples"])
    xs = sum(os.path.getsize(s + ".xz") for s in m["samples"])
    out[n] = {"class": rows[n][2], "wheel": m["wheel"], "raw": m["raw"], "zstd3_full": cnt[0],
              "zstd3_samples": zs, "xz9_samples": xs, "xz9_est": cnt[0] * xs / zs}
json.dump(out, open("zstd3.json", "w"), indent=1)
lines = []
for keep in (("send",), ("send", "send?")):
    sel = [v for v in out.values() if v["class"] in keep]
    lines.append(f"{'+'.join(keep)}: {len(sel)} wheels, wheel {sum(v['wheel'] for v in sel)/M:.1f} MiB, unpacked "
                 f"{sum(v['raw'] for v in sel)/M:.1f} MiB, zstd -3 (all bytes) {sum(v['zstd3_full'] for v in sel)/M:.1f} MiB, "
                 f"xz -9 est {sum(v['xz9_est'] for v in sel)/M:.1f} MiB")
open("summary.txt", "a").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
