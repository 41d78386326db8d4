"""The probe's cost on one server, measured in alternating windows with the probe switched at run time.

    python3 tools/device/probe_windows.py --server NAME:PORT:SWITCH:LOG [--server ...] --out DIR
        [--window-s 1.5] [--cohorts 9] [--blocks-per-cohort 3] [--control-every 3] [--settle-s 0.3]
        [--conc 64] [--prompt 128] [--new 7000]

Each server is an eager SGLang server with the probe on (`CPTEST_PROBE_DIR`, `--forward-hooks`),
`CPTEST_PROBE_SWITCH=SWITCH` (cptest/probe/runtime.py: the engine's thread reads the file every
CHORES_S, in the probe's chores; `off` pauses every per-step hook; the file is replaced whole, never
seen half written) and `SGLANG_LOG_MS=1` (its log stamps carry milliseconds). The load is a cohort: `conc`
requests of `prompt` ids sent together, `new` tokens each (ignore_eos), so the decode batch stays
whole for the cohort's life and its step time changes only with the context, smoothly. (A closed
loop of independent requests fell into step and refilled with a prefill burst every ~3.5 s, so a
window caught a random part of that cycle: results/_measure run1.)

Blocks of four windows of `window_s`, ABBA (on off off on) or BAAB alternately, so that a drift
linear in time cancels within each block; a second server runs the opposite pattern. A cohort
holds `blocks_per_cohort` blocks, started `lead_s` after its requests. Every `control_every`-th
block is a control: the same four windows with the probe left on, judged by the same estimator
(what the method reads when nothing changes). A window's throughput is the mean of SGLang's own
`Decode batch ... gen throughput (token/s)` lines (one per 40 decode steps, each measuring the
steps since the last) stamped from `settle_s` after the window's switch to its end. Without
millisecond stamps the first and last whole second of a window are dropped instead.

Per block: overhead = 1 - mean(on windows) / mean(off windows). Reported for the real blocks and,
separately, the control blocks of all servers: the mean, a 95 % bootstrap interval of the mean
(10000 resamples of the blocks) and the spread. The probe's own notes (`probe paused by`) are
counted to confirm each switch took effect. Writes DIR/windows.json.

The switch also makes the probe list the engine's collections of generations 1 and 2 (`gc` notes,
cptest/probe/runtime.py `watch_gc`): each window gets the number and the seconds of the full
(generation 2) collections that ended in it, summed per state over the real blocks, so that a
burst can be told apart from a steady cost. And it makes the probe time its own work on the
engine's thread (`cost` notes: begin and end of every probed step, deferred records and copies
included, the inner hooks not): reported as a share of the probed steps' time with a bootstrap
interval over the notes, a direct figure beside the windows' total one.

What it measures is the probe's work in its hooks; what a paused probe still costs (its hooks'
early returns, SGLang's dispatch of registered hooks) is in both states and is bounded by
benchmarks/probe_step.py's `paused` line.
"""

from __future__ import annotations

import argparse
import json
import os
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

from cptest.probe.steps import SLOW_NS

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{3}))?[^\]]*\] Decode batch"
                  r".*gen throughput \(token/s\): ([\d.]+)")
"""SGLang's decode log line; with SGLANG_LOG_MS=1 its stamp carries milliseconds."""
ABBA = ("on", "off", "off", "on")
BAAB = ("off", "on", "on", "off")


@dataclass
class Server:
    name: str
    port: int
    switch: Path
    log: Path
    windows: list[dict[str, Any]] = field(default_factory=list)


def flip(switch: Path, state: str) -> None:
    """Replace the switch file whole: the probe never reads it half written."""
    tmp = switch.with_name(switch.name + ".tmp")
    tmp.write_text(state + "\n")
    os.replace(tmp, switch)


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


def cohort(server: Server, conc: int, prompt: int, new: int, n: int) -> threading.Thread:
    """Send `conc` requests at once (distinct prompts: no prefix-cache hits); a thread that ends
    when all have finished."""

    def one(i: int) -> None:
        ids = [(31 * i + 7 * j + 13 * n) % 4000 + 3 for j in range(prompt)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0,
                                                      "ignore_eos": True}}
        url = f"http://127.0.0.1:{server.port}/generate"
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()

    def all_of_them() -> None:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(conc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    t = threading.Thread(target=all_of_them, daemon=True)
    t.start()
    return t


def window_rates(log: Path) -> tuple[list[tuple[float, float]], bool]:
    """(stamp as epoch seconds, gen throughput) of every decode log line, and whether the stamps
    carry milliseconds."""
    out, ms = [], True
    for line in log.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            if m.group(2) is None:
                ms = False
            else:
                t += int(m.group(2)) / 1000
            out.append((t, float(m.group(3))))
    return out, ms


def in_window(t: float, w: dict[str, Any], ms: bool, settle_s: float) -> bool:
    """A line stamped at t measured the 40 steps before t: keep it when they all ran in the window.
    Whole-second stamps (no SGLANG_LOG_MS): a line stamped S was written in [S, S+1)."""
    if ms:
        return w["start"] + settle_s <= t <= w["end"]
    return t >= w["start"] + 1.0 and t + 1.0 <= w["end"]


def probe_notes(probe_dir: Path, word: str) -> list[Any]:
    """The JSON payloads of the probe's `<word> [...]` notes in the server's rank files."""
    out: list[Any] = []
    tag = f'"message":"{word} ['
    for f in sorted(probe_dir.glob("rank*.jsonl")):
        for line in f.read_text(errors="replace").splitlines():
            if tag not in line:
                continue
            try:
                out.append(json.loads(json.loads(line)["message"][len(word) + 1:]))
            except (ValueError, KeyError):
                continue  # a half line of a killed rank
    return out


def gc_collections(probe_dir: Path) -> list[list[float]]:
    """[epoch_end, generation, seconds, collected] of every listed collection of the server's ranks."""
    return [c for note in probe_notes(probe_dir, "gc") for c in note]


def _interval(boot: list[float]) -> list[float]:
    """The 95 % interval of sorted bootstrap resamples: their 2.5th and 97.5th percentiles."""
    n = len(boot)
    return [boot[int(0.025 * n)], boot[int(0.975 * n) - 1]]


def _share_ci(costs: list[list[float]], fields: tuple[int, ...], rng: random.Random,
              n: int) -> tuple[float, list[float]]:
    """The notes' `fields` summed over their steps' span (the note's 4th field), and its 95 %
    bootstrap interval over the notes (n resamples)."""
    def share(cs: list[list[float]]) -> float:
        return sum(c[i] for c in cs for i in fields) / sum(c[3] for c in cs)

    boot = sorted(share(rng.choices(costs, k=len(costs))) for _ in range(n))
    return share(costs), _interval(boot)


TARGET_SHARE = 0.01
"""The probe's time on the engine's thread, as an evidence run pays it, that a server may take: the
interval's upper bound must lie below it."""


def engine_share(costs: list[list[float]], n: int = 10_000, seed: int = 1) -> dict[str, Any] | None:
    """The probe's own time on the engine's thread over the time its steps took (`cost` notes,
    [epoch, steps, probe_ns, span_ns], each about a second of probed steps): the ratio of the
    sums, a 95 % bootstrap interval over the notes, and the probe's microseconds per step."""
    costs = [c for c in costs if c[1] >= 20 and c[3] > 0]  # a note cut short by a switch says little
    if len(costs) < 2:
        return None
    rng = random.Random(seed)
    share, ci95 = _share_ci(costs, (2,), rng, n)
    steps = sum(c[1] for c in costs)
    out = {"share": share, "ci95": ci95,
           "notes": len(costs), "steps": steps, "probe_us_per_step": sum(c[2] for c in costs) / steps / 1000,
           "step_ms": sum(c[3] for c in costs) / steps / 1e6}
    full = [c for c in costs if len(c) >= 10]  # notes since the cost was split by part (steps._timed_forward)
    if full:
        n_full = sum(c[1] for c in full)
        out["us_per_step_by_part"] = {name: sum(c[i] for c in full) / n_full / 1000
                                      for i, name in ((4, "ready"), (5, "begin"), (6, "end"), (7, "send"))}
        slow = sum(c[8] for c in full)
        out["slow_steps"] = {"steps": slow, "of": n_full,
                             "us_per_step_of_all": sum(c[9] for c in full) / n_full / 1000,
                             "us_each": sum(c[9] for c in full) / slow / 1000 if slow else None}
    with_writer = [c for c in costs if len(c) >= 11]  # D69: the writer thread's rounds finish batches
    if with_writer:
        # (probe_ns + writer_ns) / span: the share comparable with notes before D69, an upper bound
        # (the writer's rounds take the GIL from the engine only in part).
        span = sum(c[3] for c in with_writer)
        out["writer_us_per_step"] = sum(c[10] for c in with_writer) / sum(c[1] for c in with_writer) / 1000
        out["share_with_writer"] = sum(c[2] + c[10] for c in with_writer) / span
    with_pool = [c for c in costs if len(c) >= 12]  # D73: the pool hook, in busy scheduler iterations
    if with_pool:
        # The probe's whole time on the engine's thread: its forward hooks' parts and the pool hook
        # (outside the forward), over the same steps' span, with its own interval over the notes.
        # D114: the chores (field 18) and the inner hooks (19) run on the engine's thread too,
        # outside both.
        parts = next(p for p, n in (((2, 11, 18, 19), 20), ((2, 11, 18), 19), ((2, 11), 0))
                     if all(len(c) >= n for c in with_pool))
        whole, whole_ci = _share_ci(with_pool, parts, rng, n)
        n_pool = sum(c[1] for c in with_pool)
        out["pool_us_per_step"] = sum(c[11] for c in with_pool) / n_pool / 1000
        if len(parts) >= 3:
            out["chores_us_per_step"] = sum(c[18] for c in with_pool) / n_pool / 1000
        if len(parts) >= 4:
            out["inner_us_per_step"] = sum(c[19] for c in with_pool) / n_pool / 1000
        out["engine_all"] = {"share": whole, "ci95": whole_ci,
                             "us_per_step": sum(c[i] for c in with_pool for i in parts) / n_pool / 1000}
        if all(len(c) >= 21 for c in with_pool):
            # The measuring's own work inside the chores (field 20: the switch's stat, the collector's
            # and the cost notes), which an evidence run does not do: the share such a run pays.
            def evidence(cs: list[list[float]]) -> float:
                return sum(sum(c[i] for i in parts) - c[20] for c in cs) / sum(c[3] for c in cs)

            boot = sorted(evidence(rng.choices(with_pool, k=len(with_pool))) for _ in range(n))
            out["measuring_us_per_step"] = sum(c[20] for c in with_pool) / n_pool / 1000
            ci95 = _interval(boot)
            out["engine_evidence"] = {
                "share": evidence(with_pool), "ci95": ci95,
                "us_per_step": out["engine_all"]["us_per_step"] - out["measuring_us_per_step"],
                "within_target": ci95[1] < TARGET_SHARE}
    finishing = [c for c in costs if len(c) >= 24]  # the copy batches' finishing by phase
    if finishing:
        n_fin = sum(c[1] for c in finishing)
        out["finishing_us_per_step_by_phase"] = {
            name: sum(c[i] for c in finishing) / n_fin / 1000
            for i, name in ((21, "lines"), (22, "write"), (23, "give_back"))}
    split = [c for c in costs if len(c) >= 18]  # D73: the pool hook's and the writer's figures split
    if split:
        n_split = sum(c[1] for c in split)
        calls, reads = sum(c[12] for c in split), sum(c[14] for c in split)
        read_ns = sum(c[13] for c in split)
        out["pool_split"] = {
            "busy_calls_per_step": calls / n_split,
            "us_per_early_return": (sum(c[11] for c in split) - read_ns) / (calls - reads) / 1000
            if calls > reads else None,
            "us_per_read": read_ns / reads / 1000 if reads else None, "reads_per_step": reads / n_split}
        out["writer_us_per_step_by_phase"] = {
            name: sum(c[i] for c in split) / n_split / 1000
            for i, name in ((15, "sends_and_polls"), (16, "finishing"), (17, "lines"))}
    return out


def target_met(shares: list[dict[str, Any] | None]) -> bool | None:
    """Whether every server's share as an evidence run pays it is below TARGET_SHARE, interval
    included; None when a server's notes cannot say (too few, or from a probe before the split)."""
    verdicts = [(s or {}).get("engine_evidence", {}).get("within_target") for s in shares]
    if not verdicts or any(v is None for v in verdicts):
        return None
    return all(verdicts)


def bootstrap(values: list[float], n: int = 10_000, seed: int = 1) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    lo, hi = _interval(means)
    return lo, hi


def summary(values: list[float]) -> dict[str, Any]:
    lo, hi = bootstrap(values)
    return {"mean": statistics.fmean(values), "ci95": [lo, hi], "n": len(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", action="append", type=parse_server, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window-s", type=float, default=1.5)
    ap.add_argument("--cohorts", type=int, default=9)
    ap.add_argument("--blocks-per-cohort", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=0.3,
                    help="with millisecond stamps: lines this soon after a switch are dropped")
    ap.add_argument("--control-every", type=int, default=3)
    ap.add_argument("--conc", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=7000)
    ap.add_argument("--lead-s", type=float, default=1.5)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 400
    for s in a.server:
        flip(s.switch, "on")
        wait_ready(s, deadline)
    print(f"{len(a.server)} servers ready", flush=True)
    for t in [cohort(s, a.conc, a.prompt, 64, -1) for s in a.server]:
        t.join()  # first-use allocations and triton builds, outside any window
    lasted = []
    for c in range(a.cohorts):
        t0 = time.monotonic()
        running = [cohort(s, a.conc, a.prompt, a.new, c) for s in a.server]
        time.sleep(a.lead_s)  # the cohort's prefill is over; the batch decodes whole
        for i in range(a.blocks_per_cohort):
            b = c * a.blocks_per_cohort + i
            control = a.control_every > 0 and b % a.control_every == a.control_every - 1
            for k in range(4):
                start = time.time()
                for j, s in enumerate(a.server):
                    label = (ABBA if (b + j) % 2 == 0 else BAAB)[k]
                    flip(s.switch, "on" if control else label)
                    s.windows.append({"block": b, "slot": k, "state": label, "control": control,
                                      "start": start, "end": start + a.window_s})
                time.sleep(max(0.0, start + a.window_s - time.time()))
        for s in a.server:
            flip(s.switch, "on")
        for t in running:
            t.join()
        lasted.append(time.monotonic() - t0)
        print(f"cohort {c + 1}/{a.cohorts} done in {lasted[-1]:.1f} s", flush=True)
    time.sleep(1.5)  # the last log lines reach the file

    real, control_blocks, per_server = [], [], {}
    gc_by_state: dict[str, dict[str, float]] = {st: {"windows": 0, "full": 0, "full_s": 0.0, "gen1": 0}
                                                for st in ("on", "off")}
    for s in a.server:
        lines, ms = window_rates(s.log)
        collections = gc_collections(s.log.parent / f"probe-{s.name}")
        for w in s.windows:
            got = [v for t, v in lines if in_window(t, w, ms, a.settle_s)]
            w["lines"] = len(got)
            w["rate"] = statistics.fmean(got) if got else None
            mine = [c for c in collections if w["start"] <= c[0] < w["end"]]
            w["gc_full"] = sum(1 for c in mine if c[1] == 2)
            w["gc_full_s"] = round(sum(c[2] for c in mine if c[1] == 2), 6)
            w["gc_gen1"] = sum(1 for c in mine if c[1] == 1)
            if not w["control"]:
                g = gc_by_state[w["state"]]
                g["windows"] += 1
                g["full"] += w["gc_full"]
                g["full_s"] += w["gc_full_s"]
                g["gen1"] += w["gc_gen1"]
        blocks = []
        for b in range(a.cohorts * a.blocks_per_cohort):
            ws = [w for w in s.windows if w["block"] == b]
            if len(ws) != 4 or any(w["rate"] is None for w in ws):
                continue
            on = statistics.fmean(w["rate"] for w in ws if w["state"] == "on")
            off = statistics.fmean(w["rate"] for w in ws if w["state"] == "off")
            blocks.append({"block": b, "control": ws[0]["control"], "on": on, "off": off,
                           "overhead": 1 - on / off})
        real += [x["overhead"] for x in blocks if not x["control"]]
        control_blocks += [x["overhead"] for x in blocks if x["control"]]
        probe_dir = s.log.parent / f"probe-{s.name}"
        notes = sum(f.read_text().count('"probe paused by') for f in probe_dir.glob("rank*.jsonl"))
        states = [("on" if w["control"] else w["state"]) for w in s.windows]
        switched = sum(now == "off" and before != "off" for before, now in zip(["on", *states], states,
                                                                                strict=False))
        off_rate = statistics.fmean(x["off"] for x in blocks if not x["control"]) if blocks else None
        mine = [x["overhead"] for x in blocks if not x["control"]]
        per_server[s.name] = {
            "blocks": blocks, "windows": s.windows, "pauses_noted": notes, "pauses_switched": switched,
            "off_tokens_per_s": off_rate, "decode_step_ms": 1000 * a.conc / off_rate if off_rate else None,
            "overhead": summary(mine) if len(mine) > 1 else None,
            "engine_share": engine_share(probe_notes(s.log.parent / f"probe-{s.name}", "cost")),
            "gc_listed": len(collections), "gc_full": sum(1 for c in collections if c[1] == 2),
            "gc_full_s": round(sum(c[2] for c in collections if c[1] == 2), 6)}
    result = {"method": __doc__, "window_s": a.window_s, "cohorts": a.cohorts,
              "blocks_per_cohort": a.blocks_per_cohort, "settle_s": a.settle_s,
              "control_every": a.control_every,
              "conc": a.conc, "prompt": a.prompt, "new": a.new, "cohort_s": lasted, "servers": per_server,
              "overhead": summary(real), "gc_by_state": gc_by_state,
              "control": summary(control_blocks) if len(control_blocks) > 1 else None,
              "target": {"share": TARGET_SHARE,
                         "met": target_met([s["engine_share"] for s in per_server.values()])}}
    (a.out / "windows.json").write_text(json.dumps(result, indent=1) + "\n")

    def pct(x: dict[str, Any] | None) -> str:
        if x is None:
            return "n/a"
        return (f"{100 * x['mean']:.2f} % (95 % CI {100 * x['ci95'][0]:.2f} .. {100 * x['ci95'][1]:.2f}, "
                f"sd {100 * (x['stdev'] or 0):.2f}, {x['n']} blocks)")

    for name, s in per_server.items():
        print(f"{name}: decode step {s['decode_step_ms']:.2f} ms, pauses noted {s['pauses_noted']} of "
              f"{s['pauses_switched']} switched, overhead {pct(s['overhead'])}", flush=True)
    print(f"probe overhead: {pct(result['overhead'])}; control (probe never off): {pct(result['control'])}",
          flush=True)
    met = result["target"]["met"]
    print(f"the {100 * TARGET_SHARE:g} % target on every server, interval included: "
          f"{'unknown' if met is None else 'met' if met else 'NOT met'}", flush=True)
    for st, g in gc_by_state.items():
        print(f"collector in {st} windows (real blocks): {g['windows']} windows, "
              f"{g['full']} full collections "
              f"({g['full_s']:.3f} s), {g['gen1']} of generation 1", flush=True)
    for name, s in per_server.items():
        print(f"{name}: {s['gc_full']} full collections in the whole run, {s['gc_full_s']:.3f} s", flush=True)
        e = s["engine_share"]
        if e is not None:
            print(f"{name}: the probe's own time on the engine's thread {100 * e['share']:.3f} % "
                  f"of its steps' time "
                  f"(95 % CI {100 * e['ci95'][0]:.3f} .. {100 * e['ci95'][1]:.3f}, {e['notes']} notes, "
                  f"{e['steps']} steps): {e['probe_us_per_step']:.1f} us of a {e['step_ms']:.2f} ms step",
                  flush=True)
            if "us_per_step_by_part" in e:
                parts = ", ".join(f"{k} {v:.1f}" for k, v in e["us_per_step_by_part"].items())
                sl = e["slow_steps"]
                print(f"{name}: by part (us per step): {parts}; steps over {SLOW_NS // 1000} us: "
                      f"{sl['steps']} of {sl['of']}, {sl['us_per_step_of_all']:.1f} us per step of all",
                      flush=True)
            if "finishing_us_per_step_by_phase" in e:
                phases = ", ".join(f"{k} {v:.1f}" for k, v in e["finishing_us_per_step_by_phase"].items())
                print(f"{name}: the copy batches' finishing by phase (us per step): {phases}", flush=True)
            if "engine_all" in e:
                a_ = e["engine_all"]
                extra = "".join(f", {label} {e[key]:.1f}" for key, label in (
                    ("chores_us_per_step", "chores"), ("inner_us_per_step", "inner hooks")) if key in e)
                print(f"{name}: with the pool hook ({e['pool_us_per_step']:.1f} us per step, outside the "
                      f"forward{extra}): {100 * a_['share']:.3f} % (95 % CI {100 * a_['ci95'][0]:.3f} .. "
                      f"{100 * a_['ci95'][1]:.3f}): {a_['us_per_step']:.1f} us per step", flush=True)
            if "engine_evidence" in e:
                ev_ = e["engine_evidence"]
                print(f"{name}: as an evidence run pays it, without the measuring's own work in the chores "
                      f"({e['measuring_us_per_step']:.1f} us per step): {100 * ev_['share']:.3f} % (95 % CI "
                      f"{100 * ev_['ci95'][0]:.3f} .. {100 * ev_['ci95'][1]:.3f}): "
                      f"{ev_['us_per_step']:.1f} us per step; the {100 * TARGET_SHARE:g} % target, "
                      f"interval included: {'met' if ev_['within_target'] else 'NOT met'}", flush=True)
            if "pool_split" in e:
                ps_, wp = e["pool_split"], e["writer_us_per_step_by_phase"]

                def us(v: float | None) -> str:
                    return "n/a" if v is None else f"{v:.1f}"
                print(f"{name}: pool hook per busy iteration: {ps_['busy_calls_per_step']:.2f} per step, "
                      f"{us(ps_['us_per_early_return'])} us when too soon, {us(ps_['us_per_read'])} us "
                      f"when it reads the pools ({ps_['reads_per_step']:.2f} per step); writer's rounds by "
                      f"phase (us per step): " + ", ".join(f"{k} {v:.1f}" for k, v in wp.items()), flush=True)


if __name__ == "__main__":
    main()
