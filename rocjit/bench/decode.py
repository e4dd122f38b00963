"""Decode, where the ops are used: the seed's decode chains, a transformers Llama, and each op's eager host cost.

Rows (every peer measured in the same run):
- chain_mlp_fp8 / chain_attn_fp8: Llama-3.1-405B TP8 shard shapes (hidden 16384, gate_up 13312 x 16384, down
  16384 x 6656, QKV 2304 x 16384), M = 1..32, FP8 with static per-tensor scales, CUDA-graph replays rotating
  among weight sets that together exceed twice the L2 (hot_us: one set, L2-resident where it fits): rocjit op by
  op against the same chain in torch.compile with torch._scaled_mm (cuBLASLt; rows padded to 16, which it needs)
  and in bf16 (torch.compile + cuBLAS). chain_mlp_fp8_fused: the same MLP with the fused GEMM epilogues
  (add + RMSNorm + FP8 -> gate/up GEMM + SwiGLU + FP8 in one launch (skinny_gemm_swiglu, interleaved weight from
  prepare_gate_up) -> down GEMM adding into the residual (skinny_gemm_residual)), against the same peers; it does
  more than they do (the residual add that the next layer's norm would otherwise do), and its error is that of
  its down-projection part. chain_mlp_fp8_per_token: the dynamic variant (per-token scales from the
  norm and from swiglu feed the GEMMs directly), against torch.compile with row-wise scaled_mm.
- hf_eager / hf_compiled: a transformers LlamaForCausalLM at Llama-3-8B layer shapes (hidden 4096, intermediate
  14336, 32 heads / 8 KV heads; 4 layers, vocab 32000, random init, bf16): µs per decoded token, stock against
  rocjit bf16 and rocjit FP8 (rocjit.integrations.transformers), eager (DynamicCache) and compiled (StaticCache +
  torch.compile(fullgraph=True, mode="reduce-overhead")); logits and greedy tokens are compared first. Two
  loops: synchronized after every token (ours_us / peers_us: what transformers' generate waits, host time of
  each step included; host_step_us: the part until the step call returns, before which the GPU has nothing of the
  step to run, so it adds to the synchronized time and moves with the host's speed) and pipelined (pipelined_us:
  tokens stay on the GPU, one synchronize at the end).
- hf_module_norm / hf_module_mlp: the eager time per call of LlamaRMSNorm and LlamaMLP on one token, stock and
  patched (wall time of back-to-back calls, synchronized at the end).
- attn_decode: ops.decode_attention at Llama-3-8B heads (32 query / 8 key-value heads, head_dim 128, bf16), one query
  token per sequence, B sequences over L cached keys (a boolean mask with every key visible), CUDA-graph replays,
  against torch's scaled_dot_product_attention given the key / value heads already repeated to 32 (as
  transformers' sdpa path does before calling it; the repeat is not timed): with the mask (the memory-efficient
  backend, what a masked decode step runs) and without (flash). floor_us: K and V read once at copy bandwidth.
- attn_decode_rope: ops.decode_attention_rope (rotary of q and the new key, the key / value written into a static
  cache at a device-side position, attention; one kernel) at the same heads, B = 1 / 8 over a 1024-key cache with
  the new token at 700 (a boolean mask up to it), CUDA-graph replays, against the same step as transformers'
  StaticCache runs it: rotate-half rotary in torch, index_copy_ into the caches, then ops.decode_attention
  (`torch_rope_index_copy_then_ours`), and that sequence compiled by torch.compile (`torch_compile_then_ours`).
  rel_err: the output against float64 (q and the new key rotated in float64, the cache as the kernel wrote it).
- eager_host_<op>: host µs per repeated eager call of each op against its torch eager equivalent and against raw
  rocjit launches of empty kernels with the same parameters as each launch the op makes (the `raw_launches` peer,
  the sum over its launches) and their ratio ours / raw (the goal: <= 1.5). ours_out_us: the same call
  with preallocated outputs (out=), where the op takes one; torch_empty_and_raw_launches: torch.empty for each
  output the op returns, then the raw launches (what a hand-written wrapper that allocates pays). The plans'
  outputs come from rocjit's torch allocator (at::empty, all of a call's outputs in one C call, small ones in one
  shared allocation; "torch_alloc" in the JSON says whether it was loaded); ours_new_empty_us /
  ratio_new_empty_vs_raw: the same call with them made by new_empty, one Python call each, and for ops with
  several outputs ours_unshared_us / ratio_unshared_vs_raw: each in an allocation of its own; both timed again
  beside the raw launches in the same run.
"""
from __future__ import annotations

import statistics
import sys
import time
import types

from rocjit.bench import harness as H
from rocjit.bench.launch import interleaved

H_405, I_405, QKV_405 = 16384, 6656, 2304
ROWS = (1, 2, 4, 8, 16, 32)
ERR_BOUND = 0.15      # relative L2 of an FP8 chain against its bf16 chain: e4m3 rounding of two GEMMs stays below it


def host_us(fns: dict, *, n: int = 200, rounds: int = 15) -> dict:
    """Host µs per call of each callable, back to back without synchronizing (n calls, then a sync outside the
    timed region), interleaved over rounds; median. n is small enough that the launch queue never fills."""
    import torch
    return interleaved(fns, torch.cuda.synchronize, n=n, rounds=rounds)


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ----------------------------------------------------------------------------- a. the seed's decode chains
def _chain_weights(dev, scales: dict):
    """One set of the chains' weights: FP8 (per-tensor `scales`, keyed like the weights), the bf16 values they stand
    for (each FP8 weight times its scale), and the gate/up matrix interleaved for the fused SwiGLU epilogue."""
    import torch
    import rocjit.ops as ops
    f8, bf = torch.float8_e4m3fn, torch.bfloat16
    w = {"gu": torch.randn(2 * I_405, H_405, device=dev).to(f8), "d": torch.randn(H_405, I_405, device=dev).to(f8),
         "qkv": torch.randn(QKV_405, H_405, device=dev).to(f8)}
    for k, sc in scales.items():
        w[k + "16"] = (w[k].float() * sc).to(bf)
    w["gu_i"] = ops.prepare_gate_up(w["gu"][:I_405], w["gu"][I_405:])[0]   # the per-tensor scale applies as it is
    return w


def _chains(result, quick):
    """The seed chains as CUDA-graph replays. Each replay rotates among enough weight sets that one pass touches
    more than twice the L2 (BENCHMARKING.md: skinny GEMMs always rotate weights): in a model every layer has its
    own weights, so none are L2-resident when their layer comes round again. hot_us / peers_hot_us: the same chains
    on one weight set, replayed back to back (the attention chain's 38 MB of QKV weights then stay in L2)."""
    import torch
    import rocjit.ops as ops
    f8, bf = torch.float8_e4m3fn, torch.bfloat16
    dev = "cuda"
    torch.manual_seed(0)
    w_ln = (torch.rand(H_405, device=dev) + 0.5).to(bf)
    s_in, s_gu, s_h, s_d = (torch.tensor([v], device=dev) for v in (0.02, 0.01, 0.05, 0.01))
    s_qkv = torch.tensor([0.01], device=dev)
    eps = 1e-6
    weight_bytes = {"chain_mlp_fp8": (2 * I_405 * H_405 + H_405 * I_405), "chain_attn_fp8": QKV_405 * H_405,
                    "chain_mlp_fp8_per_token": (2 * I_405 * H_405 + H_405 * I_405),
                    "chain_mlp_fp8_fused": (2 * I_405 * H_405 + H_405 * I_405)}
    n_sets = max(H.rotation_count(weight_bytes["chain_mlp_fp8"]), H.rotation_count(weight_bytes["chain_attn_fp8"]))
    sets = [_chain_weights(dev, {"gu": s_gu, "d": s_d, "qkv": s_qkv}) for _ in range(n_sets)]

    def norm_q(x, r, s):
        h = x + r
        r.copy_(h)
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w_ln.float()
        return (y / s).clamp(-448.0, 448.0).to(f8)

    def mlp_fp8(x, r, w):
        q = norm_q(x, r, s_in)
        gu = torch._scaled_mm(q, w["gu"].t(), s_in, s_gu, out_dtype=bf)
        g, u = gu.float().chunk(2, dim=-1)
        h = ((torch.nn.functional.silu(g) * u) / s_h).clamp(-448.0, 448.0).to(f8)
        return torch._scaled_mm(h, w["d"].t(), s_h, s_d, out_dtype=bf)

    def attn_fp8(x, r, w):
        return torch._scaled_mm(norm_q(x, r, s_in), w["qkv"].t(), s_in, s_qkv, out_dtype=bf)

    def mlp_rowwise(x, r, w):
        h = x + r
        r.copy_(h)
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w_ln.float()
        sa = (y.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-12)
        gu = torch._scaled_mm((y / sa).to(f8), w["gu"].t(), sa, s_gu.expand(1, 2 * I_405).contiguous(),
                              out_dtype=bf)
        g, u = gu.float().chunk(2, dim=-1)
        a = torch.nn.functional.silu(g) * u
        sh = (a.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-12)
        return torch._scaled_mm((a / sh).to(f8), w["d"].t(), sh, s_d.expand(1, H_405).contiguous(), out_dtype=bf)

    def mlp_bf16(x, r, w):
        h = x + r
        r.copy_(h)
        hf = h.float()
        y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w_ln.float()).to(bf)
        g, u = (y @ w["gu16"].t()).chunk(2, dim=-1)
        return (torch.nn.functional.silu(g) * u) @ w["d16"].t()

    def attn_bf16(x, r, w):
        h = x + r
        r.copy_(h)
        hf = h.float()
        y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w_ln.float()).to(bf)
        return y @ w["qkv16"].t()

    def ours_mlp(x, r, w):
        q = ops.rms_norm(x, w_ln, eps, residual=r, scale=s_in)[0]
        gu = ops.skinny_gemm(q, w["gu"], scale_a=s_in, scale_w=s_gu)
        return ops.skinny_gemm(ops.swiglu(gu, scale=s_h), w["d"], scale_a=s_h, scale_w=s_d)

    def ours_mlp_fused(x, r, w):
        q = ops.rms_norm(x, w_ln, eps, residual=r, scale=s_in)[0]
        h = ops.skinny_gemm_swiglu(q, w["gu_i"], scale_a=s_in, scale_w=s_gu, scale=s_h)
        return ops.skinny_gemm_residual(h, w["d"], r, scale_a=s_h, scale_w=s_d)

    def ours_mlp_dyn(x, r, w):
        q, s, _ = ops.rms_norm(x, w_ln, eps, residual=r, quant="per_token")
        gu = ops.skinny_gemm(q, w["gu"], scale_a=s.view(-1), scale_w=s_gu)
        h, hs = ops.swiglu(gu, quant="per_token")
        return ops.skinny_gemm(h, w["d"], scale_a=hs.view(-1), scale_w=s_d)

    def ours_attn(x, r, w):
        return ops.skinny_gemm(ops.rms_norm(x, w_ln, eps, residual=r, scale=s_in)[0], w["qkv"], scale_a=s_in,
                               scale_w=s_qkv)

    comp = {f.__name__: torch.compile(f, dynamic=False) for f in (mlp_fp8, attn_fp8, mlp_rowwise, mlp_bf16, attn_bf16)}

    def timed(fn, x, r0, n):
        """Graph-replay µs of fn over the first n weight sets, each call with its own residual copy."""
        rs = [r0.clone() for _ in range(n)]
        return H.time_graph([lambda w=w, r=r: fn(x, r, w) for w, r in zip(sets[:n], rs)])

    for M in ((1, 8, 32) if quick else ROWS):
        Mp = max(16, -(-M // 16) * 16)
        x = torch.randn(M, H_405, device=dev).to(bf)
        r0 = torch.randn(M, H_405, device=dev).to(bf)
        xp = torch.zeros(Mp, H_405, device=dev, dtype=bf)
        xp[:M] = x
        rp = torch.zeros(Mp, H_405, device=dev, dtype=bf)
        rp[:M] = r0
        for case, ours, peer_fp8, peer_bf16 in (("chain_mlp_fp8", ours_mlp, "mlp_fp8", "mlp_bf16"),
                                                ("chain_mlp_fp8_fused", ours_mlp_fused, "mlp_fp8", "mlp_bf16"),
                                                ("chain_attn_fp8", ours_attn, "attn_fp8", "attn_bf16"),
                                                ("chain_mlp_fp8_per_token", ours_mlp_dyn, "mlp_rowwise", "mlp_bf16")):
            # outputs first: the FP8 chain against the bf16 chain on the same inputs (FP8 rounding bounds it)
            r_ref = r0.clone()
            y_ours = ours(x, r0.clone(), sets[0])
            y_ref = comp[peer_bf16](x, r_ref, sets[0])
            if case.endswith("_fused"):                   # it returns residual + down: compare the down part
                y_ours = y_ours.float() - r_ref.float()
            err = _rel(y_ours, y_ref)
            if not err < ERR_BOUND:
                print(f"bench decode: {case} M={M}: rocjit's FP8 chain is {err:.3f} (relative) from the bf16 chain, "
                      f"beyond the {ERR_BOUND} that FP8 rounding explains", file=sys.stderr, flush=True)
            n = H.rotation_count(weight_bytes[case])
            t_ours = timed(ours, x, r0, n)
            t_fp8 = timed(comp[peer_fp8], xp, rp, n)
            t_bf16 = timed(comp[peer_bf16], x, r0, n)
            hot_ours, hot_fp8 = timed(ours, x, r0, 1), timed(comp[peer_fp8], xp, rp, 1)
            floor = H.floor_us(weight_bytes[case], result["ceilings"])
            H.add_row(result, case, (M, H_405), "float8_e4m3fn", t_ours,
                      {"torch_compile_scaled_mm": t_fp8, "torch_compile_bf16": t_bf16}, floor, timing="graph",
                      weight_sets=n, hot_us=hot_ours, peers_hot_us={"torch_compile_scaled_mm": hot_fp8},
                      rel_err_vs_bf16_chain=err, outputs_match=bool(err < ERR_BOUND))
            print(result["rows"][-1], flush=True)
    del sets, comp
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- c. eager host cost per op
_EMPTY_SRC = """
#include <hip/hip_runtime.h>
__global__ void empty_{p}_{s}({params}) {{}}
"""


def _raw_launcher(n_ptr: int, n_scalar: int):
    """A raw rocjit launch (native launcher) of an empty kernel with these parameters, and its arguments."""
    import torch
    import rocjit
    params = ", ".join([f"const void* p{i}" for i in range(n_ptr)] + [f"int s{i}" for i in range(n_scalar)])
    k = rocjit.kernel(_EMPTY_SRC.format(p=n_ptr, s=n_scalar, params=params))
    args = [torch.empty(64, device="cuda") for _ in range(n_ptr)] + [7] * n_scalar
    launch = k[1, 32]
    launch(*args)
    torch.cuda.synchronize()
    launch = k[1, 32]
    return lambda: launch(*args)


def _with_other_allocation(entry, fn, raws, how: str) -> dict:
    """The same call with the plans' outputs made another way, timed against the raw launches again (same run):
    how="new_empty": each output by a prototype's new_empty, one Python call each (what the plans used before
    rocjit's torch allocator); how="unshared": by the allocator, but each output in an allocation of its own."""
    from rocjit.ops import _op
    import torch
    kept, limit, group = dict(_op._MAKERS), _op.SHARE_LIMIT, _op._group
    if not kept or all(getattr(m, "__name__", "") == "new_empty" for m in kept.values()):
        return {}
    try:
        if how == "new_empty":
            _op._MAKERS.update({k: torch.empty(0, dtype=k[0], device=k[1]).new_empty for k in kept})
            _op._group = lambda outs: None
        else:
            _op.SHARE_LIMIT = 0
        entry.clear_plans()
        fn()
        fn()
        t = host_us({"ours": fn, "raw_launches": lambda: [f() for f in raws]}, rounds=7)
    finally:
        _op._MAKERS.clear()
        _op._MAKERS.update(kept)
        _op.SHARE_LIMIT, _op._group = limit, group
        entry.clear_plans()
        fn()
    return {f"ours_{how}_us": t["ours"], f"ratio_{how}_vs_raw": t["ours"] / t["raw_launches"]}


def _eager_host(result, quick):
    import torch
    import rocjit.ops as ops
    from rocjit.ops import REGISTRY
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    dev = "cuda"
    x = torch.randn(1, 4096, device=dev).to(bf)
    r = torch.randn(1, 4096, device=dev).to(bf)
    w = (torch.rand(4096, device=dev) + 0.5).to(bf)
    s = torch.tensor([0.05], device=dev)
    gu = torch.randn(1, 2 * 14336, device=dev).to(bf)
    wv = torch.randn(4096, 4096, device=dev).half()
    xv = torch.randn(4096, device=dev).half()
    w_up = torch.randn(28672, 4096, device=dev).to(bf)
    w_dn = torch.randn(4096, 14336, device=dev).to(bf)
    a_dn = torch.randn(1, 14336, device=dev).to(bf)
    a8 = torch.randn(8, 16384, device=dev).to(f8)
    w8 = torch.randn(13312, 16384, device=dev).to(f8)
    sa8 = torch.rand(8, device=dev) + 0.5
    sw8 = torch.rand(13312, device=dev) + 0.5
    a16 = torch.zeros(16, 16384, device=dev).to(f8)
    one = torch.ones((), device=dev)
    # preallocated outputs for the out= variant of each op that takes one
    o_norm = torch.empty(1, 4096, device=dev, dtype=f8)
    o_swi = torch.empty(1, 14336, device=dev, dtype=f8)
    o_gemv = torch.empty(4096, device=dev, dtype=torch.float16)
    o_up = torch.empty(1, 28672, device=dev, dtype=bf)
    o_dn = torch.empty(1, 4096, device=dev, dtype=bf)
    o_f8 = torch.empty(8, 13312, device=dev, dtype=bf)
    o_q = torch.empty(1, 4096, device=dev, dtype=f8)
    o_qs = torch.empty(1, 1, device=dev)

    def norm_eager():
        h = x + r
        hf = h.float()
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return (y / s).clamp(-448.0, 448.0).to(f8), h

    def swiglu_eager():
        g, u = gu.float().chunk(2, dim=-1)
        return ((torch.nn.functional.silu(g) * u) / s).clamp(-448.0, 448.0).to(f8)

    def quant_eager():
        xf = x.float()
        sc = xf.abs().amax(-1, keepdim=True) / 448.0
        return (xf / sc).clamp(-448.0, 448.0).to(f8), sc

    aq = torch.randn(1, 32, 1, 128, device=dev).to(bf)
    ak, av = (torch.randn(1, 8, 80, 128, device=dev).to(bf) for _ in range(2))
    am = torch.ones(1, 1, 1, 80, dtype=torch.bool, device=dev)
    o_att = torch.empty(1, 1, 32, 128, device=dev, dtype=bf)
    cases = [
        ("decode_attention", "llama8b_l80", (1, 32, 8, 80, 128), "bfloat16",
         lambda: ops.decode_attention(aq, ak, av, am),
         {"torch_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(aq, ak, av, attn_mask=am,
                                                                                 enable_gqa=True)},
         lambda: ops.decode_attention(aq, ak, av, am, out=o_att)),
        ("rms_norm", "add_rmsnorm_fp8", (1, 4096), "bfloat16", lambda: ops.rms_norm(x, w, 1e-6, residual=r, scale=s),
         {"torch_eager": norm_eager}, lambda: ops.rms_norm(x, w, 1e-6, residual=r, scale=s, out=o_norm)),
        ("swiglu", "swiglu_fp8", (1, 14336), "bfloat16", lambda: ops.swiglu(gu, scale=s),
         {"torch_eager": swiglu_eager}, lambda: ops.swiglu(gu, scale=s, out=o_swi)),
        ("quantize_fp8", "per_token", (1, 4096), "bfloat16", lambda: ops.quantize_fp8(x, granularity="token"),
         {"torch_eager": quant_eager}, lambda: ops.quantize_fp8(x, granularity="token", out=o_q, scale_out=o_qs)),
        ("gemv", "fp16", (4096, 4096), "float16", lambda: ops.gemv(wv, xv), {"torch_mv": lambda: torch.mv(wv, xv)},
         lambda: ops.gemv(wv, xv, out=o_gemv)),
        ("skinny_gemm", "bf16_gate_up", (1, 28672, 4096), "bfloat16", lambda: ops.skinny_gemm(x, w_up),
         {"torch_matmul": lambda: x @ w_up.t()}, lambda: ops.skinny_gemm(x, w_up, out=o_up)),
        ("skinny_gemm", "bf16_down", (1, 4096, 14336), "bfloat16", lambda: ops.skinny_gemm(a_dn, w_dn),
         {"torch_matmul": lambda: a_dn @ w_dn.t()}, lambda: ops.skinny_gemm(a_dn, w_dn, out=o_dn)),
        ("skinny_gemm", "fp8_per_token", (8, 13312, 16384), "float8_e4m3fn",
         lambda: ops.skinny_gemm(a8, w8, scale_a=sa8, scale_w=sw8),
         {"torch_scaled_mm": lambda: torch._scaled_mm(a16, w8.t(), one, one, out_dtype=bf)},
         lambda: ops.skinny_gemm(a8, w8, scale_a=sa8, scale_w=sw8, out=o_f8)),
    ]
    raw = {}
    for op_name, variant, shape, dtype, fn, peers, fn_out in cases:
        entry = REGISTRY[op_name]
        fn()
        fn()            # the second call replays (or records, after tuning on the first)
        torch.cuda.synchronize()
        launches = entry.last_plan or []        # what the allocating call launches and allocates
        outputs = entry.last_outputs or []
        if fn_out:
            fn_out()
            fn_out()
            torch.cuda.synchronize()
        before = entry.plans.hits if entry.plans is not None else 0
        raws = []
        for _, n_ptr, n_sc in launches:
            if (n_ptr, n_sc) not in raw:
                raw[(n_ptr, n_sc)] = _raw_launcher(n_ptr, n_sc)
            raws.append(raw[(n_ptr, n_sc)])
        cands = {"ours": fn, **peers}
        if fn_out:
            cands["ours_out"] = fn_out
        if raws:
            cands["raw_launches"] = lambda raws=raws: [f() for f in raws]
            # what a hand-written wrapper pays: torch.empty for each output the op returns, then the raw launches
            cands["torch_empty_and_raw_launches"] = lambda raws=raws, outputs=outputs: (
                [torch.empty(shape, dtype=dt, device=dev) for dt, shape in outputs], [f() for f in raws])
        t = host_us(cands, rounds=7 if quick else 15)
        hits = (entry.plans.hits if entry.plans is not None else 0) - before
        with_new_empty = _with_other_allocation(entry, fn, raws, "new_empty") if raws and outputs else {}
        if raws and len(outputs) > 1:
            with_new_empty.update(_with_other_allocation(entry, fn, raws, "unshared"))
        ours = t.pop("ours")
        ours_out = t.pop("ours_out", None)
        row = H.add_row(result, f"eager_host_{op_name}", shape, dtype, ours, t, None, timing="host", variant=variant,
                        launches=[name for name, _, _ in launches], plan_replays=hits,
                        outputs=[list(shape) for _, shape in outputs],
                        ratio_vs_raw=(ours / t["raw_launches"]) if raws else None,
                        ours_out_us=ours_out,
                        ratio_out_vs_raw=(ours_out / t["raw_launches"]) if raws and ours_out else None,
                        **with_new_empty)
        print(row, flush=True)
    del w_up, w_dn, w8, wv
    torch.cuda.empty_cache()


def _attention(result, quick):
    import torch
    import torch.nn.functional as F
    import rocjit.ops as ops
    bf = torch.bfloat16
    cases = [(1, 80), (1, 1024), (1, 8192), (8, 1024), (8, 8192)] if not quick else [(1, 80), (8, 1024)]
    for B, L in cases:
        q = torch.randn(B, 32, 1, 128, device="cuda").to(bf)
        k, v = (torch.randn(B, 8, L, 128, device="cuda").to(bf) for _ in range(2))
        mask = torch.ones(B, 1, 1, L, dtype=torch.bool, device="cuda")
        kr, vr = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
        ref = F.scaled_dot_product_attention(q.float(), kr.float(), vr.float()).transpose(1, 2)
        got = ops.decode_attention(q, k, v, mask)
        t_ours = H.time_graph([lambda: ops.decode_attention(q, k, v, mask)])
        peers = {"torch_sdpa_masked": H.time_graph([lambda: F.scaled_dot_product_attention(q, kr, vr,
                                                                                          attn_mask=mask)]),
                 "torch_sdpa_flash": H.time_graph([lambda: F.scaled_dot_product_attention(q, kr, vr)])}
        row = H.add_row(result, "attn_decode", (B, 32, 8, L, 128), "bfloat16", t_ours, peers,
                        H.floor_us(2 * k.numel() * 2, result["ceilings"]), rel_err=_rel(got.float(), ref),
                        speedup_vs_sdpa_masked=peers["torch_sdpa_masked"] / t_ours)
        print(row, flush=True)
        del q, k, v, kr, vr, mask
    torch.cuda.empty_cache()
    for B in ((1, 8) if not quick else (1,)):
        _attention_rope(result, B, 1024, 700)


def _attention_rope(result, B, L, pos):
    import torch
    import rocjit.ops as ops
    bf = torch.bfloat16
    g = torch.Generator("cuda").manual_seed(B)
    qkv = torch.randn(B, 1, (32 + 16) * 128, device="cuda", generator=g).to(bf)
    q, k, v = qkv.view(B, 1, 48, 128).split([32, 8, 8], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ang = torch.rand(B, 1, 64, device="cuda", generator=g) * 6.28
    cos, sin = torch.cat([ang, ang], -1).cos().to(bf), torch.cat([ang, ang], -1).sin().to(bf)
    kc, vc = (torch.randn(B, 8, L, 128, device="cuda", generator=g).to(bf) for _ in range(2))
    position = torch.tensor([pos], device="cuda")
    mask = (torch.arange(L, device="cuda") <= pos)[None, None, None, :]

    def rotate(x):
        return x * cos[:, None] + torch.cat([-x[..., 64:], x[..., :64]], -1) * sin[:, None]

    def unfused():
        qr, kr = rotate(q), rotate(k)
        kc.index_copy_(2, position, kr)
        vc.index_copy_(2, position, v)
        return ops.decode_attention(qr, kc, vc, mask)
    compiled = torch.compile(unfused, fullgraph=True)
    got = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, position, mask)
    torch.cuda.synchronize()
    qd, kd = (t.double() for t in (q, k))
    c64, s64 = cos.double()[:, None], sin.double()[:, None]
    qr64 = qd * c64 + torch.cat([-qd[..., 64:], qd[..., :64]], -1) * s64
    kk, vv = kc.double().repeat_interleave(4, 1), vc.double().repeat_interleave(4, 1)
    sc = (qr64 @ kk.transpose(-1, -2)) / 128 ** 0.5
    ref = torch.softmax(sc.masked_fill(~mask, float("-inf")), -1) @ vv
    t_ours = H.time_graph([lambda: ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, position, mask)])
    compiled()                      # compile outside the timed graph
    peers = {"torch_rope_index_copy_then_ours": H.time_graph([unfused]),
             "torch_compile_then_ours": H.time_graph([compiled])}
    row = H.add_row(result, "attn_decode_rope", (B, 32, 8, L, 128), "bfloat16", t_ours, peers,
                    H.floor_us(2 * kc.numel() * 2 * (pos + 1) // L, result["ceilings"]),
                    rel_err=_rel(got.double(), ref.transpose(1, 2)), position=pos)
    print(row, flush=True)
    del qkv, kc, vc
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- b. a transformers Llama
def _llama(layers: int):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                   num_key_value_heads=8, num_hidden_layers=layers, vocab_size=32000,
                                   max_position_embeddings=4096, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


class _Decoder:
    """Greedy decode of one model: an eager prefill, then single-token steps (compiled: StaticCache and one
    torch.compile'd step with CUDA graphs). `run` starts again from the prompt each time."""

    def __init__(self, model, ids, steps: int, compiled: bool):
        import torch
        import transformers
        self.model, self.ids, self.steps, self.compiled = model, ids, steps, compiled
        if compiled:
            self.cache = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps + 8)

            def step(tok, pos):
                return model(input_ids=tok, past_key_values=self.cache, cache_position=pos, use_cache=True).logits
            # each model's step gets a code object of its own, as a process serving one model has: dynamo keeps its
            # compiled entries per code object and tries them in turn, so three models sharing one step function
            # would each also evaluate (and fail) the others' guards on every call (H100: the stock model's guard
            # lookup 78 - 79 us shared, 65 - 69 us alone)
            step = types.FunctionType(step.__code__.replace(co_name=f"step_{id(model):x}"), step.__globals__,
                                      f"step_{id(model):x}", None, step.__closure__)
            self.step = torch.compile(step, fullgraph=True, mode="reduce-overhead")
        else:
            self.cache = None
            self.step = None

    def run(self, synced: bool = True):
        """(per-step µs, greedy tokens, first-step logits, host µs of the step call). host: the median time until
        the step call returns (guards, graph launch, its host bookkeeping; synced only, else None). synced: a synchronize after every token (what
        transformers' generate does to test its stopping criteria), the median step; otherwise the tokens stay
        on the GPU and the host runs ahead (a serving loop), the mean over the steps with one synchronize at the
        end. Either way no output of a step is alive when the next one starts."""
        import torch
        import transformers
        model, ids = self.model, self.ids
        if self.compiled:
            self.cache.reset()
            cache, fn = self.cache, self.step
        else:
            cache = transformers.DynamicCache(config=model.config)

            def fn(tok, pos):
                return model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        L = ids.shape[1]
        pos = [torch.tensor([L + i], device=ids.device) for i in range(self.steps)]
        with torch.no_grad():
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
            tok = logits[:, -1:].argmax(-1)
            first = logits[:, -1].float()
            del logits
            toks, times, host = [tok], [], []
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(self.steps):
                t = time.perf_counter()
                logits = fn(tok, pos[i])
                t1 = time.perf_counter()
                tok = logits[:, -1:].argmax(-1)
                del logits
                if synced:
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - t) * 1e6)
                    host.append((t1 - t) * 1e6)
                toks.append(tok)
            torch.cuda.synchronize()
            per_step = statistics.median(times[2:]) if synced else (time.perf_counter() - t0) * 1e6 / self.steps
        return per_step, torch.cat(toks, 1)[0].tolist(), first, statistics.median(host[2:]) if synced else None


def _hf(result, quick):
    import torch
    from rocjit.integrations import transformers as rt
    # cuDNN's SDPA backend rebuilds its plan whenever the KV length changes (~17 ms of host time per decode step
    # seen on an H100 with torch 2.11): it would dominate every column, so attention runs on flash / efficient SDPA
    torch.backends.cuda.enable_cudnn_sdp(False)
    layers = 2 if quick else 4
    steps = 16 if quick else 32
    rounds = 3 if quick else 5
    # three copies of one model (same seed, same weights): stock, rocjit bf16, rocjit FP8. Their decodes alternate
    # round by round, so a slow minute on the host hits every column alike
    models = {"stock": _llama(layers), "bf16": rt.patch(_llama(layers)), "fp8": rt.patch(_llama(layers), fp8=True)}
    ids = torch.randint(0, 32000, (1, 32), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    shape = (1, 4096, layers)
    for mode in ("eager", "compiled"):
        compiled = mode == "compiled"
        torch._dynamo.reset()
        decs = {k: _Decoder(m, ids, steps, compiled) for k, m in models.items()}
        times = {(k, sync): [] for k in decs for sync in (True, False)}
        hosts = {k: [] for k in decs}
        first = {}
        for k, d in decs.items():           # warm-up (compilation, graph capture, tuning) and the outputs
            d.run()
            first[k] = d.run()
        for _ in range(rounds):
            for sync in (True, False):
                for k, d in decs.items():
                    r = d.run(sync)
                    times[k, sync].append(r[0])
                    if sync:
                        hosts[k].append(r[3])
        t = {key: statistics.median(v) for key, v in times.items()}
        (_, tok_stock, logit_stock, _), (_, tok_bf16, logit_bf16, _), (_, tok_fp8, logit_fp8, _) = \
            first["stock"], first["bf16"], first["fp8"]
        row = H.add_row(result, f"hf_{mode}", shape, "bfloat16", t["bf16", True],
                        {"stock": t["stock", True], "rocjit_fp8": t["fp8", True]}, None,
                        timing="per token, synchronized after each token (median step)",
                        speedup_bf16_vs_stock=t["stock", True] / t["bf16", True],
                        speedup_fp8_vs_stock=t["stock", True] / t["fp8", True],
                        pipelined_us={k: t[k, False] for k in decs},
                        host_step_us={k: statistics.median(v) for k, v in hosts.items()},
                        pipelined_speedup_bf16_vs_stock=t["stock", False] / t["bf16", False],
                        pipelined_speedup_fp8_vs_stock=t["stock", False] / t["fp8", False],
                        logits_rel_err_bf16=_rel(logit_bf16, logit_stock), logits_rel_err_fp8=_rel(logit_fp8, logit_stock),
                        greedy_tokens_equal_bf16=tok_bf16 == tok_stock,
                        greedy_tokens_agree_bf16=sum(a == b for a, b in zip(tok_bf16, tok_stock)) / len(tok_stock),
                        greedy_tokens_agree_fp8=sum(a == b for a, b in zip(tok_fp8, tok_stock)) / len(tok_stock),
                        rounds=rounds, steps_per_round=steps)
        print(row, flush=True)
        del decs
    torch._dynamo.reset()
    # the modules alone, one token, eager: the stock model's layer 0 against the patched copy's
    h = torch.randn(1, 1, 4096, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for case, attr in (("hf_module_norm", "post_attention_layernorm"), ("hf_module_mlp", "mlp")):
            stock_mod = getattr(models["stock"].model.layers[0], attr)
            ours_mod = getattr(models["bf16"].model.layers[0], attr)
            ref, got = stock_mod(h), ours_mod(h)
            t = interleaved({"stock": lambda: stock_mod(h), "ours": lambda: ours_mod(h)}, torch.cuda.synchronize,
                            n=50, rounds=9, wall=True)
            row = H.add_row(result, case, (1, 4096), "bfloat16", t["ours"], {"stock": t["stock"]}, None,
                            timing="wall per call", rel_err=_rel(got, ref))
            print(row, flush=True)
    del models
    torch.cuda.empty_cache()


def run(argv) -> dict:
    import torch
    torch._dynamo.config.cache_size_limit = 256
    quick = H.quick(argv)
    result = H.new_result("decode", H.measure_ceilings(matmul=False))
    from rocjit import native
    native.torch_alloc()        # the op plans' allocator: built once per machine and cache, never in a timed loop
    result["torch_alloc"] = native.torch_alloc_status().split(" (")[0]
    _eager_host(result, quick)
    _chains(result, quick)
    _attention(result, quick)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: the hf_* rows are skipped (pip install rocjit[transformers])",
              file=sys.stderr)
    else:
        _hf(result, quick)
    return result
