"""Skinny GEMM for decode: C[M, N] = A[M, K] . W[N, K]^T with M <= 32, FP8 (e4m3) or bf16/fp16.

    c = rocjit.ops.skinny_gemm(a, w)                                   # bf16 / fp16
    c = rocjit.ops.skinny_gemm(a8, w8, scale_a=sa, scale_w=sw)         # FP8, C = (A W^T) * sa * sw

FP8 scales are float32 device tensors: `scale_a` one element (per tensor) or M (per row: the dynamic per-token
scales that ``rms_norm(..., quant="per_token")`` and ``swiglu(..., quant="per_token")`` return), `scale_w` one
element or N (per output channel). Matrix-core kernel (skinny_gemm.hip) on NVIDIA sm_89+ and AMD CDNA, the
portable kernel (gemv.hip) elsewhere; split-K reductions run in a fixed order (deterministic).
Configs come from rocjit.tune (tuned once per shape bucket, then persisted).
"""
from typing import Optional

from rocjit import targets
from rocjit.ops import _common as C
from rocjit.ops import _gemm as G
from rocjit.ops._gemm import (aligned_operands, ctype, has_matrix_path, has_stream_path, launch_mma,  # noqa: F401
                              launch_portable, launch_stream, mma_candidates, mma_default, portable_candidates,
                              stream_candidates)
from rocjit.ops._op import UNRECORDED, op

MAX_M = 32
_device = G._device          # (target, name, multiprocessors) of a device; tests read it here


def _check(a, w, scale_a, scale_w, out_dtype, out):
    import torch
    if not (isinstance(a, torch.Tensor) and isinstance(w, torch.Tensor)):
        raise TypeError(f"skinny_gemm: a and w must be torch tensors, got {type(a).__name__} and {type(w).__name__}")
    if a.dim() != 2 or w.dim() != 2:
        raise ValueError(f"skinny_gemm: expected a [M, K] and w [N, K], got shapes {tuple(a.shape)} and {tuple(w.shape)}")
    M, K = a.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"skinny_gemm: a is [M={M}, K={K}] but w is {tuple(w.shape)}; w must be [N, K={K}]")
    if M > MAX_M:
        raise ValueError(f"skinny_gemm handles M <= {MAX_M} rows of a (decode batches); got M={M}. Use a general "
                         f"GEMM for larger M: torch.matmul(a, w.t()) or torch._scaled_mm for FP8")
    if M < 1 or N < 1:
        raise ValueError(f"skinny_gemm: empty problem M={M}, N={N}")
    if K % 16:
        raise ValueError(f"skinny_gemm: K={K} must be a multiple of 16 (16-byte weight loads)")
    if a.dtype != w.dtype:
        raise TypeError(f"skinny_gemm: a and w must share a dtype, got {a.dtype} and {w.dtype}")
    fp8 = G._is_fp8(a.dtype)
    if not fp8 and a.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"skinny_gemm: dtype must be float8_e4m3fn / float8_e4m3fnuz, bfloat16 or float16, got {a.dtype}")
    if a.device != w.device or a.device.type != "cuda":
        raise ValueError(f"skinny_gemm: a and w must be on the same GPU, got {a.device} and {w.device}")
    if not w.is_contiguous():
        raise ValueError("skinny_gemm: w must be contiguous (row-major [N, K]); copying weights per call is not free")
    for nm, s, allowed, what in (("scale_a", scale_a, (1, M), "per tensor, or M per row"),
                                 ("scale_w", scale_w, (1, N), "per tensor, or N per output channel")):
        if s is None:
            continue
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.device != a.device:
            raise TypeError(f"skinny_gemm: {nm} must be a float32 tensor on {a.device} (no host sync in a decode step)")
        if s.numel() not in allowed:
            raise ValueError(f"skinny_gemm: {nm} must have 1 element ({what}: {allowed[1]}), got {s.numel()} "
                             f"(shape {tuple(s.shape)})")
        if not s.is_contiguous():
            raise ValueError(f"skinny_gemm: {nm} must be contiguous, got strides {s.stride()}")
    od = out_dtype if out_dtype is not None else (torch.bfloat16 if fp8 else a.dtype)
    if od not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"skinny_gemm: out_dtype must be bfloat16, float16 or float32, got {od}")
    if out is not None:
        if out.shape != (M, N) or out.dtype != od or out.device != a.device or not out.is_contiguous():
            raise ValueError(f"skinny_gemm: out must be a contiguous {od} tensor of shape ({M}, {N}) on {a.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    return M, N, K, fp8, od


def config_for(a, w, out, scale_a, scale_w, M, N, K, fp8):
    """The tuned (or default) config of this problem and run(cfg, w=w, call=UNRECORDED) that launches it."""
    target, devname, sms = G._device(a.device.index or 0)
    wave = targets.wave_size(target)
    eb = a.element_size()
    if has_matrix_path(target, fp8):
        cands, default = mma_candidates(M, N, K, sms, eb), mma_default(M, N, K, sms, eb)
        if has_stream_path(target):                  # a and w are 16-byte aligned (aligned_operands)
            cands = stream_candidates(M, N, K, sms, eb) + cands
    else:
        cands, default = portable_candidates(M), portable_candidates(M)[0]

    def run(cfg, w=w, call=UNRECORDED):
        if cfg["path"] == "mma":
            return launch_mma(a, w, out, scale_a, scale_w, M, N, K, cfg, target, wave, call)
        if cfg["path"] == "stream":
            return launch_stream(a, w, out, scale_a, scale_w, M, N, K, cfg, sms, call)
        xt = "unsigned char" if fp8 else ctype(a.dtype)
        wk = ("gemv::w_e4m3fnuz" if "fnuz" in str(a.dtype) else "gemv::w_e4m3") if fp8 else \
            ("gemv::w_bf16" if "bfloat16" in str(a.dtype) else "gemv::w_f16")
        return launch_portable(a, xt, wk, w, out, scale_w, None, 0, G.scale_modes(M, N, scale_a, scale_w), scale_a,
                               "float", M, N, K, cfg, call)

    cfg = G.tuned("skinny_gemm", bucket=G.tune.bucket(m=M, n=N, k=K), dtype=str(a.dtype).replace("torch.", ""),
                  device=devname, candidates=cands, default=default, run=run, w=w)
    return cfg, run


def _run(call, a, w, scale_a, scale_w, od, out):
    M, N, K, fp8, od = _check(a, w, scale_a, scale_w, od, out)
    a = aligned_operands("skinny_gemm", a.contiguous(), w, out)
    if out is None:
        out = call.empty((M, N), od, a.device)
    cfg, run = config_for(a, w, out, scale_a, scale_w, M, N, K, fp8)
    run(cfg, w, call)
    return out


def _custom_op():
    """(impl, fake) of torch.ops.rocjit.skinny_gemm."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(a: Tensor, w: Tensor, scale_a: Optional[Tensor], scale_w: Optional[Tensor], out_dtype: str) -> Tensor:
        return _run(UNRECORDED, a, w, scale_a, scale_w, getattr(tm, out_dtype), None)

    def fake(a, w, scale_a, scale_w, out_dtype):
        return a.new_empty((a.shape[0], w.shape[0]), dtype=getattr(tm, out_dtype))

    return impl, fake


@op(roles="TTTTOT", sources=(G.SRC, G.GEMV_SRC), bench="skinny", custom_op=_custom_op)
def skinny_gemm(call, a, w, *, scale_a=None, scale_w=None, out_dtype=None, out=None):
    """C = A W^T for A [M <= 32, K], W [N, K] (K % 16 == 0). FP8: C = (A W^T) * scale_a * scale_w with float32
    scales (scale_a 1 or M elements, scale_w 1 or N); out_dtype defaults to bfloat16 for FP8 and to the input
    dtype otherwise. Deterministic (fixed-order split-K). Inputs may be torch, cupy or numpy arrays; the result
    comes back in a's framework."""
    name = "skinny_gemm"
    at, fw = C.to_torch(a, "a", name)
    wt = C.to_torch(w, "w", name)[0]
    sa = C.to_torch(scale_a, "scale_a", name)[0] if scale_a is not None else None
    sw = C.to_torch(scale_w, "scale_w", name)[0] if scale_w is not None else None
    ot = C.to_torch(out, "out", name)[0] if out is not None else None
    if C.compiling():
        od = _check(at, wt, sa, sw, out_dtype, ot)[4]
        y = C.into_out(skinny_gemm.__rocjit_op__.torch_op()(at, wt, sa, sw, str(od).replace("torch.", "")), ot)
    else:
        y = _run(call, at, wt, sa, sw, out_dtype, ot)
    return call.done(C.to_caller(y, out, fw))
