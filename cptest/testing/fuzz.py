"""Fuzzing the language stage: grammar-aware hypothesis strategies, byte mutation of the suite, and the
one function that runs an input through validate, fmt, lint and compile.

`run_stages(path, text)` is what `cptest validate`, `fmt`, `lint` and `compile` do with a file, in
process: the only exceptions they may raise are `CptestError`s (a message and exit 2), anything else
is a crash. `scenarios()` draws scenario texts shaped like the grammar (statements of every block,
values of every kind, limits and their neighbours, unsafe env and flags, options smuggled in as flag
values, env values that are paths or module paths, huge integers) so that most
inputs get past the parser; `mutate(data, rng)` damages the bytes of the suite's files.
benchmarks/fuzz.py runs both at scale; tests/lang/test_fuzz_bench.py runs a slice of it in CI.
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import strategies as st

from cptest.contracts import CONTRACTS
from cptest.engines.sglang.releases import KNOWN_RELEASES, PINNED_RELEASE
from cptest.errors import CptestError
from cptest.lang.tables import BLOCK_KEYS

# ------------------------------------------------------------------------------------ running


def run_stages(path: Path, text: str | None = None) -> str:
    """validate, fmt, lint and compile `path` (written from `text` when given) as the CLI would.

    Returns how far it got: "syntax" (fmt refused it), "invalid" (validate refused it), "plan"
    (compile refused it), "ok". Raises whatever else the stages raise: that is a crash."""
    from cptest.lang import format_text, parse_file
    from cptest.plan import plan
    from cptest.plan.lint import lint

    if text is not None:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    raw = path.read_bytes()
    reached = "syntax"
    try:
        format_text(raw.decode("utf-8"), str(path))
        reached = "invalid"
    except (CptestError, UnicodeDecodeError):
        pass
    try:
        scenario = parse_file(path)
    except CptestError:
        return reached
    try:
        lint(scenario)
        plan(scenario).model_dump_json()
    except CptestError as err:
        if any(p.span is None for p in err.problems):  # exit 2, but not at a file:line:col
            raise AssertionError(f"a problem without a position: {err}") from None
        return "plan"
    return "ok"


# ------------------------------------------------------------------------------------ strategies

INTS = st.one_of(
    st.integers(-3, 70), st.integers(0, 16), st.integers(1, 4096),
    st.sampled_from([0, 1, 2, 4, 8, 1024, 4096, 100_000, 100_001, 1 << 20, (1 << 20) + 1, 1 << 22,
                     (1 << 22) + 1, 1 << 31, 1 << 63, (1 << 63) - 1, 10**29, 10**30, 10**31]),
    st.integers(1, 31).map(lambda n: int("9" * n)),
)  # fmt: skip
HUGE_INT_TEXT = st.sampled_from([4299, 4300, 4301, 5000, 20000]).map(lambda n: "9" * n)
WORDS = st.sampled_from(["triton", "zigzag", "interleave", "full", "breakable", "disabled", "greedy",
                         "sample", "synthetic", "none", "llama", "qwen3", "qwen3_moe", "deepseek_mla", "p99",
                         "p50", "max", "decode", "prefill", "captured", "eager", "gathered", "local", "x"])
STRINGS = st.one_of(
    st.text(st.characters(blacklist_characters='"\\\n', blacklist_categories=("Cs",)), max_size=12),
    st.sampled_from(["", *KNOWN_RELEASES, "9.9", "defaults/tiny.cps", "/dev/zero", "../..", "\\d+",
                     "(a+)+$", "(x+x+)+y", "[", "Traceback", "DCP enabled"]),
)
DURATIONS = st.builds(lambda n, u: f"{n}{u}", st.integers(-2, 100_000),
                      st.sampled_from(["ms", "s", "m", "h"]))
FLOATS = st.sampled_from(["0.3", "0.0", "1.0", "1.5", "1e-3", "1e308", "-0.5", "2.5", "0.95", "4.0"])


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


VALUES = st.one_of(
    INTS.map(str), WORDS, STRINGS.map(_quote), DURATIONS, FLOATS, st.sampled_from(["true", "false"]),
    st.builds(lambda f, a: f"{f}({', '.join(map(str, a))})", st.sampled_from(["uniform", "choice", "zipf"]),
              st.lists(INTS, max_size=4)),
)  # fmt: skip

FLAGS = ["--log-level", "--max-running-requests", "--disable-radix-cache", "--config", "--trust-remote-code",
         "--custom-weight-loader", "--enable-custom-logit-processor", "--tokenizer-path", "--tp-size",
         "--nope", "--lora-paths", "-x", "--chunked-prefill-size", "--cuda-graph-bs", "--watchdog-timeout",
         "--max-prefill-tokens", "--preferred-sampling-params", "--schedule-policy",
         "--cuda-graph-config"]  # fmt: skip
# Flag values: options smuggled in as values, negative numbers (values to argparse), and values of
# each type of the flag tables, right and wrong.
FLAG_VALUES = st.one_of(STRINGS, st.sampled_from([
    "--trust-remote-code", "--forward-hooks", "--config=x.yaml", "--host", "-c", "-tp", "-1e5", "--",
    "-1", "-.5", "-", "1", "four", "1.5", "{}", "[1]", "{bad", "8k", "2.5Mi", "lpm", "FCFS",
]))  # fmt: skip
ENVS = ["SGLANG_ENABLE_CP_V2", "PYTHONPATH", "LD_PRELOAD", "NCCL_NVLS_ENABLE", "NCCL_DEBUG",
        "NCCL_NET_PLUGIN", "CUDA_VISIBLE_DEVICES", "HOME", "TORCH_EXTENSIONS_DIR", "1BAD",
        "OMP_NUM_THREADS", "SGLANG_EXTERNAL_MODEL_PACKAGE", "TRITON_CACHE_MANAGER",
        "TRITON_REMOTE_CACHE_BACKEND", "FLASHINFER_WORKSPACE_BASE", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
        "TORCH_LOGS_OUT", "SGLANG_USE_PICKLE_IPC", "TORCH_COMPILE_BACKEND", "SGLANG_S3_ENDPOINT_URL",
        "PYTORCH_CUDA_ALLOC_CONF"]  # fmt: skip
# Environment values: paths and module paths (refused through any allowed prefix) beside plain ones.
ENV_VALUES = st.one_of(STRINGS, st.sampled_from([
    "/etc/passwd", "~root", "a\\b", "trace/out", "evil.mod:Cls", "evil.mod", "mod:Cls", "1", "INFO",
    "INIT,COLL", "expandable_segments:True", "inductor",
]))  # fmt: skip
EXPECTS = [
    "launch accepted", 'launch rejected matching {s}', "rows replicated", "rows kv_owner position % {i}",
    "rows split {w} ffn {w}", "capacity logical == {i} * physical within {f}",
    "capacity transitions peak >= {f} together within {i}",
    "generation logprob p99 <= {f} * control topk {i} agree >= {f} vs baseline",
    "generation free_running topk {i} vs baseline", "generation tokens_agree >= {f} vs baseline",
    "graph {w} {w}", "serving all_complete", "serving completed >= {i} of {i}",
    "shutdown within {d} gpu_memory_released no_orphans exit_status in ({i}, -9)",
    "log contains {s}", "log absent {s}",
    'violated rows replicated on sglang "' + PINNED_RELEASE.name + '" because {s}',
]  # fmt: skip
FAULTS = ["fault {a} rank {i} after {i} requests", "fault {a} server at {d}",
          "fault stop rank {i} at {d} for {d}", "fault {a} rank {i} after {i} decode_steps"]  # fmt: skip


@st.composite
def _filled(draw: st.DrawFn, template: str) -> str:
    out = template
    for hole, strat in (("{i}", INTS.map(str)), ("{f}", FLOATS), ("{s}", STRINGS.map(_quote)),
                        ("{w}", WORDS), ("{d}", DURATIONS),
                        ("{a}", st.sampled_from(["kill", "stop", "cont", "sigterm", "sigint", "boom"]))):
        while hole in out:
            out = out.replace(hole, draw(strat), 1)
    return out


@st.composite
def _block(draw: st.DrawFn, name: str, keys: tuple[str, ...],
           valid: dict[str, st.SearchStrategy[str]]) -> str:
    chosen = draw(st.lists(st.sampled_from(keys), max_size=len(keys) + 2))
    items = [f"{k} {draw(st.one_of(valid[k], VALUES) if k in valid else VALUES)}" for k in chosen]
    return f"{name} {{ " + " ".join(items) + " }"


_small = st.sampled_from(["1", "2", "4", "8"])
_GEOMETRY = {"layers": st.sampled_from(["1", "2"]), "hidden": st.sampled_from(["64", "256"]),
             "heads": st.sampled_from(["4", "8"]), "kv_heads": st.sampled_from(["1", "2", "4"]),
             "head_dim": st.sampled_from(["16", "64"]), "vocab": st.sampled_from(["256", "4096"]),
             "intermediate": st.sampled_from(["128", "512"]), "seed": st.sampled_from(["0", "7"])}
_TOPOLOGY = {"gpus": _small, "tp": _small, "dcp": _small, "attn_cp": _small, "pp": st.just("1"),
             "cp_strategy": st.sampled_from(["zigzag", "interleave"])}
_WORKLOAD = {"requests": st.sampled_from(["1", "4", "16"]), "concurrency": st.sampled_from(["1", "4"]),
             "prompt_tokens": st.sampled_from(["8", "uniform(4, 64)", "choice(4, 16)"]),
             "output_tokens": st.sampled_from(["4", "8"]), "timeout": st.sampled_from(["30s", "2m"]),
             "fill_drain": st.sampled_from(["0.95", "0.5"])}


VALID_EXPECTS = [*(e for c in CONTRACTS.values() for e in c.examples),
                 'violated rows replicated because "a known defect"']
"""Every contract's examples (a new contract's too), and a declared violation."""
VALID_SERVE = ['flag "--log-level" "info"', 'flag "--disable-radix-cache"', 'env "SGLANG_ENABLE_CP_V2" "1"',
               'env "NCCL_DEBUG" "INFO"', "attention_backend triton", "mem_fraction 0.3", "page_size 16",
               "cuda_graph_decode disabled", 'flag "--max-running-requests" "8"']  # fmt: skip
VALID_FAULTS = ["fault kill rank 1 after 2 requests", "fault sigterm server at 5s",
                "fault stop rank 0 at 1s for 2s"]


@st.composite
def _valid_core(draw: st.DrawFn) -> list[str]:
    """The statements of a scenario that validates (so that lint and compile get to work)."""
    tp = draw(st.sampled_from([1, 2, 4]))
    dcp = draw(st.sampled_from([d for d in (1, 2, 4) if tp % d == 0]))
    requests = draw(st.sampled_from([1, 4, 16, 64]))
    parts = [
        draw(st.sampled_from([*(f'engine sglang "{r}"' for r in KNOWN_RELEASES), "engine reference"])),
        f"model synthetic {draw(st.sampled_from(['llama', 'qwen3']))} {{ layers {draw(st.integers(1, 2))} "
        f"hidden 64 heads 8 kv_heads {draw(st.sampled_from([1, 2, 8]))} head_dim 16 "
        f"vocab {draw(st.sampled_from([256, 4096]))} intermediate 128 seed {draw(st.integers(0, 9))} }}",
        f"topology {{ gpus {tp} tp {tp}" + (f" dcp {dcp}" if dcp > 1 else "") + " }",
        f"workload {{ requests {requests} concurrency {draw(st.sampled_from([1, 4]))} "
        f"prompt_tokens {draw(st.sampled_from(['8', 'uniform(4, 64)', 'choice(4, 16)']))} "
        f"output_tokens {draw(st.sampled_from([1, 4, 8]))} }}",
    ]
    for what in draw(st.lists(st.sampled_from(["serve", "baseline", "fault", "expect", "deadline",
                                               "description", "exclusive"]), max_size=4, unique=True)):
        if what == "serve":
            parts.append("serve { " + " ".join(draw(st.lists(st.sampled_from(VALID_SERVE), max_size=3,
                                                                 unique=True))) + " }")
        elif what == "baseline":
            parts.append(draw(st.sampled_from(["baseline none", "baseline { tp 1 }", "baseline { tp 2 }"])))
        elif what == "fault" and tp > 1:
            parts.append(draw(st.sampled_from(VALID_FAULTS)))
        elif what == "expect":
            parts.append("expect { " + " ".join(draw(st.lists(st.sampled_from(VALID_EXPECTS), max_size=4,
                                                                 unique=True))) + " }")
        elif what == "deadline":
            parts.append(draw(st.sampled_from(["deadline 2h", "deadline 90m", "deadline 600s"])))
        elif what in ("description", "exclusive"):
            parts.append(f"{what} {_quote(draw(STRINGS))}")
    return parts


@st.composite
def scenarios(draw: st.DrawFn) -> str:
    """One scenario text, shaped by the grammar (see the module docstring): a valid core, then
    `chaos` damaged or adversarial statements (0: valid as drawn)."""
    parts: list[str] = draw(_valid_core())
    chaos = draw(st.sampled_from([0, 0, 1, 1, 2, 3]))
    for _ in range(chaos):
        parts.append(draw(_chaos()))
    if chaos and draw(st.booleans()):  # replace a core statement instead of adding one
        parts.pop(draw(st.integers(0, 3)))
    order = draw(st.permutations(parts))
    name = draw(st.sampled_from(["fz", "f-1", "x.y", "tp"] if chaos == 3 else ["fz", "f-1", "x.y"]))
    header = draw(st.sampled_from(["1", "2"])) if chaos == 3 else "1"
    return f"cptest {header}\nscenario {name} {{\n  " + "\n  ".join(order) + "\n}\n"


@st.composite
def _chaos(draw: st.DrawFn) -> str:
    what = draw(st.sampled_from(["model", "topology", "workload", "serve", "baseline", "fault", "expect",
                                 "unsafe", "deadline", "huge", "extends", "dataset", "engine"]))
    if what == "engine":
        return draw(st.sampled_from(['engine sglang "9.9"', "engine vllm", 'engine sglang ""']))
    if what == "model" and draw(st.booleans()):
        # Models by identity: ids and revisions that are paths, never to reach --model-path.
        ident = draw(st.sampled_from(HUB_IDS))
        kind = draw(st.sampled_from(["hub", "local"]))
        return (f"model {kind} {_quote(ident)} revision {_quote(draw(st.sampled_from(HUB_IDS)))} facts {{ "
                'architecture "LlamaForCausalLM" layers 1 hidden 8 heads 1 kv_heads 1 head_dim 8 vocab 8 }')
    if what == "model":
        keys = BLOCK_KEYS["model"]
        geometry = {k: draw(_GEOMETRY[k]) for k in _GEOMETRY}
        for k in draw(st.lists(st.sampled_from(keys), max_size=2)):
            geometry[k] = draw(VALUES)
        arch = draw(st.sampled_from(["llama", "qwen3", "qwen3_moe", "deepseek_mla", "gpt"]))
        return f"model synthetic {arch} {{ " + " ".join(f"{k} {v}" for k, v in geometry.items()) + " }"
    if what == "topology":
        return draw(_block("topology", BLOCK_KEYS["topology"], _TOPOLOGY))
    if what == "workload":
        keys = tuple(k for k in BLOCK_KEYS["workload"] if k not in ("sampling", "source"))
        return draw(_block("workload", keys, _WORKLOAD))
    if what == "serve":
        items = [f"flag {_quote(draw(st.sampled_from(FLAGS)))}"
                 + "".join(f" {_quote(x)}" for x in draw(st.lists(FLAG_VALUES, max_size=3)))
                 for _ in range(draw(st.integers(0, 3)))]
        items += [f"env {_quote(draw(st.sampled_from(ENVS)))} {_quote(draw(ENV_VALUES))}"
                  for _ in range(draw(st.integers(0, 3)))]
        items += [f"{k} {draw(VALUES)}" for k in draw(st.lists(st.sampled_from(BLOCK_KEYS["serve"][:9]),
                                                                max_size=3))]
        return "serve { " + " ".join(items) + " }"
    if what == "baseline":
        return draw(st.one_of(st.just("baseline none"),
                              _block("baseline", BLOCK_KEYS["baseline"], _TOPOLOGY)))
    if what == "fault":
        return draw(_filled(draw(st.sampled_from(FAULTS))))
    if what == "expect":
        entries = [draw(_filled(t)) for t in draw(st.lists(st.sampled_from(EXPECTS), max_size=4))]
        return "expect { " + " ".join(entries) + " }"
    if what == "unsafe":
        return f"unsafe {_quote(draw(STRINGS))}"
    if what == "deadline":
        return f"deadline {draw(st.one_of(DURATIONS, VALUES))}"
    if what == "huge":
        return f"workload {{ requests {draw(HUGE_INT_TEXT)} }}"
    if what == "extends":
        return f"extends {_quote(draw(st.sampled_from(EXTENDS_TARGETS)))}"
    return f"workload {{ source dataset {_quote(draw(st.sampled_from(['/dev/zero', 'x.jsonl'])))} }}"


HUB_IDS = ["org/name", "/root/.ssh", "../../x", "org/../x", "~/.ssh", "org/name/x", "org/..", "", "a" * 300]
"""Hub ids and revisions, the one valid first: the rest are paths of the machine."""
EXTENDS_TARGETS = ["defaults/tiny.cps", "nope.cps", "/dev/zero", "/proc/self/environ", "/etc/passwd",
                   "../../x", "~/.ssh", "../../elsewhere/d.cps", "/tmp/x.cps"]
"""`extends` targets; all but the first are refused without being read (`cptest.lang.includes`)."""


# ------------------------------------------------------------------------------------ bytes

INTERESTING = [
    b"{", b"}", b"(", b")", b'"', b"\\", b"#", b"\n", b"\x00", b"\xff", b"\xc3", b"-", b"99999", b"9" * 5000,
    b"1e999", b" 2h", b' extends "/dev/zero" ', b'unsafe "x" ', b"deadline 9999999h ",
    b'env "PYTHONPATH" "/tmp" ', b'flag "--config" "a" "b" ', b'log absent "(x+x+)+y" ',
    b'flag "--cuda-graph-bs" "1" "--trust-remote-code" ', b'env "TORCH_LOGS_OUT" "/tmp/x" ',
    b'env "TRITON_CACHE_MANAGER" "m:C" ', b' extends "/proc/self/environ" ', b'model hub "/root/.ssh" ',
    b' extends "../../etc/passwd" ', b'model local "/etc" ', b'revision "../x" ',
    b"requests 1000000000 ", b"vocab 99999999999 ", b"(" * 200, b"uniform(1, 1048577)",
]  # fmt: skip


def mutate(data: bytes, rng: random.Random, corpus: list[bytes] | None = None) -> bytes:
    """`data` with 1-8 random byte-level edits: flip, insert, delete, duplicate or splice a chunk,
    insert an interesting token."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        pos = rng.randint(0, len(buf))
        if op == 0 and buf:
            i = min(pos, len(buf) - 1)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos:pos] = bytes([rng.randrange(256)])
        elif op == 2 and buf:
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 3 and buf:
            start = rng.randrange(len(buf))
            buf[pos:pos] = buf[start : start + rng.randint(1, 64)]
        elif op == 4 and corpus:
            other = rng.choice(corpus)
            start = rng.randrange(max(len(other), 1))
            buf[pos:pos] = other[start : start + rng.randint(1, 200)]
        else:
            buf[pos:pos] = rng.choice(INTERESTING)
    return bytes(buf)


__all__ = ["mutate", "run_stages", "scenarios"]
