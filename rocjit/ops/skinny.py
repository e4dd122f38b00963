"""Skinny GEMM for decode: C[M, N] = A[M, K] . W[N, K]^T with M <= 32, FP8 (e4m3) or bf16/fp16.

    c = rocjit.ops.skinny_gemm(a, w)                                   # bf16 / fp16
    c = rocjit.ops.skinny_gemm(a8, w8, scale_a=sa, scale_w=sw)         # FP8, C = (A W^T) * sa * sw

FP8 scales are float32 device tensors: `scale_a` one element (per tensor) or M (per row: the dynamic per-token
scales that ``rms_norm(..., quant="per_token")`` and ``swiglu(..., quant="per_token")`` return), `scale_w` one
element or N (per output channel). Matrix-core kernels (skinny_gemm.hip) on NVIDIA sm_89+ and AMD CDNA, and on
NVIDIA at M <= 2 also the portable kernel (gemv.hip), which the tuner picks where it streams the weights faster; the
portable kernel alone elsewhere. Split-K reductions run in a fixed order (deterministic).
Configs come from rocjit.tune (tuned once per shape bucket, then persisted).

Fused epilogues (one launch; the same kernels and configs as skinny_gemm, tuned on their own):

    w_gu, s_gu = rocjit.ops.prepare_gate_up(gate_w, up_w, gate_scale, up_scale)    # once, at load time
    h = rocjit.ops.skinny_gemm_swiglu(a8, w_gu, scale_a=sa, scale_w=s_gu, scale=s_h, intermediate=I)
    #   h = fp8(silu(gate) * up / s_h) [M, I]: the [M, 2I] gate/up result never reaches memory
    y = rocjit.ops.skinny_gemm_residual(h, w_down, residual, scale_a=s_h, scale_w=s_d)
    #   residual += h W_down^T in place (fp32 accumulation, one rounding), or into out=
"""
from typing import Optional

from rocjit import targets
from rocjit.ops import _common as C
from rocjit.ops import _gemm as G
from rocjit.ops._gemm import (EP_RESIDUAL, EP_STORE, aligned_operands, ep_swiglu,  # noqa: F401
                              has_epilogue_path, has_matrix_path, has_stream_path, has_tma_path, has_wgmma_path,
                              launch_mma, launch_stream, launch_tma, launch_wgmma, mma_candidates,
                              mma_default, portable_candidates, stream_candidates, tma_candidates, wgmma_candidates)
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


def config_for(a, w, out, scale_a, scale_w, M, N, K, fp8, ep=EP_STORE, residual=None, out_scale=None,
               op_name="skinny_gemm"):
    """The tuned (or default) config of this problem and run(cfg, w=w, call=UNRECORDED) that launches it.
    A fused epilogue `ep` (see _gemm.launch_mma) runs on targets with the matrix-core kernels (there, on NVIDIA at
    M <= 2, on the portable kernel too: G.skinny_candidates). It is tuned on its own
    (key skinny_gemm_residual / skinny_gemm_swiglu: the best plain config is not always the best fused one), with
    the plain GEMM's shipped default as its default; tuning a residual epilogue writes a scratch output, never
    `residual`."""
    target, devname, sms = G._device(a.device.index or 0)
    wave = targets.wave_size(target)
    eb = a.element_size()
    fused = ep != EP_STORE
    if has_matrix_path(target, fp8) or (fused and has_epilogue_path(target, fp8)):
        cands, default = G.skinny_candidates(M, N, K, sms, eb, target, ep), mma_default(M, N, K, sms, eb)
    elif fused:
        raise NotImplementedError(f"{op_name}: the fused epilogue needs the matrix-core kernel (NVIDIA sm_80+, "
                                  f"sm_89+ for FP8; AMD gfx90a / gfx942 / gfx950); {target} has none. Use "
                                  f"skinny_gemm and a separate op there")
    else:
        cands, default = portable_candidates(M), portable_candidates(M)[0]

    def launch(cfg, w, call, out):
        if cfg["path"] == "mma":
            return launch_mma(a, w, out, scale_a, scale_w, M, N, K, cfg, target, wave, call, ep=ep,
                              residual=residual, out_scale=out_scale)
        if cfg["path"] == "wgmma":
            return launch_wgmma(a, w, out, scale_a, scale_w, M, N, K, cfg, call, ep=ep, residual=residual,
                                out_scale=out_scale)
        if cfg["path"] == "tma":
            return launch_tma(a, w, out, scale_a, scale_w, M, N, K, cfg, sms, call, ep=ep, residual=residual,
                              out_scale=out_scale)
        if cfg["path"] == "stream":
            return launch_stream(a, w, out, scale_a, scale_w, M, N, K, cfg, sms, call, ep=ep, residual=residual,
                                 out_scale=out_scale)
        return G.launch_skinny_portable(a, w, out, scale_a, scale_w, M, N, K, cfg, call, ep=ep, residual=residual,
                                        out_scale=out_scale)

    def run(cfg, w=w, call=UNRECORDED):
        return launch(cfg, w, call, out)

    scratch = []

    def tune_run(cfg, w):
        if ep == EP_RESIDUAL and out is residual:    # timing runs must not add into the caller's residual
            if not scratch:
                scratch.append(out.new_empty(out.shape))
            return launch(cfg, w, UNRECORDED, scratch[0])
        return run(cfg, w)

    bucket, dtype = G.tune.weight_bucket(m=M, n=N, k=K), str(a.dtype).replace("torch.", "")
    key = "skinny_gemm" if not fused else "skinny_gemm_residual" if ep == EP_RESIDUAL else "skinny_gemm_swiglu"
    if fused:
        default = G.tune.default_config("skinny_gemm", bucket, dtype, devname, cands, default)
    cfg = G.tuned(key, bucket=bucket, dtype=dtype, device=devname, candidates=cands, default=default, run=tune_run,
                  w=w)
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
    sa = C.torch_or_none(scale_a, "scale_a", name)
    sw = C.torch_or_none(scale_w, "scale_w", name)
    ot = C.torch_or_none(out, "out", name)
    if C.compiling():
        od = _check(at, wt, sa, sw, out_dtype, ot)[4]
        y = C.into_out(skinny_gemm.__rocjit_op__.torch_op()(at, wt, sa, sw, str(od).replace("torch.", "")), ot)
    else:
        y = _run(call, at, wt, sa, sw, out_dtype, ot)
    return call.done(C.to_caller(y, out, fw))


# ----------------------------------------------------------------------------- fused epilogues
GATE_UP_GROUP = 8          # gate rows, then as many up rows, per 16-row tile of the interleaved weight


def prepare_gate_up(gate_w, up_w, gate_scale=None, up_scale=None):
    """One-time weight preparation for :func:`skinny_gemm_swiglu`: returns ``(w_gate_up, scale_w)``.

    ``gate_w`` and ``up_w`` are [I, K] (any dtype skinny_gemm takes, same device). ``w_gate_up`` is
    [2 * ceil(I / 8) * 8, K]: for each group t of 8 outputs, rows 16t..16t+7 are gate rows 8t..8t+7 and rows
    16t+8..16t+15 the matching up rows, so a 16-row matrix-core tile holds both halves of its 8 outputs (rows
    missing from the last group are zero). ``scale_w`` is None when both scales are None, else the float32
    per-output-channel scales interleaved the same way (a one-element scale is broadcast; padded rows get 1).
    Pass ``intermediate=I`` to skinny_gemm_swiglu when I is not a multiple of 8."""
    import torch
    for nm, t in (("gate_w", gate_w), ("up_w", up_w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise TypeError(f"prepare_gate_up: {nm} must be a 2-D torch tensor [I, K], got "
                            f"{type(t).__name__} {tuple(getattr(t, 'shape', ()))}")
    if gate_w.shape != up_w.shape or gate_w.dtype != up_w.dtype or gate_w.device != up_w.device:
        raise ValueError(f"prepare_gate_up: gate_w and up_w must match in shape, dtype and device, got "
                         f"{gate_w.dtype} {tuple(gate_w.shape)} on {gate_w.device} and {up_w.dtype} "
                         f"{tuple(up_w.shape)} on {up_w.device}")
    if (gate_scale is None) != (up_scale is None):
        raise ValueError("prepare_gate_up: give both gate_scale and up_scale, or neither")
    inter, K = gate_w.shape
    groups = -(-inter // GATE_UP_GROUP)
    rows = groups * GATE_UP_GROUP
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[gate_w.element_size()]     # copies move bits only

    def interleave(g, u, fill, dtype):
        halves = []
        for t in (g, u):
            h = torch.full((rows,) + tuple(t.shape[1:]), fill, dtype=dtype, device=gate_w.device)
            h[:inter] = t
            halves.append(h.view((groups, GATE_UP_GROUP) + tuple(t.shape[1:])))
        return torch.stack(halves, dim=1).reshape((2 * rows,) + tuple(g.shape[1:]))

    w = interleave(gate_w.contiguous().view(raw), up_w.contiguous().view(raw), 0, raw).view(gate_w.dtype)
    if gate_scale is None:
        return w, None
    scales = []
    for nm, s in (("gate_scale", gate_scale), ("up_scale", up_scale)):
        s = torch.as_tensor(s, dtype=torch.float32, device=gate_w.device).reshape(-1)
        if s.numel() not in (1, inter):
            raise ValueError(f"prepare_gate_up: {nm} must have 1 or I={inter} elements, got {s.numel()}")
        scales.append(s.expand(inter))
    return w, interleave(scales[0], scales[1], 1.0, torch.float32).contiguous()


def _check_swiglu(a, w, scale_a, scale_w, scale, intermediate, out_dtype, out, fmt):
    import torch
    name = "skinny_gemm_swiglu"
    N = w.shape[0] if isinstance(w, torch.Tensor) and w.dim() == 2 else 0
    if N % (2 * GATE_UP_GROUP):
        raise ValueError(f"{name}: w_gate_up must come from prepare_gate_up ([2 * ceil(I/8) * 8, K] interleaved "
                         f"rows), got {N} rows (not a multiple of 16)")
    inter = N // 2 if intermediate is None else intermediate
    if type(inter) is not int or not 0 < inter <= N // 2 or -(-inter // GATE_UP_GROUP) * 2 * GATE_UP_GROUP != N:
        raise ValueError(f"{name}: intermediate must be the I given to prepare_gate_up (w_gate_up has {N} rows: "
                         f"I in {N // 2 - GATE_UP_GROUP + 1}..{N // 2}), got {intermediate!r}")
    M, N, K, fp8, _ = _check(a, w, scale_a, scale_w, None, None)
    if scale is not None:
        C.check_scale(name, scale, a.device)
        if out_dtype is not None and out_dtype != C.fp8_torch_dtype(fmt):
            raise TypeError(f"{name}: scale= quantizes the output to {fmt}; out_dtype={out_dtype} contradicts it")
        od = C.fp8_torch_dtype(fmt)
    else:
        od = out_dtype if out_dtype is not None else (torch.bfloat16 if fp8 else a.dtype)
        if od not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{name}: out_dtype must be bfloat16, float16 or float32 (or pass scale= for FP8), "
                            f"got {od}")
    if out is not None:
        C.check_tensor(name, "out", out, dtypes=(od,), shape=(M, inter), device=a.device)
    return M, N, K, fp8, inter, od


def _run_swiglu(call, a, w, scale_a, scale_w, scale, inter, od, fmt, out):
    M, N, K = a.shape[0], w.shape[0], a.shape[1]
    a = aligned_operands("skinny_gemm_swiglu", a.contiguous(), w)
    if out is None:
        out = call.empty((M, inter), od, a.device)
    cfg, run = config_for(a, w, out, scale_a, scale_w, M, N, K, G._is_fp8(a.dtype),
                          ep=ep_swiglu(fmt if scale is not None else None), out_scale=scale,
                          op_name="skinny_gemm_swiglu")
    run(cfg, w, call)
    return out


def _swiglu_custom_op():
    """(impl, fake) of torch.ops.rocjit.skinny_gemm_swiglu."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(a: Tensor, w: Tensor, scale_a: Optional[Tensor], scale_w: Optional[Tensor], scale: Optional[Tensor],
             intermediate: int, out_dtype: str, fmt: str) -> Tensor:
        _check_swiglu(a, w, scale_a, scale_w, scale, intermediate, getattr(tm, out_dtype), None, fmt)
        return _run_swiglu(UNRECORDED, a, w, scale_a, scale_w, scale, intermediate, getattr(tm, out_dtype), fmt, None)

    def fake(a, w, scale_a, scale_w, scale, intermediate, out_dtype, fmt):
        return a.new_empty((a.shape[0], intermediate), dtype=getattr(tm, out_dtype))

    return impl, fake


@op(roles="TTTTTOOTO", sources=(G.SRC,), bench="skinny", custom_op=_swiglu_custom_op)
def skinny_gemm_swiglu(call, a, w_gate_up, *, scale_a=None, scale_w=None, scale=None, intermediate=None,
                       out_dtype=None, out=None, fp8_format=None):
    """silu(gate) * up of the gate/up GEMM in one launch: gate/up = A W^T (* scale_a * scale_w) with w_gate_up and
    its per-channel scale_w from prepare_gate_up (A [M <= 32, K], K % 16 == 0; FP8 or bf16/fp16 as skinny_gemm).
    Returns [M, I] (I = intermediate, default rows / 2) in out_dtype (bfloat16 for FP8 inputs, else a's dtype), or
    FP8 fp8(silu(gate) * up / scale) with a static one-element float32 `scale` (the device's native format unless
    fp8_format says otherwise). Dynamic per-token scales would need the whole row of I outputs, which no tile owns:
    use skinny_gemm + swiglu(quant="per_token") for those. Deterministic."""
    name = "skinny_gemm_swiglu"
    at, fw = C.to_torch(a, "a", name)
    wt = C.to_torch(w_gate_up, "w_gate_up", name)[0]
    sa = C.torch_or_none(scale_a, "scale_a", name)
    sw = C.torch_or_none(scale_w, "scale_w", name)
    ot = C.torch_or_none(out, "out", name)
    scale = C.resolve_quant(name, scale, None, at.device)[0]
    fmt = C.fp8_format(fp8_format, at.device) if scale is not None else "e4m3fn"
    M, N, K, fp8, inter, od = _check_swiglu(at, wt, sa, sw, scale, intermediate, out_dtype, ot, fmt)
    if C.compiling():
        y = C.into_out(skinny_gemm_swiglu.__rocjit_op__.torch_op()(at, wt, sa, sw, scale, inter,
                                                                    str(od).replace("torch.", ""), fmt), ot)
    else:
        y = _run_swiglu(call, at, wt, sa, sw, scale, inter, od, fmt, ot)
    return call.done(C.to_caller(y, out, fw))


def _check_residual(a, w, residual, scale_a, scale_w, out):
    name = "skinny_gemm_residual"
    shape = (a.shape[0], w.shape[0]) if getattr(a, "dim", lambda: 0)() == 2 and getattr(w, "dim", lambda: 0)() == 2 \
        else None
    C.check_tensor(name, "residual", residual, dtypes=C.half_dtypes(), shape=shape)
    if out is not None:
        C.check_tensor(name, "out", out, dtypes=(residual.dtype,), shape=shape, device=residual.device)
    M, N, K, fp8, _ = _check(a, w, scale_a, scale_w, None, None)
    if residual.device != a.device:
        raise ValueError(f"skinny_gemm_residual: residual is on {residual.device}, expected {a.device}")
    return M, N, K, fp8


def _run_residual(call, a, w, residual, scale_a, scale_w, out):
    M, N, K, fp8 = _check_residual(a, w, residual, scale_a, scale_w, out)
    a = aligned_operands("skinny_gemm_residual", a.contiguous(), w)
    out = residual if out is None else out
    cfg, run = config_for(a, w, out, scale_a, scale_w, M, N, K, fp8, ep=EP_RESIDUAL, residual=residual,
                          op_name="skinny_gemm_residual")
    run(cfg, w, call)
    return out


def _residual_custom_op():
    """(impl, fake) of torch.ops.rocjit.skinny_gemm_residual: residual += A W^T in place, returns nothing."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(a: Tensor, w: Tensor, residual: Tensor, scale_a: Optional[Tensor], scale_w: Optional[Tensor]) -> None:
        _run_residual(UNRECORDED, a, w, residual, scale_a, scale_w, None)

    def fake(a, w, residual, scale_a, scale_w):
        return None

    return impl, fake


@op(roles="TTTTTT", sources=(G.SRC,), bench="skinny", custom_op=_residual_custom_op, mutates_args=("residual",))
def skinny_gemm_residual(call, a, w, residual, *, scale_a=None, scale_w=None, out=None):
    """residual + A W^T (* scale_a * scale_w) in one launch, accumulated in fp32 and rounded once to residual's
    dtype (bfloat16 / float16, [M, N]): written into `residual` in place and returned, or into out= (then
    residual is only read). A, W, scales as skinny_gemm. Deterministic: with split-K the reduction adds the
    residual once."""
    name = "skinny_gemm_residual"
    at, fw = C.to_torch(a, "a", name)
    wt = C.to_torch(w, "w", name)[0]
    rt = C.to_torch(residual, "residual", name)[0]
    sa = C.torch_or_none(scale_a, "scale_a", name)
    sw = C.torch_or_none(scale_w, "scale_w", name)
    ot = C.torch_or_none(out, "out", name)
    if C.compiling():
        _check_residual(at, wt, rt, sa, sw, ot)
        target = rt if ot is None else ot.copy_(rt)
        skinny_gemm_residual.__rocjit_op__.torch_op()(at, wt, target, sa, sw)
        y = target
    else:
        y = _run_residual(call, at, wt, rt, sa, sw, ot)
    if out is not None:
        return call.done(C.to_caller(y, out, fw))
    if fw == "numpy":                   # the caller's array gets the in-place update
        C.copy_back(residual, rt, fw)
    return call.done(residual if fw != "torch" else rt)
