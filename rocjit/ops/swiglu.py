"""Fused SwiGLU (+ FP8 quantization) (kernels_src/swiglu.hip).

    y = swiglu(gate_up)                          # gate_up [..., 2d], gate half first; y [..., d] = silu(gate) * up
    q = swiglu(gate_up, scale=s)                 # fp8(y / s), s fp32 [1]
    q, scales = swiglu(gate_up, quant="per_token")   # dynamic per-row scales [rows, 1]

Eager torch calls that repeat an earlier call's shape, dtype, device and options take a cached plan that
re-checks every argument with a few attribute reads; anything else goes through the full path.
"""
from typing import Optional

from rocjit.ops import _common as C

_plans = {}  # shape / dtype / mode -> launch(out, scales, gate_up, scale, rows, d)
_eager = {}  # (gate_up.shape, dtype, device, scale?, quant, fp8_format) -> plan for the fast path
_Tensor = None
_is_compiling = None


def swiglu(gate_up, *, scale=None, quant=None, out=None, fp8_format=None):
    if type(gate_up) is _Tensor and out is None and not _is_compiling():
        plan = _eager.get((gate_up.shape, gate_up.dtype, gate_up.get_device(), scale is None, quant, fp8_format))
        if plan is not None:
            result = plan(gate_up, scale)
            if result is not None:
                return result
    return _swiglu(gate_up, scale, quant, out, fp8_format)


def _swiglu(gate_up, scale, quant, out, fp8_format):
    op = "swiglu"
    xt, fw = C.to_torch(gate_up, "gate_up", op)
    scale_arg, quant_arg = scale, quant
    scale, quant = C.resolve_quant(op, scale, quant, xt.device)
    C.check_tensor(op, "gate_up", xt, dtypes=C.half_dtypes())
    if xt.dim() < 1 or xt.shape[-1] % 2:
        raise ValueError(f"{op}: gate_up must be [..., 2*d] with an even last dimension, got {tuple(xt.shape)}")
    if not xt.is_cuda:
        raise ValueError(f"{op}: gate_up must be on a GPU, got {xt.device}")
    if scale is not None:
        C.check_scale(op, scale, xt.device)
    fmt = C.fp8_format(fp8_format, xt.device) if quant else "e4m3fn"
    if C.compiling():
        y, scales = _torch_op()(xt, scale, quant or "none", fmt)
        if out is not None:
            out.copy_(y)
            y = out
    else:
        y, scales = _launch(xt, scale, quant, fmt, out)
        if fw == "torch" and out is None and scale_arg is scale:
            _remember(xt, scale, quant_arg, quant, fp8_format, fmt)
    y, scales = C.convert_outputs((y, scales), fw)
    return (y, scales) if quant == "per_token" else y


def _launch(x, scale, quant, fmt, out):
    tm = C.torch()
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d) if d else 0
    qmode = C.QUANT_MODES[quant]
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
    launch = _launcher(rows, d, x.dtype, qmode, fmt, is_aligned, dev)
    dummy = C.dummy_f32(dev)
    launch(out, scales if scales is not None else dummy, x, scale if scale is not None else dummy, rows, d)
    return out, scales


def _launcher(rows, d, dtype, qmode, fmt, is_aligned, dev):
    """launch(out, scales, gate_up, scale, rows, d) for a shape."""
    key = (rows, d, dtype, qmode, fmt, is_aligned, dev)
    launch = _plans.get(key)
    if launch is None:
        if rows >= 2 ** 31:
            raise ValueError(f"swiglu: {rows} rows are too many for one launch")
        name, grid, block, tiles = kernel_config(rows, d, dtype, qmode, fmt, is_aligned, C.device_info(dev))
        k = C.module("swiglu.hip")[name][grid, block]
        if qmode != 2:
            def launch(out, scales, x, scale, rows, d, k=k):
                k(out, x, scale, d)
        else:
            def launch(out, scales, x, scale, rows, d, k=k, tiles=tiles):
                k(out, scales, x, scale, rows, d, tiles)
        _plans[key] = launch
    return launch


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


def _remember(x, scale, quant_arg, quant, fp8_format, fmt):
    """Cache the eager plan for calls shaped like this one (torch tensors on a GPU, no out=)."""
    global _Tensor, _is_compiling
    tm = C.torch()
    _Tensor, _is_compiling = tm.Tensor, tm.compiler.is_compiling
    d = x.shape[-1] // 2
    rows = x.numel() // (2 * d) if d else 0
    if rows == 0 or d == 0:
        return
    dev, dtype, shape = x.get_device(), x.dtype, x.shape
    qmode = C.QUANT_MODES[quant]
    out_dtype = C.fp8_torch_dtype(fmt) if qmode else dtype
    is_aligned = d % 8 == 0
    launch = _launcher(rows, d, dtype, qmode, fmt, is_aligned, dev)
    dummy, f32, Tensor = C.dummy_f32(dev), tm.float32, tm.Tensor
    out_shape, scales_shape = tuple(shape[:-1]) + (d,), (rows, 1)
    has_s, per_token = scale is not None, qmode == 2

    def plan(x, s):
        # every property the kernel relies on; a miss falls back to the full path (which names the problem)
        if not x.is_contiguous() or (is_aligned and x.data_ptr() & 15):
            return None
        if has_s and not (type(s) is Tensor and s.dtype is f32 and s.get_device() == dev and s.numel() == 1):
            return None
        y = x.new_empty(out_shape, dtype=out_dtype)  # measured cheaper than torch.empty(..., device=)
        scales = x.new_empty(scales_shape, dtype=f32) if per_token else dummy
        launch(y, scales, x, s if has_s else dummy, rows, d)
        return (y, scales) if per_token else y

    key = (shape, dtype, dev, scale is None, quant_arg, fp8_format)
    if len(_eager) < 1024:
        _eager[key] = plan


def _torch_op():
    """torch.ops.rocjit.swiglu (what torch.compile traces)."""
    return C.custom_op("swiglu", _op_functions)


def _op_functions():
    """(impl, fake) of torch.ops.rocjit.swiglu."""
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

    return impl, fake
