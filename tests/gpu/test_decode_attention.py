"""Decode attention on the GPU against a float64 reference: random data, poisoned outputs, every element checked,
grouped-query heads, masks, causal rows, split caches, strided inputs, graphs and torch.compile."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from rocjit import ops  # noqa: E402
from rocjit.ops import attention as A  # noqa: E402
from rocjit.ops import _common as C  # noqa: E402

TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}


def rand(shape, dtype):
    return torch.randn(shape, dtype=torch.float32, device="cuda").to(dtype)


def reference(q, k, v, mask=None, scale=None, causal=False):
    """float64 on the host: [B, S, Hq, D]."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    B, hq, S, D = q.shape
    g = hq // k.shape[1]
    L = k.shape[2]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    if mask is not None:
        m = mask.cpu()
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.double()
    if causal:
        allowed = torch.arange(L)[None, :] <= (L - S + torch.arange(S))[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)         # rows with every key masked: zeros, as the op documents
    return (p @ v).transpose(1, 2).numpy()


def check(got, ref, dtype):
    got = got.detach().double().cpu().numpy()
    assert got.shape == ref.shape
    assert np.isfinite(got).all()
    err = np.abs(got - ref)
    tol = TOL[dtype] * (1 + np.abs(ref))
    assert (err <= tol).all(), f"max err {err.max()} (ref {ref.flat[err.argmax()]})"


def poisoned(B, S, hq, D, dtype):
    return torch.full((B, S, hq, D), float("nan"), dtype=dtype, device="cuda")


CASES = [  # B, Hq, Hkv, S, L, D
    (1, 32, 8, 1, 80, 128),       # Llama-8B decode over a short static cache
    (1, 32, 8, 1, 4099, 128),     # long cache: split across blocks, a partial last split
    (3, 28, 4, 1, 517, 128),      # Qwen2-7B's 7 query heads per key / value head (a padded row group)
    (2, 16, 16, 3, 133, 64),      # multi-head, three query rows
    (1, 8, 2, 5, 61, 96),         # a head dimension that is not a power of two
    (2, 8, 1, 2, 300, 256),       # multi-query, the largest head dimension
    (1, 64, 8, 4, 1000, 128),     # 32 rows per key / value head: several row groups
    (1, 4, 4, 1, 1, 128),         # one key
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_against_float64(case, dtype):
    B, hq, hkv, S, L, D = case
    torch.manual_seed(hash(case) % 1000)
    q, k, v = rand((B, hq, S, D), dtype), rand((B, hkv, L, D), dtype), rand((B, hkv, L, D), dtype)
    out = ops.decode_attention(q, k, v, out=poisoned(B, S, hq, D, dtype))
    check(out, reference(q, k, v), dtype)
    got = ops.decode_attention(q, k, v)                     # allocated output (a second call replays a plan)
    check(got, reference(q, k, v), dtype)
    check(ops.decode_attention(q, k, v, causal=True), reference(q, k, v, causal=True), dtype)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks_broadcast_and_strided_inputs(kind):
    dtype = torch.bfloat16
    B, hq, hkv, S, L, D = 2, 32, 8, 2, 700, 128
    # q as the model makes it: [B, S, Hq, D] transposed; k / v slices of a larger static cache
    q = rand((B, S, hq, D), dtype).transpose(1, 2)
    cache_k, cache_v = rand((B, hkv, L + 37, D), dtype), rand((B, hkv, L + 37, D), dtype)
    k, v = cache_k[:, :, :L], cache_v[:, :, :L]
    valid = torch.rand((B, 1, S, L), device="cuda") > 0.3
    if kind == "bool":
        valid[1, :, 1] = False                              # one row sees no key at all: zeros
    mask = valid if kind == "bool" else torch.where(valid, rand((B, 1, S, L), dtype) * 0.5,
                                                    torch.tensor(torch.finfo(dtype).min, dtype=dtype, device="cuda"))
    ref = reference(q, k, v, mask=mask.expand(B, hq, S, L) if kind == "bool" else mask)
    out = ops.decode_attention(q, k, v, mask, out=poisoned(B, S, hq, D, dtype))
    check(out, ref, dtype)
    if kind == "bool":
        assert (out[1, 1] == 0).all()
    # a per-head mask, and a mask without leading dimensions
    mh = torch.rand((B, hq, S, L), device="cuda") > 0.5
    check(ops.decode_attention(q, k, v, mh), reference(q, k, v, mask=mh), dtype)
    m2 = torch.rand((S, L), device="cuda") > 0.5
    check(ops.decode_attention(q, k, v, m2), reference(q, k, v, mask=m2.expand(B, hq, S, L)), dtype)


def test_unaligned_inputs_and_scale():
    dtype = torch.float16
    base = rand((1 * 8 * 1 * 64 + 3,), dtype)
    q = base[3:].view(1, 8, 1, 64)                          # not 16-byte aligned
    k, v = rand((1, 2, 45, 64), dtype), rand((1, 2, 45, 64), dtype)
    check(ops.decode_attention(q, k, v, scale=0.3), reference(q, k, v, scale=0.3), dtype)


def test_split_configs_agree():
    """Every split count the host could pick gives the same result (the merge is exact up to rounding)."""
    dtype = torch.bfloat16
    q, k, v = rand((1, 32, 1, 128), dtype), rand((1, 8, 2000, 128), dtype), rand((1, 8, 2000, 128), dtype)
    ref = reference(q, k, v)
    real = A.kernel_config
    try:
        for n in (1, 2, 5, 31):
            def fixed(B, hq, hkv, S, L, D, wave, sms, n=n, **kw):
                k_rows, groups, warps, unroll, _, _ = real(B, hq, hkv, S, L, D, wave, sms, **kw)
                per = C.ceil_div(L, n)
                return k_rows, groups, warps, unroll, per, C.ceil_div(L, per)
            A.kernel_config = fixed
            check(A._run(A.UNRECORDED, q, k, v, None, 128 ** -0.5, False, None), ref, dtype)
    finally:
        A.kernel_config = real


@pytest.mark.parametrize("S,rope", [(1, False), (3, False), (1, True)])      # the rotary step takes one token
def test_rows_per_block_configs_agree(S, rope):
    """4, 2 or 1 query rows per block (a short cache spreads its rows over more blocks), with every unroll the
    host may pick for them, each against float64: grouped heads, several query rows, the rotary step."""
    dtype = torch.bfloat16
    B, hq, hkv, L, D = 2, 32, 8, 75, 128
    torch.manual_seed(S)
    real = A.kernel_config
    try:
        for k_rows in (4, 2, 1):
            for unroll in ((1, 2) if k_rows == 4 and rope else (1, 2, 3) if k_rows == 4 else (1, 3, 4)):
                def fixed(B, hq, hkv, S, L, D, wave, sms, k_rows=k_rows, unroll=unroll, **kw):
                    warps = real(B, hq, hkv, S, L, D, wave, sms, **kw)[2]
                    return k_rows, C.ceil_div((hq // hkv) * S, k_rows), warps, unroll, L, 1
                A.kernel_config = fixed
                # the full path (no recorded plan: each config is launched as chosen)
                if rope:
                    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, 50)
                    out = A._run(A.UNRECORDED, q, kc, vc, None, D ** -0.5, False, poisoned(B, 1, hq, D, dtype),
                                 rope=(k, v, cos, sin, p), advance=True)
                    assert p.item() == 51
                    check(out, reference(rotate(q, cos, sin), kc, vc), dtype)
                else:
                    q, k, v = rand((B, hq, S, D), dtype), rand((B, hkv, L, D), dtype), rand((B, hkv, L, D), dtype)
                    out = A._run(A.UNRECORDED, q, k, v, None, D ** -0.5, True, poisoned(B, S, hq, D, dtype))
                    check(out, reference(q, k, v, causal=True), dtype)
    finally:
        A.kernel_config = real


def test_cuda_graph_replays_on_new_data():
    dtype = torch.bfloat16
    q, k, v = rand((1, 32, 1, 128), dtype), rand((1, 8, 3000, 128), dtype), rand((1, 8, 3000, 128), dtype)
    mask = torch.rand((1, 1, 1, 3000), device="cuda") > 0.2
    ops.decode_attention(q, k, v, mask)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.decode_attention(q, k, v, mask)
    for t in (q, k, v):
        t.copy_(rand(t.shape, dtype))
    mask.copy_(torch.rand((1, 1, 1, 3000), device="cuda") > 0.6)
    out.fill_(float("nan"))
    g.replay()
    check(out, reference(q, k, v, mask=mask.expand(1, 32, 1, 3000)), dtype)


def test_torch_compile_fullgraph():
    dtype = torch.bfloat16
    q, k, v = rand((1, 32, 1, 128), dtype), rand((1, 8, 77, 128), dtype), rand((1, 8, 77, 128), dtype)
    mask = torch.rand((1, 1, 1, 77), device="cuda") > 0.2

    def f(q, k, v, mask):
        return ops.decode_attention(q * 1.0, k, v, mask, scale=0.1).reshape(1, 1, -1) + 0

    got = torch.compile(f, fullgraph=True)(q, k, v, mask)
    check(got.view(1, 1, 32, 128), reference(q, k, v, mask=mask.expand(1, 32, 1, 77), scale=0.1), dtype)


def test_errors_name_the_argument():
    dtype = torch.bfloat16
    q, k, v = rand((1, 32, 1, 128), dtype), rand((1, 8, 9, 128), dtype), rand((1, 8, 9, 128), dtype)
    with pytest.raises(ValueError, match="heads must be a multiple"):
        ops.decode_attention(q, rand((1, 5, 9, 128), dtype), rand((1, 5, 9, 128), dtype))
    with pytest.raises(ValueError, match="v must have k's shape"):
        ops.decode_attention(q, k, rand((1, 8, 10, 128), dtype))
    with pytest.raises(TypeError, match="k must have dtype"):
        ops.decode_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="mask must broadcast"):
        ops.decode_attention(q, k, v, torch.ones((1, 1, 1, 10), dtype=torch.bool, device="cuda"))
    with pytest.raises(TypeError, match="mask must have dtype"):
        ops.decode_attention(q, k, v, torch.ones((1, 1, 1, 9), dtype=torch.float32, device="cuda"))
    with pytest.raises(ValueError, match="contiguous last dimension"):
        ops.decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v)
    with pytest.raises(ValueError, match="head dimension"):
        ops.decode_attention(rand((1, 8, 1, 12), dtype), rand((1, 8, 3, 12), dtype), rand((1, 8, 3, 12), dtype))
    with pytest.raises(ValueError, match="out must have shape"):
        ops.decode_attention(q, k, v, out=poisoned(1, 1, 32, 64, dtype))
    with pytest.raises(ValueError, match="q must be on a GPU"):
        ops.decode_attention(q.cpu(), k.cpu(), v.cpu())
    with pytest.raises(ValueError, match="k is on"):
        ops.decode_attention(q, k.cpu(), v)


# ----------------------------------------------------------------------------- decode_attention_rope
def rotate(x, cos, sin):
    """float64 rotary embedding, rotate-half convention: x [B, H, 1, D], cos / sin [B or 1, 1, D]."""
    x, c, s = (t.detach().double().cpu() for t in (x, cos, sin))
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * c[:, None] + rot * s[:, None]


def rope_case(B, hq, hkv, L, D, dtype, pos, cos_batch=True):
    qkv = rand((B, 1, (hq + 2 * hkv) * D), dtype)        # the projections' output, as a model splits it
    q, k, v = qkv.view(B, 1, hq + 2 * hkv, D).split([hq, hkv, hkv], dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ang = torch.rand((B if cos_batch else 1, 1, D // 2), device="cuda") * 6.3
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    kc, vc = rand((B, hkv, L, D), dtype), rand((B, hkv, L, D), dtype)
    return q, k, v, cos, sin, kc, vc, torch.tensor([pos], device="cuda")


ROPE_CASES = [  # B, Hq, Hkv, L, D, position
    (1, 32, 8, 72, 128, 40),      # Llama-8B decode over a static cache, the new token mid-cache
    (1, 32, 8, 4099, 128, 4098),  # long cache split across blocks: the new key in the partial last split
    (3, 28, 4, 517, 128, 0),      # Qwen2-7B heads, the first position
    (2, 8, 1, 300, 256, 150),     # multi-query, the largest head dimension
    (1, 8, 2, 61, 64, 60),        # the last position
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_against_float64(case, dtype):
    B, hq, hkv, L, D, pos = case
    torch.manual_seed(sum(case))
    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, pos, cos_batch=B > 1)
    kc0, vc0 = kc.clone(), vc.clone()
    # a causal mask over the filled part of the cache, as a model's static cache has it (later slots hold junk)
    mask = (torch.arange(L, device="cuda") <= pos)[None, None, None, :]
    out = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p, mask, out=poisoned(B, 1, hq, D, dtype))
    k_rot = rotate(k, cos, sin)
    # the caches: the new key (rotated, rounded to the cache's dtype) and value at pos, every other row untouched
    want_k, want_v = kc0.clone(), vc0.clone()
    want_k[:, :, pos] = k_rot[:, :, 0].to(dtype).cuda()
    want_v[:, :, pos] = v[:, :, 0]
    assert torch.equal(vc, want_v)
    kerr = (kc.double() - want_k.double()).abs()
    assert (kerr <= TOL[dtype] * (1 + want_k.double().abs())).all()
    assert torch.equal(torch.cat([kc[:, :, :pos], kc[:, :, pos + 1:]], 2),
                       torch.cat([kc0[:, :, :pos], kc0[:, :, pos + 1:]], 2))
    ref = reference(rotate(q, cos, sin), kc, vc, mask)    # q rotated in float64, the cache as written
    check(out, ref, dtype)


def test_rope_matches_the_unfused_ops_and_refuses_bad_input():
    """The same step through decode_attention (rotation and cache write in torch) gives the same output; bad
    arguments get named errors; a position outside the cache writes nothing and gives NaN."""
    dtype = torch.bfloat16
    B, hq, hkv, L, D, pos = 2, 16, 4, 90, 128, 33
    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, pos)
    kc2, vc2 = kc.clone(), vc.clone()
    got = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p)
    kc2[:, :, pos] = rotate(k, cos, sin)[:, :, 0].to(dtype).cuda()
    vc2[:, :, pos] = v[:, :, 0]
    check(got, reference(rotate(q, cos, sin), kc2, vc2), dtype)
    with pytest.raises(ValueError, match="position must hold one element"):
        ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, torch.tensor([1, 2], device="cuda"))
    with pytest.raises(TypeError, match="position must have dtype int64"):
        ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p.int())
    with pytest.raises(ValueError, match="one new token"):
        ops.decode_attention_rope(torch.cat([q, q], 2), k, v, cos, sin, kc, vc, p)
    with pytest.raises(ValueError, match=r"cos must be \[B or 1, 1, D\]"):
        ops.decode_attention_rope(q, k, v, cos[..., :64], sin[..., :64], kc, vc, p)
    with pytest.raises(ValueError, match="k must have shape"):
        ops.decode_attention_rope(q, k[:1], v, cos, sin, kc, vc, p)
    with pytest.raises(ValueError, match="different tensors"):
        ops.decode_attention_rope(q, k, v, cos, sin, kc, kc, p)
    before_k, before_v = kc.clone(), vc.clone()
    for bad in (L, -1):
        out = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, torch.tensor([bad], device="cuda"))
        assert torch.isnan(out).all()
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)


def test_rope_under_compile_and_graph():
    """torch.compile(fullgraph) with the caches as mutated inputs, and a CUDA graph replayed with a new position:
    each against float64."""
    dtype = torch.bfloat16
    B, hq, hkv, L, D = 1, 32, 8, 64, 128
    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, 5)

    def step(q, k, v, cos, sin, kc, vc, p):
        return ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p) * 1.0
    f = torch.compile(step, fullgraph=True)
    for pos in (5, 6, 7):
        p.fill_(pos)
        kc0 = kc.clone()
        got = f(q, k, v, cos, sin, kc, vc, p)
        kc0[:, :, pos] = rotate(k, cos, sin)[:, :, 0].to(dtype).cuda()
        assert torch.equal(vc[:, :, pos], v[:, :, 0])
        check(got, reference(rotate(q, cos, sin), kc, vc), dtype)
        assert ((kc.double() - kc0.double()).abs() <= 2e-2 * (1 + kc0.double().abs())).all()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p)
    for pos in (20, 41):
        p.fill_(pos)
        out.fill_(float("nan"))
        g.replay()
        assert torch.equal(vc[:, :, pos], v[:, :, 0])
        check(out, reference(rotate(q, cos, sin), kc, vc), dtype)


@pytest.mark.parametrize("case", [(1, 32, 8, 72, 128, 40), (1, 32, 8, 4099, 128, 4098), (3, 28, 4, 517, 128, 0)])
def test_rope_advance_grows_the_position_once(case):
    """advance=True: the same output and caches as without it, and the position one further (the blocks of a
    split cache, several sequences and row groups each counting once); a 0-dim position, as a static cache
    layer keeps its length, too."""
    dtype = torch.bfloat16
    B, hq, hkv, L, D, pos = case
    torch.manual_seed(sum(case))
    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, pos, cos_batch=B > 1)
    kc2, vc2 = kc.clone(), vc.clone()
    mask = (torch.arange(L, device="cuda") <= pos)[None, None, None, :]
    want = ops.decode_attention_rope(q, k, v, cos, sin, kc2, vc2, p.clone(), mask)
    p0 = torch.tensor(pos, device="cuda")                 # 0-dim
    got = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p0, mask, out=poisoned(B, 1, hq, D, dtype),
                                    advance=True)
    assert p0.item() == pos + 1
    assert torch.equal(got, want) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    check(got, reference(rotate(q, cos, sin), kc, vc, mask), dtype)


def test_rope_advance_out_of_range_and_repeated_in_a_graph():
    """A position outside the cache still gives NaN, writes nothing and grows by one (-1 -> 0, L -> L + 1); a CUDA
    graph replayed five times writes five successive cache rows, each step's output against float64."""
    dtype = torch.bfloat16
    B, hq, hkv, L, D = 2, 16, 4, 90, 128
    q, k, v, cos, sin, kc, vc, p = rope_case(B, hq, hkv, L, D, dtype, 0)
    before_k, before_v = kc.clone(), vc.clone()
    for bad in (L, -1, -(2 ** 31)):
        pb = torch.tensor([bad], device="cuda")
        out = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, pb, advance=True)
        assert torch.isnan(out).all() and pb.item() == bad + 1
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)
    with pytest.raises(TypeError, match="advance must be a bool"):
        ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p, advance=1)
    p.fill_(30)
    g = torch.cuda.CUDAGraph()
    kc_cap, vc_cap = kc.clone(), vc.clone()
    with torch.cuda.graph(g):
        out = ops.decode_attention_rope(q, k, v, cos, sin, kc, vc, p, advance=True)
    kc.copy_(kc_cap)
    vc.copy_(vc_cap)
    p.fill_(30)                       # capture launched nothing: the position is where it was set
    k_rot = rotate(k, cos, sin)[:, :, 0].to(dtype).cuda()
    for step in range(5):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert p.item() == 31 + step
        assert torch.equal(vc[:, :, 30 + step], v[:, :, 0])
        assert ((kc[:, :, 30 + step].double() - k_rot.double()).abs() <= 2e-2 * (1 + k_rot.double().abs())).all()
        check(out, reference(rotate(q, cos, sin), kc, vc), dtype)
    assert torch.equal(kc[:, :, 35:], kc_cap[:, :, 35:]) and torch.equal(kc[:, :, :30], kc_cap[:, :, :30])
