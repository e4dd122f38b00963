"""FP8 quantization (kernels_src/quant_fp8.hip). Scales are fp32 dequantization multipliers: x ~= q * s,
s = amax / fp8 max (as in Primus-Turbo / DeepSeek-V3).

    q, s = quantize_fp8(x, scale=s0)                       # static per-tensor (s is s0)
    q, s = quantize_fp8(x)                                 # dynamic per-tensor, s [1]
    q, s = quantize_fp8(x, granularity="token")            # per row, s [rows, 1]
    q, s = quantize_fp8(x, granularity="block")            # 1 x 128 along the last dim, s [rows, ceil(K/128)]
    q, s = quantize_fp8_weight(w)                          # 128 x 128 tiles, s [ceil(N/128), ceil(K/128)]
    q_row, s_row, q_col, s_col = quantize_fp8_dual(x)      # 1x128 and 128x1 from one read of x:
                                                           # s_row [M, ceil(K/128)], s_col [ceil(M/128), K]
x is [..., K] (2-D for the weight and dual forms), float16 or bfloat16, contiguous.
"""
from typing import Optional

from rocjit.ops import _common as C

BLOCK = 128
_kernels = {}
_ROW_BLOCKS, _COL_BLOCKS, _TILE = 1, 2, 4


def _kernel(name):
    k = _kernels.get(name)
    if k is None:
        k = _kernels[name] = C.module("quant_fp8.hip")[name]
    return k


def _prepare(op, x, fp8_format, block=BLOCK, two_d=False):
    xt, fw = C.to_torch(x, "x", op)
    C.check_tensor(op, "x", xt, dtypes=C.half_dtypes())
    if not xt.is_cuda:
        raise ValueError(f"{op}: x must be on a GPU, got {xt.device}")
    if xt.dim() < 1 or (two_d and xt.dim() != 2):
        raise ValueError(f"{op}: x must be {'2-D [M, K]' if two_d else '[..., K]'}, got shape {tuple(xt.shape)}")
    if block != BLOCK:
        raise ValueError(f"{op}: block must be {BLOCK} (the kernels' block size), got {block}")
    return xt, fw, C.fp8_format(fp8_format, xt.device)


def quantize_fp8(x, *, scale=None, granularity="tensor", block=BLOCK, fp8_format=None):
    op = "quantize_fp8"
    if granularity not in ("tensor", "token", "block"):
        raise ValueError(f"{op}: granularity must be 'tensor', 'token' or 'block', got {granularity!r}")
    xt, fw, fmt = _prepare(op, x, fp8_format, block)
    tm = C.torch()
    if scale is not None:
        if granularity != "tensor":
            raise ValueError(f"{op}: a static scale= goes with granularity='tensor'")
        if not isinstance(scale, tm.Tensor):
            scale = tm.tensor([float(scale)], dtype=tm.float32, device=xt.device)
        C.check_tensor(op, "scale", scale, dtypes=(tm.float32,), device=xt.device)
        if scale.numel() != 1:
            raise ValueError(f"{op}: scale must hold one element, got shape {tuple(scale.shape)}")
    mode = "static" if scale is not None else granularity
    if C.compiling():
        q, s = _torch_op("quantize_fp8")(xt, scale, mode, fmt)
    else:
        q, s = _quantize(xt, scale, mode, fmt)
        if mode == "static":
            s = scale
    return C.convert_outputs((q, s), fw)


def _quantize(x, scale, mode, fmt):
    tm = C.torch()
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    q = tm.empty(x.shape, dtype=C.fp8_torch_dtype(fmt), device=x.device)
    if mode == "block":
        s = tm.empty((rows, C.ceil_div(K, BLOCK)), dtype=tm.float32, device=x.device)
        if rows and K:
            _blocks(x.view(rows, K), q.view(rows, K), s, None, None, _ROW_BLOCKS, fmt)
        return q, s
    s = tm.empty((rows, 1) if mode == "token" else (1,), dtype=tm.float32, device=x.device)
    if rows == 0 or K == 0:
        if mode == "tensor":
            s.fill_(1e-12 / C.fp8_max(fmt))
        return q, s
    dev = x.device.index or 0
    info = C.device_info(dev)
    dummy = C.dummy_f32(dev)
    T = C.kernel_type(x.dtype)
    is_aligned = K % 8 == 0 and C.aligned(x, q)
    partials, nparts = dummy, 0
    qmode = {"static": 1, "token": 2, "tensor": 3}[mode]
    if mode == "tensor":
        nparts = min(1024, 4 * info["sms"], max(1, C.ceil_div(x.numel(), 512 * 8)))
        partials = tm.empty(nparts, dtype=tm.float32, device=x.device)
        flat_aligned = x.numel() % 8 == 0 and C.aligned(x)
        _kernel(f"amax_kernel<{T}, 512, {C.cbool(flat_aligned)}>")[nparts, 512](partials, x, x.numel())
    threads, blk, per_thread, tiles = C.row_config(C.ceil_div(K, 8), rows, info["sms"], info["wave"],
                                                   reduce=mode == "token")
    name = f"quant_rows_kernel<{T}, {C.fp8_tag(fmt)}, {qmode}, {threads}, {blk}, {per_thread}, {C.cbool(is_aligned)}>"
    grid = C.ceil_div(rows * tiles, blk // threads)
    scale_in = scale if mode == "static" else partials
    _kernel(name)[grid, blk](q, s if mode != "static" else dummy, x, scale_in, rows, K, tiles, nparts)
    return q, s


def _blocks(x, q_row, s_row, q_col, s_col, kmode, fmt):
    """Launch quant_blocks_kernel on a contiguous [M, K] x."""
    M, K = x.shape
    dev = x.device.index or 0
    dummy = C.dummy_f32(dev)
    tile_rows = BLOCK if kmode & (_COL_BLOCKS | _TILE) else (16 if M <= 2048 else 64)
    outs = [t for t in (q_row, q_col) if t is not None]
    is_aligned = K % 8 == 0 and C.aligned(x) and C.aligned(*outs, to=8)
    name = (f"quant_blocks_kernel<{C.kernel_type(x.dtype)}, {C.fp8_tag(fmt)}, {kmode}, {tile_rows}, "
            f"{C.cbool(is_aligned)}>")
    grid = (C.ceil_div(K, BLOCK), C.ceil_div(M, tile_rows))
    _kernel(name)[grid, 256](q_row if q_row is not None else q_col, s_row if s_row is not None else dummy,
                             q_col if q_col is not None else q_row, s_col if s_col is not None else dummy, x, M, K)


def quantize_fp8_weight(w, *, block=BLOCK, fp8_format=None):
    op = "quantize_fp8_weight"
    wt, fw, fmt = _prepare(op, w, fp8_format, block, two_d=True)
    if C.compiling():
        return C.convert_outputs(tuple(_torch_op("quantize_fp8_weight")(wt, fmt)), fw)
    return C.convert_outputs(_weight(wt, fmt), fw)


def _weight(w, fmt):
    tm = C.torch()
    N, K = w.shape
    q = tm.empty(w.shape, dtype=C.fp8_torch_dtype(fmt), device=w.device)
    s = tm.empty((C.ceil_div(N, BLOCK), C.ceil_div(K, BLOCK)), dtype=tm.float32, device=w.device)
    if N and K:
        _blocks(w, q, s, None, None, _TILE, fmt)
    return q, s


def quantize_fp8_dual(x, *, block=BLOCK, fp8_format=None):
    op = "quantize_fp8_dual"
    xt, fw, fmt = _prepare(op, x, fp8_format, block, two_d=True)
    if C.compiling():
        return C.convert_outputs(tuple(_torch_op("quantize_fp8_dual")(xt, fmt)), fw)
    return C.convert_outputs(_dual(xt, fmt), fw)


def _dual(x, fmt, kmode=_ROW_BLOCKS | _COL_BLOCKS):
    """kmode selects row blocks, column blocks or both (the benchmark's separate launches use one each)."""
    tm = C.torch()
    M, K = x.shape
    f8 = C.fp8_torch_dtype(fmt)
    q_row = tm.empty(x.shape, dtype=f8, device=x.device) if kmode & _ROW_BLOCKS else None
    s_row = tm.empty((M, C.ceil_div(K, BLOCK)), dtype=tm.float32, device=x.device) if kmode & _ROW_BLOCKS else None
    q_col = tm.empty(x.shape, dtype=f8, device=x.device) if kmode & _COL_BLOCKS else None
    s_col = tm.empty((C.ceil_div(M, BLOCK), K), dtype=tm.float32, device=x.device) if kmode & _COL_BLOCKS else None
    if M and K:
        _blocks(x, q_row, s_row, q_col, s_col, kmode, fmt)
    return q_row, s_row, q_col, s_col


def _torch_op(name):
    """torch.ops.rocjit.quantize_fp8 / quantize_fp8_weight / quantize_fp8_dual (what torch.compile traces)."""
    return C.custom_op(name, _OP_FUNCTIONS[name])


def _quantize_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(x: Tensor, scale: Optional[Tensor], mode: str, fmt: str) -> tuple[Tensor, Tensor]:
        q, s = _quantize(x, scale, mode, fmt)
        return q, (scale.clone() if mode == "static" else s)

    def fake(x, scale, mode, fmt):
        K = x.shape[-1]
        rows = x.numel() // K if K else 0
        shape = {"block": (rows, C.ceil_div(K, BLOCK)), "token": (rows, 1)}.get(mode, (1,))
        return x.new_empty(x.shape, dtype=C.fp8_torch_dtype(fmt)), x.new_empty(shape, dtype=tm.float32)

    return impl, fake


def _weight_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(w: Tensor, fmt: str) -> tuple[Tensor, Tensor]:
        return _weight(w, fmt)

    def fake(w, fmt):
        N, K = w.shape
        return (w.new_empty(w.shape, dtype=C.fp8_torch_dtype(fmt)),
                w.new_empty((C.ceil_div(N, BLOCK), C.ceil_div(K, BLOCK)), dtype=tm.float32))

    return impl, fake


def _dual_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(x: Tensor, fmt: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return _dual(x, fmt)

    def fake(x, fmt):
        M, K = x.shape
        f8 = C.fp8_torch_dtype(fmt)
        return (x.new_empty(x.shape, dtype=f8), x.new_empty((M, C.ceil_div(K, BLOCK)), dtype=tm.float32),
                x.new_empty(x.shape, dtype=f8), x.new_empty((C.ceil_div(M, BLOCK), K), dtype=tm.float32))

    return impl, fake


_OP_FUNCTIONS = {"quantize_fp8": _quantize_op, "quantize_fp8_weight": _weight_op, "quantize_fp8_dual": _dual_op}
