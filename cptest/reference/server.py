"""`python3 -m cptest.reference.server`: the reference engine's HTTP process and its rank processes.

Process tree (like SGLang's): this process (title `cptest-ref::server`) serves HTTP and forks one
process per rank (`cptest-ref::scheduler_TP<r>`, see `rank.py`). With `--nnodes N` (SGLang's flags:
`--node-rank k`, `--dist-init-addr HOST:PORT` of node 0's rendezvous) node 0 is this process with
its block of ranks, and every other node a `FollowerNode` (`cptest-ref::node<k>`, no HTTP).
HTTP subset (the pinned SGLang release's shapes,
`cptest/run/driver.py`):

- `POST /generate`: input_ids, sampling_params (max_new_tokens, temperature, top_k, top_p,
  sampling_seed, stop_token_ids, ignore_eos), rid, stream, return_logprob, logprob_start_len (-1, or
  0 <= L <= len(input_ids)), top_logprobs_num (0..64). `stream: false` answers one JSON object
  `{text, output_ids, meta_info}`; `stream: true` SSE `data: {...}` chunks of the same shape with
  cumulative output_ids and meta_info lists, then `data: [DONE]`. meta_info: id, finish_reason,
  prompt_tokens, completion_tokens, cached_tokens, e2e_latency; with return_logprob also
  input_token_logprobs, output_token_logprobs, output_token_logprobs_length, and with
  top_logprobs_num > 0 input_top_logprobs and output_top_logprobs (`[logprob, token_id, null]`
  triples; shapes and their SGLang sources: `Logprobs`). Logprobs are log_softmax of the raw
  logits (not temperature-scaled). A bad body or value: 400 `{"error": {"message": ...}}`.
- `POST /flush_cache` (200: the reference keeps no prefix cache to drop).
- `GET /server_info` (alias `/get_server_info`), `GET /health`, `GET /health_generate` (a real
  one-token generation through every rank).

Signals: SIGTERM drains (new requests get 503, in-flight ones finish), then every rank exits and
this process exits 0. A rank that dies makes the watcher send SIGQUIT to this process, which fails
every in-flight request with an error chunk, SIGKILLs the ranks and then itself (status -9), as
SGLang's watchdog path does (docs/sglang.md §10): requests get errors, never hang.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cptest import __version__
from cptest.reference.layout import Layout, node_ranks
from cptest.reference.server_args import NODE_TITLE, SERVER_TITLE, TITLE_PREFIX, ReferenceConfig, parse

HEALTH_TIMEOUT_S = 20.0
LISTEN_BACKLOG = 1024
"""Pending connections the listening socket holds (`listen()` backlog; the kernel caps it at
`net.core.somaxconn`). socketserver's default is 5: the driver opens one connection per request
(bench_serving's policy), so a burst of 16-64 connects overflows it, the kernel falls back to SYN
cookies and drops handshakes, and requests fail with transport errors, already at concurrency 16.
It must hold at least a workload's concurrency plus the readiness and info probes."""

RANK_THREADS = 1
"""torch intra-op threads per rank. One: the ops are small, and ranks share the cores with each other
and with cptest's driver; two threads per rank made a TP1 run five times slower on 2 cores (spinning)."""


def capacity_line(rows: int, page: int, dcp: int) -> str:
    """The line that states the server's KV capacity (`cptest.engines.reference.LOG_PATTERNS` reads it)."""
    return f"KV pool: {rows} rows per rank, page {page}, logical capacity max_total_num_tokens={rows * dcp}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} cptest-ref] {msg}", flush=True)


def pool_rows(cfg: ReferenceConfig) -> int:
    """KV pool rows per rank: whole blocks of `page * dcp` logical tokens (every node computes the same)."""
    block = cfg.page_size * cfg.degrees.dcp
    blocks = max((cfg.max_total_tokens or 32768) // block, 1)
    return blocks * cfg.page_size


def rank_args(cfg: ReferenceConfig, rows: int, context_length: int) -> Any:
    """What every rank of this node is started with; several nodes meet at `--dist-init-addr`."""
    from cptest.reference.rank import RankArgs, free_port

    init = None
    if cfg.degrees.nodes > 1:
        if not cfg.dist_init_addr:
            raise SystemExit("cptest-ref: --nnodes > 1 needs --dist-init-addr HOST:PORT "
                             "(node 0's rendezvous)")
        init = f"tcp://{cfg.dist_init_addr}"
    return RankArgs(model_dir=cfg.model_path, degrees=cfg.degrees, rows=rows, page=cfg.page_size,
                    max_running=cfg.max_running_requests, context_length=context_length,
                    master_port=free_port(), title_prefix=TITLE_PREFIX, threads=RANK_THREADS,
                    init_method=init)


class Engine:
    """The HTTP process's view of the ranks: a pipe to rank 0 and one event queue per request."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        self.cfg = cfg
        self.queues: dict[str, queue.Queue[tuple[Any, ...]]] = {}
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.draining = False
        self.stopping = False
        self.capacity = 0
        self.procs: list[Any] = []
        self.conn: Any = None
        self.httpd: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from cptest.reference.modeling import load_config
        from cptest.reference.rank import rank_main

        cfg = self.cfg
        model = load_config(Path(cfg.model_path))
        d = cfg.degrees
        lay = Layout(d, rank=0)
        bad = lay.problems()
        if bad:
            raise SystemExit(f"cptest-ref: cannot serve this layout: {'; '.join(bad)}")
        rows = pool_rows(cfg)
        ctx = cfg.context_length or model.context_length
        if d.dcp > 1:
            log(f"DCP enabled, dcp_size={d.dcp}, tp_size={d.tp}")
        if lay.pcp:
            log(f"prefill context parallelism enabled, attn_cp_size={d.attn_cp}, "
                f"strategy={lay.strategy}")
        if d.attn_dp > 1:
            log(f"attention DP enabled, dp_size={d.attn_dp}, attn_tp_size={d.attn_tp}: each DP rank "
                f"its own requests and KV pool (capacity below is one DP rank's)")
        log(f"{model.architecture}: {model.layers} layers, hidden {model.hidden}, heads {model.heads}, "
            f"kv_heads {model.kv_heads}; tp {d.tp}, dcp {d.dcp}, attn_cp {d.attn_cp}, attn_dp {d.attn_dp}")
        log(capacity_line(rows, cfg.page_size, d.dcp))
        args = rank_args(cfg, rows, ctx)
        ctx_fork = mp.get_context("fork")
        ours, theirs = ctx_fork.Pipe(duplex=True)
        me = os.getpid()
        for r in node_ranks(d, 0):
            p = ctx_fork.Process(target=rank_main, args=(r, args, theirs if r == 0 else None, me),
                                 name=f"rank{r}", daemon=False)
            p.start()
            self.procs.append(p)
        self.conn = ours
        threading.Thread(target=self._watch, name="rank-watcher", daemon=True).start()
        first = self._recv_ready()
        self.capacity = int(first)
        threading.Thread(target=self._dispatch, name="dispatch", daemon=True).start()
        log(f"ranks ready: {', '.join(str(p.pid) for p in self.procs)}")

    def _recv_ready(self) -> int:
        while True:
            if self.conn.poll(0.2):
                for m in self.conn.recv():
                    if m[0] == "ready":
                        return int(m[1])
            if any(p.exitcode is not None for p in self.procs):
                time.sleep(0.5)  # the watcher reports it and brings the process down
                raise SystemExit(3)

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            dead = [(r, p) for r, p in enumerate(self.procs) if p.exitcode is not None]
            if dead and not self.stopping:
                time.sleep(0.2)  # let a peer's death and its consequences settle, to name them all
                for r, p in enumerate(self.procs):
                    if p.exitcode is not None:
                        log(f"rank {r} (pid {p.pid}) exited with status {p.exitcode}")
                log(f"sending SIGQUIT to the server (pid {os.getpid()})")
                os.kill(os.getpid(), signal.SIGQUIT)
                return

    def _dispatch(self) -> None:
        while True:
            try:
                events = self.conn.recv()
            except (EOFError, OSError):
                return
            for e in events:
                q = self.queues.get(e[1]) if len(e) > 1 else None
                if q is not None:
                    q.put(e)

    def submit(self, rid: str, ids: list[int], max_new: int, sampling: dict[str, Any],
               logprob_start_len: int = -1, top_logprobs_num: int = 0) -> queue.Queue[Any]:
        q: queue.Queue[tuple[Any, ...]] = queue.Queue()
        with self.lock:
            if rid in self.queues:
                raise ValueError(f"duplicate rid {rid!r}")
            self.queues[rid] = q
        self._send([("gen", rid, ids, max_new, sampling, logprob_start_len, top_logprobs_num)])
        return q

    def release(self, rid: str, aborted: bool) -> None:
        with self.lock:
            self.queues.pop(rid, None)
        if aborted:
            self._send([("abort", rid)])

    def inflight(self) -> int:
        with self.lock:
            return len(self.queues)

    def _send(self, msgs: list[tuple[Any, ...]]) -> None:
        with self.send_lock:
            self.conn.send(msgs)

    # ------------------------------------------------------------------ signals
    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.draining:
            return
        self.draining = True
        log(f"SIGTERM received. Draining {self.inflight()} in-flight request(s), then shutting down")
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self) -> None:
        while self.inflight():
            time.sleep(0.05)
        self.stopping = True
        self._send([("shutdown",)])
        for p in self.procs:
            p.join(timeout=30)
        for r, p in enumerate(self.procs):
            if p.exitcode is None:
                log(f"rank {r} (pid {p.pid}) did not exit within 30 s; killing it")
                p.kill()
                p.join(timeout=5)
        log("all ranks exited; bye")
        if self.httpd is not None:
            self.httpd.shutdown()

    def on_sigquit(self, signum: int, frame: Any) -> None:
        log("SIGQUIT received: a rank died; failing in-flight requests and killing the process tree")
        self.stopping = True
        with self.lock:
            qs = list(self.queues.items())
        for rid, q in qs:
            q.put(("error", rid, "the reference engine lost a rank (SIGQUIT); request aborted"))
        deadline = time.monotonic() + 1.0
        while self.inflight() and time.monotonic() < deadline:
            time.sleep(0.02)
        for p in self.procs:
            if p.exitcode is None and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class FollowerNode:
    """Node k > 0 of a multi-node server (SGLang's `--node-rank k`): no HTTP, only this node's ranks,
    which take their steps from rank 0 on node 0 over gloo.

    Its ends mirror the leader's: the leader's shutdown ends every rank (exit 0 once they all did);
    a rank that dies otherwise (a fault, the leader gone) makes this process SIGKILL its other ranks
    and itself (status -9), as the leader's SIGQUIT path does. SIGTERM (cptest's shutdown, or
    Slurm's signal to every process of the job) waits up to `FOLLOWER_GRACE_S` for the leader's
    shutdown to end the ranks, then kills them."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        self.cfg = cfg
        self.procs: list[Any] = []
        self.terminating = threading.Event()

    def run(self) -> int:
        from cptest.reference.modeling import load_config
        from cptest.reference.rank import rank_main

        cfg, d = self.cfg, self.cfg.degrees
        if not 0 < cfg.node_rank < d.nodes:
            raise SystemExit(f"cptest-ref: --node-rank {cfg.node_rank} outside 0..{d.nodes - 1}")
        bad = Layout(d, rank=0).problems()
        if bad:
            raise SystemExit(f"cptest-ref: cannot serve this layout: {'; '.join(bad)}")
        model = load_config(Path(cfg.model_path))
        args = rank_args(cfg, pool_rows(cfg), cfg.context_length or model.context_length)
        ctx_fork = mp.get_context("fork")
        me = os.getpid()
        ranks = node_ranks(d, cfg.node_rank)
        log(f"node {cfg.node_rank} of {d.nodes}: ranks {ranks.start}..{ranks.stop - 1}, "
            f"rendezvous {cfg.dist_init_addr}")
        for r in ranks:
            p = ctx_fork.Process(target=rank_main, args=(r, args, None, me), name=f"rank{r}", daemon=False)
            p.start()
            self.procs.append(p)
        log(f"ranks started: {', '.join(str(p.pid) for p in self.procs)}")
        deadline: float | None = None
        while True:
            time.sleep(0.1)
            codes = [p.exitcode for p in self.procs]
            if self.terminating.is_set() and deadline is None:
                deadline = time.monotonic() + FOLLOWER_GRACE_S
            if all(c == 0 for c in codes):
                log("all ranks exited; bye")
                return 0
            failed = [(r, p) for r, p in zip(ranks, self.procs, strict=True) if p.exitcode not in (None, 0)]
            late = deadline is not None and time.monotonic() > deadline
            if failed or late:
                time.sleep(0.2)  # let a peer's death and its consequences settle, to name them all
                for r, p in zip(ranks, self.procs, strict=True):
                    if p.exitcode is not None:
                        log(f"rank {r} (pid {p.pid}) exited with status {p.exitcode}")
                why = "ranks did not end after SIGTERM" if late and not failed else "a rank died"
                log(f"{why}: killing this node's ranks and itself")
                for p in self.procs:
                    if p.exitcode is None and p.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(p.pid, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if not self.terminating.is_set():
            log(f"SIGTERM received: waiting up to {FOLLOWER_GRACE_S:.0f} s for node 0 to end the ranks")
            self.terminating.set()


FOLLOWER_GRACE_S = 30.0
"""How long a follower node waits after SIGTERM for node 0's shutdown to end its ranks."""

MAX_TOP_LOGPROBS = 64
"""The largest `top_logprobs_num` the reference serves (SGLang sets no bound; a bound keeps a request's
answer small)."""


def _int_field(body: dict[str, Any], name: str, default: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, not {v!r}")
    return v


def logprob_options(body: dict[str, Any], n_input: int) -> tuple[int, int]:
    """(logprob_start_len, top_logprobs_num) of a /generate body; ValueError for a value it refuses.

    As in the pinned SGLang release, both are ignored without `return_logprob`
    (managers/scheduler.py:2542-2544): then (-1, 0). `logprob_start_len` is -1 (output tokens only)
    or 0 <= L <= len(input_ids); SGLang refuses L > len(input_ids) (scheduler.py:2561-2565) and
    serves L == len(input_ids) as no input positions. `top_logprobs_num` is 0 <= K <= MAX_TOP_LOGPROBS.
    """
    start = _int_field(body, "logprob_start_len", -1)
    k = _int_field(body, "top_logprobs_num", 0)
    if not body.get("return_logprob"):
        return -1, 0
    if start < -1:
        raise ValueError(f"logprob_start_len={start} must be -1 or a position 0..{n_input} of the input")
    if start > n_input:
        raise ValueError(f"logprob_start_len={start} is higher than the number of input tokens "
                         f"len(input_ids)={n_input}. Please use a smaller logprob_start_len.")
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num={k} must be in 0..{MAX_TOP_LOGPROBS}")
    return start, k


def _triples(pairs: list[tuple[float, int]] | list[list[Any]] | None) -> list[list[Any]] | None:
    return None if not pairs else [[lp, t, None] for lp, t in pairs]


class Logprobs:
    """The logprob fields of one request's `meta_info`, in the pinned SGLang release's shapes.

    Cited from `sglang/srt/` of the pinned release's wheel (cp312, sha256 fb4cba47...068093). SGLang
    (return_text_in_logprobs false) sends every logprob as a triple `[logprob, token_id, null]`
    (managers/tokenizer_manager.py:2699-2711, `detokenize_logprob_tokens`). With `return_logprob`,
    every chunk's meta_info (2228-2236) has `input_token_logprobs`, `output_token_logprobs` and
    `output_token_logprobs_length`, and with `top_logprobs_num` K > 0 also `input_top_logprobs` and
    `output_top_logprobs` (2481-2586, `add_logprob_to_meta_info`): per position a list of K triples,
    logprob descending (torch.topk, layers/logprob_processor.py:64-72), or null where SGLang has no
    values (tokenizer_manager.py:2719-2737, `detokenize_top_logprobs_tokens`). The lists are
    cumulative in every chunk of a stream; the input lists come once, with the first token
    (managers/scheduler_components/output_streamer.py:459-497).

    Input positions: with `logprob_start_len` L >= 0, `len(input_ids) - L` entries (positions
    L..len(input_ids)-1, token ids `input_ids[L:]`); the first entry's logprob is null and its top-k
    entry null *whatever L is*: SGLang computes logits from row L on, so token L itself is never
    scored (layers/logits_processor.py:575-620; scheduler_components/logprob_result_processor.py:36-38
    prepends None and drops the sampling row, :50 takes the ids from L, :64-80 the same for the
    top-k; lengths asserted at :152-163, :276-285). With L == -1 (default) SGLang takes
    L = len(input_ids) (managers/scheduler.py:2546-2550): the input lists are `[]`.
    """

    def __init__(self, ids: list[int], start: int, k: int) -> None:
        self.ids, self.start, self.k = ids, start, k
        self.input: list[list[Any]] = []
        self.input_top: list[list[list[Any]] | None] = []
        self.output: list[list[Any]] = []
        self.output_top: list[list[list[Any]] | None] = []

    def add(self, tok: int, lp: float, extra: dict[str, Any] | None) -> None:
        extra = extra or {}
        if "input" in extra:
            self.input = [[v, t, None] for v, t in zip(extra["input"], self.ids[self.start :], strict=True)]
            self.input_top = [_triples(row) for row in (extra.get("input_top") or [])]
        self.output.append([lp, tok, None])
        if self.k > 0:
            self.output_top.append(_triples(extra.get("top")))

    def fields(self) -> dict[str, Any]:
        m: dict[str, Any] = {"input_token_logprobs": self.input, "output_token_logprobs": self.output,
                             "output_token_logprobs_length": len(self.output)}
        if self.k > 0:
            m["input_top_logprobs"] = self.input_top
            m["output_top_logprobs"] = self.output_top
        return m


def meta(rid: str, prompt: int, out: list[int], finish: dict[str, Any] | None, logprobs: Logprobs | None,
         t0: float) -> dict[str, Any]:
    m: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": prompt,
                         "completion_tokens": len(out), "cached_tokens": 0,
                         "e2e_latency": round(time.monotonic() - t0, 6)}
    if logprobs is not None:
        m.update(logprobs.fields())
    return m


def handler_for(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base signature
            pass

        def _json(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?")[0]
            if path == "/health":
                self._json(503 if engine.draining else 200, {})
            elif path == "/health_generate":
                self._health_generate()
            elif path in ("/server_info", "/get_server_info"):
                c, d = engine.cfg, engine.cfg.degrees
                self._json(200, {
                    "engine": "reference", "version": f"cptest-reference {__version__}",
                    "model_path": c.model_path, "tp_size": d.tp, "dcp_size": d.dcp, "attn_cp_size": d.attn_cp,
                    "enable_prefill_cp": d.prefill_cp, "cp_strategy": d.cp_strategy, "page_size": c.page_size,
                    "max_total_num_tokens": engine.capacity, "max_running_requests": c.max_running_requests,
                    "context_length": c.context_length, "pp_size": 1, "dp_size": 1,
                })  # fmt: skip
            else:
                self._json(404, {"error": {"message": f"no route {path}"}})

        def _health_generate(self) -> None:
            if engine.draining:
                self._json(503, {"error": {"message": "draining"}})
                return
            rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
            q = engine.submit(rid, [0], 1, {"temperature": 0.0, "ignore_eos": True})
            try:
                e = q.get(timeout=HEALTH_TIMEOUT_S)
            except queue.Empty:
                engine.release(rid, aborted=True)
                self._json(503, {"error": {"message": "health generation timed out"}})
                return
            engine.release(rid, aborted=False)
            self._json(200 if e[0] == "token" else 503, {})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?")[0] == "/flush_cache":
                # SGLang's route; the reference engine keeps no prefix cache, so there is nothing to drop.
                self._json(200, {"message": "Cache flushed."})
                return
            if self.path.split("?")[0] != "/generate":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                ids = [int(i) for i in body["input_ids"]]
                sp = dict(body.get("sampling_params") or {})
                max_new = int(sp.pop("max_new_tokens", 128))
                start, k = logprob_options(body, len(ids))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                self._json(400, {"error": {"message": f"bad request: {type(e).__name__}: {e}"}})
                return
            if engine.draining:
                self._json(503, {"error": {"message": "the server is shutting down"}})
                return
            rid = str(body.get("rid") or uuid.uuid4().hex)
            logprobs = Logprobs(ids, start, k) if body.get("return_logprob") else None
            stream = bool(body.get("stream"))
            t0 = time.monotonic()
            try:
                q = engine.submit(rid, ids, max_new, sp, start, k)
            except ValueError as e:
                self._json(400, {"error": {"message": str(e)}})
                return
            out: list[int] = []
            finished = False
            try:
                if stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.end_headers()
                while not finished:
                    e = q.get()
                    if e[0] == "error":
                        finished = True
                        err = {"error": {"message": e[2]}}
                        if stream:
                            self.wfile.write(f"data: {json.dumps(err)}\n\n".encode())
                            self.wfile.write(b"data: [DONE]\n\n")
                        else:
                            self._json(500, err)
                        return
                    _, _, tok, lp, finish, extra = e
                    out.append(int(tok))
                    if logprobs is not None:
                        logprobs.add(int(tok), float(lp), extra)
                    finished = finish is not None
                    chunk = {"text": "", "output_ids": list(out),
                             "meta_info": meta(rid, len(ids), out, finish, logprobs, t0)}
                    if stream:
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    elif finished:
                        self._json(200, chunk)
                if stream:
                    self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; the request is aborted below
            finally:
                engine.release(rid, aborted=not finished)

    return Handler


class Server(ThreadingHTTPServer):
    """The HTTP server: one thread per connection, a listen backlog that holds a burst of connects."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    allow_reuse_port = False
    """Never share the port: with SO_REUSEPORT a second server would bind beside another run's and
    the kernel would split connections between them (newer Pythons default it on for HTTPServer)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away before its answer was written (a readiness probe that timed out
        while the ranks were still starting) is the client's business: one line, not a traceback
        (a `log absent "Traceback"` expectation reads the log). Anything else: socketserver's
        traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log(f"client {client_address[0]}:{client_address[1]} went away before its answer was written")
            return
        super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> int:
    import setproctitle

    cfg = parse(sys.argv[1:] if argv is None else argv)
    if cfg.node_rank > 0:
        setproctitle.setproctitle(f"{NODE_TITLE}{cfg.node_rank}")
        node = FollowerNode(cfg)
        signal.signal(signal.SIGTERM, node.on_sigterm)
        log(f"cptest reference engine {__version__} (CPU, float32, gloo; not SGLang) pid {os.getpid()}")
        return node.run()
    setproctitle.setproctitle(SERVER_TITLE)
    engine = Engine(cfg)
    signal.signal(signal.SIGQUIT, engine.on_sigquit)
    signal.signal(signal.SIGTERM, engine.on_sigterm)
    log(f"cptest reference engine {__version__} (CPU, float32, gloo; not SGLang) pid {os.getpid()}")
    # Bind before starting ranks: a port already in use fails the launch at once, before any rank.
    httpd = Server((cfg.host, cfg.port), handler_for(engine))
    engine.httpd = httpd
    # The ranks are forked after the bind: without this each would hold the listening socket too,
    # and a rank outliving the HTTP process would keep the port bound (and look like its listener).
    os.register_at_fork(after_in_child=httpd.socket.close)
    engine.start()
    log(f"serving on http://{cfg.host}:{cfg.port}")
    httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
