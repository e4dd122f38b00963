"""Fused residual add + RMSNorm + FP8 quantization (kernels_src/rms_norm.hip).

    y = rms_norm(x, weight)                                     # y: x's dtype
    y, residual = rms_norm(x, weight, residual=r)               # r <- x + r in place, norm of the sum
    q = rms_norm(x, weight, scale=s)                            # q = fp8(norm * weight / s), s fp32 [1]
    q, scales = rms_norm(x, weight, quant="per_token")          # dynamic per-row scales [rows, 1]
    q, scales, residual = rms_norm(x, weight, residual=r, quant="per_token")

FP8 outputs use the device's native format (e4m3fnuz on gfx942, e4m3fn elsewhere) unless ``fp8_format``
says otherwise. Eager calls launch directly; under torch.compile they go through torch.ops.rocjit.rms_norm.

Eager torch calls that repeat an earlier call's shape, dtype, device and options take a cached plan: it
re-checks every argument with a few attribute reads and launches; anything it does not recognise (and every
error) goes through the full path, whose messages name the argument.
"""
from typing import Optional

from rocjit.ops import _common as C

_plans = {}  # shape / dtype / mode -> (configured launcher, blocks per row)
_eager = {}  # (x.shape, x.dtype, device, residual?, scale?, quant, fp8_format) -> plan for the fast path
_Tensor = None
_is_compiling = None


def rms_norm(x, weight, eps: float = 1e-6, *, residual=None, scale=None, quant=None, out=None, fp8_format=None):
    if type(x) is _Tensor and out is None and not _is_compiling():
        plan = _eager.get((x.shape, x.dtype, x.get_device(), residual is None, scale is None, quant, fp8_format))
        if plan is not None:
            result = plan(x, weight, eps, residual, scale)
            if result is not None:
                return result
    return _rms_norm(x, weight, eps, residual, scale, quant, out, fp8_format)


def _rms_norm(x, weight, eps, residual, scale, quant, out, fp8_format):
    op = "rms_norm"
    xt, fw = C.to_torch(x, "x", op)
    wt = C.to_torch(weight, "weight", op)[0]
    rt = C.to_torch(residual, "residual", op)[0] if residual is not None else None
    scale_arg, quant_arg = scale, quant
    scale, quant = C.resolve_quant(op, scale, quant, xt.device)
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    _check(op, xt, wt, rt, scale)
    if C.compiling():
        y, scales = _torch_op()(xt, wt, float(eps), rt, scale, quant or "none", fmt)
        if out is not None:
            out.copy_(y)
            y = out
    else:
        y, scales = _launch(xt, wt, float(eps), rt, scale, quant, fmt, out)
        if fw == "torch" and out is None and scale_arg is scale:
            _remember(xt, rt, scale, quant_arg, quant, fp8_format, fmt)
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
        C.check_scale(op, scale, x.device)
    if not x.is_cuda:
        raise ValueError(f"{op}: x must be on a GPU, got {x.device}")


def _launch(x, w, eps, r, scale, quant, fmt, out):
    tm = C.torch()
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    qmode = C.QUANT_MODES[quant]
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
    launch = _launcher(rows, hidden, x.dtype, qmode, fmt, r is not None, is_aligned, dev)
    dummy = C.dummy_f32(dev)
    launch(out, scales if scales is not None else dummy, x, r if r is not None else x, w,
           scale if scale is not None else dummy, rows, hidden, eps)
    return out, scales


def _launcher(rows, hidden, dtype, qmode, fmt, residual: bool, is_aligned: bool, dev: int):
    key = (rows, hidden, dtype, qmode, fmt, residual, is_aligned, dev)
    launch = _plans.get(key)
    if launch is None:
        name, grid, block = kernel_config(rows, hidden, dtype, qmode, fmt, residual, is_aligned, C.device_info(dev))
        launch = _plans[key] = C.module("rms_norm.hip")[name][grid, block]
    return launch


def kernel_config(rows, hidden, dtype, qmode, fmt, residual: bool, is_aligned: bool, info: dict):
    """(kernel name expression, grid, block) for a shape: few long rows split across a cluster of blocks
    (NVIDIA sm_90+), otherwise one row per group of threads."""
    chunks = C.ceil_div(hidden, 8)
    split = C.split_config(chunks, rows, info["sms"], info["wave"]) if info["clusters"] else None
    head = f"{C.kernel_type(dtype)}, {C.fp8_tag(fmt)}, {qmode}, {C.cbool(residual)}"
    if split is not None:
        blocks, threads, per_thread = split
        return (f"rms_norm_split_kernel<{head}, {threads}, {per_thread}, {blocks}, {C.cbool(is_aligned)}>",
                rows * blocks, threads)
    threads, block, per_thread, _ = C.row_config(chunks, rows, info["sms"], info["wave"], reduce=True)
    return (f"rms_norm_kernel<{head}, {threads}, {block}, {per_thread}, {C.cbool(is_aligned)}>",
            C.ceil_div(rows, block // threads), block)


def _remember(x, r, scale, quant_arg, quant, fp8_format, fmt):
    """Cache the eager plan for calls shaped like this one (torch tensors on a GPU, no out=)."""
    global _Tensor, _is_compiling
    tm = C.torch()
    _Tensor, _is_compiling = tm.Tensor, tm.compiler.is_compiling
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    if rows == 0 or hidden == 0:
        return
    dev, dtype, shape = x.get_device(), x.dtype, x.shape
    qmode = C.QUANT_MODES[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else dtype
    is_aligned = hidden % 8 == 0
    launch = _launcher(rows, hidden, dtype, qmode, fmt, r is not None, is_aligned, dev)
    dummy, f32 = C.dummy_f32(dev), tm.float32
    Tensor = tm.Tensor
    w_shape, scales_shape = (hidden,), (rows, 1)
    has_r, has_s, per_token = r is not None, scale is not None, qmode == 2

    def plan(x, w, eps, r, s):
        # every property the kernel relies on; a miss falls back to the full path (which names the problem)
        if not (isinstance(w, Tensor) and w.dtype is dtype and w.shape == w_shape and w.get_device() == dev
                and w.is_contiguous() and x.is_contiguous() and type(eps) is float):
            return None
        if is_aligned and (x.data_ptr() | w.data_ptr()) & 15:
            return None
        if has_r and not (type(r) is Tensor and r.dtype is dtype and r.shape == shape and r.get_device() == dev
                          and r.is_contiguous() and not (is_aligned and r.data_ptr() & 15)):
            return None
        if has_s and not (type(s) is Tensor and s.dtype is f32 and s.get_device() == dev and s.numel() == 1):
            return None
        y = x.new_empty(shape, dtype=out_dtype)  # measured cheaper than torch.empty(..., device=)
        scales = x.new_empty(scales_shape, dtype=f32) if per_token else dummy
        launch(y, scales, x, r if has_r else x, w, s if has_s else dummy, rows, hidden, eps)
        if per_token:
            return (y, scales, r) if has_r else (y, scales)
        return (y, r) if has_r else y

    key = (shape, dtype, dev, r is None, scale is None, quant_arg, fp8_format)
    if len(_eager) < 1024:
        _eager[key] = plan


def _torch_op():
    """torch.ops.rocjit.rms_norm: mutates residual in place; returns (y, scales) (scales empty unless per-token)."""
    return C.custom_op("rms_norm", _op_functions, mutates_args=("residual",))


def _op_functions():
    """(impl, fake) of torch.ops.rocjit.rms_norm."""
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

    return impl, fake
