"""Run SGLang 0.5.17's own code on the CPU for the differential tests: one JSON request per stdin line,
one JSON answer per stdout line (SGLang's import takes seconds, so one process answers many).

Runs in the interpreter of `tools/sglang-cpu-env.sh` (never cptest's): it imports sglang, not cptest.
Requests (`op` and its fields):

- `version`: the sglang version.
- `server_args` {argv}: SGLang's own parser and `ServerArgs.from_cli_args` on a launch argv
  (`--device cpu` appended: there is no accelerator). Answers `ok` with resolved fields, or the
  exception's type, message and raising line. With `gpu_capability` [major, minor], ServerArgs reads
  that compute capability (DSA checkpoints pick their defaults by it). With `worker_start`, then
  calls the real `initialize_model_parallel` with the sizes `distributed/bootstrap.py:88-97` passes it.
- `groups` {tp, pp, attn_dp, attn_cp, moe_ep, moe_dp, dcp}: every group `initialize_model_parallel`
  builds (`distributed/parallel_state.py:2191-2545`), or its exception; and per TP rank its
  (attn_tp_rank, attn_dp_rank) from `layers/dp_attention.py:compute_dp_attention_world_info`.
- `split` {strategy, cp, extend_lens, prefix_lens}: the prefill CP split of one batch on every CP
  rank, through the strategy's own `can_apply`, `build_metadata`, `pad_logical_token_to_physical`,
  `shard_hidden_states` and `shard_position_ids` (`layers/cp/zigzag.py`, `interleave.py`, `padding.py`).
- `split_v1` {cp, extend_lens, prefix_lens}: a model's own CP-v1 split of one batch on every CP rank
  (CP v2 off: Qwen3-MoE, DeepSeek), through `can_cp_split`, `prepare_context_parallel_metadata` and
  `cp_split_and_rebuild_position` (`layers/utils/cp_utils.py`); the metadata on the CPU
  (`device="cpu"`, where the forward leaves the default, CUDA).
- `dcp_lens` {dcp, lens, starts}: `layers/dcp/layout.py:get_dcp_lens` for every rank.
- `dcp_filter` {dcp, locs}: `layers/dcp/layout.py:filter_dcp_local_kv_indices` for every rank.
- `alloc_extend` {page_size, prefix_lens, seq_lens, last_loc, free_pages}: the paged allocator's
  `alloc_extend_naive` (`mem_cache/allocator/paged.py:45-102`), the allocation in plain torch. On
  CUDA the allocator runs a triton kernel instead (`alloc_extend_kernel`); the two are taken to
  agree, which only a GPU could compare.
- `dp_buffer` {model_path, tp, dp, attn_cp, strategy, dp_rank, tokens, extend}: the attention-DP
  buffer one DP rank's forward batch sizes, through `ForwardBatch.prepare_mlp_sync_batch`
  (`model_executor/forward_batch_info.py:1229-1311`) on a batch of `tokens[dp_rank]` rows, with
  `tokens` as the DP ranks exchanged them; answers the four fields the probe reads, the rows the
  forward runs, its padded positions and `out_cache_loc`, and the positions once
  `post_forward_mlp_sync_batch` cut them back.
- `dp_gather` {model_path, tp, dp, attn_cp, prefill_cp, cases}: the MLP's attention-DP gather on a real
  gloo world of `tp` processes forked from this one. Each builds SGLang's own groups
  (`init_distributed_environment`, `initialize_model_parallel`, `initialize_dp_attention`), sizes its DP
  rank's batch of every case ({tokens, extend}: each DP rank's count as exchanged) through
  `prepare_mlp_sync_batch`, and runs the gather `prepare_mlp` starts with,
  `CommunicateWithAllReduceAndLayerNormFn._gather_hidden_states_and_residual` (`dp_gather_replicate` or
  `dp_gather_partial`, `layers/dp_attention.py`). Answers per rank and case the padding mode, the
  buffer, the slices, the rank's rows, and the gathered buffer's first column or the exception. A
  rank's real rows hold `1000 * (dp_rank + 1) + row` on its attention-TP rank 0 and 0 on the others
  (attention-TP partial sums add up to it); padding rows hold 0.

What is not SGLang's own, and why:
- torchvision's two op schemas (`_define_torchvision_ops`): PyPI's torchvision links libtorch_cuda,
  so its C ops never load beside CPU torch, and its Python registers fakes for two of them anyway.
- `initialize_model_parallel` runs with `init_model_parallel_group` replaced by a recorder (no
  process group is created; the rank lists are SGLang's), a world group stub with local rank 0, the
  world size `tp * pp`, and `is_cuda` True unless the request says `cuda: false` (the GPU machine's
  platform; the CPU would fail the DCP platform check before anything else).
- `torch.cuda.get_device_capability`, where a request names one (the GPU machine's is 9.0): the CPU
  build has no device to ask, and ServerArgs asks it for a DSA checkpoint before its CP block.
- `prepare_mlp_sync_batch` runs with `torch.tensor`'s `pin_memory` dropped (the CPU build has no
  pinned allocator), a model runner stub holding the ServerArgs, the attention DP size and this DP
  rank's attention ranks set as `initialize_dp_attention` would, and no CUDA-graph prefill.
- In `dp_gather`'s processes: SGLang registers its collective ops (`reg_all_gather_into_tensor`,
  `reg_reduce_scatter_tensor`) for the CUDA dispatch key only, so a CPU registration hands each call
  to that same kernel, SGLang's Python body; `memcpy_triton`'s kernel runs in Triton's interpreter (no
  GPU to compile for). The collectives are gloo's: where NCCL raises `ValueError("output tensor size
  must be equal to world_size times input tensor size")`, gloo refuses the same sizes with a
  `RuntimeError` of its own. The layernorm is the identity and the residual 0: what is compared is
  where the rows go.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any


def _define_torchvision_ops() -> None:
    import torch

    for op in ("nms", "qnms"):
        # A torchvision whose ops loaded has defined them already.
        with contextlib.suppress(RuntimeError):
            torch.library.define(f"torchvision::{op}",
                                 "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _where(err: BaseException) -> str:
    """`path:line` (relative to sglang/srt/) of the innermost sglang frame that raised."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        marker = "/sglang/srt/"
        if marker in frame.filename:
            return f"{frame.filename.split(marker, 1)[1]}:{frame.lineno}"
    return ""


def _error(err: BaseException) -> dict[str, Any]:
    return {"ok": False, "type": type(err).__name__, "message": str(err), "where": _where(err)}


RESOLVED = ("tp_size", "pp_size", "dp_size", "enable_dp_attention", "dcp_size", "attn_cp_size", "moe_dp_size",
            "ep_size", "enable_prefill_cp", "cp_strategy", "attention_backend", "prefill_attention_backend",
            "decode_attention_backend", "disable_cuda_graph")


def server_args(req: dict[str, Any]) -> dict[str, Any]:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = list(req["argv"])
    environ = dict(os.environ)
    capability = req.get("gpu_capability")
    try:
        os.environ.update(req.get("env", {}))  # the scenario's `serve { env }`, as the launcher sets it
        ns = parser.parse_args([*argv, "--device", "cpu"])
        with _device_capability(capability):
            sa = ServerArgs.from_cli_args(ns)
        from sglang.srt.layers.cp.utils import enable_cp_v2

        # Whether this launch takes the generic PCP path (CP v2): ServerArgs sets the variable by
        # the model's class unless the environment did; read before the variables are restored.
        cp_v2 = enable_cp_v2()
    except SystemExit as err:  # argparse refuses the argv
        return {"ok": False, "type": "SystemExit", "message": str(err), "where": "argparse"}
    except Exception as err:  # noqa: BLE001 - the answer is the exception
        return _error(err)
    finally:
        # ServerArgs sets process-wide variables (SGLANG_ENABLE_CP_V2 ...): each request starts clean.
        os.environ.clear()
        os.environ.update(environ)
    from sglang.srt.layers.cp import base

    # What `init_cp_strategy` (layers/cp/base.py:245-271) bound for this ServerArgs; read directly,
    # since `get_cp_strategy` would fall back to the process's published args.
    bound = base._STRATEGY
    graphs = sa.cuda_graph_config
    out: dict[str, Any] = {"ok": True, "cp_v2": cp_v2,
                           "resolved": {k: getattr(sa, k, None) for k in RESOLVED},
                           "cp_strategy_bound": None if bound is None else bound.name,
                           "graph_backends": {"prefill": str(graphs.prefill.backend),
                                              "decode": str(graphs.decode.backend)}}
    if req.get("worker_start"):
        out["worker_start"] = groups({
            "tp": sa.tp_size, "pp": sa.pp_size, "attn_dp": sa.dp_size if sa.enable_dp_attention else 1,
            "attn_cp": sa.attn_cp_size, "moe_ep": sa.ep_size, "moe_dp": sa.moe_dp_size, "dcp": sa.dcp_size,
        })
    return out


@contextlib.contextmanager
def _device_capability(capability: list[int] | None) -> Any:
    """`torch.cuda.get_device_capability` answering `capability` while ServerArgs runs, if given."""
    if capability is None:
        yield
        return
    import torch

    real = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *_a, **_k: tuple(capability)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


_GROUP_GLOBALS = ("_TP", "_PDMUX_PREFILL_TP_GROUP", "_DCP", "_ATTN_CP", "_ATTN_TP", "_MOE_DP", "_MOE_EP",
                  "_MOE_TP", "_PP")


def groups(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.distributed import parallel_state as ps

    built: dict[str, list[list[int]]] = {}

    def record(group_ranks: list[list[int]], *_a: Any, group_name: str | None = None, **_k: Any) -> Any:
        built[str(group_name)] = [list(g) for g in group_ranks]
        return SimpleNamespace(ranks=group_ranks, rank_in_group=0, pynccl_comm=None, name=group_name)

    tp, pp = int(req["tp"]), int(req.get("pp", 1))
    saved = {name: getattr(ps, name) for name in (*_GROUP_GLOBALS, "_WORLD", "init_model_parallel_group",
                                                   "is_cuda")}
    saved_dist = (torch.distributed.is_initialized, torch.distributed.get_world_size)
    try:
        for name in _GROUP_GLOBALS:
            setattr(ps, name, None)
        ps._WORLD = SimpleNamespace(local_rank=0, device_group=None)
        ps.init_model_parallel_group = record
        ps.is_cuda = lambda: bool(req.get("cuda", True))
        torch.distributed.is_initialized = lambda: True
        torch.distributed.get_world_size = lambda *_a, **_k: tp * pp
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            attention_data_parallel_size=int(req.get("attn_dp", 1)),
            attention_context_model_parallel_size=int(req.get("attn_cp", 1)),
            expert_model_parallel_size=int(req.get("moe_ep", 1)),
            moe_data_model_parallel_size=int(req.get("moe_dp", 1)),
            decode_context_parallel_size=int(req.get("dcp", 1)), backend="gloo",
        )  # fmt: skip
        # A group SGLang aliases to another (`_ATTN_CP = _TP` ...) is recorded under the alias too.
        aliases = {"attn_cp": ps._ATTN_CP, "attention_tp": ps._ATTN_TP, "moe_dp": ps._MOE_DP,
                   "moe_ep": ps._MOE_EP, "moe_tp": ps._MOE_TP, "dcp": ps._DCP}
        for name, group in aliases.items():
            if group is not None:
                built[name] = [list(g) for g in group.ranks]
        from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

        attn_dp, attn_cp = int(req.get("attn_dp", 1)), int(req.get("attn_cp", 1))
        ranks = [compute_dp_attention_world_info(attn_dp > 1, r, tp, attn_dp, attn_cp) for r in range(tp)]
        return {"ok": True, "groups": built, "attn_ranks": [[r[0], r[2]] for r in ranks]}
    except Exception as err:  # noqa: BLE001 - the answer is the exception
        return _error(err)
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)
        torch.distributed.is_initialized, torch.distributed.get_world_size = saved_dist


_PUBLISHED: dict[tuple[str, int], Any] = {}


def _publish_pcp_args(strategy: str, cp: int, model_path: str) -> None:
    """Publish a ServerArgs with prefill CP on (tp = attn_cp = cp): the split's padding reads the
    published mode (`layers/cp/padding.py:24-32`)."""
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    key = (strategy, cp)
    if key not in _PUBLISHED:
        _PUBLISHED[key] = ServerArgs(model_path=model_path, tp_size=cp, attn_cp_size=cp,
                                     enable_prefill_cp=True, cp_strategy=strategy, device="cpu",
                                     skip_tokenizer_init=True)
    get_context().set_server_args(_PUBLISHED[key])


def split(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.layers.cp.interleave import InterleaveCPStrategy
    from sglang.srt.layers.cp.padding import pad_logical_token_to_physical
    from sglang.srt.layers.cp.zigzag import ZigzagCPStrategy
    from sglang.srt.runtime_context import get_parallel

    strategy, cp = str(req["strategy"]), int(req["cp"])
    extend = [int(n) for n in req["extend_lens"]]
    prefix = [int(n) for n in req.get("prefix_lens") or [0] * len(extend)]
    _publish_pcp_args(strategy, cp, str(req["model_path"]))
    cls = ZigzagCPStrategy if strategy == "zigzag" else InterleaveCPStrategy
    total = sum(extend)
    mode = SimpleNamespace(is_context_parallel_extend=lambda: True)
    rows = torch.arange(1, total + 1)  # 0 marks a padding row
    out: dict[str, Any] = {"ok": True, "rows": []}
    for rank in range(cp):
        with get_parallel().override(attn_cp_size=cp, attn_cp_rank=rank):
            strat = cls(cp)
            batch = SimpleNamespace(forward_mode=mode, extend_seq_lens_cpu=extend, input_ids=rows)
            out["applies"] = bool(strat.can_apply(total, batch))
            if not out["applies"]:
                return out
            meta = strat.build_metadata(total, [p + n for p, n in zip(prefix, extend, strict=True)], extend)
            pad_logical_token_to_physical(meta)
            batch.attn_cp_metadata = meta
            local = strat.shard_hidden_states(rows, batch)
            out["rows"].append([int(x) - 1 for x in local.tolist()])
            positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, extend, strict=True)])
            out.setdefault("positions", []).append([int(x) for x in strat.shard_position_ids(positions,
                                                                                            batch).tolist()])
            if strategy == "zigzag":
                out.setdefault("layout", []).append({"split_list": list(meta.split_list),
                                                     "zigzag_index": list(meta.zigzag_index)})
            out["logical"] = list(meta.per_rank_logical_token)
            out["physical"] = list(meta.per_rank_actual_token)
    return out


def split_v1(req: dict[str, Any]) -> dict[str, Any]:
    """A model's own CP-v1 split of one batch on every CP rank: `can_cp_split`,
    `prepare_context_parallel_metadata` and `cp_split_and_rebuild_position`
    (`layers/utils/cp_utils.py`), as Qwen3-MoE's and DeepSeek's forwards call them with CP v2 off."""
    import torch
    from sglang.srt.layers.utils.cp_utils import (
        can_cp_split,
        cp_split_and_rebuild_position,
        prepare_context_parallel_metadata,
    )
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.runtime_context import get_parallel

    cp = int(req["cp"])
    extend = [int(n) for n in req["extend_lens"]]
    prefix = [int(n) for n in req.get("prefix_lens") or [0] * len(extend)]
    _publish_pcp_args("zigzag", cp, str(req["model_path"]))
    total = sum(extend)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, extend, strict=True)])
    out: dict[str, Any] = {"ok": True, "positions": [], "metadata": []}
    for rank in range(cp):
        with get_parallel().override(attn_cp_size=cp, attn_cp_rank=rank):
            batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, extend_seq_lens_cpu=extend)
            out["applies"] = bool(can_cp_split(total, cp, batch))
            if not out["applies"]:
                return out
            meta = prepare_context_parallel_metadata(total, rank, cp, [p + n for p, n in zip(prefix, extend,
                                                                                         strict=True)],
                                                     extend_seqs_len=extend, device="cpu")
            batch.attn_cp_metadata = meta
            local = cp_split_and_rebuild_position(batch, positions)
            out["positions"].append([int(x) for x in local.tolist()])
            out["metadata"].append({key: list(getattr(meta, key)) for key in (
                "split_list", "zigzag_index", "per_rank_actual_token", "max_rank_len")})
    return out


def dcp_lens(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.layers.dcp.layout import get_dcp_lens

    dcp = int(req["dcp"])
    lens = torch.tensor([int(n) for n in req["lens"]])
    starts = req.get("starts")
    start = None if starts is None else torch.tensor([int(s) for s in starts])
    return {"ok": True, "lens": [get_dcp_lens(lens, dcp, r, start).tolist() for r in range(dcp)]}


def dcp_filter(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.layers.dcp.layout import filter_dcp_local_kv_indices
    from sglang.srt.runtime_context import get_parallel

    dcp = int(req["dcp"])
    locs = torch.tensor([int(n) for n in req["locs"]], dtype=torch.int64)
    out = []
    for rank in range(dcp):
        with get_parallel().override(dcp_enabled=dcp > 1, dcp_size=dcp, dcp_rank=rank):
            out.append(filter_dcp_local_kv_indices(locs).tolist())
    return {"ok": True, "local": out}


def alloc_extend(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive

    def t(name: str) -> Any:
        return torch.tensor([int(n) for n in req[name]], dtype=torch.int64)

    prefix, seq = t("prefix_lens"), t("seq_lens")
    out = torch.empty(int((seq - prefix).sum()), dtype=torch.int64)
    alloc_extend_naive(prefix, seq, t("last_loc"), t("free_pages"), out, int(req["page_size"]), "cpu")
    return {"ok": True, "locs": out.tolist()}


def dp_buffer(req: dict[str, Any]) -> dict[str, Any]:
    environ = dict(os.environ)
    try:
        return _dp_buffer_sized(req)
    except Exception as err:  # noqa: BLE001 - the answer is the exception
        return _error(err)
    finally:
        # ServerArgs sets process-wide variables (SGLANG_ENABLE_CP_V2 ...): each request starts clean.
        os.environ.clear()
        os.environ.update(environ)


def _dp_buffer_sized(req: dict[str, Any]) -> dict[str, Any]:
    import torch
    from sglang.srt.layers import dp_attention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs

    tp, dp, cp = int(req["tp"]), int(req["dp"]), int(req["attn_cp"])
    tokens = [int(n) for n in req["tokens"]]
    dp_rank, extend = int(req["dp_rank"]), bool(req["extend"])
    sa = ServerArgs(model_path=str(req["model_path"]), tp_size=tp, dp_size=dp, enable_dp_attention=True,
                    attn_cp_size=cp, enable_prefill_cp=cp > 1,
                    cp_strategy=req.get("strategy") or "zigzag", device="cpu", skip_tokenizer_init=True)
    get_context().set_server_args(sa)
    n = tokens[dp_rank]
    bs = 1 if extend else n
    fb = ForwardBatch(forward_mode=ForwardMode.EXTEND if extend else ForwardMode.DECODE, batch_size=bs,
                      input_ids=torch.arange(n), req_pool_indices=torch.zeros(bs, dtype=torch.int64),
                      seq_lens=torch.full((bs,), n), out_cache_loc=torch.arange(n), seq_lens_sum=n * bs,
                      positions=torch.arange(n), seq_lens_cpu=torch.full((bs,), n))
    fb.original_global_num_tokens_cpu = list(tokens)
    fb.global_num_tokens_cpu = list(tokens)
    fb.global_num_tokens_gpu = torch.tensor(tokens)
    fb.global_num_tokens_for_logprob_cpu = list(tokens)
    fb.is_extend_in_batch = extend
    runner = SimpleNamespace(
        server_args=sa, is_draft_worker=False,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(get_text_config=SimpleNamespace),
                                     linear_attn_registry_result=None),
        attn_backend=SimpleNamespace(get_cuda_graph_seq_len_fill_value=lambda: 1))
    tensor, saved_dp = torch.tensor, dp_attention._ATTN_DP_SIZE

    def unpinned(*a: Any, pin_memory: bool = False, **k: Any) -> Any:
        return tensor(*a, **k)

    torch.tensor, dp_attention._ATTN_DP_SIZE = unpinned, dp
    try:
        with get_parallel().override(attn_tp_size=tp // (dp * cp), attn_dp_rank=dp_rank, attn_dp_size=dp,
                                     attn_cp_size=cp):
            fb.prepare_mlp_sync_batch(runner)
            padded = {"positions": fb.positions.tolist(), "out_cache_loc": fb.out_cache_loc.tolist()}
            rows = int(fb.input_ids.shape[0])
            fb.post_forward_mlp_sync_batch(SimpleNamespace(next_token_logits=torch.zeros(rows, 4),
                                                           hidden_states=None))
    finally:
        torch.tensor, dp_attention._ATTN_DP_SIZE = tensor, saved_dp
    return {"ok": True, "original_global_num_tokens_cpu": list(fb.original_global_num_tokens_cpu),
            "global_num_tokens_cpu": [int(x) for x in fb.global_num_tokens_cpu],
            "global_dp_buffer_len": int(fb.global_dp_buffer_len), "dp_padding_mode": fb.dp_padding_mode.name,
            "rows": rows, "padded_positions": padded["positions"],
            "padded_out_cache_loc": padded["out_cache_loc"], "positions_after": fb.positions.tolist()}


def dp_gather(req: dict[str, Any]) -> dict[str, Any]:
    """Fork a gloo world of `tp` ranks, run every case on each, and collect what each rank saw."""
    import multiprocessing
    import shutil
    import tempfile

    # Imported before the fork, so that no rank imports them again.
    from sglang.srt.layers import communicator  # noqa: F401
    from sglang.srt.model_executor import forward_batch_info  # noqa: F401
    from sglang.srt.server_args import ServerArgs

    tp, dp, cp = int(req["tp"]), int(req["dp"]), int(req["attn_cp"])
    prefill_cp = bool(req.get("prefill_cp", cp > 1))
    environ = dict(os.environ)
    store = tempfile.mkdtemp(prefix="cptest-gloo-")
    procs: list[Any] = []
    try:
        sa = ServerArgs(model_path=str(req["model_path"]), tp_size=tp, dp_size=dp, enable_dp_attention=True,
                        attn_cp_size=cp, enable_prefill_cp=prefill_cp,
                        cp_strategy="zigzag" if prefill_cp else None, device="cpu", skip_tokenizer_init=True)
        fork = multiprocessing.get_context("fork")
        pipes = []
        for rank in range(tp):
            receive, send = fork.Pipe(duplex=False)
            proc = fork.Process(target=_gather_rank, args=(rank, sa, req["cases"], f"{store}/store", send),
                                daemon=True)
            proc.start()
            procs.append(proc)
            pipes.append(receive)
        ranks = []
        for rank, receive in enumerate(pipes):
            if not receive.poll(float(req.get("timeout_s", 120))):
                return {"ok": False, "type": "TimeoutError", "message": f"rank {rank} did not answer",
                        "where": ""}
            ranks.append(receive.recv())
        failed = [r for r in ranks if not r["ok"]]
        if failed:
            return {"ok": False, "type": "RankError", "message": failed[0]["error"], "where": ""}
        return {"ok": True, "ranks": ranks}
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        shutil.rmtree(store, ignore_errors=True)
        os.environ.clear()
        os.environ.update(environ)


HIDDEN = 4
"""The gathered rows' width: the buffers are sized in rows, so a narrow one shows the same."""


def _gather_rank(rank: int, sa: Any, cases: list[dict[str, Any]], store: str, answer: Any) -> None:
    try:
        answer.send({"ok": True, "rank": rank, "cases": _gather_cases(rank, sa, cases, store)})
    except BaseException:  # noqa: BLE001 - the parent hears of it instead of waiting
        answer.send({"ok": False, "rank": rank, "error": traceback.format_exc()})


def _gather_cases(rank: int, sa: Any, cases: list[dict[str, Any]], store: str) -> list[dict[str, Any]]:
    import torch
    from sglang.kernels.ops.memory import memcpy_triton
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers import dp_attention
    from sglang.srt.layers.communicator import (
        CommunicateContext,
        CommunicateWithAllReduceAndLayerNormFn,
        ScatterMode,
    )
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.runtime_context import get_context, get_parallel
    from triton.runtime.interpreter import InterpretedFunction

    torch.set_num_threads(1)
    memcpy_triton.memcpy_triton_kernel = InterpretedFunction(memcpy_triton.memcpy_triton_kernel.fn)
    library = torch.library.Library("sglang", "IMPL")
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    for name in ("reg_all_gather_into_tensor", "reg_reduce_scatter_tensor"):
        op = getattr(torch.ops.sglang, name).default
        library.impl(name, lambda *a, op=op: op.redispatch(cuda, *a), "CPU")

    ps.init_distributed_environment(world_size=sa.tp_size, rank=rank, distributed_init_method=f"file://{store}",
                                    local_rank=rank, backend="gloo", timeout=60)
    ps.initialize_model_parallel(tensor_model_parallel_size=sa.tp_size,
                                 attention_data_parallel_size=sa.dp_size,
                                 attention_context_model_parallel_size=sa.attn_cp_size, backend="gloo")
    get_context().set_server_args(sa)
    dp_attention.initialize_dp_attention(sa, SimpleNamespace(hf_config=SimpleNamespace(), hidden_size=HIDDEN,
                                                             dtype=torch.float32))
    dp_rank = dp_attention.get_attention_dp_rank()
    attn_tp_rank = ps.get_attn_tp_group().rank_in_group
    runner = SimpleNamespace(
        server_args=sa, is_draft_worker=False,
        model_config=SimpleNamespace(hf_config=SimpleNamespace(get_text_config=SimpleNamespace),
                                     linear_attn_registry_result=None),
        attn_backend=SimpleNamespace(get_cuda_graph_seq_len_fill_value=lambda: 1))
    tensor = torch.tensor

    def unpinned(*a: Any, pin_memory: bool = False, **k: Any) -> Any:
        return tensor(*a, **k)

    torch.tensor = unpinned
    where = {"tp_group": ps.get_tp_group().world_size, "attn_tp": ps.get_attn_tp_group().world_size,
             "dp_rank": dp_rank, "attn_cp_rank": get_parallel().attn_cp_rank, "attn_tp_rank": attn_tp_rank}
    out = []
    for case in cases:
        tokens, extend = [int(n) for n in case["tokens"]], bool(case["extend"])
        n = tokens[dp_rank]
        mode = ForwardMode.IDLE if n == 0 else ForwardMode.EXTEND if extend else ForwardMode.DECODE
        bs = 0 if n == 0 else 1 if extend else n
        fb = ForwardBatch(forward_mode=mode, batch_size=bs, input_ids=torch.arange(n),
                          req_pool_indices=torch.zeros(bs, dtype=torch.int64), seq_lens=torch.full((bs,), n),
                          out_cache_loc=torch.arange(n), seq_lens_sum=n * bs, positions=torch.arange(n),
                          seq_lens_cpu=torch.full((bs,), n))
        fb.original_global_num_tokens_cpu = list(tokens)
        fb.global_num_tokens_cpu = list(tokens)
        fb.global_num_tokens_gpu = tensor(tokens)
        fb.global_num_tokens_for_logprob_cpu = list(tokens)
        fb.is_extend_in_batch = extend
        fb.prepare_mlp_sync_batch(runner)
        rows = int(fb.input_ids.shape[0])
        hidden = torch.zeros(rows, HIDDEN)
        if attn_tp_rank == 0:
            hidden[:n, 0] = 1000 * (dp_rank + 1) + torch.arange(n, dtype=torch.float32)
        seen: dict[str, Any] = {**where, "mode": fb.dp_padding_mode.name,
                                "buffer": int(fb.global_dp_buffer_len),
                                "slices": [int(x) for x in fb.global_num_tokens_cpu], "rows": rows}
        try:
            gathered, _ = CommunicateWithAllReduceAndLayerNormFn._gather_hidden_states_and_residual(
                hidden, torch.zeros_like(hidden), forward_batch=fb, layernorm=_identity,
                context=CommunicateContext.init_new(), residual_input_mode=ScatterMode.TP_ATTN_FULL)
            seen.update(ok=True, gathered=[float(x) for x in gathered[:, 0].tolist()])
        except Exception as err:  # noqa: BLE001 - the answer is the exception
            seen.update(_error(err))
        out.append(seen)
    return out


def _identity(hidden: Any, residual: Any = None) -> Any:
    """The layernorm: what is compared is where the rows go, not their values' scale."""
    return hidden if residual is None else (hidden, residual)


def version(_req: dict[str, Any]) -> dict[str, Any]:
    import sglang

    return {"ok": True, "version": sglang.__version__}


OPS = {"version": version, "server_args": server_args, "groups": groups, "split": split, "split_v1": split_v1,
       "dcp_lens": dcp_lens,
       "dcp_filter": dcp_filter, "alloc_extend": alloc_extend, "dp_buffer": dp_buffer,
       "dp_gather": dp_gather}


def main() -> None:
    # Answers own stdout; whatever SGLang prints or logs goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    _define_torchvision_ops()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = OPS[req["op"]](req)
        except Exception as err:  # noqa: BLE001 - a driver bug is an answer too, not a hang
            answer = {**_error(err), "driver_error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
