"""The probe's cost on one server, measured in alternating windows with the probe switched at run time.

    python3 tools/device/probe_windows.py --server NAME:PORT:SWITCH:LOG [--server ...] --out DIR
        [--window-s 5] [--blocks 10] [--conc 64] [--prompt 128] [--new 1024] [--warm-s 15]

Each server is an eager SGLang server with the probe on (`CPTEST_PROBE_DIR`, `--forward-hooks`)
and `CPTEST_PROBE_SWITCH=SWITCH` (cptest/probe/runtime.py: the probe's writer thread reads the
file every 20 ms; `off` pauses every per-step hook). A closed loop of `conc` requests keeps each
server busy (`prompt` ids, `new` tokens, ignore_eos; a finished request is replaced at once). The
switch is flipped every `window_s` seconds in blocks of four windows, ABBA then BAAB (on off off
on, off on on off, ...), so that a linear drift of the machine cancels within each block; a second
server runs the opposite pattern. A window's throughput is the mean of SGLang's own `Decode batch
... gen throughput (token/s)` lines (one per 40 decode steps) stamped inside it, dropping the first
second after a switch and the last second before the next (the log's stamps are whole seconds).

Per block: overhead = 1 - mean(on windows) / mean(off windows). Reported: the mean over all
blocks of all servers, a 95 % bootstrap interval of that mean (10000 resamples of the blocks),
and the same for the method's null: the two middle windows of a block are in one state, so
1 - second/first measures what the method reads when nothing changes. The probe's own notes
(`probe paused` / `probe resumed`) are counted to confirm each switch took effect.
Writes DIR/windows.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] Decode batch"
                  r".*gen throughput \(token/s\): ([\d.]+)")
ABBA = ("on", "off", "off", "on")
BAAB = ("off", "on", "on", "off")


@dataclass
class Server:
    name: str
    port: int
    switch: Path
    log: Path
    windows: list[dict[str, Any]] = field(default_factory=list)


def parse_server(text: str) -> Server:
    name, port, switch, log = text.split(":", 3)
    return Server(name, int(port), Path(switch), Path(log))


def wait_ready(server: Server, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health_generate", timeout=5)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{server.name} not ready")


def load(server: Server, conc: int, prompt: int, new: int, stop: threading.Event) -> list[threading.Thread]:
    """`conc` threads, each sending one request after another until `stop`."""

    def worker(i: int) -> None:
        n = 0
        while not stop.is_set():
            ids = [(31 * i + 7 * j + 13 * n) % 4000 + 3 for j in range(prompt)]  # distinct: no cache hits
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0,
                                                          "ignore_eos": True}}
            url = f"http://127.0.0.1:{server.port}/generate"
            req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=600).read()
            except OSError:
                time.sleep(0.5)
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(conc)]
    for t in threads:
        t.start()
    return threads


def window_rates(log: Path) -> list[tuple[float, float]]:
    """(stamp as epoch seconds, gen throughput) of every decode log line."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            out.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp(), float(m.group(2))))
    return out


def bootstrap(values: list[float], n: int = 10_000, seed: int = 1) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def summary(values: list[float]) -> dict[str, Any]:
    lo, hi = bootstrap(values)
    return {"mean": statistics.fmean(values), "ci95": [lo, hi], "n": len(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="append", type=parse_server, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window-s", type=float, default=5.0)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--warm-s", type=float, default=15.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 400
    for s in a.server:
        s.switch.write_text("on\n")
        wait_ready(s, deadline)
    print(f"{len(a.server)} servers ready", flush=True)
    stop = threading.Event()
    for s in a.server:
        load(s, a.conc, a.prompt, a.new, stop)
    time.sleep(a.warm_s)  # the batch fills and the first requests' lengths spread out
    for b in range(a.blocks):
        for k in range(4):
            start = time.time()
            for j, s in enumerate(a.server):
                state = (ABBA if (b + j) % 2 == 0 else BAAB)[k]
                s.switch.write_text(state + "\n")
                s.windows.append({"block": b, "slot": k, "state": state, "start": start,
                                  "end": start + a.window_s})
            time.sleep(max(0.0, start + a.window_s - time.time()))
        print(f"block {b + 1}/{a.blocks} done", flush=True)
    for s in a.server:
        s.switch.write_text("on\n")
    stop.set()
    time.sleep(1.5)  # the last log lines reach the file

    overhead, null, per_server = [], [], {}
    for s in a.server:
        lines = window_rates(s.log)
        for w in s.windows:
            # whole-second stamps: a line stamped S was written in [S, S+1)
            got = [v for t, v in lines if t >= w["start"] + 1.0 and t + 1.0 <= w["end"]]
            w["lines"] = len(got)
            w["rate"] = statistics.fmean(got) if got else None
        blocks = []
        for b in range(a.blocks):
            ws = [w for w in s.windows if w["block"] == b]
            if any(w["rate"] is None for w in ws):
                continue
            on = statistics.fmean(w["rate"] for w in ws if w["state"] == "on")
            off = statistics.fmean(w["rate"] for w in ws if w["state"] == "off")
            blocks.append({"block": b, "on": on, "off": off, "overhead": 1 - on / off,
                           "null": 1 - ws[2]["rate"] / ws[1]["rate"]})
        overhead += [x["overhead"] for x in blocks]
        null += [x["null"] for x in blocks]
        probe_dir = s.log.parent / f"probe-{s.name}"
        notes = sum(f.read_text().count('"probe paused by') for f in probe_dir.glob("rank*.jsonl"))
        off_rate = statistics.fmean(x["off"] for x in blocks) if blocks else None
        states = [w["state"] for w in s.windows]
        switched = sum(now == "off" and before != "off" for before, now in zip(["on", *states], states,
                                                                                strict=False))
        per_server[s.name] = {
            "blocks": blocks, "windows": s.windows, "pauses_noted": notes, "pauses_switched": switched,
            "off_tokens_per_s": off_rate, "decode_step_ms": 1000 * a.conc / off_rate if off_rate else None,
            "overhead": summary([x["overhead"] for x in blocks]) if len(blocks) > 1 else None}
    result = {"method": __doc__, "window_s": a.window_s, "blocks": a.blocks, "conc": a.conc,
              "prompt": a.prompt, "new": a.new, "servers": per_server,
              "overhead": summary(overhead), "null": summary(null)}
    (a.out / "windows.json").write_text(json.dumps(result, indent=1) + "\n")
    o, z = result["overhead"], result["null"]
    for name, s in per_server.items():
        so = s["overhead"]
        print(f"{name}: {len(s['blocks'])} blocks, decode step {s['decode_step_ms']:.2f} ms, pauses noted "
              f"{s['pauses_noted']} of {s['pauses_switched']} switched, overhead "
              f"{100 * so['mean']:.2f} % [{100 * so['ci95'][0]:.2f}, {100 * so['ci95'][1]:.2f}]", flush=True)
    def pct(x: dict[str, Any]) -> str:
        return f"{100 * x['mean']:.2f} % (95 % CI {100 * x['ci95'][0]:.2f} .. {100 * x['ci95'][1]:.2f})"

    print(f"probe overhead: {pct(o)}, {o['n']} blocks; null: {pct(z)}", flush=True)


if __name__ == "__main__":
    main()
