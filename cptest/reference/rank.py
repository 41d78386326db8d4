"""One rank process of the reference engine: torch.distributed (gloo) member, model shard, KV pool.

Rank 0 also runs the scheduler: it receives requests from the HTTP process over a pipe, decides
each step, broadcasts it to every rank (`broadcast_object_list` over the world group), samples
from the logits and sends token events back, with the logprobs a request asked for (its output
tokens' top-k; with the first token, its input positions' logprobs and top-k). Every rank writes
the probe's evidence records to `$CPTEST_PROBE_DIR/rank<world>.jsonl` (Geometry, KvPool, Capacity,
Graph `disabled`, one Step per forward), flushed line by line so a killed rank leaves at most one
truncated line. Rank 0 and every other rank hold a lifeline (`lifeline.py`): a peer's death stops
the rank that sees it even where gloo would leave it waiting in a collective.

With attention DP the leader keeps one scheduler (and one pool's accounting) per DP rank, hands each
request to the next DP rank in turn (SGLang's default `round_robin` load balancing), and every step
message carries one part per DP rank: its batch, or nothing (an idle forward that still joins the
MLP's collectives, as SGLang's idle batches do). Each DP rank's first rank computes its logits, and
an all-gather brings them to the leader to sample.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cptest.evidence import (
    Capacity,
    DpBuffer,
    Geometry,
    Graph,
    KvPool,
    ProbeNote,
    RankId,
    Step,
    ranges_from,
    slot_runs_from,
)
from cptest.probe.pool_hooks import PoolSampler
from cptest.reference.layout import Layout
from cptest.reference.lifeline import Lifelines
from cptest.reference.modeling import DpSizes, Model, ModelConfig, SeqRows, SoloComm, load_shard
from cptest.reference.modeling import KvPool as Pool
from cptest.reference.scheduler import BlockView, Request, Scheduler
from cptest.store import rank_file_name
from cptest.topology import Degrees, process_title

GLOO_TIMEOUT = timedelta(days=1)
"""A stopped rank (SIGSTOP fault) must not turn into a collective timeout: only death ends a rank."""


@dataclass(frozen=True)
class RankArgs:
    model_dir: str
    degrees: Degrees
    rows: int
    page: int
    max_running: int
    context_length: int
    master_port: int
    title_prefix: str
    threads: int
    init_method: str | None = None
    """torch.distributed's rendezvous; None: `tcp://127.0.0.1:<master_port>` (one node). Several
    nodes meet at node 0's `--dist-init-addr`, as SGLang's do."""

    @property
    def rendezvous(self) -> str:
        return self.init_method or f"tcp://127.0.0.1:{self.master_port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_title(prefix: str, layout: Layout) -> str:
    """`<prefix>_ATTN_CP<c>_TP<r>`: SGLang's title scheme, from `cptest.topology.process_title`."""
    return process_title(layout.me, layout.degrees, prefix)


class GlooComm:
    """Collectives over gloo groups built identically on every rank (size-1 groups are skipped)."""

    def __init__(self, layout: Layout) -> None:
        self.groups: dict[str, Any] = {}
        names = ("tp", "dcp", "attn_cp", "attn_tp") + (("dp_block",) if layout.attn_dp > 1 else ())
        for name in names:
            for members in layout.all_groups(name):
                pg = None
                if len(members) > 1:
                    pg = dist.new_group(members, backend="gloo", timeout=GLOO_TIMEOUT)
                if layout.rank in members:
                    self.groups[name] = pg

    def all_reduce(self, t: torch.Tensor, group: str) -> torch.Tensor:
        pg = self.groups.get(group)
        if pg is None:
            return t
        t = t.contiguous()
        dist.all_reduce(t, group=pg)
        return t

    def all_gather(self, t: torch.Tensor, group: str) -> list[torch.Tensor]:
        pg = self.groups.get(group)
        if pg is None:
            return [t]
        t = t.contiguous()
        out = [torch.empty_like(t) for _ in range(dist.get_world_size(pg))]
        dist.all_gather(out, t, group=pg)
        return out


class Evidence:
    """JSON lines of probe records; no-op without CPTEST_PROBE_DIR."""

    def __init__(self, world_rank: int) -> None:
        d = os.environ.get("CPTEST_PROBE_DIR")
        self.t0 = time.monotonic()
        self.f = None
        if d:
            Path(d).mkdir(parents=True, exist_ok=True)
            self.f = open(Path(d) / rank_file_name(world_rank), "a", encoding="utf-8")  # noqa: SIM115

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 6)

    def write(self, record: Any) -> None:
        if self.f is not None:
            self.f.write(record.model_dump_json() + "\n")
            self.f.flush()


def _die_with_parent() -> None:
    """SIGKILL this rank when the HTTP process dies, however it dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def rank_main(rank: int, args: RankArgs, conn: Any, parent: int) -> None:
    """Entry point of a forked rank process. Never returns normally (os._exit by multiprocessing)."""
    _die_with_parent()
    if os.getppid() != parent:
        os._exit(1)
    # The node's main process decides: neither a terminal's ^C nor a SIGTERM sent to every process
    # of the node (what Slurm's `scancel --signal=TERM` does to a job) ends a rank by itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import setproctitle

    layout = Layout(args.degrees, rank)
    setproctitle.setproctitle(rank_title(args.title_prefix, layout))
    torch.set_num_threads(args.threads)
    if args.degrees.tp > 1:
        dist.init_process_group("gloo", init_method=args.rendezvous, rank=rank,
                                world_size=args.degrees.tp, timeout=GLOO_TIMEOUT)
        lifelines = Lifelines.join(rank, args.degrees.tp, args.rendezvous, _exchange)
        comm: Any = GlooComm(layout)
    else:
        lifelines = Lifelines(rank, {})
        comm = SoloComm()
    from cptest.reference.modeling import load_config

    cfg = load_config(Path(args.model_dir))
    shard = load_shard(Path(args.model_dir), cfg, layout)
    pool = Pool(cfg, layout, args.rows, args.page, len(shard.kv_heads))
    model = Model(cfg, shard, layout, comm, pool)
    ev = Evidence(rank)
    rid = _write_static(ev, layout, cfg, args, len(shard.kv_heads))
    if args.degrees.tp > 1:
        dist.barrier()
    try:
        if rank == 0:
            _Leader(args, layout, cfg, model, ev, rid, conn, lifelines).loop()
        else:
            _follow(args, model, ev, rid, lifelines)
    except (RuntimeError, OSError, EOFError) as e:
        # A peer died (gloo reports the reset) or the HTTP process went away: the server's watcher
        # handles it (SIGQUIT path); one line here, not a traceback that reads like an engine bug.
        # Anything else is a bug of the engine and keeps its traceback.
        first = str(e).splitlines()[0] if str(e) else ""
        if not isinstance(e, (OSError, EOFError)) and "gloo" not in first and "Connection" not in first:
            raise
        print(f"cptest-ref rank {rank}: stopping: {type(e).__name__}: {first[:200]}", flush=True)
        os._exit(1)
    if args.degrees.tp > 1:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _write_static(ev: Evidence, layout: Layout, cfg: ModelConfig, args: RankArgs, kv_heads: int) -> RankId:
    rid = RankId(world=layout.rank, tp=layout.rank, dcp=layout.dcp_rank, attn_cp=layout.attn_cp_rank,
                 attn_tp=layout.attn_tp_rank, attn_dp=layout.attn_dp_rank, pid=os.getpid())
    sizes = {"tp": layout.tp, "dcp": layout.dcp, "attn_cp": layout.attn_cp, "attn_tp": layout.attn_tp,
             "attn_dp": layout.attn_dp, "pp": 1, "world": layout.world}
    groups = {name: layout.group(name) for name in ("world", "tp", "dcp", "attn_cp", "attn_tp", "pp")}
    t = ev.now()
    ev.write(Geometry(t=t, rank=rid, sizes=sizes, groups=groups, gpu=None, hostname=socket.gethostname()))
    ev.write(KvPool(t=t, rank=rid, rows=args.rows, allocator_size=args.rows * layout.dcp, page_size=args.page,
                    allocator_page_size=args.page * layout.dcp, head_num=kv_heads, head_dim=cfg.head_dim,
                    layer_num=cfg.layers, dtype="float32"))
    ev.write(Capacity(t=t, rank=rid, max_total_num_tokens=args.rows * layout.dcp,
                      max_running_requests=args.max_running, context_len=args.context_length))
    for phase in ("decode", "prefill"):  # the reference has no CUDA graphs: every forward is eager
        ev.write(Graph(t=t, rank=rid, event="disabled", phase=phase))  # type: ignore[arg-type]
    return rid


def _seq_rows(part: dict[str, Any]) -> list[SeqRows]:
    return [SeqRows(rid=s[0], positions=list(range(s[1], s[1] + s[2])), context=s[3], blocks=s[4],
                    logits_from=s[5]) for s in part.get("seqs", ())]


def _dp_sizes(msg: dict[str, Any], layout: Layout) -> DpSizes | None:
    """The step's attention-DP buffer (None without attention DP): every DP rank's rows, from the
    one message every rank got."""
    if layout.attn_dp == 1:
        return None
    parts = msg["parts"]
    return DpSizes.of([len(p.get("tokens", ())) for p in parts], any(p.get("extend") for p in parts),
                      layout.attn_tp)


def _step(model: Model, ev: Evidence, rid: RankId, msg: dict[str, Any]) -> Any:
    """Run one broadcast step on this rank and record it; returns the logits of its DP rank's batch
    on the rank that speaks for it (its first rank: the leader without attention DP), else None: only
    those run the final norm and lm_head.

    `msg["parts"][d]`: DP rank d's batch: `extend` (None: idle), `tokens`, and `seqs`, per request
    (rid, first position, rows, context, block table, logits_from), see `SeqRows`; every rank gets
    the same message and each runs its DP rank's part (lockstep)."""
    lay = model.layout
    part = msg["parts"][lay.attn_dp_rank]
    want_logits = lay.rank == lay.dp_leader(lay.attn_dp_rank)
    seqs = _seq_rows(part)
    extend = bool(part.get("extend"))
    dp = _dp_sizes(msg, lay)
    logits, st = model.forward(part.get("tokens", []), seqs, extend, want_logits, dp)
    pos = [p for s in seqs for p in s.positions]
    # Under PCP the MLP runs over the whole batch (the attention shards gathered back) and hands
    # every row on: the rows entering and leaving it are the batch's, not the attention's.
    batch = {s.rid: ranges_from(s.positions) for s in seqs} if st.cp_active else None
    seq_positions: dict[str, list[tuple[int, int]]] = {}
    at = 0
    local = set(st.local_rows)
    for s in seqs:
        mine = [p for i, p in enumerate(s.positions) if at + i in local]
        at += len(s.positions)
        if mine:
            seq_positions[s.rid] = ranges_from(mine)
    mode = "idle" if part.get("extend") is None else "extend" if extend else "decode"
    ev.write(Step(
        t=ev.now(), rank=rid, step=msg["step"], mode=mode,  # type: ignore[arg-type]
        batch_size=len(seqs), rows_in=len(pos), attn_rows=st.attn_rows, ffn_rows=st.ffn_rows,
        # The logits stage gets every row's hidden state (gathered under PCP) and picks the rows
        # whose logits it returns; only the rank that speaks for the DP rank's batch runs it.
        logits_rows=len(pos) if want_logits else None, cp_active=st.cp_active if model.layout.pcp else None,
        positions=ranges_from(pos[i] for i in st.local_rows), seq_positions=seq_positions,
        kv_written={k: ranges_from(v) for k, v in st.kv_written.items() if v},
        extend_lens=[len(s.positions) for s in seqs] if extend else [],
        prefix_lens=[0] * len(seqs) if extend else [],
        # Every layer runs the same rows here.
        ffn_out_rows=st.ffn_rows, layers=st.layers, ffn_seq_positions=batch, ffn_out_seq_positions=batch,
        kv_slots={k: slot_runs_from(v) for k, v in st.kv_slots.items() if v},
        kv_read={k: ranges_from(v) for k, v in st.kv_read.items() if v},
        dp_buffer=None if dp is None else DpBuffer(tokens=list(dp.tokens), padded=list(dp.padded),
                                                   rows=dp.rows, mode=dp.mode),  # type: ignore[arg-type]
    ))  # fmt: skip
    return logits


def _gather_logits(model: Model, msg: dict[str, Any], logits: torch.Tensor | None) -> list[torch.Tensor]:
    """Each DP rank's logits, on every rank: its first rank's rows, padded to the longest over one
    all-gather of the TP group (one DP rank: this rank's own)."""
    lay = model.layout
    if lay.attn_dp == 1:
        assert logits is not None
        return [logits]
    counts = [sum(s.logits_rows() for s in _seq_rows(p)) for p in msg["parts"]]
    mine = torch.zeros(max(counts), model.cfg.vocab)
    if logits is not None:
        mine[: logits.shape[0]] = logits
    parts = model.comm.all_gather(mine, "tp")
    return [parts[lay.dp_leader(d)][:n] for d, n in enumerate(counts)]


def _broadcast(msg: dict[str, Any] | None, world: int) -> dict[str, Any]:
    box = _exchange([msg]) if world > 1 else [msg]
    assert box[0] is not None
    return box[0]


def _exchange(box: list[Any]) -> list[Any]:
    """Rank 0's `box` on every rank (the world group's broadcast)."""
    dist.broadcast_object_list(box, src=0)
    return box


def _follow(args: RankArgs, model: Model, ev: Evidence, rid: RankId, lifelines: Lifelines) -> None:
    dcp = args.degrees.dcp
    view = BlockView(args.rows // args.page, args.page * dcp)
    sampler = PoolSampler()
    while True:
        msg = _broadcast(None, args.degrees.tp)
        if msg.get("exit"):
            lifelines.closing()
            return
        # This rank's pool sample at the leader's iteration: its own block count (BlockView) of its
        # DP rank's pool, that DP rank's queue length (only the leader holds the queues).
        part = msg["parts"][model.layout.attn_dp_rank]
        view.update([(s[0], s[4]) for s in part.get("seqs", ())], part.get("released", []))
        rec = sampler.offer(rank=rid, t=ev.now(), step=msg["step"], total=args.rows * dcp,
                            free=view.free_tokens, evictable=None, protected=None, running=len(view.live),
                            waiting=part.get("waiting", 0), scheduler_total=args.rows * dcp)
        if rec is not None:
            ev.write(rec)
        if msg.get("pool_only"):
            continue
        logits = _step(model, ev, rid, msg)
        if model.layout.attn_dp > 1:
            _gather_logits(model, msg, logits)


def sample(logits: torch.Tensor, sampling: dict[str, Any], gen: torch.Generator | None) -> tuple[int, float]:
    """(token, its log-probability under the model's distribution) for one request's logits.

    Greedy when temperature is 0 (or absent); otherwise temperature, top_k and top_p as SGLang's
    pytorch sampling backend applies them. The logprob is of the unscaled distribution.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    temp = float(sampling.get("temperature", 1.0) if sampling.get("temperature") is not None else 1.0)
    if temp <= 1e-6:
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    probs = torch.softmax(logits / temp, dim=-1)
    top_k = int(sampling.get("top_k") or -1)
    if 0 < top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    top_p = float(sampling.get("top_p") or 1.0)
    if top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[si[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    tok = int(torch.multinomial(probs / probs.sum(), 1, generator=gen))
    return tok, float(logp[tok])


TopLogprobs = list[list[tuple[float, int]]]
"""Per position, the top K `(logprob, token_id)` pairs, logprob descending."""


def top_logprobs(logp: torch.Tensor, k: int) -> TopLogprobs:
    """Top `k` of each row of log-probabilities [rows, vocab], sorted descending (torch.topk, as
    SGLang's `get_top_logprobs_raw`, layers/logprob_processor.py:64-72 of the pinned release)."""
    k = min(k, logp.shape[-1])
    values, indices = logp.topk(k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), indices.tolist(), strict=True)]


LOGPROB_CHUNK_ROWS = 1024
"""Rows per log_softmax when scoring input positions: the log-probabilities of a long prompt are
never all in memory beside its logits (SGLang chunks the same way:
layers/logprob_processor.py:416-504, `_forward_by_chunk`)."""


def input_logprobs(rows: torch.Tensor, ids: list[int], start: int, k: int
                   ) -> tuple[list[float | None], list[list[tuple[float, int]] | None] | None]:
    """The pinned SGLang release's input logprobs of positions `start`..len(ids)-1 from `rows`, the logits of
    positions `start`..len(ids)-1 (row j scores token j+1; the last row is the sampling row).

    Entry 0 is None whatever `start` is: SGLang computes logits from row `start` on, so token `start`
    itself is never scored (layers/logits_processor.py:575-620; managers/scheduler_components/
    logprob_result_processor.py:36-38 prepends None and drops the sampling row, :64-80 the same for
    the top-k). Values: log_softmax of the raw logits (layers/logprob_processor.py:500-504, no
    temperature). Returns (len(ids) - start values, as many top-k rows, or None when k == 0)."""
    if start >= len(ids):
        return [], ([] if k > 0 else None)
    vals: list[float | None] = [None]
    top: list[list[tuple[float, int]] | None] | None = [None] if k > 0 else None
    scored = rows.shape[0] - 1
    for a in range(0, scored, LOGPROB_CHUNK_ROWS):
        b = min(a + LOGPROB_CHUNK_ROWS, scored)
        logp = torch.log_softmax(rows[a:b].float(), dim=-1)
        target = torch.tensor(ids[start + 1 + a : start + 1 + b], dtype=torch.long)
        vals.extend(logp.gather(1, target[:, None]).squeeze(1).tolist())
        if top is not None:
            top.extend(top_logprobs(logp, k))
    return vals, top


class _Leader:
    """Rank 0: the schedulers (one per attention-DP rank), step broadcaster, sampler."""

    def __init__(self, args: RankArgs, layout: Layout, cfg: ModelConfig, model: Model, ev: Evidence,
                 rid: RankId, conn: Any, lifelines: Lifelines) -> None:
        self.args, self.layout, self.cfg, self.model, self.ev, self.rid, self.conn = (
            args, layout, cfg, model, ev, rid, conn)
        self.lifelines = lifelines
        blocks = args.rows // args.page
        self.scheds = [Scheduler(blocks, args.page * layout.dcp, max_running=args.max_running)
                       for _ in range(layout.attn_dp)]
        """One per attention-DP rank: each DP rank has its own pool and queue (its own scheduler in
        SGLang); the leader's own pool is DP rank 0's."""
        self.sched = self.scheds[0]
        self.next_dp = 0
        """The DP rank the next request goes to: round robin, SGLang's default load balancing without
        disaggregation (server_args.py:3855-3864, managers/data_parallel_controller.py:754-764)."""
        self.gens: dict[str, torch.Generator] = {}
        self.stopping = False
        self.step_no = 0
        self.sampler = PoolSampler()
        self.released: list[list[str]] = [[] for _ in self.scheds]
        """Per DP rank, requests whose blocks went back to its free list since the last message."""

    def idle(self) -> bool:
        return all(s.idle() for s in self.scheds)

    def loop(self) -> None:
        # The server's capacity is DP rank 0's pool: SGLang's DP controller reports its first DP
        # scheduler's (managers/data_parallel_controller.py:733).
        self.conn.send([("ready", self.sched.capacity)])
        while True:
            if self.idle() and any(self.released):
                self._drained()
            self._receive(block=self.idle())
            if self.stopping and self.idle():
                self.lifelines.closing()
                _broadcast({"exit": True}, self.args.degrees.tp)
                return
            batches = [s.next_batch() for s in self.scheds]
            if all(b is None for b in batches):
                continue
            self._sample()
            self._run(batches)

    def _drained(self) -> None:
        """The last requests were released and nothing waits: the leader's drained sample, and the
        other ranks learn of the releases (a message without a forward), so theirs is written at the
        same iteration. Every rank samples at exactly these points and before each step, so their
        samplers see the same sequence (`PoolSampler` decides from it alone)."""
        self._sample()
        _broadcast({"pool_only": True, "step": self.step_no,
                    "parts": [{"released": r, "waiting": 0} for r in self._take_released()]},
                   self.args.degrees.tp)

    def _take_released(self) -> list[list[str]]:
        out, self.released = self.released, [[] for _ in self.scheds]
        return out

    def _sample(self) -> None:
        """The leader's pool sample after this iteration's admissions (SGLang: after
        `get_next_batch_to_run`), from its scheduler's own free list and queues."""
        s = self.sched
        total = s.capacity
        rec = self.sampler.offer(rank=self.rid, t=self.ev.now(), step=self.step_no, total=total,
                                 free=len(s.free) * s.block_tokens, evictable=None, protected=None,
                                 running=len(s.running), waiting=len(s.waiting), scheduler_total=total)
        if rec is not None:
            self.ev.write(rec)

    def _receive(self, block: bool) -> None:
        while True:
            if not self.conn.poll(0.5 if block else 0):
                if block and not self.stopping:
                    continue
                return
            for m in self.conn.recv():
                self._handle(m)
            block = False

    def _handle(self, m: tuple[Any, ...]) -> None:
        kind = m[0]
        if kind == "gen":
            _, rid, ids, max_new, sampling, start, k = m
            req = Request(rid=rid, input_ids=list(ids), max_new_tokens=int(max_new), sampling=dict(sampling),
                          logprob_start_len=int(start), top_logprobs_num=int(k))
            why = self.scheds[self.next_dp].submit(req)
            if why is not None:
                self.conn.send([("error", rid, why)])
                return
            self.next_dp = (self.next_dp + 1) % len(self.scheds)
            seed = sampling.get("sampling_seed")
            g = torch.Generator()
            g.manual_seed(int(seed) if seed is not None else zlib.crc32(rid.encode()))
            self.gens[rid] = g
        elif kind == "abort":
            for d, sched in enumerate(self.scheds):
                if sched.abort(m[1]) is not None:
                    self.released[d].append(m[1])
            self.gens.pop(m[1], None)
        elif kind == "shutdown":
            self.stopping = True

    def _part(self, batch: Any, released: list[str], waiting: int) -> dict[str, Any]:
        """One DP rank's part of a step message: its batch's rows, or an idle part (`extend` None)."""
        part: dict[str, Any] = {"released": released, "waiting": waiting}
        if batch is None:
            return {**part, "extend": None}
        tokens: list[int] = []
        seqs = []
        for r in batch.requests:
            if batch.extend:
                n = len(r.input_ids)
                tokens.extend(r.input_ids)
                start = r.logprob_start_len if 0 <= r.logprob_start_len < n else None
                seqs.append((r.rid, 0, n, n, r.blocks, start))
            else:
                p = len(r.input_ids) + len(r.output_ids) - 1
                tokens.append(r.output_ids[-1])
                seqs.append((r.rid, p, 1, p + 1, r.blocks, None))
        return {**part, "extend": batch.extend, "tokens": tokens, "seqs": seqs}

    def _run(self, batches: list[Any]) -> None:
        released = self._take_released()
        parts = [self._part(b, r, len(s.waiting))
                 for b, r, s in zip(batches, released, self.scheds, strict=True)]
        msg = {"step": self.step_no, "parts": parts}
        self.step_no += 1
        _broadcast(msg, self.args.degrees.tp)
        per_dp = _gather_logits(self.model, msg, _step(self.model, self.ev, self.rid, msg))
        events: list[tuple[Any, ...]] = []
        for d, (batch, part) in enumerate(zip(batches, parts, strict=True)):
            if batch is not None:
                events.extend(self._sample_batch(d, batch.extend, batch.requests, _seq_rows(part), per_dp[d]))
        if not all(s.leak_free() for s in self.scheds):  # an accounting bug must be visible, not silent
            self.ev.write(ProbeNote(rank=self.rid, level="error", message="KV block accounting leaked"))
        self.conn.send(events)

    def _sample_batch(self, dp_rank: int, extend: bool, reqs: list[Request], seqs: list[SeqRows],
                      logits: torch.Tensor) -> list[tuple[Any, ...]]:
        """Each request's next token (and the logprobs it asked for) from its DP rank's logits."""
        sched = self.scheds[dp_rank]
        events: list[tuple[Any, ...]] = []
        at = 0
        for r, s in zip(reqs, seqs, strict=True):
            n_rows = s.logits_rows()
            rows = logits[at : at + n_rows]
            at += n_rows
            tok, lp = sample(rows[-1], r.sampling, self.gens.get(r.rid))
            extra: dict[str, Any] = {}
            if r.top_logprobs_num > 0:
                logp = torch.log_softmax(rows[-1:].float(), dim=-1)
                extra["top"] = top_logprobs(logp, r.top_logprobs_num)[0]
            if extend and r.logprob_start_len >= 0:
                extra["input"], extra["input_top"] = input_logprobs(rows, r.input_ids, r.logprob_start_len,
                                                                    r.top_logprobs_num)
            r.output_ids.append(tok)
            stops = set(r.sampling.get("stop_token_ids") or [])
            if not r.sampling.get("ignore_eos"):
                stops |= set(self.cfg.eos)
            finish = None
            if tok in stops:
                finish = {"type": "stop", "matched": tok}
            elif len(r.output_ids) >= r.max_new_tokens:
                finish = {"type": "length", "length": r.max_new_tokens}
            events.append(("token", r.rid, tok, lp, finish, extra or None))
            if finish is not None:
                sched.finish(r)
                self.released[dp_rank].append(r.rid)
                self.gens.pop(r.rid, None)
        return events
