"""Fused RMSNorm / SwiGLU / FP8 quantization on the GPU against float64 references (random data, poisoned
outputs, every element checked)."""
import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from rocjit import ops  # noqa: E402
from rocjit.ops import _common as C  # noqa: E402

HIDDEN = [8, 4096, 5120, 8192, 16384, 1001]
ROWS = [0, 1, 3, 67]
DTYPES = [torch.float16, torch.bfloat16]
FMTS = ["e4m3fn", "e4m3fnuz"]
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def rand(shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=torch.float32, device="cuda") * scale).to(dtype)


def f64(t):
    return t.detach().double().cpu().numpy()


def check_half(got, ref, dtype):
    got = f64(got)
    assert got.shape == ref.shape
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    err = np.abs(got[~nan] - ref[~nan])
    tol = np.abs(ref[~nan]) * ULP[dtype] + 1e-6
    assert (err <= tol).all(), f"max err {err.max()} at ref {ref[~nan][err.argmax()]}"


NAN_CODE = {"e4m3fn": 0x7F, "e4m3fnuz": 0x80}


def poisoned_fp8(shape, fmt):
    """An FP8 out= full of NaN codes: a byte the kernel leaves unwritten decodes as NaN and fails check_fp8."""
    return torch.full(shape, NAN_CODE[fmt], dtype=torch.uint8, device="cuda").view(C.fp8_torch_dtype(fmt))


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def check_fp8(got, ref_values, fmt):
    """>= 99.9% of bytes equal to the reference quantizer, the rest within one fp8 step; NaN where ref is NaN.

    Values within 1e-6 (relative) of an fp8 rounding boundary are left out of the 99.9% count: there fp32
    arithmetic legitimately decides the side, and bf16 data makes exact ties common (per-row quantization of
    x * w / amax cancels the rms, leaving ratios of short products). They must still be within one step."""
    codes = got.view(torch.uint8).cpu().numpy().reshape(ref_values.shape)
    want = C.fp8_reference(ref_values, fmt)
    nan = np.isnan(ref_values)
    assert np.isnan(C.fp8_decode(codes[nan], fmt)).all()
    # every element: a finite value saturates, it never becomes NaN (nor stays an unwritten NaN poison code)
    unwritten = np.isnan(C.fp8_decode(codes[~nan], fmt))
    assert not unwritten.any(), f"{unwritten.sum()} of {unwritten.size} fp8 outputs are NaN where the reference is not"
    v = ref_values[~nan]
    boundary = C.fp8_reference(v * (1 - 1e-6), fmt) != C.fp8_reference(v * (1 + 1e-6), fmt)
    c, w = codes[~nan].astype(int), want[~nan].astype(int)
    equal = (c == w) | boundary
    if c.size:
        assert equal.mean() >= 0.999, f"only {equal.mean():.5f} of fp8 bytes match ({(~equal).sum()} of {c.size})"
        near = (np.abs((c & 0x7F) - (w & 0x7F)) <= 1) & ((((c ^ w) & 0x80) == 0) | ((c & 0x7F) <= 1))
        assert (equal | near).all()


def rms_ref(x, w, eps, r=None):
    h = f64(x) + (f64(r) if r is not None else 0)
    if r is not None:
        h = f64((x + r))  # the kernel normalizes the rounded sum it writes back
    rms = np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    return h / rms * f64(w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mode", ["plain", "residual", "static", "per_token"])
def test_rms_norm(dtype, hidden, rows, mode):
    torch.manual_seed(hidden * 31 + rows)
    eps = 1e-6
    x, w = rand((rows, hidden), dtype), rand((hidden,), dtype)
    r = rand((rows, hidden), dtype) if mode != "plain" else None
    r0 = r.clone() if r is not None else None
    fmt = "e4m3fn" if hidden % 2 else "e4m3fnuz"
    ref = rms_ref(x, w, eps, r0)
    if mode in ("plain", "residual"):
        out = torch.full((rows, hidden), float("nan"), dtype=dtype, device="cuda")
        res = ops.rms_norm(x, w, eps, residual=r, out=out)
        y = res[0] if r is not None else res
        assert y.data_ptr() == out.data_ptr()
        check_half(y, ref, dtype)
    elif mode == "static":
        s = torch.tensor([0.02], device="cuda")
        out = poisoned_fp8((rows, hidden), fmt)
        y, _ = ops.rms_norm(x, w, eps, residual=r, scale=s, fp8_format=fmt, out=out)
        assert y.data_ptr() == out.data_ptr()
        check_fp8(y, ref / np.float64(np.float32(0.02)), fmt)
    else:
        out = poisoned_fp8((rows, hidden), fmt)
        y, scales, _ = ops.rms_norm(x, w, eps, residual=r, quant="per_token", fp8_format=fmt, out=out)
        assert y.data_ptr() == out.data_ptr()
        amax = np.maximum(np.abs(ref).max(axis=-1, keepdims=True) if rows else np.zeros((0, 1)), 1e-12)
        s_ref = amax / C.fp8_max(fmt)
        rel = np.abs(f64(scales) / s_ref - 1) if rows else np.zeros(1)
        assert rel.max() <= 1e-6, f"scale relative error {rel.max():.3g}"
        check_fp8(y, ref / f64(scales), fmt)
    if r is not None:
        assert torch.equal(r, x + r0)


@pytest.mark.parametrize("hidden", [16384, 16392, 16388])
@pytest.mark.parametrize("rows", [1, 5, 8, 33])
@pytest.mark.parametrize("mode", ["plain", "static", "per_token"])
def test_rms_norm_split_rows(hidden, rows, mode):
    """Few rows split across a cluster of blocks (sm_90+): odd chunk counts, unaligned rows, every mode."""
    dtype = torch.bfloat16 if hidden % 8 else torch.float16
    torch.manual_seed(hidden + rows)
    x, w, r = rand((rows, hidden), dtype), rand((hidden,), dtype), rand((rows, hidden), dtype)
    r0 = r.clone()
    ref = rms_ref(x, w, 1e-6, r0)
    if mode == "plain":
        y, _ = ops.rms_norm(x, w, residual=r, out=poisoned((rows, hidden), dtype))
        check_half(y, ref, dtype)
    elif mode == "static":
        y, _ = ops.rms_norm(x, w, residual=r, scale=torch.tensor([0.02], device="cuda"), fp8_format="e4m3fn",
                            out=poisoned_fp8((rows, hidden), "e4m3fn"))
        check_fp8(y, ref / np.float64(np.float32(0.02)), "e4m3fn")
    else:
        y, scales, _ = ops.rms_norm(x, w, residual=r, quant="per_token", fp8_format="e4m3fn",
                                    out=poisoned_fp8((rows, hidden), "e4m3fn"))
        s_ref = np.maximum(np.abs(ref).max(axis=-1, keepdims=True), 1e-12) / C.fp8_max("e4m3fn")
        assert (np.abs(f64(scales) / s_ref - 1)).max() <= 1e-6
        check_fp8(y, ref / f64(scales), "e4m3fn")
    assert torch.equal(r, x + r0)


def test_eager_plan_rechecks_arguments():
    """A cached eager plan still checks every argument: a second call with a wrong one gets the full error."""
    x, w, r = rand((2, 4096), torch.float16), rand((4096,), torch.float16), rand((2, 4096), torch.float16)
    s = torch.tensor([0.05], device="cuda")
    ops.rms_norm(x, w, residual=r, scale=s)
    ops.swiglu(x, scale=s)
    with pytest.raises(TypeError, match="weight must have dtype float16"):
        ops.rms_norm(x, w.bfloat16(), residual=r, scale=s)
    with pytest.raises(ValueError, match="weight must be contiguous"):
        ops.rms_norm(x, rand((4096 * 2,), torch.float16)[::2], residual=r, scale=s)
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.rms_norm(x, rand((4095,), torch.float16), residual=r, scale=s)
    with pytest.raises(ValueError, match="residual must be contiguous"):
        ops.rms_norm(x, w, residual=rand((4096, 2), torch.float16).t(), scale=s)
    with pytest.raises(ValueError, match="scale must hold one element"):
        ops.rms_norm(x, w, residual=r, scale=torch.ones(2, device="cuda"))
    with pytest.raises(TypeError, match="scale must have dtype float32"):
        ops.swiglu(x, scale=s.double())
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        ops.swiglu(rand((4096, 2), torch.float16).t(), scale=s)
    y = ops.rms_norm(x[:, 1:-7].contiguous()[:, :4088], w[:4088], scale=s)  # other shape: a new plan
    assert y.shape == (2, 4088)


def test_rms_norm_saturation_and_nan():
    x, w = rand((4, 4096), torch.float16), rand((4096,), torch.float16)
    x[1, 5] = float("nan")
    y = ops.rms_norm(x, w, scale=torch.tensor([1e-5], device="cuda"), fp8_format="e4m3fn")
    ref = rms_ref(x, w, 1e-6) / np.float64(np.float32(1e-5))
    codes = y.view(torch.uint8).cpu().numpy()
    assert ((codes[0] & 0x7F) == 0x7E).mean() > 0.9  # saturated to +-448
    assert np.isnan(C.fp8_decode(codes[1], "e4m3fn")).all()  # a NaN poisons its row's rms
    check_fp8(y, ref, "e4m3fn")


def silu_ref(g_u):
    a = f64(g_u)
    d = a.shape[-1] // 2
    g, u = a[..., :d], a[..., d:]
    return g / (1 + np.exp(-g)) * u


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", HIDDEN)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mode", ["plain", "static", "per_token"])
def test_swiglu(dtype, d, rows, mode):
    torch.manual_seed(d + rows)
    x = rand((rows, 2 * d), dtype, 3.0)
    ref = silu_ref(x)
    fmt = "e4m3fnuz" if d % 2 else "e4m3fn"
    if mode == "plain":
        out = torch.full((rows, d), float("nan"), dtype=dtype, device="cuda")
        y = ops.swiglu(x, out=out)
        got, want = f64(y), ref
        nan = np.isnan(want)
        err = np.abs(got - want)
        # exp2 approximation: a couple of fp32 ulps before rounding to the dtype
        assert (err <= np.abs(want) * ULP[dtype] * 1.01 + 1e-5).all()
        assert not nan.any()
    elif mode == "static":
        y = ops.swiglu(x, scale=torch.tensor([0.05], device="cuda"), fp8_format=fmt, out=poisoned_fp8((rows, d), fmt))
        check_fp8(y, ref / np.float64(np.float32(0.05)), fmt)
    else:
        y, scales = ops.swiglu(x, quant="per_token", fp8_format=fmt, out=poisoned_fp8((rows, d), fmt))
        s_ref = np.maximum(np.abs(ref).max(axis=-1, keepdims=True) if rows else np.zeros((0, 1)), 1e-12) / C.fp8_max(fmt)
        assert np.allclose(f64(scales), s_ref, rtol=1e-6, atol=0)
        check_fp8(y, ref / f64(scales), fmt)


@pytest.mark.parametrize("d", [6656, 4100])
@pytest.mark.parametrize("rows", [1, 5, 130, 2048])
def test_swiglu_tiled_shapes(d, rows):
    """The (rows, tiles) grid at small and large batches, aligned and unaligned rows."""
    dtype = torch.float16
    torch.manual_seed(d * 7 + rows)
    x = rand((rows, 2 * d), dtype, 3.0)
    y = ops.swiglu(x, scale=torch.tensor([0.05], device="cuda"), fp8_format="e4m3fn",
                   out=poisoned_fp8((rows, d), "e4m3fn"))
    check_fp8(y, silu_ref(x) / np.float64(np.float32(0.05)), "e4m3fn")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 7168), (1, 7168), (37, 4096), (130, 1001), (300, 5120), (16, 8)])
@pytest.mark.parametrize("gran", ["static", "tensor", "token", "block"])
def test_quantize_fp8(dtype, shape, gran):
    torch.manual_seed(shape[0] + shape[1])
    x = rand(shape, dtype, 4.0)
    if x.numel():
        x.view(-1)[7 % x.numel()] = float("nan")
    a = f64(x)
    fmt = "e4m3fn" if shape[0] % 2 else "e4m3fnuz"
    m = C.fp8_max(fmt)
    if gran == "static":
        q, s = ops.quantize_fp8(x, scale=torch.tensor([0.01], device="cuda"), fp8_format=fmt)
        check_fp8(q, a / np.float64(np.float32(0.01)), fmt)
        return
    q, s = ops.quantize_fp8(x, granularity=gran, fp8_format=fmt)
    absx = np.where(np.isnan(a), 0, np.abs(a))  # amax ignores NaN (fmaxf)
    if gran == "tensor":
        s_ref = np.full((1,), max(absx.max() if absx.size else 0, 1e-12) / m)
    elif gran == "token":
        s_ref = np.maximum(absx.max(axis=-1, keepdims=True) if absx.size else np.zeros((shape[0], 1)), 1e-12) / m
    else:
        M, K = shape
        nb = -(-K // 128)
        pad = np.zeros((M, nb * 128))
        pad[:, :K] = absx
        s_ref = np.maximum(pad.reshape(M, nb, 128).max(-1), 1e-12) / m
    assert np.allclose(f64(s), s_ref, rtol=1e-6, atol=0)
    if x.numel():
        div = f64(s).repeat(128, axis=1)[:, :shape[1]] if gran == "block" else f64(s)
        check_fp8(q, a / div, fmt)


def blocks_ref(a, m, axis_rows):
    """Scales of 128-blocks along columns (1x128, axis_rows=False) or rows (128x1, True)."""
    M, K = a.shape
    absx = np.abs(a)
    if axis_rows:
        nb = -(-M // 128)
        pad = np.zeros((nb * 128, K))
        pad[:M] = absx
        return np.maximum(pad.reshape(nb, 128, K).max(1), 1e-12) / m
    nb = -(-K // 128)
    pad = np.zeros((M, nb * 128))
    pad[:, :K] = absx
    return np.maximum(pad.reshape(M, nb, 128).max(-1), 1e-12) / m


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7168), (256, 1024), (300, 1001), (129, 4096)])
@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_dual_and_weight(dtype, shape, fmt):
    x = rand(shape, dtype, 2.0)
    a = f64(x)
    m = C.fp8_max(fmt)
    M, K = shape
    q_row, s_row, q_col, s_col = ops.quantize_fp8_dual(x, fp8_format=fmt)
    sr, sc = blocks_ref(a, m, False), blocks_ref(a, m, True)
    assert np.allclose(f64(s_row), sr, rtol=1e-6, atol=0)
    assert np.allclose(f64(s_col), sc, rtol=1e-6, atol=0)
    check_fp8(q_row, a / f64(s_row).repeat(128, axis=1)[:, :K], fmt)
    check_fp8(q_col, a / f64(s_col).repeat(128, axis=0)[:M], fmt)
    q, s = ops.quantize_fp8_weight(x, fp8_format=fmt)
    nb_r, nb_c = -(-M // 128), -(-K // 128)
    pad = np.zeros((nb_r * 128, nb_c * 128))
    pad[:M, :K] = np.abs(a)
    st = np.maximum(pad.reshape(nb_r, 128, nb_c, 128).max((1, 3)), 1e-12) / m
    assert np.allclose(f64(s), st, rtol=1e-6, atol=0)
    check_fp8(q, a / np.repeat(np.repeat(f64(s), 128, 0), 128, 1)[:M, :K], fmt)


# the dual quantizer on shapes of a few hundred 128 x 128 tiles with tails in both dimensions, both layouts of the
# column blocks (transpose_col=True: the [K, M] copy and [K, ceil(M/128)] scale view FP8Linear's wgrad reads).
# 2096 x 1032 and 4224 x 4104 take the aligned transposed path (M a multiple of 16; on NVIDIA the streamed kernel,
# whose persistent blocks walk 1089 tiles of the second several times each) over 9 and 33 column tiles: the grouped
# tile order (groups of 8 column tiles) ends on a group of one
@pytest.mark.parametrize("shape", [(2100, 2100), (4100, 1030), (2096, 1032), (4224, 4104)])
@pytest.mark.parametrize("transpose_col", [False, True])
@pytest.mark.parametrize("fmt", FMTS)
def test_quantize_dual_large_with_tails(shape, transpose_col, fmt):
    M, K = shape
    torch.manual_seed(M + K)
    x = rand(shape, torch.bfloat16, 3.0)
    a = f64(x)
    m = C.fp8_max(fmt)
    q_row, s_row, q_col, s_col = ops.quantize_fp8_dual(x, fp8_format=fmt, transpose_col=transpose_col)
    if transpose_col:
        assert q_col.shape == (K, M) and s_col.shape == (K, -(-M // 128))
        q_col, s_col = q_col.t(), s_col.t()
    sr, sc = blocks_ref(a, m, False), blocks_ref(a, m, True)
    assert np.allclose(f64(s_row), sr, rtol=1e-6, atol=0)
    assert np.allclose(f64(s_col), sc, rtol=1e-6, atol=0)
    check_fp8(q_row, a / f64(s_row).repeat(128, axis=1)[:, :K], fmt)
    check_fp8(q_col, a / f64(s_col).repeat(128, axis=0)[:M], fmt)


def _act64(name, z, g=None):
    """float64 activation (g given: g * act'(z)), the formulas torch's kernels use."""
    s2 = math.sqrt(2.0)
    if name == "gelu":
        cdf = 0.5 * (1 + torch.erf(z / s2))
        return z * cdf if g is None else g * (cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))
    if name == "gelu_tanh":
        k, c = math.sqrt(2 / math.pi), 0.044715
        t = torch.tanh(k * (z + c * z ** 3))
        return 0.5 * z * (1 + t) if g is None else g * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * c * z * z))
    if name == "silu":
        sig = torch.sigmoid(z)
        return z * sig if g is None else g * sig * (1 + z * (1 - sig))
    return z.clamp_min(0) if g is None else g * (z > 0).double()


def _dirty_allocator():
    """Fill blocks of torch's caching allocator (both pools) with 0xff and free them: the outputs an op allocates
    next start as NaN codes / NaN floats, so an element a kernel leaves unwritten fails the checks."""
    junk = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in [1 << 26] + [1 << 19] * 16]
    del junk


def _unsigned_zeros(q, values, fmt):
    """(q, values) with -0 made +0 on both sides (e4m3fn): where the activation's value is zero or underflows, the
    sign of that zero is arithmetic's choice (relu's backward gives +0 where g * 0 would give -0; tanh-GELU's
    derivative is exactly 0 in fp32 where float64 still has a tiny value of the other sign)."""
    assert fmt == "e4m3fn"
    codes = q.view(torch.uint8).clone()
    codes[codes == 0x80] = 0
    return codes.view(q.dtype), np.where(C.fp8_reference(values, fmt) == 0x80, 0.0, values)


# the activation fused into the dual quantizer (an MLP's act(z) forward, g * act'(z) backward), every activation,
# against float64 references rounded to x's dtype as the kernel rounds them: the unaligned kernel (K % 8 != 0), the
# aligned one with M % 16 != 0 (transposed columns take the per-tile kernel; its last column block holds 8 rows: a
# block of one row, in the tail of GELU where fp32's 1 + erf(x) cancels as in torch, would take its scale from that
# error), and the streamed kernel (with grad its ring holds both operands) over tails in both dimensions
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu"])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("shape, dtype, transpose_col", [((300, 1001), torch.bfloat16, True),
                                                          ((136, 4096), torch.float16, True),
                                                          ((2096, 1032), torch.bfloat16, True),
                                                          ((1040, 776), torch.bfloat16, False)])
def test_quantize_dual_fused_activation(activation, backward, shape, dtype, transpose_col):
    M, K = shape
    torch.manual_seed(M * 7 + K)
    fmt = "e4m3fn"
    z = rand(shape, dtype, 2.5)
    g = rand(shape, dtype, 1.5) if backward else None
    ref = _act64(activation, z.double(), None if g is None else g.double()).to(dtype).double()
    a = ref.cpu().numpy()
    m = C.fp8_max(fmt)
    results = []
    for _ in range(2):                       # the second call replays the first one's plan
        _dirty_allocator()
        out = ops.quantize_fp8_dual(z, fp8_format=fmt, transpose_col=transpose_col, activation=activation, grad=g)
        results.append(out)
        q_row, s_row, q_col, s_col = out
        if transpose_col:
            assert q_col.shape == (K, M)
            q_col, s_col = q_col.t(), s_col.t()
        # fp32 vs float64 activation can round a value to the neighbouring half-precision number (subnormals
        # included): scales to one ulp
        tiny = (2.0 ** -24 if dtype == torch.float16 else 0.0) / m
        assert np.allclose(f64(s_row), blocks_ref(a, m, False), rtol=ULP[dtype], atol=tiny)
        assert np.allclose(f64(s_col), blocks_ref(a, m, True), rtol=ULP[dtype], atol=tiny)
        check_fp8(*_unsigned_zeros(q_row, a / f64(s_row).repeat(128, axis=1)[:, :K], fmt), fmt)
        check_fp8(*_unsigned_zeros(q_col, a / f64(s_col).repeat(128, axis=0)[:M], fmt), fmt)
    for first, again in zip(*results):
        assert torch.equal(first.view(torch.uint8) if first.element_size() == 1 else first,
                           again.view(torch.uint8) if again.element_size() == 1 else again)
    if activation == "gelu" and not backward:   # torch's own gelu quantized unfused: the same result
        plain = ops.quantize_fp8_dual(torch.nn.functional.gelu(z), fp8_format=fmt, transpose_col=transpose_col)
        diff = (plain[0].view(torch.uint8) != results[0][0].view(torch.uint8)).float().mean().item()
        assert diff < 1e-3, diff


def test_quantize_dual_fused_activation_checks():
    z = rand((64, 256), torch.bfloat16)
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.quantize_fp8_dual(z, activation="tanh")
    with pytest.raises(ValueError, match="needs activation="):
        ops.quantize_fp8_dual(z, grad=z.clone())
    with pytest.raises(ValueError, match="grad must have shape"):
        ops.quantize_fp8_dual(z, activation="gelu", grad=z[:32].clone())
    with pytest.raises(TypeError, match="grad must have dtype"):
        ops.quantize_fp8_dual(z, activation="gelu", grad=z.half())
    # the gradient may be x itself (one object in two places: no plan is recorded, the result is still right)
    a = _act64("silu", z.double(), z.double()).to(torch.bfloat16).double().cpu().numpy()
    q_row, s_row, _, _ = ops.quantize_fp8_dual(z, activation="silu", grad=z)
    check_fp8(*_unsigned_zeros(q_row, a / f64(s_row).repeat(128, axis=1)[:, :256], "e4m3fn"), "e4m3fn")


# quantize_fp8_dual(columns=False), the row blocks alone (an inference or frozen-weight forward): bit-identical to the
# dual call's row outputs, on the per-tile kernel's 16- and 64-row tiles (M <= 2048 and above), aligned or not, with
# and without a fused activation or its backward; outputs start as NaN codes, and the second call replays the plan
@pytest.mark.parametrize("shape, dtype", [((300, 1001), torch.bfloat16), ((136, 4096), torch.float16),
                                          ((2096, 1032), torch.bfloat16), ((4100, 1030), torch.float16)])
@pytest.mark.parametrize("activation, backward", [(None, False), ("gelu", False), ("relu", True)])
def test_quantize_rows_only_matches_the_dual(shape, dtype, activation, backward):
    M, K = shape
    torch.manual_seed(M + K)
    z = rand(shape, dtype, 2.5)
    g = rand(shape, dtype, 1.5) if backward else None
    q_ref, s_ref, _, _ = ops.quantize_fp8_dual(z, activation=activation, grad=g)
    for _ in range(2):
        _dirty_allocator()
        q, s, q_col, s_col = ops.quantize_fp8_dual(z, activation=activation, grad=g, columns=False)
        assert q_col is None and s_col is None
        assert s.shape == s_ref.shape and s.stride() == s_ref.stride() == (1, M)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


def test_quantize_rows_only_checks():
    z = rand((64, 256), torch.bfloat16)
    with pytest.raises(ValueError, match="columns=False makes none"):
        ops.quantize_fp8_dual(z, transpose_col=True, columns=False)
    with pytest.raises(TypeError, match="columns must be True or False"):
        ops.quantize_fp8_dual(z, columns=None)


def test_numpy_inputs_return_numpy():
    x = np.random.default_rng(0).standard_normal((5, 256)).astype(np.float16)
    w = np.ones(256, np.float16)
    y = ops.rms_norm(x, w)
    assert isinstance(y, np.ndarray) and y.dtype == np.float16
    q, s = ops.quantize_fp8(x.astype(np.float16), granularity="token")
    assert isinstance(q, np.ndarray) and isinstance(s, np.ndarray)


def test_cuda_graph_capture_replays_on_new_data():
    x, w, r = rand((8, 4096), torch.float16), rand((4096,), torch.float16), rand((8, 4096), torch.float16)
    s = torch.tensor([0.05], device="cuda")
    ops.rms_norm(x, w, residual=r.clone(), scale=s)  # compile + load outside capture
    ops.swiglu(x, scale=s)
    g = torch.cuda.CUDAGraph()
    r_in = r.clone()
    with torch.cuda.graph(g):
        y, _ = ops.rms_norm(x, w, residual=r_in, scale=s)
        z = ops.swiglu(x, scale=s)
    x.copy_(rand((8, 4096), torch.float16))
    r_in.copy_(r)
    for t in (y, z):                  # outputs live in the graph's pool: poison them so only the replay can pass
        t.view(torch.uint8).fill_(NAN_CODE["e4m3fn"])
    g.replay()
    torch.cuda.synchronize()
    check_fp8(y, rms_ref(x, w, 1e-6, r) / np.float64(np.float32(0.05)), "e4m3fn")
    check_fp8(z, silu_ref(x) / np.float64(np.float32(0.05)), "e4m3fn")


def test_torch_compile_fullgraph():
    def block(x, r, w, s):
        q, res = ops.rms_norm(x, w, residual=r, scale=s)
        y = ops.swiglu(torch.cat([res, res], dim=-1), scale=s)
        q2, s2 = ops.quantize_fp8(res, granularity="block")
        return q, y, q2, s2

    x, w = rand((16, 1024), torch.float16), rand((1024,), torch.float16)
    r = rand((16, 1024), torch.float16)
    s = torch.tensor([0.05], device="cuda")
    r0 = r.clone()
    q, y, q2, s2 = torch.compile(block, fullgraph=True)(x, r, w, s)
    h = x + r0                        # the rounded sum, written back into r in place
    assert torch.equal(r, h)
    inv = np.float64(np.float32(0.05))
    check_fp8(q, rms_ref(x, w, 1e-6, r0) / inv, "e4m3fn")
    check_fp8(y, silu_ref(torch.cat([h, h], dim=-1)) / inv, "e4m3fn")
    s_ref = blocks_ref(f64(h), C.fp8_max("e4m3fn"), False)
    assert np.allclose(f64(s2), s_ref, rtol=1e-6, atol=0)
    check_fp8(q2, f64(h) / f64(s2).repeat(128, axis=1)[:, :1024], "e4m3fn")


def test_errors_name_the_argument():
    x = rand((4, 64), torch.float16)
    with pytest.raises(TypeError, match="weight must have dtype float16"):
        ops.rms_norm(x, rand((64,), torch.bfloat16))
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.rms_norm(x, rand((32,), torch.float16))
    with pytest.raises(ValueError, match="x must be contiguous"):
        ops.rms_norm(rand((64, 4), torch.float16).t(), rand((64,), torch.float16))
    with pytest.raises(ValueError, match="even last dimension"):
        ops.swiglu(rand((4, 63), torch.float16))
    with pytest.raises(ValueError, match="block must be 128"):
        ops.quantize_fp8(x, granularity="block", block=64)
