"""Fused SwiGLU (+ FP8 quantization) (kernels_src/swiglu.hip).

    y = swiglu(gate_up)                          # gate_up [..., 2d], gate half first; y [..., d] = silu(gate) * up
    q = swiglu(gate_up, scale=s)                 # fp8(y / s), s fp32 [1]
    q, scales = swiglu(gate_up, quant="per_token")   # dynamic per-row scales [rows, 1]
"""
from typing import Optional

from rocjit.ops import _common as C

_QUANT = {None: 0, "static": 1, "per_token": 2}
_plans = {}  # shape / dtype / mode -> (configured launcher, tiles per row)


def swiglu(gate_up, *, scale=None, quant=None, out=None, fp8_format=None):
    op = "swiglu"
    xt, fw = C.to_torch(gate_up, "gate_up", op)
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
    C.check_tensor(op, "gate_up", xt, dtypes=C.half_dtypes())
    if xt.dim() < 1 or xt.shape[-1] % 2:
        raise ValueError(f"{op}: gate_up must be [..., 2*d] with an even last dimension, got {tuple(xt.shape)}")
    if not xt.is_cuda:
        raise ValueError(f"{op}: gate_up must be on a GPU, got {xt.device}")
    if scale is not None:
        C.check_tensor(op, "scale", scale, dtypes=(tm.float32,), device=xt.device)
        if scale.numel() != 1:
            raise ValueError(f"{op}: scale must hold one element, got shape {tuple(scale.shape)}")
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    if C.compiling():
        y, scales = _torch_op()(xt, scale, quant or "none", fmt)
        if out is not None:
            out.copy_(y)
            y = out
    else:
        y, scales = _launch(xt, scale, quant, fmt, out)
    y, scales = C.convert_outputs((y, scales), fw)
    return (y, scales) if quant == "per_token" else y


def _launch(x, scale, quant, fmt, out):
    tm = C.torch()
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d) if d else 0
    qmode = _QUANT[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else x.dtype
    shape = tuple(x.shape[:-1]) + (d,)
    if out is None:
        out = tm.empty(shape, dtype=out_dtype, device=x.device)
    else:
        C.check_tensor("swiglu", "out", out, dtypes=(out_dtype,), shape=shape, device=x.device)
    dev = x.device.index or 0
    scales = tm.empty((rows, 1), dtype=tm.float32, device=x.device) if qmode == 2 else None
    if rows == 0 or d == 0:
        return out, scales
    is_aligned = d % 8 == 0 and C.aligned(x, out)
    key = (rows, d, x.dtype, qmode, fmt, is_aligned, dev)
    plan = _plans.get(key)
    if plan is None:
        info = C.device_info(dev)
        threads, block, per_thread, tiles = C.row_config(C.ceil_div(d, 8), rows, info["sms"], info["wave"],
                                                         reduce=qmode == 2)
        if rows * tiles >= 2 ** 31:
            raise ValueError(f"swiglu: {rows} rows are too many for one launch")
        name = (f"swiglu_kernel<{C.kernel_type(x.dtype)}, {C.fp8_tag(fmt)}, {qmode}, {threads}, {block}, "
                f"{per_thread}, {C.cbool(is_aligned)}>")
        launch = C.module("swiglu.hip")[name][C.ceil_div(rows * tiles, block // threads), block]
        plan = _plans[key] = (launch, tiles)
    launch, tiles = plan
    dummy = C.dummy_f32(dev)
    launch(out, scales if scales is not None else dummy, x, scale if scale is not None else dummy, rows, d, tiles)
    return out, scales


_op = None


def _torch_op():
    global _op
    if _op is None:
        tm = C.torch()
        Tensor = tm.Tensor

        def impl(gate_up: Tensor, scale: Optional[Tensor], quant: str, fmt: str) -> tuple[Tensor, Tensor]:
            y, scales = _launch(gate_up, scale, None if quant == "none" else quant, fmt, None)
            return y, scales if scales is not None else gate_up.new_empty((0,), dtype=tm.float32)

        def fake(gate_up, scale, quant, fmt):
            d = gate_up.shape[-1] // 2
            rows = gate_up.numel() // (2 * d) if d else 0
            dtype = gate_up.dtype if quant == "none" else C.fp8_torch_dtype(fmt)
            return (gate_up.new_empty(tuple(gate_up.shape[:-1]) + (d,), dtype=dtype),
                    gate_up.new_empty((rows, 1) if quant == "per_token" else (0,), dtype=tm.float32))

        _op = C.custom_op("swiglu", impl, fake)
    return _op
