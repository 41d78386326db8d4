"""Random *valid* scenario texts, for property tests and benchmarks (benchmarks/parse_compile.py).

`random_scenario_text(rng)` is deterministic in `rng`, writes settings in a shuffled order with
varied spacing and comments (so the formatter has work to do), and always produces a scenario that
`parse_text` accepts without touching the file system (synthetic models only).
"""

from __future__ import annotations

import random

from cptest.engines.sglang.releases import PINNED_RELEASE

_ARCH = {
    "llama": "layers {l} hidden {h} heads {n} kv_heads {k} head_dim {d} vocab 4096 intermediate 512 seed {s}",
    "qwen3": "layers {l} hidden {h} heads {n} kv_heads {k} head_dim {d} vocab 4096 intermediate 512",
    "deepseek_mla": (
        "layers {l} hidden {h} heads {n} kv_heads {n} vocab 4096 intermediate 512 kv_lora_rank 64 "
        "q_lora_rank 128 qk_nope_head_dim 32 qk_rope_head_dim 16 v_head_dim 32"
    ),
}


def _sep(rng: random.Random) -> str:
    return rng.choice([" ", "  ", "\n  ", "\n\t", " # note\n  "])


def _block(rng: random.Random, name: str, items: list[str]) -> str:
    rng.shuffle(items)
    return f"{name} {{" + "".join(_sep(rng) + it for it in items) + _sep(rng) + "}"


def _duration(rng: random.Random) -> str:
    return rng.choice([f"{rng.randint(1, 300)}s", f"{rng.randint(1, 999)}ms", f"{rng.randint(1, 5)}m"])


def random_scenario_text(rng: random.Random) -> str:
    """One valid scenario (see module doc)."""
    tp = rng.choice([1, 2, 4, 8])
    pp = rng.choice([1, 1, 1, 2])
    gpus = tp * pp
    divisors = [d for d in (1, 2, 4, 8) if tp % d == 0]
    mode = rng.choice(["dcp", "pcp", "tp"])
    topo = [f"gpus {gpus}", f"tp {tp}"]
    if pp > 1:
        topo.append(f"pp {pp}")
    if rng.random() < 0.3:
        topo.append(f"nodes {rng.choice([n for n in (1, 2) if gpus % n == 0])}")
    dcp = 1
    if mode == "dcp":
        dcp = rng.choice(divisors)
        topo.append(f"dcp {dcp}")
    elif mode == "pcp" and tp > 1:
        cp = rng.choice([d for d in divisors if d > 1])
        topo += [f"attn_cp {cp}", f"cp_strategy {rng.choice(['zigzag', 'interleave'])}"]
        if rng.random() < 0.5:
            topo.append("prefill_cp true")
    arch = rng.choice(list(_ARCH))
    heads = rng.choice([8, 16, 32])
    kv = rng.choice([k for k in (1, 2, 4, 8) if heads % k == 0])
    geometry = _ARCH[arch].format(
        l=rng.randint(1, 8),
        h=rng.choice([256, 512]),
        n=heads,
        k=kv,
        d=rng.choice([64, 128]),
        s=rng.randint(0, 99),
    )
    requests = rng.randint(1, 128)
    work = [
        f"requests {requests}",
        f"seed {rng.randint(0, 1000)}",
        rng.choice([f"concurrency {rng.randint(1, 32)}", f"rate {rng.choice([0.5, 2, 10.25])}"]),
        "prompt_tokens "
        + rng.choice([str(rng.randint(1, 4096)), "uniform(16, 2048)", "choice(16, 64, 256)"]),
        f"output_tokens {rng.randint(1, 256)}",
    ]
    if rng.random() < 0.5:
        work.append(
            rng.choice(["sampling greedy", "sampling sample { temperature 0.7 top_p 0.9 top_k 40 seed 1 }"])
        )
    if rng.random() < 0.5:
        work.append(f"timeout {_duration(rng)}")
    if rng.random() < 0.3:
        work.append(f"logprobs {rng.choice(['true', 'false'])}")
    serve = [
        "attention_backend triton",
        "sampling_backend pytorch",
        f"mem_fraction {rng.choice([0.3, 0.5, 0.85])}",
    ]
    if rng.random() < 0.5:
        serve.append(f"cuda_graph_decode {rng.choice(['full', 'breakable', 'disabled'])}")
    if rng.random() < 0.5:
        serve.append('flag "--chunked-prefill-size" "4096"')
    expect = ["launch accepted", f"serving completed >= {rng.randint(0, requests)} of {requests}"]
    if dcp > 1:
        expect.append(f"rows kv_owner position % {dcp}")
        expect.append(f"capacity logical == {dcp} * physical within 0.01")
    if rng.random() < 0.5:
        expect.append("generation tokens_agree >= 0.95 logprob_within 0.05 vs baseline")
    if rng.random() < 0.5:
        expect.append(f"shutdown within {_duration(rng)} no_orphans exit_status in (0, -9, 137)")
    if rng.random() < 0.3:
        expect.append('violated graph decode captured because "hooks need eager"')
    if rng.random() < 0.3:
        expect.append('log absent "Traceback"')
    stmts = [
        f'engine sglang "{PINNED_RELEASE.name}"',
        f"model synthetic {arch} {{ {geometry} }}",
        _block(rng, "topology", topo),
        _block(rng, "serve", serve),
        _block(rng, "workload", work),
        _block(rng, "expect", expect),
    ]
    if rng.random() < 0.6:
        stmts.append(f"baseline {{ tp {tp} }}" if rng.random() < 0.8 else "baseline none")
    if rng.random() < 0.5:
        stmts.append(f"fault kill rank {rng.randrange(gpus)} after {rng.randint(1, 64)} requests")
    if rng.random() < 0.3:
        stmts.append(f"fault stop rank {rng.randrange(gpus)} at {_duration(rng)} for 5s")
    if rng.random() < 0.3:
        stmts.append(f'description "random scenario {rng.randint(0, 10**6)}"')
    rng.shuffle(stmts)
    name = f"s{rng.randint(0, 10**9)}"
    return f"cptest 1\n# generated\nscenario {name} {{\n  " + "\n  ".join(stmts) + "\n}\n"
