# PCP2 zigzag on TP2 with the tiny Llama of one KV head: the co-located probe run of issue 31 read the
# output equal to TP2's. 0.5.17 runs the CP-v2 path (the only one that splits prefill rows) only for
# the model classes of `CP_V2_DEFAULT_MODEL_CLASSES` (layers/cp/utils.py:42-52), which exclude
# LlamaForCausalLM, so the flags are accepted and nothing is split: the row contract is declared
# violated on 0.5.17, generation is expected to agree with TP2 (nothing else changed).
cptest 1
scenario pcp2_zigzag_llama_kv1 {
  description "PCP2 zigzag on TP2, tiny Llama with 1 KV head: accepted, split or not"
  extends "../defaults/tiny.cps"
  model synthetic llama {
    layers 4
    hidden 256
    heads 8
    kv_heads 1
    head_dim 64
    vocab 4096
    intermediate 512
    seed 7
  }
  topology {
    gpus 2
    tp 2
    attn_cp 2
    cp_strategy zigzag
  }
  baseline {
    tp 2
  }
  expect {
    violated rows split zigzag on sglang "0.5.17" because "0.5.17 splits prefill rows only for CP_V2_DEFAULT_MODEL_CLASSES, which exclude Llama (layers/cp/utils.py:42-52)"
    generation logprob p99 <= 4 * control free_running topk 5 vs baseline
  }
}
