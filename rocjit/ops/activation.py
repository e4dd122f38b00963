"""Fused SwiGLU (+ FP8 quantization) (kernels_src/swiglu.hip).

    y = swiglu(gate_up)                          # gate_up [..., 2d], gate half first; y [..., d] = silu(gate) * up
    q = swiglu(gate_up, scale=s)                 # fp8(y / s), s fp32 [1]
    q, scales = swiglu(gate_up, quant="per_token")   # dynamic per-row scales [rows, 1]
"""
from typing import Optional

from rocjit.ops import _common as C
from rocjit.ops._op import UNRECORDED, op

_SRC = "swiglu.hip"


def _run(call, x, scale, quant, fmt, out):
    tm = C.torch()
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d) if d else 0
    qmode = C.QUANT_MODES[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else x.dtype
    shape = tuple(x.shape[:-1]) + (d,)
    if out is None:
        out = call.empty(shape, out_dtype, x.device)
    else:
        C.check_tensor("swiglu", "out", out, dtypes=(out_dtype,), shape=shape, device=x.device)
    scales = call.empty((rows, 1), tm.float32, x.device) if qmode == 2 else None
    if rows == 0 or d == 0:
        return out, scales
    if rows >= 2 ** 31:
        raise ValueError(f"swiglu: {rows} rows are too many for one launch")
    dev = x.device.index or 0
    is_aligned = d % 8 == 0 and C.aligned(x, out)
    name, grid, block, tiles = kernel_config(rows, d, x.dtype, qmode, fmt, is_aligned, C.device_info(dev))
    k = C.module(_SRC)[name]
    if qmode != 2:
        scale_arg = scale if scale is not None else call.const(C.dummy_f32(dev))
        call.launch(k, grid, block, out, x, scale_arg, d)
    else:
        call.launch(k, grid, block, out, scales, x, call.const(C.dummy_f32(dev)), rows, d, tiles)
    return out, scales


def kernel_config(rows, d, dtype, qmode, fmt, is_aligned, info: dict):
    """(kernel name expression, grid, block, tiles per row): element-wise modes cut rows into tiles on a
    (rows, tiles) grid; per-token scales keep a row in one group of threads for its amax."""
    chunks = C.ceil_div(d, 8)
    head = f"{C.kernel_type(dtype)}, {C.fp8_tag(fmt)}, {qmode}"
    if qmode != 2:
        threads, per_thread, tiles = C.tile_config(chunks, rows, info["sms"], info["wave"])
        return f"swiglu_tiled_kernel<{head}, {per_thread}, {C.cbool(is_aligned)}>", (rows, tiles), threads, tiles
    threads, block, per_thread, tiles = C.row_config(chunks, rows, info["sms"], info["wave"], reduce=True)
    return (f"swiglu_kernel<{head}, {threads}, {block}, {per_thread}, {C.cbool(is_aligned)}>",
            C.ceil_div(rows * tiles, block // threads), block, tiles)


def _check(name, xt, scale):
    C.check_tensor(name, "gate_up", xt, dtypes=C.half_dtypes())
    if xt.dim() < 1 or xt.shape[-1] % 2:
        raise ValueError(f"{name}: gate_up must be [..., 2*d] with an even last dimension, got {tuple(xt.shape)}")
    if not xt.is_cuda:
        raise ValueError(f"{name}: gate_up must be on a GPU, got {xt.device}")
    if scale is not None:
        C.check_scale(name, scale, xt.device)


def _custom_op():
    """(impl, fake) of torch.ops.rocjit.swiglu."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(gate_up: Tensor, scale: Optional[Tensor], quant: str, fmt: str) -> tuple[Tensor, Tensor]:
        q = C.custom_op_quant("swiglu", scale, quant, fmt, gate_up.device)
        _check("swiglu", gate_up, scale)
        y, scales = _run(UNRECORDED, gate_up, scale, q, fmt, None)
        return y, scales if scales is not None else gate_up.new_empty((0,), dtype=tm.float32)

    def fake(gate_up, scale, quant, fmt):
        d = gate_up.shape[-1] // 2
        rows = gate_up.numel() // (2 * d) if d else 0
        dtype = gate_up.dtype if quant == "none" else C.fp8_torch_dtype(fmt)
        return (gate_up.new_empty(tuple(gate_up.shape[:-1]) + (d,), dtype=dtype),
                gate_up.new_empty((rows, 1) if quant == "per_token" else (0,), dtype=tm.float32))

    return impl, fake


@op(roles="TTOTO", sources=(_SRC,), bench="swiglu", custom_op=_custom_op)
def swiglu(call, gate_up, *, scale=None, quant=None, out=None, fp8_format=None):
    """silu(gate) * up for gate_up [..., 2d] (gate half first), optionally quantized to FP8 with a static scale
    or dynamic per-row scales (then returns (y, scales))."""
    name = "swiglu"
    xt, fw = C.to_torch(gate_up, "gate_up", name)
    ot = C.torch_or_none(out, "out", name)
    scale, quant = C.resolve_quant(name, scale, quant, xt.device)
    _check(name, xt, scale)
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    if C.compiling():
        y, scales = swiglu.__rocjit_op__.torch_op()(xt, scale, quant or "none", fmt)
        y = C.into_out(y, ot)
    else:
        y, scales = _run(call, xt, scale, quant, fmt, ot)
    y = C.to_caller(y, out, fw)
    scales = C.convert_outputs(scales, fw)
    return call.done((y, scales) if quant == "per_token" else y)
