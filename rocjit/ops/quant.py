"""FP8 quantization (kernels_src/quant_fp8.hip). Scales are fp32 dequantization multipliers: x ~= q * s,
s = amax / fp8 max (as in Primus-Turbo / DeepSeek-V3).

    q, s = quantize_fp8(x, scale=s0)                       # static per-tensor (s is s0)
    q, s = quantize_fp8(x)                                 # dynamic per-tensor, s [1]
    q, s = quantize_fp8(x, granularity="token")            # per row, s [rows, 1]
    q, s = quantize_fp8(x, granularity="block")            # 1 x 128 along the last dim, s [rows, ceil(K/128)]
    q, s = quantize_fp8_weight(w)                          # 128 x 128 tiles, s [ceil(N/128), ceil(K/128)]
    q, s, q_t = quantize_fp8_weight(w, transposed=True)    # + q_t [K, N] = q^T (same tiles; its scales are s.t())
    q_row, s_row, q_col, s_col = quantize_fp8_dual(x)      # 1x128 and 128x1 from one read of x:
                                                           # s_row [M, ceil(K/128)] (M-major: strides (1, M)),
                                                           # s_col [ceil(M/128), K]
    q_row, s_row, q_colT, s_colT = quantize_fp8_dual(x, transpose_col=True)
                                                           # column blocks stored transposed: q_colT [K, M],
                                                           # s_colT [K, ceil(M/128)] (K-major for wgrad)
    ... = quantize_fp8_dual(z, activation="gelu")          # of gelu(z), the activation fused into the read
    ... = quantize_fp8_dual(z, activation="gelu", grad=g)  # of g * gelu'(z), the activation's backward
x is [..., K] (2-D for the weight and dual forms), float16 or bfloat16, contiguous.
"""
from typing import Optional

from rocjit import targets
from rocjit.ops import _common as C
from rocjit.ops import _gemm
from rocjit.ops._op import UNRECORDED, op

BLOCK = 128
_SRC = "quant_fp8.hip"
_ROW_BLOCKS, _COL_BLOCKS, _TILE, _TILE_COL = 1, 2, 4, 8
_STREAM_RING = 2 * BLOCK * BLOCK * 2    # quant_dual_stream_kernel's dynamic shared memory: 2 tiles of 16-bit x
# the activations quantize_fp8_dual fuses (kAct of quant_fp8.hip), computed as torch computes them:
# gelu = torch.nn.functional.gelu, gelu_tanh = gelu(approximate="tanh"), silu, relu
ACTIVATIONS = {None: 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu": 4}


def _kernel(name):
    return C.module(_SRC)[name]


def _prepare(op, x, fp8_format, block=BLOCK, two_d=False):
    xt, fw = C.to_torch(x, "x", op)
    _check_x(op, xt, two_d)
    if block != BLOCK:
        raise ValueError(f"{op}: block must be {BLOCK} (the kernels' block size), got {block}")
    return xt, fw, C.fp8_format(fp8_format, xt.device)


def _check_x(op, xt, two_d=False, fmt=None):
    """What every quantizer needs of x (the public functions and the torch custom ops alike)."""
    if fmt is not None:
        C.fp8_format(fmt, None)
    C.check_tensor(op, "x", xt, dtypes=C.half_dtypes())
    if xt.dim() < 1 or (two_d and xt.dim() != 2):
        raise ValueError(f"{op}: x must be {'2-D [M, K]' if two_d else '[..., K]'}, got shape {tuple(xt.shape)}")
    if not xt.is_cuda:
        raise ValueError(f"{op}: x must be on a GPU, got {xt.device}")


def _scale_shape(mode, rows, K):
    return {"block": (rows, C.ceil_div(K, BLOCK)), "token": (rows, 1)}.get(mode, (1,))


def _quantize(call, x, scale, mode, fmt, q=None, s=None):
    """(q, s) of x; q / s written into the given (checked) tensors, else allocated."""
    tm = C.torch()
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    if q is None:
        q = call.empty(x.shape, C.fp8_torch_dtype(fmt), x.device)
    if s is None:
        s = call.empty(_scale_shape(mode, rows, K), tm.float32, x.device)
    if mode == "block":
        if rows and K:
            _blocks(call, x, q, s, None, None, _ROW_BLOCKS, fmt, rows, K)
        return q, s
    if rows == 0 or K == 0:
        if mode == "tensor":
            call.forget()                    # a fill, not a launch: not something a plan replays
            s.fill_(1e-12 / C.fp8_max(fmt))
        return q, s
    dev = x.device.index or 0
    info = C.device_info(dev)
    dummy = call.const(C.dummy_f32(dev))
    T = C.kernel_type(x.dtype)
    is_aligned = K % 8 == 0 and C.aligned(x, q)
    partials, nparts = dummy, 0
    qmode = {"static": 1, "token": 2, "tensor": 3}[mode]
    if mode == "tensor":
        nparts = min(1024, 4 * info["sms"], max(1, C.ceil_div(x.numel(), 512 * 8)))
        partials = call.empty((nparts,), tm.float32, x.device)
        flat_aligned = x.numel() % 8 == 0 and C.aligned(x)
        call.launch(_kernel(f"amax_kernel<{T}, 512, {C.cbool(flat_aligned)}>"), nparts, 512, partials, x, x.numel())
    threads, blk, per_thread, tiles = C.row_config(C.ceil_div(K, 8), rows, info["sms"], info["wave"],
                                                   reduce=mode == "token")
    name = f"quant_rows_kernel<{T}, {C.fp8_tag(fmt)}, {qmode}, {threads}, {blk}, {per_thread}, {C.cbool(is_aligned)}>"
    grid = C.ceil_div(rows * tiles, blk // threads)
    scale_in = scale if mode == "static" else partials
    call.launch(_kernel(name), grid, blk, q, s if mode != "static" else dummy, x, scale_in, rows, K, tiles, nparts)
    return q, s


def _blocks(call, x, q_row, s_row, q_col, s_col, kmode, fmt, M, K, col_t=False, row_t=False, act=None, grad=None):
    """Launch quant_blocks_kernel on a contiguous x read as [M, K]; col_t: q_col (and s_col) stored transposed;
    row_t: s_row (row blocks) stored M-major, [ceil(K/128), M]; act (an ACTIVATIONS key): quantize act(x), or with
    grad (x's shape, dtype and device, contiguous) grad * act'(x). The dual quantization (both row and column blocks)
    on aligned operands runs quant_dual_stream_kernel on NVIDIA sm_80+ (the same outputs)."""
    dev = x.device.index or 0
    dummy = call.const(C.dummy_f32(dev))
    tile_rows = BLOCK if kmode & (_COL_BLOCKS | _TILE) else (16 if M <= 2048 else 64)
    outs = [t for t in (q_row, q_col) if t is not None]
    is_aligned = K % 8 == 0 and C.aligned(x) and C.aligned(*outs, to=8) and (grad is None or C.aligned(grad))
    fused = f"{ACTIVATIONS[act]}, {C.cbool(grad is not None)}"
    if col_t:                   # the transposed rows (length M) leave as 16-byte stores
        is_aligned = is_aligned and M % 16 == 0 and C.aligned(q_col)
    args = (q_row if q_row is not None else q_col, s_row if s_row is not None else dummy,
            q_col if q_col is not None else q_row, s_col if s_col is not None else dummy, x, M, K,
            grad if grad is not None else dummy)
    tiles = (C.ceil_div(K, BLOCK), C.ceil_div(M, tile_rows))
    if kmode == _ROW_BLOCKS | _COL_BLOCKS and is_aligned:
        target, _, sms = _gemm._device(dev)
        if target.startswith("sm_") and targets.nvidia_arch(target) >= 80:     # cp.async
            # the streamed dual kernel: two persistent blocks per multiprocessor, each with a 64 KB ring of x (with an
            # activation, one 32 KB buffer per operand: x and grad)
            name = (f"quant_dual_stream_kernel<{C.kernel_type(x.dtype)}, {C.fp8_tag(fmt)}, {C.cbool(col_t)}, "
                    f"{C.cbool(row_t)}, {fused}>")
            ring = _STREAM_RING if act is None else _STREAM_RING // 2 * (2 if grad is not None else 1)
            call.launch(_kernel(name), min(tiles[0] * tiles[1], 2 * sms), 256, *args, shared_mem=ring)
            return
    name = (f"quant_blocks_kernel<{C.kernel_type(x.dtype)}, {C.fp8_tag(fmt)}, {kmode}, {tile_rows}, "
            f"{C.cbool(is_aligned)}, {C.cbool(col_t)}, {C.cbool(row_t)}, {fused}>")
    call.launch(_kernel(name), tiles, 256, *args)


def _weight(call, w, fmt, transposed=False):
    tm = C.torch()
    N, K = w.shape
    q = call.empty(w.shape, C.fp8_torch_dtype(fmt), w.device)
    s = call.empty((C.ceil_div(N, BLOCK), C.ceil_div(K, BLOCK)), tm.float32, w.device)
    q_t = call.empty((K, N), C.fp8_torch_dtype(fmt), w.device) if transposed else None
    if N and K:
        _blocks(call, w, q, s, q_t, None, _TILE | (_TILE_COL if transposed else 0), fmt, N, K, col_t=transposed)
    return (q, s, q_t) if transposed else (q, s)


def _dual(x, fmt, kmode=_ROW_BLOCKS | _COL_BLOCKS, call=UNRECORDED, transpose_col=False, act=None, grad=None):
    """kmode selects row blocks, column blocks or both (the benchmark's separate launches use one each);
    transpose_col stores the column-block output transposed: q_col [K, M], and returns s_col as [K, ceil(M/128)],
    a transposed view of its [ceil(M/128), K] memory. s_row is always the transposed view [M, ceil(K/128)] of
    [ceil(K/128), M] memory (views that an eager plan makes again from its outputs: Call.view). act / grad: the
    fused activation (see _blocks; checked by the caller)."""
    tm = C.torch()
    M, K = x.shape
    f8 = C.fp8_torch_dtype(fmt)
    q_row = call.empty(x.shape, f8, x.device) if kmode & _ROW_BLOCKS else None
    s_row = call.empty((C.ceil_div(K, BLOCK), M), tm.float32, x.device) if kmode & _ROW_BLOCKS else None
    col = kmode & _COL_BLOCKS
    q_col = call.empty((K, M) if transpose_col else x.shape, f8, x.device) if col else None
    s_col = call.empty((C.ceil_div(M, BLOCK), K), tm.float32, x.device) if col else None
    if M and K:
        _blocks(call, x, q_row, s_row, q_col, s_col, kmode, fmt, M, K, col_t=transpose_col and bool(col), row_t=True,
                act=act, grad=grad)
    t = tm.Tensor.t
    return (q_row, call.view(t, s_row) if s_row is not None else None, q_col,
            call.view(t, s_col) if transpose_col and col else s_col)


def _quantize_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(x: Tensor, scale: Optional[Tensor], mode: str, fmt: str) -> tuple[Tensor, Tensor]:
        if mode not in ("static", "tensor", "token", "block") or (mode == "static") != (scale is not None):
            raise ValueError(f"quantize_fp8: mode {mode!r} with scale {scale!r} is not a valid combination")
        _check_x("quantize_fp8", x, fmt=fmt)
        if scale is not None:
            C.check_scale("quantize_fp8", scale, x.device)
        q, s = _quantize(UNRECORDED, x, scale, mode, fmt)
        return q, (scale.clone() if mode == "static" else s)

    def fake(x, scale, mode, fmt):
        K = x.shape[-1]
        rows = x.numel() // K if K else 0
        shape = _scale_shape(mode, rows, K)
        return x.new_empty(x.shape, dtype=C.fp8_torch_dtype(fmt)), x.new_empty(shape, dtype=tm.float32)

    return impl, fake


def _weight_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(w: Tensor, fmt: str, transposed: bool) -> tuple[Tensor, Tensor, Tensor]:
        _check_x("quantize_fp8_weight", w, two_d=True, fmt=fmt)
        q, s, *t = _weight(UNRECORDED, w, fmt, transposed)      # no transposed copy: an empty third output
        return q, s, (t[0] if t else w.new_empty((0,), dtype=q.dtype))

    def fake(w, fmt, transposed):
        N, K = w.shape
        f8 = C.fp8_torch_dtype(fmt)
        return (w.new_empty(w.shape, dtype=f8), w.new_empty((C.ceil_div(N, BLOCK), C.ceil_div(K, BLOCK)), dtype=tm.float32),
                w.new_empty((K, N) if transposed else (0,), dtype=f8))

    return impl, fake


def _kmode(columns):
    return _ROW_BLOCKS | _COL_BLOCKS if columns else _ROW_BLOCKS


def _no_columns(x, fmt):
    """The custom op's stand-ins for the column outputs of a rows-only call."""
    tm = C.torch()
    return x.new_empty((0,), dtype=C.fp8_torch_dtype(fmt)), x.new_empty((0,), dtype=tm.float32)


def _dual_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(x: Tensor, fmt: str, transpose_col: bool, activation: Optional[str] = None,
             grad: Optional[Tensor] = None, columns: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        _check_activation("quantize_fp8_dual", x, activation, grad)
        _check_x("quantize_fp8_dual", x, two_d=True, fmt=fmt)
        res = _dual(x, fmt, _kmode(columns), transpose_col=transpose_col, act=activation, grad=grad)
        # no column blocks: empty third and fourth outputs (the public function returns None for them)
        return res if columns else (*res[:2], *_no_columns(x, fmt))

    def fake(x, fmt, transpose_col, activation=None, grad=None, columns=True):
        M, K = x.shape
        f8 = C.fp8_torch_dtype(fmt)
        kt = (K, M) if transpose_col else (M, K)
        s_col = x.new_empty((C.ceil_div(M, BLOCK), K), dtype=tm.float32)
        rows = (x.new_empty(x.shape, dtype=f8), x.new_empty((C.ceil_div(K, BLOCK), M), dtype=tm.float32).t())
        if not columns:
            return (*rows, *_no_columns(x, fmt))
        return (*rows, x.new_empty(kt, dtype=f8), s_col.t() if transpose_col else s_col)

    return impl, fake


@op(roles="TTOOOTT", sources=(_SRC,), bench="quant", custom_op=_quantize_op)
def quantize_fp8(call, x, *, scale=None, granularity="tensor", block=BLOCK, fp8_format=None, out=None,
                 scale_out=None):
    """x -> (q, s) with x ~= q * s: static per-tensor (scale=), dynamic per tensor, per row ("token") or per
    1 x 128 block along the last dimension ("block"). out= (FP8, x's shape) and scale_out= (float32, the shape of s)
    receive q and s in place of new tensors: a decode step's repeated call then allocates nothing."""
    name = "quantize_fp8"
    if granularity not in ("tensor", "token", "block"):
        raise ValueError(f"{name}: granularity must be 'tensor', 'token' or 'block', got {granularity!r}")
    xt, fw, fmt = _prepare(name, x, fp8_format, block)
    tm = C.torch()
    if scale is not None:
        if granularity != "tensor":
            raise ValueError(f"{name}: a static scale= goes with granularity='tensor'")
        if not isinstance(scale, tm.Tensor):
            scale = tm.tensor([float(scale)], dtype=tm.float32, device=xt.device)
        C.check_tensor(name, "scale", scale, dtypes=(tm.float32,), device=xt.device)
        if scale.numel() != 1:
            raise ValueError(f"{name}: scale must hold one element, got shape {tuple(scale.shape)}")
    mode = "static" if scale is not None else granularity
    ot = C.torch_or_none(out, "out", name)
    st = C.torch_or_none(scale_out, "scale_out", name)
    if ot is not None:
        C.check_tensor(name, "out", ot, dtypes=(C.fp8_torch_dtype(fmt),), shape=xt.shape, device=xt.device)
    if st is not None:
        if mode == "static":
            raise ValueError(f"{name}: scale_out= has nothing to receive with a static scale= (s is that scale)")
        K = xt.shape[-1]
        C.check_tensor(name, "scale_out", st, dtypes=(tm.float32,),
                       shape=_scale_shape(mode, xt.numel() // K if K else 0, K), device=xt.device)
    if C.compiling():
        q, s = quantize_fp8.__rocjit_op__.torch_op()(xt, scale, mode, fmt)
        q = C.into_out(q, ot)
        s = C.into_out(s, st)
    else:
        q, s = _quantize(call, xt, scale, mode, fmt, ot, st)
        if mode == "static":
            s = scale
    return call.done((C.to_caller(q, out, fw), C.to_caller(s, scale_out, fw)))


@op(roles="TOOO", sources=(_SRC,), bench="quant", custom_op=_weight_op)
def quantize_fp8_weight(call, w, *, block=BLOCK, fp8_format=None, transposed=False):
    """w [N, K] -> (q, s) with 128 x 128 tile scales s [ceil(N/128), ceil(K/128)]; transposed=True also returns
    q_t [K, N] = q^T from the same launch (the K-major weight of dgrad; its tile scales are s.t())."""
    wt, fw, fmt = _prepare("quantize_fp8_weight", w, fp8_format, block, two_d=True)
    transposed = bool(transposed)
    if C.compiling():
        res = tuple(quantize_fp8_weight.__rocjit_op__.torch_op()(wt, fmt, transposed))
        return C.convert_outputs(res if transposed else res[:2], fw)
    return call.done(C.convert_outputs(_weight(call, wt, fmt, transposed), fw))


def _check_activation(op, xt, activation, grad):
    """activation is one of ACTIVATIONS; grad (with an activation only) is a tensor like x."""
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        allowed = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"{op}: activation must be one of {allowed}, got {activation!r}")
    if grad is not None:
        if activation is None:
            raise ValueError(f"{op}: grad= is the upstream gradient of an activation's backward; it needs activation=")
        C.check_tensor(op, "grad", grad, dtypes=(xt.dtype,), shape=xt.shape, device=xt.device)


@op(roles="TOOOOTO", sources=(_SRC,), bench="quant", custom_op=_dual_op)
def quantize_fp8_dual(call, x, *, block=BLOCK, fp8_format=None, transpose_col=False, activation=None, grad=None,
                      columns=True):
    """x [M, K] -> (q_row, s_row, q_col, s_col): 1 x 128 row blocks and 128 x 1 column blocks from one read.
    s_row [M, ceil(K/128)] is M-major (a transposed view, strides (1, M)): each K block's scales of consecutive rows
    lie together, the layout cuBLASLt's blockwise GEMM takes and the one gemm_fp8_blockwise's TMA kernel copies
    with one bulk copy per K block (any other layout costs the GEMM a copy). transpose_col=True stores the
    column-block output transposed, q_col [K, M], and returns s_col [K, ceil(M/128)] as a transposed view (strides
    (1, K)): the K-major operand, with its 1 x 128 scales along M, of a GEMM that reduces over M (wgrad), whose
    per-row scales it reads one contiguous block row at a time.

    activation= ("gelu", "gelu_tanh", "silu" or "relu") quantizes act(x) instead of x, the activation computed in
    fp32 and rounded to x's dtype in the same read (an MLP's activation fused into the quantization of its output);
    with grad= (the upstream gradient, x's shape and dtype, contiguous) it quantizes grad * act'(x), the activation's
    backward with x its input. The functions are torch's (gelu's default is the erf form, gelu_tanh its tanh form),
    evaluated on the hardware's exp2 and reciprocal to about 1e-6 relative (quant_fp8.hip): a value can differ from
    torch's by one step of x's dtype where it lies that close to a rounding boundary.

    columns=False makes the row blocks alone, (q_row, s_row, None, None), bit-identical to the dual call's: the
    forward of a layer whose weight takes no gradient (inference, frozen weights) needs no column blocks."""
    name = "quantize_fp8_dual"
    xt, fw, fmt = _prepare(name, x, fp8_format, block, two_d=True)
    transpose_col = bool(transpose_col)
    if not isinstance(columns, bool):
        raise TypeError(f"{name}: columns must be True or False, got {columns!r}")
    if transpose_col and not columns:
        raise ValueError(f"{name}: transpose_col=True lays out the column blocks, and columns=False makes none")
    gt = C.torch_or_none(grad, "grad", name)
    _check_activation(name, xt, activation, gt)
    if C.compiling():
        res = tuple(quantize_fp8_dual.__rocjit_op__.torch_op()(xt, fmt, transpose_col, activation, gt, columns))
        return C.convert_outputs(res if columns else (*res[:2], None, None), fw)
    return call.done(C.convert_outputs(_dual(xt, fmt, _kmode(columns), call=call, transpose_col=transpose_col,
                                             act=activation, grad=gt), fw))
