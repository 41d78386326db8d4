"""Continuous batching and KV capacity accounting of the reference engine (pure Python, no torch).

Lives on rank 0. Each call of `next_batch` returns one forward step: an *extend* of newly admitted
requests (whole prompts, no prefix cache, no chunking) when any can be admitted, else a *decode* of
every running request (one row each). A request is admitted when its whole budget
`ceil((prompt + max_new_tokens) / B)` blocks is free (B = page * dcp logical tokens per block), so
nothing is ever preempted; a request that could never fit is refused at submission.

Accounting: `total_blocks * B` is the scheduler's capacity (`max_total_num_tokens`), equal to the
allocator's token space `rows * dcp`; `free + used == total` holds after every call (`leak_free`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    blocks: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: dict[str, Any] | None = None
    logprob_start_len: int = -1
    """SGLang's `logprob_start_len`: -1 no input logprobs; L in [0, len(input_ids)]: input logprobs of
    positions L..len(input_ids)-1 (none when L == len(input_ids)). Set only with `return_logprob`."""
    top_logprobs_num: int = 0
    """SGLang's `top_logprobs_num`: K > 0 also returns the top K of every input and output position."""

    @property
    def budget(self) -> int:
        """Token positions this request may occupy: its prompt and every token it may generate."""
        return len(self.input_ids) + self.max_new_tokens


@dataclass
class Batch:
    extend: bool
    requests: list[Request]


class Scheduler:
    def __init__(self, total_blocks: int, block_tokens: int, max_running: int = 64,
                 max_prefill_tokens: int = 16384) -> None:
        self.total_blocks, self.block_tokens = total_blocks, block_tokens
        self.max_running, self.max_prefill_tokens = max_running, max_prefill_tokens
        self.free: list[int] = list(range(total_blocks - 1, -1, -1))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def capacity(self) -> int:
        """Logical KV tokens the scheduler admits against (`max_total_num_tokens`)."""
        return self.total_blocks * self.block_tokens

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def submit(self, req: Request) -> str | None:
        """Queue `req`; the reason it can never run, or None."""
        if not req.input_ids:
            return "input_ids is empty"
        if req.max_new_tokens < 1:
            return "max_new_tokens must be >= 1"
        need = self.blocks_for(req.budget)
        if need > self.total_blocks:
            return (f"the request needs {req.budget} tokens of KV cache, more than the capacity "
                    f"{self.capacity} (max_total_num_tokens)")
        self.waiting.append(req)
        return None

    def abort(self, rid: str) -> Request | None:
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == rid:
                    q.remove(r)
                    self._release(r)
                    return r
        return None

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def next_batch(self) -> Batch | None:
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            req = self.waiting[0]
            need = self.blocks_for(req.budget)
            if need > len(self.free):
                break
            if admitted and tokens + len(req.input_ids) > self.max_prefill_tokens:
                break
            self.waiting.popleft()
            req.blocks = [self.free.pop() for _ in range(need)]
            admitted.append(req)
            tokens += len(req.input_ids)
        if admitted:
            self.running.extend(admitted)
            return Batch(extend=True, requests=admitted)
        if self.running:
            return Batch(extend=False, requests=list(self.running))
        return None

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self._release(req)

    def _release(self, req: Request) -> None:
        self.free.extend(reversed(req.blocks))
        req.blocks = []

    def leak_free(self) -> bool:
        used = sum(len(r.blocks) for r in self.running)
        return used + len(self.free) == self.total_blocks


class BlockView:
    """A follower rank's own count of the KV blocks in use: the block tables of the steps it
    ran, less the requests the leader said it released. Each rank thus reaches its pool sample from
    what it saw, not from the leader's free list, so the capacity group's members can disagree
    when their accounting does."""

    def __init__(self, total_blocks: int, block_tokens: int) -> None:
        self.total_blocks, self.block_tokens = total_blocks, block_tokens
        self.live: dict[str, int] = {}
        """Request id -> blocks of its table."""

    def update(self, tables: list[tuple[str, list[int]]], released: list[str]) -> None:
        for rid in released:
            self.live.pop(rid, None)
        for rid, blocks in tables:
            self.live[rid] = len(blocks)

    @property
    def used_blocks(self) -> int:
        return sum(self.live.values())

    @property
    def free_tokens(self) -> int:
        return (self.total_blocks - self.used_blocks) * self.block_tokens
