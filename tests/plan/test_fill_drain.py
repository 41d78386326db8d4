"""Specification of `cptest.plan.fill_drain`: the closed loop a `fill_drain P` workload gets, sized
from the engine's reading of max_total_tokens (D59)."""

from __future__ import annotations

import pytest

from cptest.errors import PlanError
from cptest.lang import parse_text
from cptest.plan import plan
from cptest.plan.fill_drain import logical_capacity

TEXT = """cptest 1
scenario t {
  engine {engine}
  model synthetic llama { layers 2 hidden 64 heads 4 kv_heads 1 head_dim 16 vocab 128 intermediate 128 }
  topology { gpus 2 tp 2 dcp 2 }
  serve { {serve} }
  workload { requests {requests} fill_drain {peak} prompt_tokens {prompt} output_tokens 16 }
}
"""


def _plan(engine: str = 'sglang "0.5.17"', serve: str = "max_total_tokens 4096", peak: str = "0.95",
          prompt: str = "240", requests: int = 64):  # noqa: ANN202 - a Plan
    text = (TEXT.replace("{engine}", engine).replace("{serve}", serve).replace("{peak}", peak)
            .replace("{prompt}", prompt).replace("{requests}", str(requests)))
    return plan(parse_text(text, "t.cps"))


def test_sglang_reads_max_total_tokens_as_rows_per_rank_so_dcp2_doubles_the_pool() -> None:
    # 8192 logical tokens / 256 per request: 31 hold 0.95 of it (30 would hold 0.94), a 32nd waits
    assert _plan().workload.concurrency == 32


def test_the_reference_engine_reads_it_as_the_logical_capacity() -> None:
    # 4096 tokens / 256: 16 hold 1.0 (15 hold 0.94), a 17th waits
    assert _plan(engine="reference").workload.concurrency == 17


def test_budgets_round_up_to_whole_allocator_pages() -> None:
    assert logical_capacity(4096, 4, 2, per_rank=True) == 8192
    assert logical_capacity(4095, 4, 2, per_rank=False) == 4088
    # 241 + 16 tokens take 264 with pages of 4 x 2: 30 hold 0.967 of the 8192, a 31st waits
    assert _plan(serve="max_total_tokens 4096 page_size 4", prompt="241").workload.concurrency == 31


@pytest.mark.parametrize(("kw", "message"), [
    ({"serve": "mem_fraction 0.3"},
     "fill_drain sizes the workload from the KV pool, which the plan knows only from serve max_total_tokens"),
    ({"prompt": "uniform(100, 200)"}, "fill_drain needs fixed prompt_tokens and output_tokens"),
    ({"prompt": "3000"},
     "requests of 3016 tokens cannot hold 0.95 of the 8192-token KV pool: 2 fit, 0.736 of it"),
    ({"requests": 8}, "fill_drain needs at least 32 requests: 31 hold 0.95 of the 8192-token pool"),
    ({"serve": "max_total_tokens 100"}, "requests of 256 tokens cannot hold 0.95 of the 200-token KV pool: "
                                        "0 fit, 0.000 of it"),
])
def test_what_the_plan_cannot_size_is_a_plan_error_at_the_workload(kw: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(PlanError) as err:
        _plan(**kw)
    (problem,) = err.value.problems
    assert problem.message.startswith(message)
    assert problem.span is not None and problem.span.line == 7
