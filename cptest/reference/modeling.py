"""The reference model: Llama / Qwen3 decoder in float32 on CPU, sharded by a `Layout`.

Contract: with any layout (TP, PCP zigzag/interleave, DCP) the logits of a batch equal those of an
unsharded forward up to float32 reduction order (tests/reference/test_parity.py holds it to 1e-4 in
log-probability against transformers). Collectives go through `Comm`, so the math is one code path
for one rank and for many.

Per layer: RMSNorm on every row (hidden states are replicated on every rank), attention on this
rank's *attention rows* (all rows, or this CP rank's share of an extend under PCP) for its query
heads, K/V written to the paged pool (all rows under PCP after an all-gather over the ATTN_CP group;
only the rows this rank owns, `pos % dcp`, under DCP), o_proj on the local heads, a sum over TP
(rows of other CP ranks are zero on this rank, so one all-reduce joins heads and rows: the
*final gather* of rows), then the SiLU MLP on every row (FFN rows are gathered), sharded over TP.

With attention DP every DP rank runs its own batch through attention (the sums above go over its
`dp_block`), and the MLP runs over the attention-DP buffer: every DP rank's rows in DP order, each
slice padded as `DpSizes` says, joined by an all-reduce over TP; each rank keeps its own slice of the
MLP's output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from cptest.reference.layout import Layout

ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    rope_theta: float
    qk_norm: bool
    tie_embeddings: bool
    eos: tuple[int, ...]
    context_length: int


def load_config(model_dir: Path) -> ModelConfig:
    """config.json -> ModelConfig. Raises ValueError for an architecture the reference cannot run."""
    raw: dict[str, Any] = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    arch = (raw.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"the reference engine runs {', '.join(ARCHITECTURES)}, not {arch}")
    if raw.get("rope_scaling"):
        raise ValueError("rope_scaling is not implemented by the reference engine")
    heads = int(raw["num_attention_heads"])
    eos = raw.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        hidden=int(raw["hidden_size"]),
        intermediate=int(raw["intermediate_size"]),
        layers=int(raw["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        vocab=int(raw["vocab_size"]),
        eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        qk_norm=arch == "Qwen3ForCausalLM",
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos=tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),)),
        context_length=int(raw.get("max_position_embeddings", 8192)),
    )


class Comm(Protocol):
    """The collectives the model needs; `group` is a group name of `Layout.all_groups`."""

    def all_reduce(self, t: torch.Tensor, group: str) -> torch.Tensor: ...
    def all_gather(self, t: torch.Tensor, group: str) -> list[torch.Tensor]: ...


class SoloComm:
    """Collectives of a one-rank world (every group has one member)."""

    def all_reduce(self, t: torch.Tensor, group: str) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor, group: str) -> list[torch.Tensor]:
        return [t]


@dataclass
class Shard:
    """The weights of one rank."""

    embed: torch.Tensor
    lm_head: torch.Tensor
    norm: torch.Tensor
    layers: list[dict[str, torch.Tensor]]
    q_heads: list[int]
    attn_q_heads: list[int]
    kv_heads: list[int]
    q_to_kv: torch.Tensor
    """For each head of `attn_q_heads`, its index into `kv_heads`."""


def load_shard(model_dir: Path, cfg: ModelConfig, layout: Layout) -> Shard:
    """This rank's slice of the checkpoint, as float32 (bf16 weights convert exactly)."""
    from safetensors.torch import load_file

    w: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        w.update(load_file(str(f)))
    if not w:
        raise ValueError(f"no *.safetensors in {model_dir}")
    hd = cfg.head_dim
    q_heads = layout.q_heads(cfg.heads)
    kv = layout.kv_heads(cfg.heads, cfg.kv_heads)
    group = cfg.heads // cfg.kv_heads
    attn_q = layout.attn_q_heads(cfg.heads)
    q_to_kv = torch.tensor([kv.index(h // group) for h in attn_q], dtype=torch.long)
    if cfg.intermediate % layout.tp:
        raise ValueError(f"intermediate {cfg.intermediate} cannot be split over tp {layout.tp}")
    per = cfg.intermediate // layout.tp
    ffn = slice(layout.rank * per, (layout.rank + 1) * per)

    def rows(t: torch.Tensor, heads: list[int]) -> torch.Tensor:
        idx = torch.tensor([h * hd + i for h in heads for i in range(hd)], dtype=torch.long)
        return t.float().index_select(0, idx).contiguous()

    layers = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        layer = {
            "in_norm": w[p + "input_layernorm.weight"].float(),
            "post_norm": w[p + "post_attention_layernorm.weight"].float(),
            "q": rows(w[p + "self_attn.q_proj.weight"], q_heads),
            "k": rows(w[p + "self_attn.k_proj.weight"], kv),
            "v": rows(w[p + "self_attn.v_proj.weight"], kv),
            "o": rows(w[p + "self_attn.o_proj.weight"].t(), q_heads).t().contiguous(),
            "gate": w[p + "mlp.gate_proj.weight"].float()[ffn].contiguous(),
            "up": w[p + "mlp.up_proj.weight"].float()[ffn].contiguous(),
            "down": w[p + "mlp.down_proj.weight"].float()[:, ffn].contiguous(),
        }
        if cfg.qk_norm:
            layer["q_norm"] = w[p + "self_attn.q_norm.weight"].float()
            layer["k_norm"] = w[p + "self_attn.k_norm.weight"].float()
        layers.append(layer)
    embed = w["model.embed_tokens.weight"].float()
    lm_head = embed if cfg.tie_embeddings else w["lm_head.weight"].float()
    return Shard(embed=embed, lm_head=lm_head, norm=w["model.norm.weight"].float(), layers=layers,
                 q_heads=q_heads, attn_q_heads=attn_q, kv_heads=kv, q_to_kv=q_to_kv)


# ---------------------------------------------------------------------------------------- KV pool
class KvPool:
    """Paged K/V of one rank: `rows` physical token rows per layer, in pages of `page` rows.

    The allocator (on the scheduler rank) hands out *blocks*; block b covers logical positions
    `[j*B, (j+1)*B)` of a request (its j-th block, B = page * dcp) and physical rows
    `[b*page, (b+1)*page)` on every rank of the DCP group; position p lives on DCP rank `p % dcp` at
    row `b*page + (p % B) // dcp`. Logical token space: rows * dcp.
    """

    def __init__(self, cfg: ModelConfig, layout: Layout, rows: int, page: int, kv_heads: int) -> None:
        self.rows, self.page, self.dcp = rows, page, layout.dcp
        self.block_tokens = page * layout.dcp
        # torch.empty: pages of a large pool are only committed when written.
        self.k = [torch.empty(rows, kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
        self.v = [torch.empty(rows, kv_heads, cfg.head_dim) for _ in range(cfg.layers)]

    def row_of(self, blocks: Sequence[int], pos: torch.Tensor) -> torch.Tensor:
        """Physical rows of positions (all owned by this rank) of a request with block table `blocks`."""
        return pool_rows(blocks, pos, self.page, self.dcp)


def pool_rows(blocks: Sequence[int], pos: torch.Tensor, page: int, dcp: int) -> torch.Tensor:
    """Physical rows of positions `pos` (all owned by one DCP rank) of a request whose j-th block of
    `page * dcp` positions is allocator block `blocks[j]`: SGLang's logical slot
    `blocks[p // B] * B + p % B` divided by `dcp` (B = page * dcp)."""
    table = torch.tensor(list(blocks), dtype=torch.long)
    block_tokens = page * dcp
    return table[pos // block_tokens] * page + (pos % block_tokens) // dcp


# ---------------------------------------------------------------------------------------- math
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form, as HF Llama/Qwen3) of x [n, heads, dim] at positions."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    half = dim // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attend(q: torch.Tensor, qpos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kpos: torch.Tensor,
           q_to_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of q [n, H, d] at qpos over k/v [m, Hk, d] at kpos -> (out [n, H, d], lse [n, H]).

    A query with no visible key (an empty DCP shard) gets out 0 and lse -inf, which `merge_lse`
    weighs exactly 0.
    """
    n, h, d = q.shape
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full((n, h), -math.inf)
    kk = k[:, q_to_kv, :].permute(1, 0, 2)  # [H, m, d]
    vv = v[:, q_to_kv, :].permute(1, 0, 2)
    scores = torch.einsum("nhd,hmd->hnm", q, kk) / math.sqrt(d)
    if int(kpos.max()) <= int(qpos.min()):  # every key visible to every query (decode): no mask
        lse = torch.logsumexp(scores, dim=-1)  # [H, n]
        out = torch.einsum("hnm,hmd->nhd", torch.exp(scores - lse[..., None]), vv)
        return out, lse.t().contiguous()
    mask = kpos[None, :] > qpos[:, None]  # [n, m]
    scores = scores.masked_fill(mask[None], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # [H, n]
    probs = torch.exp(scores - lse[..., None].masked_fill(torch.isinf(lse)[..., None], 0.0))
    probs = probs.masked_fill(mask[None], 0.0)
    out = torch.einsum("hnm,hmd->nhd", probs, vv)
    return out, lse.t().contiguous()


def merge_lse(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exact log-sum-exp merge of partial attentions over disjoint key sets ([n, H, d], [n, H] each)."""
    lse = torch.stack(list(lses))  # [s, n, H]
    total = torch.logsumexp(lse, dim=0)
    weight = torch.exp(lse - total.masked_fill(torch.isinf(total), 0.0)[None])
    weight = weight.masked_fill(torch.isinf(lse), 0.0)
    return (weight[..., None] * torch.stack(list(outs))).sum(0)


# ---------------------------------------------------------------------------------------- attention DP
@dataclass(frozen=True)
class DpSizes:
    """The attention-DP buffer of one step, as the pinned release's `prepare_mlp_sync_batch` sizes it
    (model_executor/forward_batch_info.py:1229-1311) for a CP-v2 model: `tokens` is each DP rank's row
    count, `padded` its slice (aligned up to the attention-TP size; under `max_len` every slice the
    longest), `mode` `sum_len` when any DP rank extends or when padding to the longest would cost more
    than twice the rows, else `max_len` (layers/dp_attention.py:86-118)."""

    tokens: tuple[int, ...]
    padded: tuple[int, ...]
    mode: str

    @classmethod
    def of(cls, tokens: Sequence[int], any_extend: bool, attn_tp: int) -> DpSizes:
        aligned = [-(-n // attn_tp) * attn_tp for n in tokens]
        longest, total = max(aligned), sum(aligned)
        mode = "sum_len" if any_extend or total * 2 < longest * len(aligned) else "max_len"
        padded = [longest] * len(aligned) if mode == "max_len" else aligned
        return cls(tokens=tuple(tokens), padded=tuple(padded), mode=mode)

    @property
    def rows(self) -> int:
        return sum(self.padded)

    def start(self, dp_rank: int) -> int:
        """The first buffer row of DP rank `dp_rank`'s slice."""
        return sum(self.padded[:dp_rank])


# ---------------------------------------------------------------------------------------- forward
@dataclass
class SeqRows:
    """One request in a forward batch: rows `[start, start + n)` of the packed batch."""

    rid: str
    positions: list[int]
    """Position of each of its rows (extend: start..end; decode: one)."""
    context: int
    """Tokens of the request in the KV cache after this step (last position + 1)."""
    blocks: list[int]
    logits_from: int | None = None
    """Position from which the request wants logits, every row up to its last (an extend that
    returns input logprobs); None (or a position past its last row): its last row only."""

    def logits_first(self) -> int:
        """Index, among this request's rows, of its first row with logits."""
        last = len(self.positions) - 1
        if self.logits_from is None:
            return last
        return min(max(self.logits_from - self.positions[0], 0), last)

    def logits_rows(self) -> int:
        """Rows of this request whose logits `Model.forward` returns (at least its last)."""
        return len(self.positions) - self.logits_first()


@dataclass
class ForwardStats:
    attn_rows: int
    ffn_rows: int
    cp_active: bool
    local_rows: list[int]
    kv_written: dict[str, list[int]]
    layers: int = 0
    kv_slots: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """Request id -> (position, pool row) of each K/V this rank wrote."""
    kv_read: dict[str, list[int]] = field(default_factory=dict)
    """Request id -> the pool rows its attention read (this rank's share of its context)."""


class Model:
    """One rank's model. `forward` must be called by every rank with the same batch, in lockstep."""

    def __init__(self, cfg: ModelConfig, shard: Shard, layout: Layout, comm: Comm, pool: KvPool) -> None:
        self.cfg, self.shard, self.layout, self.comm, self.pool = cfg, shard, layout, comm, pool

    @torch.no_grad()
    def forward(self, tokens: list[int], seqs: list[SeqRows], extend: bool, want_logits: bool,
                dp: DpSizes | None = None) -> tuple[torch.Tensor | None, ForwardStats]:
        """Logits (when `want_logits`) and what this rank did.

        The logits are those of each request's rows from `SeqRows.logits_first` to its last row
        (`logits_rows` of them: the last row alone unless it asks for input logprobs), packed in
        batch order, [sum of logits_rows, vocab]. The final norm and lm_head run on those rows only.
        With attention DP, `tokens` and `seqs` are this rank's DP batch (possibly empty: an idle
        forward that still joins the MLP's collectives) and `dp` the step's buffer over every DP rank.
        """
        cfg, lay, sh = self.cfg, self.layout, self.shard
        n_rows = len(tokens)
        pos = torch.tensor([p for s in seqs for p in s.positions], dtype=torch.long)
        hidden = sh.embed[torch.tensor(tokens, dtype=torch.long)]
        split, per_cp = False, [list(range(n_rows))]
        if extend and lay.pcp:
            from cptest.reference.layout import pcp_local_rows

            split, per_cp = pcp_local_rows([len(s.positions) for s in seqs], lay.attn_cp, lay.strategy)
        local = per_cp[lay.attn_cp_rank] if split else list(range(n_rows))
        local_t = torch.tensor(local, dtype=torch.long)
        seq_of_row = torch.tensor([i for i, s in enumerate(seqs) for _ in s.positions], dtype=torch.long)
        owned = [lay.owner(p) == lay.dcp_rank for p in pos.tolist()]
        owned_t = torch.tensor(owned, dtype=torch.bool)
        kv_written: dict[str, list[int]] = {}
        at = 0
        for s in seqs:
            kv_written[s.rid] = [p for p, o in zip(s.positions, owned[at : at + len(s.positions)],
                                                   strict=True) if o]
            at += len(s.positions)
        hq, hk, hd = len(sh.q_heads), len(sh.kv_heads), cfg.head_dim
        self._plan_rows(seqs, pos, owned_t)
        for li, w in enumerate(sh.layers):
            x = rms_norm(hidden, w["in_norm"], cfg.eps)
            xl = x[local_t]
            lpos = pos[local_t]
            q = (xl @ w["q"].t()).view(len(local), hq, hd)
            k = (xl @ w["k"].t()).view(len(local), hk, hd)  # hk, not -1: an idle DP rank has 0 rows
            v = (xl @ w["v"].t()).view(len(local), hk, hd)
            if cfg.qk_norm:
                q = rms_norm(q, w["q_norm"], cfg.eps)
                k = rms_norm(k, w["k_norm"], cfg.eps)
            q, k = rope(q, lpos, cfg.rope_theta), rope(k, lpos, cfg.rope_theta)
            if split:  # K/V of every row, written to every CP rank's pool
                k, v = self._gather_rows(k, per_cp), self._gather_rows(v, per_cp)
            self._write(li, seqs, pos, k, v, owned_t)
            if lay.dcp > 1:
                qg = torch.cat(self.comm.all_gather(q.contiguous(), "dcp"), dim=1)
                out, lse = self._attend(li, seqs, qg, lpos, seq_of_row[local_t])
                parts = self.comm.all_gather(torch.cat([out.flatten(1), lse], dim=1), "dcp")
                g = len(sh.attn_q_heads)
                outs = [p[:, : g * hd].view(-1, g, hd) for p in parts]
                lses = [p[:, g * hd :] for p in parts]
                merged = merge_lse(outs, lses)
                mine = slice(lay.dcp_rank * hq, (lay.dcp_rank + 1) * hq)
                attn = merged[:, mine, :]
            else:
                attn, _ = self._attend(li, seqs, q, lpos, seq_of_row[local_t])
            o = attn.reshape(len(local), hq * hd) @ w["o"].t()
            if split:
                full = torch.zeros(n_rows, cfg.hidden)
                full[local_t] = o
                o = self.comm.all_reduce(full, lay.attention_group)
            else:
                o = self.comm.all_reduce(o, "attn_tp" if lay.attn_cp > 1 else lay.attention_group)
            hidden = hidden + o
            x = rms_norm(hidden, w["post_norm"], cfg.eps)
            hidden = hidden + self._mlp(w, x, dp)
        logits = None
        if want_logits:
            rows: list[int] = []
            at = 0
            for s in seqs:
                rows.extend(range(at + s.logits_first(), at + len(s.positions)))
                at += len(s.positions)
            sel = torch.tensor(rows, dtype=torch.long)
            logits = rms_norm(hidden[sel], sh.norm, cfg.eps) @ sh.lm_head.t()
        return logits, ForwardStats(attn_rows=len(local), ffn_rows=n_rows if dp is None else dp.rows,
                                    cp_active=split,
                                    local_rows=local, kv_written=kv_written, layers=len(sh.layers),
                                    kv_slots=self._slots, kv_read=self._reads)

    def _mlp(self, w: dict[str, torch.Tensor], x: torch.Tensor, dp: DpSizes | None) -> torch.Tensor:
        """The MLP's output for this rank's rows `x`: sharded over TP and summed; with attention DP run
        over the buffer of every DP rank's rows (each DP rank's first rank puts its batch in its slice,
        an all-reduce over TP fills the buffer), of which this rank keeps its own slice."""
        if dp is None:
            return self.comm.all_reduce(self._mlp_shard(w, x), "tp")
        lay = self.layout
        start = dp.start(lay.attn_dp_rank)
        buffer = torch.zeros(dp.rows, x.shape[1])
        if lay.rank == lay.dp_leader(lay.attn_dp_rank):
            buffer[start : start + x.shape[0]] = x
        buffer = self.comm.all_reduce(buffer, "tp")
        out = self.comm.all_reduce(self._mlp_shard(w, buffer), "tp")
        return out[start : start + x.shape[0]]

    @staticmethod
    def _mlp_shard(w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ w["gate"].t()) * (x @ w["up"].t())) @ w["down"].t()

    def _gather_rows(self, t: torch.Tensor, per_cp: list[list[int]]) -> torch.Tensor:
        """Rows computed by each CP rank -> all rows in packed order (padded all-gather)."""
        longest = max(len(r) for r in per_cp)
        pad = torch.zeros((longest, *t.shape[1:]))
        pad[: t.shape[0]] = t
        parts = self.comm.all_gather(pad, "attn_cp")
        n = sum(len(r) for r in per_cp)
        full = torch.empty((n, *t.shape[1:]))
        for rows, part in zip(per_cp, parts, strict=True):
            full[torch.tensor(rows, dtype=torch.long)] = part[: len(rows)]
        return full

    def _plan_rows(self, seqs: list[SeqRows], pos: torch.Tensor, owned: torch.Tensor) -> None:
        """Pool rows of this step, the same for every layer: where the batch's owned rows are written
        (`_w_src` batch rows -> `_w_dst` pool rows) and, per request, the rows and positions of this
        rank's shard of its context (`_ctx`)."""
        lay = self.layout
        src, dst, ctx = [], [], []
        self._slots: dict[str, list[tuple[int, int]]] = {}
        self._reads: dict[str, list[int]] = {}
        at = 0
        for s in seqs:
            n = len(s.positions)
            sel = owned[at : at + n]
            if bool(sel.any()):
                src.append(torch.arange(at, at + n)[sel])
                dst.append(self.pool.row_of(s.blocks, pos[at : at + n][sel]))
                self._slots[s.rid] = list(zip(pos[at : at + n][sel].tolist(), dst[-1].tolist(), strict=True))
            kpos = torch.arange(lay.dcp_rank, max(s.context, lay.dcp_rank), lay.dcp, dtype=torch.long)
            ctx.append((kpos, self.pool.row_of(s.blocks, kpos)))
            self._reads[s.rid] = ctx[-1][1].tolist()
            at += n
        empty = torch.zeros(0, dtype=torch.long)
        self._w_src = torch.cat(src) if src else empty
        self._w_dst = torch.cat(dst) if dst else empty
        self._ctx = ctx

    def _write(self, li: int, seqs: list[SeqRows], pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               owned: torch.Tensor) -> None:
        if self._w_src.numel():
            self.pool.k[li][self._w_dst] = k[self._w_src]
            self.pool.v[li][self._w_dst] = v[self._w_src]

    def _attend(self, li: int, seqs: list[SeqRows], q: torch.Tensor, qpos: torch.Tensor,
                qseq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of the query rows over this rank's pool (its DCP shard), request by request."""
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:2], -math.inf)
        for i, _ in enumerate(seqs):
            sel = (qseq == i).nonzero().flatten()
            if sel.numel() == 0:
                continue
            kpos, rows = self._ctx[i]
            o, lz = attend(q[sel], qpos[sel], self.pool.k[li][rows], self.pool.v[li][rows], kpos,
                           self.shard.q_to_kv)
            out[sel], lse[sel] = o, lz
        return out, lse
