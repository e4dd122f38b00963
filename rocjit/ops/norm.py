"""Fused residual add + RMSNorm + FP8 quantization (kernels_src/rms_norm.hip).

    y = rms_norm(x, weight)                                     # y: x's dtype
    y, residual = rms_norm(x, weight, residual=r)               # r <- x + r in place, norm of the sum
    q = rms_norm(x, weight, scale=s)                            # q = fp8(norm * weight / s), s fp32 [1]
    q, scales = rms_norm(x, weight, quant="per_token")          # dynamic per-row scales [rows, 1]
    q, scales, residual = rms_norm(x, weight, residual=r, quant="per_token")

FP8 outputs use the device's native format (e4m3fnuz on gfx942, e4m3fn elsewhere) unless ``fp8_format``
says otherwise. Eager calls launch directly; under torch.compile they go through torch.ops.rocjit.rms_norm.
"""
from typing import Optional

from rocjit.ops import _common as C

_QUANT = {None: 0, "static": 1, "per_token": 2}
_plans = {}  # shape / dtype / mode -> configured launcher


def rms_norm(x, weight, eps: float = 1e-6, *, residual=None, scale=None, quant=None, out=None, fp8_format=None):
    op = "rms_norm"
    xt, fw = C.to_torch(x, "x", op)
    wt = C.to_torch(weight, "weight", op)[0]
    rt = C.to_torch(residual, "residual", op)[0] if residual is not None else None
    tm = C.torch()
    if scale is not None and not isinstance(scale, tm.Tensor):
        scale = tm.tensor([float(scale)], dtype=tm.float32, device=xt.device)
    if quant is None and scale is not None:
        quant = "static"
    if quant not in _QUANT:
        raise ValueError(f"{op}: quant must be None, 'static' or 'per_token', got {quant!r}")
    if quant == "static" and scale is None:
        raise ValueError(f"{op}: quant='static' needs scale= (a float32 tensor of one element)")
    if quant == "per_token" and scale is not None:
        raise ValueError(f"{op}: quant='per_token' computes its own scales; do not pass scale=")
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    _check(op, xt, wt, rt, scale)
    if C.compiling():
        y, scales = _torch_op()(xt, wt, float(eps), rt, scale, quant or "none", fmt)
        if out is not None:
            out.copy_(y)
            y = out
    else:
        y, scales = _launch(xt, wt, float(eps), rt, scale, quant, fmt, out)
    outs = C.convert_outputs((y, scales), fw)
    y, scales = outs
    if rt is not None and fw == "numpy":  # the caller's array gets the in-place update
        import numpy as np
        np.copyto(residual, C.from_torch(rt, fw))
    res = residual if rt is not None and fw != "torch" else rt
    result = (y,) + ((scales,) if quant == "per_token" else ()) + ((res,) if rt is not None else ())
    return result if len(result) > 1 else result[0]


def _check(op, x, w, r, scale):
    C.check_tensor(op, "x", x, dtypes=C.half_dtypes())
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., hidden], got a scalar")
    hidden = x.shape[-1]
    C.check_tensor(op, "weight", w, dtypes=(x.dtype,), shape=(hidden,), device=x.device)
    if r is not None:
        C.check_tensor(op, "residual", r, dtypes=(x.dtype,), shape=tuple(x.shape), device=x.device)
    if scale is not None:
        C.check_tensor(op, "scale", scale, dtypes=(C.torch().float32,), device=x.device)
        if scale.numel() != 1:
            raise ValueError(f"{op}: scale must hold one element, got shape {tuple(scale.shape)}")
    if not x.is_cuda:
        raise ValueError(f"{op}: x must be on a GPU, got {x.device}")


def _launch(x, w, eps, r, scale, quant, fmt, out):
    tm = C.torch()
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    qmode = _QUANT[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else x.dtype
    if out is None:
        out = tm.empty(x.shape, dtype=out_dtype, device=x.device)
    else:
        C.check_tensor("rms_norm", "out", out, dtypes=(out_dtype,), shape=tuple(x.shape), device=x.device)
    dev = x.device.index or 0
    scales = tm.empty((rows, 1), dtype=tm.float32, device=x.device) if qmode == 2 else None
    if rows == 0 or hidden == 0:
        return out, scales
    is_aligned = hidden % 8 == 0 and C.aligned(x, w, out) and (r is None or C.aligned(r))
    key = (rows, hidden, x.dtype, qmode, fmt, r is not None, is_aligned, dev)
    launch = _plans.get(key)
    if launch is None:
        info = C.device_info(dev)
        threads, block, per_thread, _ = C.row_config(C.ceil_div(hidden, 8), rows, info["sms"], info["wave"],
                                                     reduce=True)
        name = (f"rms_norm_kernel<{C.kernel_type(x.dtype)}, {C.fp8_tag(fmt)}, {qmode}, {C.cbool(r is not None)}, "
                f"{threads}, {block}, {per_thread}, {C.cbool(is_aligned)}>")
        launch = _plans[key] = C.module("rms_norm.hip")[name][C.ceil_div(rows, block // threads), block]
    dummy = C.dummy_f32(dev)
    launch(out, scales if scales is not None else dummy, x, r if r is not None else x, w,
           scale if scale is not None else dummy, rows, hidden, eps)
    return out, scales


_op = None


def _torch_op():
    """torch.ops.rocjit.rms_norm: mutates residual in place; returns (y, scales) (scales empty unless per-token)."""
    global _op
    if _op is None:
        tm = C.torch()
        Tensor = tm.Tensor

        def impl(x: Tensor, weight: Tensor, eps: float, residual: Optional[Tensor], scale: Optional[Tensor],
                 quant: str, fmt: str) -> tuple[Tensor, Tensor]:
            y, scales = _launch(x, weight, eps, residual, scale, None if quant == "none" else quant, fmt, None)
            return y, scales if scales is not None else x.new_empty((0,), dtype=tm.float32)

        def fake(x, weight, eps, residual, scale, quant, fmt):
            dtype = x.dtype if quant == "none" else C.fp8_torch_dtype(fmt)
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            return (x.new_empty(x.shape, dtype=dtype),
                    x.new_empty((rows, 1) if quant == "per_token" else (0,), dtype=tm.float32))

        _op = C.custom_op("rms_norm", impl, fake, mutates_args=("residual",))
    return _op
