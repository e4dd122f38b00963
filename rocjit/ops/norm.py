"""Fused residual add + RMSNorm + FP8 quantization (kernels_src/rms_norm.hip).

    y = rms_norm(x, weight)                                     # y: x's dtype
    y, residual = rms_norm(x, weight, residual=r)               # r <- x + r in place, norm of the sum
    q = rms_norm(x, weight, scale=s)                            # q = fp8(norm * weight / s), s fp32 [1]
    q, scales = rms_norm(x, weight, quant="per_token")          # dynamic per-row scales [rows, 1]
    q, scales, residual = rms_norm(x, weight, residual=r, quant="per_token")

FP8 outputs use the device's native format (e4m3fnuz on gfx942, e4m3fn elsewhere) unless ``fp8_format``
says otherwise. Under torch.compile calls go through torch.ops.rocjit.rms_norm.
"""
from typing import Optional

from rocjit.ops import _common as C
from rocjit.ops._op import UNRECORDED, op

_SRC = "rms_norm.hip"


def _check(op_name, x, w, r, scale):
    C.check_tensor(op_name, "x", x, dtypes=C.half_dtypes())
    if x.dim() < 1:
        raise ValueError(f"{op_name}: x must be [..., hidden], got a scalar")
    hidden = x.shape[-1]
    C.check_tensor(op_name, "weight", w, dtypes=(x.dtype,), shape=(hidden,), device=x.device)
    if r is not None:
        C.check_tensor(op_name, "residual", r, dtypes=(x.dtype,), shape=tuple(x.shape), device=x.device)
    if scale is not None:
        C.check_scale(op_name, scale, x.device)
    if not x.is_cuda:
        raise ValueError(f"{op_name}: x must be on a GPU, got {x.device}")


def _run(call, x, w, eps, r, scale, quant, fmt, out):
    tm = C.torch()
    hidden = x.shape[-1]
    rows = x.numel() // hidden if hidden else 0
    qmode = C.QUANT_MODES[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else x.dtype
    if out is None:
        out = call.empty(x.shape, out_dtype, x.device)
    else:
        C.check_tensor("rms_norm", "out", out, dtypes=(out_dtype,), shape=tuple(x.shape), device=x.device)
    scales = call.empty((rows, 1), tm.float32, x.device) if qmode == 2 else None
    if rows == 0 or hidden == 0:
        return out, scales
    dev = x.device.index or 0
    is_aligned = hidden % 8 == 0 and C.aligned(x, w, out) and (r is None or C.aligned(r))
    name, grid, block = kernel_config(rows, hidden, x.dtype, qmode, fmt, r is not None, is_aligned,
                                      C.device_info(dev))
    dummy = call.const(C.dummy_f32(dev))
    call.launch(C.module(_SRC)[name], grid, block, out, scales if scales is not None else dummy, x,
                r if r is not None else x, w, scale if scale is not None else dummy, rows, hidden, eps)
    return out, scales


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


def _custom_op():
    """(impl, fake) of torch.ops.rocjit.rms_norm: mutates residual in place; returns (y, scales), scales empty
    unless per-token."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(x: Tensor, weight: Tensor, eps: float, residual: Optional[Tensor], scale: Optional[Tensor],
             quant: str, fmt: str) -> tuple[Tensor, Tensor]:
        q = C.custom_op_quant("rms_norm", scale, quant, fmt, x.device)
        _check("rms_norm", x, weight, residual, scale)
        y, scales = _run(UNRECORDED, x, weight, float(eps), residual, scale, q, fmt, None)
        return y, scales if scales is not None else x.new_empty((0,), dtype=tm.float32)

    def fake(x, weight, eps, residual, scale, quant, fmt):
        dtype = x.dtype if quant == "none" else C.fp8_torch_dtype(fmt)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return (x.new_empty(x.shape, dtype=dtype),
                x.new_empty((rows, 1) if quant == "per_token" else (0,), dtype=tm.float32))

    return impl, fake


@op(roles="TTSTTOTO", sources=(_SRC,), bench="norm", custom_op=_custom_op, mutates_args=("residual",))
def rms_norm(call, x, weight, eps=1e-6, *, residual=None, scale=None, quant=None, out=None, fp8_format=None):
    """RMSNorm of x (or of x + residual, written back into residual), optionally quantized to FP8 with a static
    scale or dynamic per-row scales. Returns y, then scales (per-token), then residual (when given)."""
    name = "rms_norm"
    xt, fw = C.to_torch(x, "x", name)
    wt = C.to_torch(weight, "weight", name)[0]
    rt = C.torch_or_none(residual, "residual", name)
    ot = C.torch_or_none(out, "out", name)
    scale, quant = C.resolve_quant(name, scale, quant, xt.device)
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    _check(name, xt, wt, rt, scale)
    if type(eps) is not float:
        eps = C.check_float(name, "eps", eps)
    if C.compiling():
        y, scales = rms_norm.__rocjit_op__.torch_op()(xt, wt, eps, rt, scale, quant or "none", fmt)
        y = C.into_out(y, ot)
    else:
        y, scales = _run(call, xt, wt, eps, rt, scale, quant, fmt, ot)
    y = C.to_caller(y, out, fw)
    scales = C.convert_outputs(scales, fw)
    if rt is not None and fw == "numpy":  # the caller's array gets the in-place update
        C.copy_back(residual, rt, fw)
    res = residual if rt is not None and fw != "torch" else rt
    result = (y,) + ((scales,) if quant == "per_token" else ()) + ((res,) if rt is not None else ())
    return call.done(result if len(result) > 1 else result[0])
