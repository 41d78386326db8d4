"""The CPU reference engine: the CP contracts of docs/architecture.md §9 executed for real (not SGLang).

    argv.py       the server's command line (built by the plan, parsed by the server)
    plan.py       the engine's part of planning: argv and rank titles (`cptest-ref::scheduler_TP<r>`)
    choice.py     which engine `cptest run` uses; the labelled CPU profile for oversized synthetic models
    layout.py     groups, head shards, PCP row splits (pure)
    scheduler.py  continuous batching and KV capacity accounting (pure)
    model.py      Llama/Qwen3 forward in float32 with TP, PCP (zigzag, interleave), DCP (LSE merge), paged KV
    rank.py       one rank process: gloo, model shard, evidence records; rank 0 schedules and samples
    server.py     `python3 -m cptest.reference.server`: HTTP (the pinned SGLang release's
                  /generate subset), signals
"""
