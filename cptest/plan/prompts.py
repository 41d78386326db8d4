"""Synthetic prompts: token ids from a seed, the same on every machine, regenerated where they are used.

A synthetic workload's prompts are consecutive slices of one stream of numpy's PCG64 *raw* output
(NEP 19 guarantees BitGenerator raw streams stay stable across numpy versions; Generator methods
are not guaranteed, so none is used), seeded from sha256(`cptest-prompts/<seed>`). Each 64-bit
draw gives two 32-bit words (low word first); word k, reduced modulo the id range, is the stream's
token k (bias < 1e-5 for any real vocabulary). The stream is prefix-stable, so a prompt depends
only on where it starts: appending requests never changes the earlier prompts, and a plan names a
prompt by (seed, vocab, start, length) instead of storing its ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

FIRST_ORDINARY_ID = 3
"""Token ids below this are kept out of synthetic prompts: 0/1/2 are BOS/EOS/PAD in the tiny
models (make-tiny-models) and in most Llama-style vocabularies' first slots."""


def _stream_key(seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"cptest-prompts/{seed}".encode()).digest()[:16], "little")


def synthetic_prompt(seed: int, vocab: int, at: int, tokens: int) -> bytes:
    """Tokens `at` .. `at + tokens - 1` of the stream of `seed`, in [FIRST_ORDINARY_ID, vocab), as
    little-endian uint32 bytes. Jumps to the draw that holds token `at` (`PCG64.advance`, the same
    state as drawing every word before it) and draws only what the prompt needs."""
    import numpy as np

    span = max(vocab - FIRST_ORDINARY_ID, 1)
    gen = np.random.PCG64(_stream_key(seed))
    gen.advance(at // 2)
    skip = at % 2
    raw = gen.random_raw((skip + tokens + 1) // 2).astype("<u8").view("<u4")[skip : skip + tokens]
    return (raw % np.uint32(span) + np.uint32(FIRST_ORDINARY_ID)).astype("<u4").tobytes()


def synthetic_prompts(seed: int, lengths: Sequence[int], vocab: int) -> list[bytes]:
    """The prompts of `lengths` tokens each, cut in order from the start of the stream of `seed`
    (what `synthetic_prompt` gives for each start), as little-endian uint32 bytes."""
    data = synthetic_prompt(seed, vocab, 0, sum(lengths))
    out, at = [], 0
    for n in lengths:
        out.append(data[at : at + 4 * n])
        at += 4 * n
    return out
