"""A tiny stand-in for an SGLang server, for runner tests only (test infrastructure, not evidence).

Main process: a stdlib HTTP server with `/health_generate`, `/server_info` and streaming `/generate`
(SGLang's SSE shape: cumulative `output_ids` and `meta_info.output_token_logprobs` triples, a final
chunk with `finish_reason`, then `data: [DONE]`). Output token i of a prompt is
`(sum(input_ids) + 7 * i) % 1000` with logprob `-0.01 * (i + 1)`. It spawns `--ranks` "scheduler"
children titled `sglang::scheduler_TP<r>` (each with a sleeping grandchild), and behaves like SGLang:
- SIGTERM: drain in-flight requests (health turns 503), kill its tree, exit 0;
- a scheduler dies: SIGKILL its process group, itself included (SGLang's SIGQUIT path, status -9);
- with CPTEST_PROBE_DIR: appends a Step(decode) record to rank0.jsonl per generated token.
Test knobs: `--reject MSG` (print and exit 1 during launch), `--ready-after S`, `--token-delay S`,
`--ignore-sigterm`, `--orphan` (a double-forked grandchild reparented to init), and per request
a prompt starting with `SLOW` then N (N ms per token) or `FAIL` (an error chunk naming the prompt's
second token): the plan's sampling parameters are typed, so the knobs travel in the token ids.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def scheduler_main(rank: int) -> None:
    import setproctitle

    setproctitle.setproctitle(f"sglang::scheduler_TP{rank}")
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    signal.signal(signal.SIGTERM, lambda *_: (helper.kill(), os._exit(0)))
    while True:
        time.sleep(1)


def spawn_orphan() -> None:
    # Double fork: the grandchild's parent exits, so init adopts it; it keeps our session id.
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    time.sleep(3600)\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)



SLOW = 900001
"""A prompt `[SLOW, ms, ...]` is answered at `ms` milliseconds per token."""
FAIL = 900002
"""A prompt `[FAIL, n, ...]` gets an error chunk `bad input n`."""

class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.draining = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.schedulers: list[subprocess.Popen[bytes]] = []
        self.probe = None
        probe_dir = os.environ.get("CPTEST_PROBE_DIR")
        if probe_dir:
            os.makedirs(probe_dir, exist_ok=True)
            self.probe = open(os.path.join(probe_dir, "rank0.jsonl"), "a")  # noqa: SIM115
        self.step = 0

    def write_step(self) -> None:
        if self.probe is None:
            return
        with self.lock:
            self.step += 1
            rec = {"v": 1, "kind": "step", "t": time.monotonic() - self.t0, "rank": {"world": 0},
                   "step": self.step, "mode": "decode", "batch_size": 1, "rows_in": 1}
            self.probe.write(json.dumps(rec) + "\n")
            self.probe.flush()

    def watch_schedulers(self) -> None:
        while not self.draining:
            for p in self.schedulers:
                if p.poll() is not None and not self.draining:
                    print(f"Subprocess scheduler crashed with exit code {p.returncode}", flush=True)
                    # SGLang's SIGQUIT path kills the children and then itself; the process group
                    # also takes the helpers of the dead scheduler, which init adopted.
                    os.killpg(os.getpgrp(), signal.SIGKILL)
            time.sleep(0.05)


ENGINE: Engine


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def _reply(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        e = ENGINE
        if self.path in ("/health", "/health_generate"):
            ok = not e.draining and time.monotonic() - e.t0 >= e.args.ready_after
            self._reply(200 if ok else 503)
        elif self.path in ("/server_info", "/get_server_info"):
            self._reply(200, json.dumps({"tp_size": e.args.ranks, "max_total_num_tokens": 4096,
                                         "version": "fake"}).encode())
        else:
            self._reply(404)

    def do_POST(self) -> None:
        e = ENGINE
        if self.path != "/generate":
            self._reply(404)
            return
        if e.draining:
            self._reply(503)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        ids = body["input_ids"]
        sp = body.get("sampling_params") or {}
        n = int(sp.get("max_new_tokens", 16))
        knob = ids[0] if ids else None
        delay = ids[1] / 1000 if knob == SLOW and len(ids) > 1 else e.args.token_delay
        with e.lock:
            e.inflight += 1
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if knob == FAIL:
                err = {"error": {"message": f"bad input {ids[1] if len(ids) > 1 else ''}", "code": 400}}
                self.wfile.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            else:
                out: list[int] = []
                lps: list[list] = []
                for i in range(n):
                    time.sleep(delay)
                    out.append((sum(ids) + 7 * i) % 1000)
                    lps.append([-0.01 * (i + 1), out[-1], None])
                    e.write_step()
                    fin = {"type": "length", "length": n} if i == n - 1 else None
                    chunk = {"text": None, "output_ids": out, "meta_info": {
                        "id": "x", "finish_reason": fin, "prompt_tokens": len(ids),
                        "completion_tokens": len(out), "output_token_logprobs": lps}}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        finally:
            with e.lock:
                e.inflight -= 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--scheduler", type=int, default=None)
    ap.add_argument("--reject", default=None)
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--token-delay", type=float, default=0.0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--orphan", action="store_true")
    args = ap.parse_args()
    if args.scheduler is not None:
        scheduler_main(args.scheduler)
        return
    global ENGINE
    ENGINE = e = Engine(args)
    print(f"fake engine pid {os.getpid()} port {args.port}", flush=True)
    if os.environ.get("CPTEST_PROBE_COPY_WITHIN_S"):  # what the runner told the probe, for its tests
        print(f"probe copy bound {os.environ['CPTEST_PROBE_COPY_WITHIN_S']} s", flush=True)
    if args.reject:
        time.sleep(0.2)
        print(f"ValueError: {args.reject}", file=sys.stderr, flush=True)
        sys.exit(1)
    # The SIGTERM disposition comes before the children: a test sees the whole tree and may signal
    # it at once, and a SIGTERM before the handler would end the head with -15 instead of a drain.
    # (Under --ignore-sigterm the children inherit SIG_IGN through exec: that tree ends by SIGKILL.)
    stop = threading.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for r in range(args.ranks):
        e.schedulers.append(subprocess.Popen([sys.executable, __file__, "--scheduler", str(r)]))
    if args.orphan:
        spawn_orphan()
    threading.Thread(target=e.watch_schedulers, daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("The server is fired up and ready to roll!", flush=True)
    while not stop.wait(0.1):
        pass
    print("SIGTERM received. Draining requests and shutting down...", flush=True)
    e.draining = True
    deadline = time.monotonic() + 5
    while e.inflight and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # the watcher sees `draining` and stops before we kill our own schedulers
    procs = e.schedulers
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=5)
    os._exit(0)


if __name__ == "__main__":
    main()
