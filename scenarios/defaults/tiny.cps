# Shared settings of the tiny-model suite (scenarios/*.cps extend this file).
# The tiny models are synthetic checkpoints cptest writes into its model store (`cptest models make
# --all`: hidden 256, 4 layers, 8 heads, head_dim 64, vocab 4096, context 8192, no tokenizer).
cptest 1
defaults {
  engine sglang "0.5.17"
  serve {
    # triton is the MHA backend with a DCP path (docs/sglang.md §3.1), and it needs none of the
    # kernel extras (fa3, FlashMLA) that the GPU machine's base bundle strips.
    attention_backend triton
    # Eager decode: every step's inside (attention / MLP rows, the KV write and its DCP owner mask)
    # is observed only in eager forwards; a replay's record has its rows and positions only (D58).
    # Scenarios that qualify graphs say `cuda_graph_decode full`.
    cuda_graph_decode disabled
    # Prefill graphs off, as the plan set them while row evidence forced eager runs (before D58):
    # SGLang's default prefill graph would change the TP-only baselines' forwards.
    cuda_graph_prefill disabled
    max_total_tokens 65536
    mem_fraction 0.3
    sampling_backend pytorch
    skip_tokenizer_init true
    # As in the probe smoke run that worked on the 2-GPU machine (results/_smoke): custom
    # all-reduce's CUDA IPC buffers are not what is being qualified here.
    flag "--disable-custom-all-reduce"
  }
  workload {
    requests 32
    concurrency 8
    seed 7
    # zigzag needs every prompt >= 2 * attn_cp tokens or silently runs without CP (§5).
    prompt_tokens uniform(64, 1024)
    output_tokens 32
    sampling greedy
    timeout 120s
  }
  expect {
    launch accepted
    graph decode disabled
    serving all_complete
    shutdown within 60s gpu_memory_released no_orphans
    log absent "Traceback"
  }
}
