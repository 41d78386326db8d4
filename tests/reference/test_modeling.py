"""cptest/reference/modeling.py: the attention math (LSE merge) and the paged pool's addressing."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cptest.reference.layout import Layout  # noqa: E402
from cptest.reference.modeling import KvPool, ModelConfig, attend, merge_lse  # noqa: E402
from cptest.topology import Degrees  # noqa: E402

CFG = ModelConfig(architecture="LlamaForCausalLM", hidden=16, intermediate=32, layers=1, heads=2,
                  kv_heads=1, head_dim=4, vocab=8, eps=1e-5, rope_theta=1e4, qk_norm=False,
                  tie_embeddings=False, eos=(1,), context_length=64)


def _qkv(n: int, m: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, 2, 4, generator=g), torch.randn(m, 1, 4, generator=g),
            torch.randn(m, 1, 4, generator=g))


@pytest.mark.parametrize("d", [2, 3, 4])
def test_lse_merge_of_interleaved_shards_equals_full_attention(d: int) -> None:
    q, k, v = _qkv(5, 9)
    qpos = torch.arange(4, 9)
    kpos = torch.arange(9)
    q2kv = torch.tensor([0, 0])
    full, _ = attend(q, qpos, k, v, kpos, q2kv)
    parts = [attend(q, qpos, k[r::d], v[r::d], kpos[r::d], q2kv) for r in range(d)]
    merged = merge_lse([p[0] for p in parts], [p[1] for p in parts])
    assert torch.allclose(merged, full, atol=1e-6)


def test_an_empty_shard_weighs_exactly_zero_in_the_merge() -> None:
    q, k, v = _qkv(1, 1)
    qpos = torch.tensor([0])
    out, lse = attend(q, qpos, k, v, torch.tensor([0]), torch.tensor([0, 0]))
    none = torch.tensor([], dtype=torch.long)
    empty_out, empty_lse = attend(q, qpos, k[:0], v[:0], none, torch.tensor([0, 0]))
    assert torch.all(empty_out == 0) and torch.all(torch.isinf(empty_lse))
    merged = merge_lse([out, empty_out], [lse, empty_lse])
    assert torch.equal(merged, out)
    assert not math.isnan(float(merge_lse([empty_out], [empty_lse]).sum()))


def test_pool_rows_of_a_dcp_rank_hold_only_its_positions_and_never_collide() -> None:
    for d in (1, 2, 4):
        for rank in range(d):
            pool = KvPool(CFG, Layout(Degrees(tp=d, dcp=d), rank=rank), rows=64, page=2, kv_heads=1)
            blocks = [5, 1, 7]
            pos = torch.tensor([p for p in range(len(blocks) * pool.block_tokens) if p % d == rank])
            rows = pool.row_of(blocks, pos).tolist()
            assert len(set(rows)) == len(rows)
            assert all(r // pool.page in blocks for r in rows)
