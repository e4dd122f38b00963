"""GEMV and small-batch GEMV for decode: y = W x, W [N, K], x [K] or [B <= 8, K].

Weight formats (x is float16 or bfloat16; y has x's dtype):
  - float16 / bfloat16 W (the same dtype as x);
  - int8 W with per-row scales ``w_scale`` [N]: W = q * w_scale[n]  (see ``quantize_int8``);
  - int4 W packed two per byte as uint8 [N, K/2], **low nibble first** (byte j of a row holds
    k = 2j in bits 0-3 and k = 2j+1 in bits 4-7), with group-wise ``w_scale`` and ``w_zero``
    [N, K/group_size], group_size 32, 64 or 128: W = (q - w_zero) * w_scale  (see ``quantize_int4``).
Scales / zero points are float32, float16 or bfloat16 tensors (both of one dtype); zero points need not be
integers.

fp16/bf16 weights run on matrix cores where the GPU has them (skinny_gemm.hip with M = B) or the
portable kernel (gemv.hip: P threads per team of RT rows, shuffle reductions, int8/int4 dequantized in
registers); the tuner picks per shape bucket.
"""
from typing import Optional

from rocjit import targets
from rocjit.ops import _common as C
from rocjit.ops import _gemm as G
from rocjit.ops._op import UNRECORDED, op

MAX_BATCH = 8
GROUP_SIZES = (32, 64, 128)


def _candidates(kind: str, B: int, N: int, K: int, target: str, sms: int) -> tuple[list[dict], dict]:
    portable = [{"path": "portable", "p": p, "rows": r, "unroll": u}
                for p, r, u in ((32, 4, 4), (32, 8, 2), (16, 8, 4), (16, 16, 2), (8, 16, 4), (8, 32, 2), (4, 32, 4))]
    # several rows per team share one activation load and conversion (int4: also its pre-scaling and sum)
    portable += [{"path": "portable", "p": p, "rows": r, "unroll": u, "rt": rt}
                 for p, r, u, rt in ((32, 4, 2, 2), (16, 8, 2, 2), (32, 4, 1, 4), (16, 8, 1, 4), (8, 16, 2, 2),
                                     (32, 4, 2, 4))
                 if B <= 2]
    default = {"path": "portable", "p": 32 if K >= 4096 else 16, "rows": 4 if K >= 4096 else 8, "unroll": 4}
    if kind in ("f16", "bf16") and G.has_matrix_path(target, fp8=False):
        # the streamed kernel never beat the portable one at B = 1 (H100 sweep); it can at B > 1
        stream = G.stream_candidates(B, N, K, sms) if B > 1 and G.has_stream_path(target) else []
        return portable + G.mma_candidates(B, N, K, sms, 2, target) + stream, default
    return portable, default


def _check(w, x, w_scale, w_zero, group_size, out):
    import torch
    if not isinstance(w, torch.Tensor) or not isinstance(x, torch.Tensor):
        raise TypeError(f"gemv: w and x must be torch tensors, got {type(w).__name__} and {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"gemv: x must be float16 or bfloat16, got {x.dtype}")
    if x.dim() not in (1, 2):
        raise ValueError(f"gemv: x must be [K] or [B, K], got shape {tuple(x.shape)}")
    B = 1 if x.dim() == 1 else x.shape[0]
    K = x.shape[-1]
    if not 1 <= B <= MAX_BATCH:
        raise ValueError(f"gemv: x has B={B} rows; gemv takes 1..{MAX_BATCH} (use rocjit.ops.skinny_gemm for up to "
                         f"32, a general GEMM beyond)")
    if w.dim() != 2:
        raise ValueError(f"gemv: w must be a 2-D [N, K] matrix (int4: [N, K/2] packed), got shape {tuple(w.shape)}")
    N = w.shape[0]
    if w.dtype in (torch.float16, torch.bfloat16):
        kind = "f16" if w.dtype == torch.float16 else "bf16"
        if w.dtype != x.dtype:
            raise TypeError(f"gemv: float weights must have x's dtype {x.dtype}, got {w.dtype}")
        want_k = K
    elif w.dtype == torch.int8:
        kind, want_k = "i8", K
    elif w.dtype == torch.uint8:
        kind, want_k = "i4", K // 2
    else:
        raise TypeError(f"gemv: w dtype must be float16, bfloat16, int8 (per-row scales) or uint8 (packed int4), "
                        f"got {w.dtype}")
    if w.shape[1] != want_k or (kind == "i4" and K % 2):
        raise ValueError(f"gemv: x has K={K}, so w must be [N, {want_k}]" + (" (two int4 per byte)" if kind == "i4" else "")
                         + f", got {tuple(w.shape)}")
    if K % 16 or K == 0:
        raise ValueError(f"gemv: K={K} must be a positive multiple of 16 (16-byte weight loads)")
    if w.device != x.device or x.device.type != "cuda":
        raise ValueError(f"gemv: w and x must be on the same GPU, got {w.device} and {x.device}")
    if not w.is_contiguous():
        raise ValueError("gemv: w must be contiguous (row-major)")
    sdt = (torch.float32, torch.float16, torch.bfloat16)
    if kind in ("f16", "bf16"):
        if w_scale is not None or w_zero is not None or group_size is not None:
            raise ValueError("gemv: w_scale / w_zero / group_size apply to int8 / int4 weights only")
    elif kind == "i8":
        if w_scale is None or w_scale.shape != (N,) or w_scale.dtype not in sdt:
            raise ValueError(f"gemv: int8 weights need w_scale of shape ({N},) in float32/float16/bfloat16, got "
                             f"{None if w_scale is None else (tuple(w_scale.shape), w_scale.dtype)}")
        if w_zero is not None or group_size is not None:
            raise ValueError("gemv: int8 weights are symmetric per row: no w_zero / group_size")
    else:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"gemv: int4 weights need group_size in {GROUP_SIZES}, got {group_size}")
        if K % group_size:
            raise ValueError(f"gemv: K={K} must be a multiple of group_size={group_size}")
        if N * (K // group_size) >= 2**31:
            raise ValueError(f"gemv: w_scale / w_zero with N*K/group_size = {N * (K // group_size)} entries are "
                             f"too large (at most 2**31 - 1)")
        g = (N, K // group_size)
        for nm, t in (("w_scale", w_scale), ("w_zero", w_zero)):
            if t is None or tuple(t.shape) != g or t.dtype not in sdt:
                raise ValueError(f"gemv: int4 weights need {nm} of shape {g} in float32/float16/bfloat16, got "
                                 f"{None if t is None else (tuple(t.shape), t.dtype)}")
        if w_scale.dtype != w_zero.dtype:
            raise TypeError(f"gemv: w_scale and w_zero must share a dtype, got {w_scale.dtype} and {w_zero.dtype}")
    for nm, t in (("w_scale", w_scale), ("w_zero", w_zero)):
        if t is not None and (t.device != x.device or not t.is_contiguous()):
            raise ValueError(f"gemv: {nm} must be a contiguous tensor on {x.device}")
    oshape = (N,) if x.dim() == 1 else (B, N)
    if out is not None and (tuple(out.shape) != oshape or out.dtype != x.dtype or out.device != x.device
                            or not out.is_contiguous()):
        raise ValueError(f"gemv: out must be a contiguous {x.dtype} tensor of shape {oshape} on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    return kind, B, N, K, oshape




def _run(call, w, x, w_scale, w_zero, group_size, out):
    kind, B, N, K, oshape = _check(w, x, w_scale, w_zero, group_size, out)
    x = G.aligned_operands("gemv", x.contiguous(), w, out)
    if out is None:
        out = call.empty(oshape, x.dtype, x.device)
    target, devname, sms = G._device(x.device.index or 0)
    cands, default = _candidates(kind, B, N, K, target, sms)

    def run(cfg, w=w, call=UNRECORDED):
        return run_config(cfg, kind, x, w, out, w_scale, w_zero, group_size, target, sms, call)

    dtype = f"{kind}-{str(x.dtype).replace('torch.', '')}" + (f"-g{group_size}" if kind == "i4" else "")
    cfg = G.tuned("gemv", bucket=G.tune.weight_bucket(b=B, n=N, k=K), dtype=dtype, device=devname, candidates=cands,
                  default=default, run=run, w=w)
    run(cfg, w, call)
    return out


def run_config(cfg: dict, kind: str, x, w, out, w_scale, w_zero, group_size, target: str, sms: int,
               call=UNRECORDED):
    """One launch of candidate `cfg`: x [K] or [B, K] -> out [N] or [B, N] (the tuner's candidates and the tests
    run this). Tensors are passed as they are, never as views, so an eager call can record them."""
    K = x.shape[-1]
    B, N = x.numel() // K, w.shape[0]
    if cfg["path"] == "mma":
        return G.launch_mma(x, w, out, None, None, B, N, K, cfg, target, targets.wave_size(target), call)
    if cfg["path"] == "stream":
        return G.launch_stream(x, w, out, None, None, B, N, K, cfg, sms, call)
    st = G.ctype(w_scale.dtype) if w_scale is not None else "float"
    return G.launch_portable(x, G.ctype(x.dtype), G.GEMV_WEIGHT_KINDS[kind], w, out, w_scale, w_zero, group_size or 0,
                             G.SCALE_W_PER_COLUMN, None, st, B, N, K, cfg, call)


def _custom_op():
    """(impl, fake) of torch.ops.rocjit.gemv."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(w: Tensor, x: Tensor, w_scale: Optional[Tensor], w_zero: Optional[Tensor], group_size: int) -> Tensor:
        return _run(UNRECORDED, w, x, w_scale, w_zero, group_size or None, None)

    def fake(w, x, w_scale, w_zero, group_size):
        return x.new_empty(tuple(x.shape[:-1]) + (w.shape[0],))

    return impl, fake


@op(roles="TTTTOT", sources=(G.SRC, G.GEMV_SRC), bench="gemv", custom_op=_custom_op)
def gemv(call, w, x, *, w_scale=None, w_zero=None, group_size=None, out=None):
    """y = W x (see rocjit.ops.matvec for the weight formats). x [K] -> y [N]; x [B <= 8, K] -> y [B, N].
    Inputs may be torch, cupy or numpy arrays; y comes back in x's framework."""
    name = "gemv"
    xt, fw = C.to_torch(x, "x", name)
    wt = C.to_torch(w, "w", name)[0]
    st = C.torch_or_none(w_scale, "w_scale", name)
    zt = C.torch_or_none(w_zero, "w_zero", name)
    ot = C.torch_or_none(out, "out", name)
    if C.compiling():
        _check(wt, xt, st, zt, group_size, ot)
        y = C.into_out(gemv.__rocjit_op__.torch_op()(wt, xt, st, zt, int(group_size or 0)), ot)
    else:
        y = _run(call, wt, xt, st, zt, group_size, ot)
    return call.done(C.to_caller(y, out, fw))
