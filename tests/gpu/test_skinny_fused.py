"""Fused skinny-GEMM epilogues on the GPU against float64 references: gate/up + SwiGLU (+ static FP8) and
down + residual, on every kernel path (mma with and without grid split-K, stream, tma, wgmma, gemv.hip's portable
kernel), through the ops, their eager plans, CUDA graphs and torch.compile."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import rocjit.ops as ops  # noqa: E402
from rocjit.ops import _gemm as G  # noqa: E402
from rocjit.ops import skinny  # noqa: E402

F8 = torch.float8_e4m3fn


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _silu(x):
    return x / (1 + torch.exp(-x))


def _gate_up_case(dt, M, inter, K, seed, per_channel=True):
    """a, interleaved w, scale_a, interleaved scale_w, float64 reference of silu(gate) * up [M, inter]."""
    g = _gen(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    gate = torch.randn(inter, K, device="cuda", generator=g)
    up = torch.randn(inter, K, device="cuda", generator=g)
    if dt == F8:
        a, gate, up = (a * 3).to(F8), (gate * 3).to(F8), (up * 3).to(F8)
        sa = torch.tensor([0.37], device="cuda")
        gs = torch.rand(inter if per_channel else 1, device="cuda", generator=g) * 0.05 + 0.02
        us = torch.rand(inter if per_channel else 1, device="cuda", generator=g) * 0.05 + 0.02
        w, sw = ops.prepare_gate_up(gate, up, gs, us)
        gd = (a.double() @ gate.double().t()) * 0.37 * gs.double()
        ud = (a.double() @ up.double().t()) * 0.37 * us.double()
    else:
        a, gate, up = a.to(dt), gate.to(dt), up.to(dt)
        sa = sw = None
        w, _ = ops.prepare_gate_up(gate, up)
        gd, ud = a.double() @ gate.double().t(), a.double() @ up.double().t()
    return a, w, sa, sw, _silu(gd) * ud


def _check_fp8(out, ref_scaled):
    """FP8 e4m3 output against the float64 value it encodes: within one rounding (half an ulp = 2^-4 relative,
    with slack for fp32 on the way), every element."""
    assert out.dtype == F8
    y = out.double()
    assert not torch.isnan(y).any(), "output left unwritten (poison visible)"
    err = (y - ref_scaled).abs()
    bad = err > 0.07 * ref_scaled.abs() + 2.0 ** -8
    assert not bad.any(), f"{int(bad.sum())} elements off, worst {float(err.max())}"


def _check_half(out, ref, rel):
    y = out.double()
    assert not torch.isnan(y).any(), "output left unwritten (poison visible)"
    scale = ref.abs().max()
    bad = (y - ref).abs() > rel * ref.abs() + 1e-4 * scale
    assert not bad.any(), f"{int(bad.sum())} elements off, worst {float((y - ref).abs().max())}"


def _poisoned(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device="cuda")
    t.view(torch.uint8).fill_(0xFF)                      # NaN in fp8 e4m3fn, bf16 and fp16 alike
    return t


def _configs(M, N, K, eb, swiglu=False):
    target, _, sms = skinny._device(0)
    cfgs = skinny.mma_candidates(M, N, K, sms, eb) + G.portable_skinny_candidates(M, target, swiglu)
    if skinny.has_stream_path(target):
        cfgs = skinny.stream_candidates(M, N, K, sms, eb) + cfgs
    if skinny.has_tma_path(target):
        cfgs = skinny.tma_candidates(M, N, K, sms, eb) + cfgs
    if skinny.has_wgmma_path(target):
        cfgs = skinny.wgmma_candidates(M, N, K, sms, eb) + cfgs
    return cfgs, target, sms


def _launch(cfg, a, w, out, sa, sw, M, N, K, target, sms, **kw):
    if cfg["path"] == "mma":
        return G.launch_mma(a, w, out, sa, sw, M, N, K, cfg, target, 32 if target.startswith("sm_") else 64, **kw)
    if cfg["path"] == "tma":
        return G.launch_tma(a, w, out, sa, sw, M, N, K, cfg, sms, **kw)
    if cfg["path"] == "wgmma":
        return G.launch_wgmma(a, w, out, sa, sw, M, N, K, cfg, **kw)
    if cfg["path"] == "portable":
        return G.launch_skinny_portable(a, w, out, sa, sw, M, N, K, cfg, **kw)
    return G.launch_stream(a, w, out, sa, sw, M, N, K, cfg, sms, **kw)


# ----------------------------------------------------------------------------- every path
@pytest.mark.parametrize(("M", "K"), [(1, 6672), (2, 6672), (17, 272), (32, 6672)])
def test_swiglu_fp8_every_config(M, K):
    """I = 1037 (padded to 1040: a partial last group), K with a tail past the last 64-byte k-block."""
    inter = 1037
    a, w, sa, sw, ref = _gate_up_case(F8, M, inter, K, seed=M + K)
    N = w.shape[0]
    s_h = (ref.abs().max() / 300).float().reshape(1)
    ref_q = ref / s_h.double()
    cfgs, target, sms = _configs(M, N, K, 1, swiglu=True)
    assert any(c.get("splits", 1) > 1 for c in cfgs) or K < 1024
    assert any(c["path"] == "portable" for c in cfgs) == (M <= G.PORTABLE_SKINNY_ROWS and target.startswith("sm_"))
    for cfg in cfgs:
        out = _poisoned((M, inter), F8)
        _launch(cfg, a, w, out, sa, sw, M, N, K, target, sms, ep=G.ep_swiglu("e4m3fn"), out_scale=s_h)
        _check_fp8(out, ref_q)


@pytest.mark.parametrize("M", [2, 5])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_swiglu_half_every_config(dt, M):
    inter, K = 1001, 1040
    a, w, _, _, ref = _gate_up_case(dt, M, inter, K, seed=3 + M)
    N = w.shape[0]
    cfgs, target, sms = _configs(M, N, K, 2, swiglu=True)
    for cfg in cfgs:
        out = _poisoned((M, inter), dt)
        _launch(cfg, a, w, out, None, None, M, N, K, target, sms, ep=G.ep_swiglu(None))
        _check_half(out, ref, 2.0 ** -7)


def _residual_case(dt, M, N, K, seed):
    g = _gen(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    if dt == F8:
        a, w = (a * 3).to(F8), (w * 3).to(F8)
        sa, sw = torch.tensor([0.37], device="cuda"), torch.rand(N, device="cuda", generator=g) + 0.5
        prod = (a.double() @ w.double().t()) * 0.37 * sw.double()
        rdt = torch.bfloat16
    else:
        a, w = a.to(dt), w.to(dt)
        sa = sw = None
        prod = a.double() @ w.double().t()
        rdt = dt
    r0 = (torch.randn(M, N, device="cuda", generator=g) * prod.std()).to(rdt)
    return a, w, sa, sw, r0, r0.double() + prod


@pytest.mark.parametrize(("dt", "M", "K"), [(F8, 1, 6672), (F8, 32, 6672), (torch.float16, 9, 1040),
                                             (torch.bfloat16, 2, 1040)],
                         ids=["fp8-m1", "fp8-m32", "f16-m9", "bf16-m2"])
def test_residual_every_config_in_place_and_out(dt, M, K):
    N = 1037
    a, w, sa, sw, r0, ref = _residual_case(dt, M, N, K, seed=M + 5)
    cfgs, target, sms = _configs(M, N, K, a.element_size())
    rel = 2.0 ** -8 if r0.dtype == torch.bfloat16 else 2.0 ** -10
    for cfg in cfgs:
        r = r0.clone()
        _launch(cfg, a, w, r, sa, sw, M, N, K, target, sms, ep=G.EP_RESIDUAL, residual=r)
        _check_half(r, ref, rel)
        src = r0.clone()
        outs = []
        for _ in range(2):
            out = _poisoned((M, N), r0.dtype)
            _launch(cfg, a, w, out, sa, sw, M, N, K, target, sms, ep=G.EP_RESIDUAL, residual=src)
            outs.append(out)
        assert torch.equal(src, r0), "out= must leave residual untouched"
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], r), cfg    # deterministic, residual added once


# ----------------------------------------------------------------------------- the ops
@pytest.mark.parametrize("M", [1, 2, 8, 13, 32])
def test_swiglu_op_fp8_static_scale(M):
    inter, K = 1037, 512
    a, w, sa, sw, ref = _gate_up_case(F8, M, inter, K, seed=40 + M)
    s_h = (ref.abs().max() / 300).float().reshape(1)
    y = ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw, scale=s_h, intermediate=inter)
    assert y.shape == (M, inter)
    _check_fp8(y, ref / s_h.double())
    out = _poisoned((M, inter), F8)
    assert ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw, scale=s_h, intermediate=inter, out=out) is out
    assert torch.equal(out.view(torch.uint8), y.view(torch.uint8))


def test_swiglu_op_per_tensor_scales_and_bf16_out():
    a, w, sa, sw, ref = _gate_up_case(F8, 4, 512, 1024, seed=9, per_channel=False)
    assert sw.numel() == 1024                          # prepare_gate_up broadcasts per-tensor scales
    y = ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw)
    assert y.dtype == torch.bfloat16 and y.shape == (4, 512)
    _check_half(y, ref, 2.0 ** -7)


def test_swiglu_op_bf16_model():
    a, w, _, _, ref = _gate_up_case(torch.bfloat16, 3, 1001, 2048, seed=12)
    y = ops.skinny_gemm_swiglu(a, w, intermediate=1001)
    assert y.dtype == torch.bfloat16
    _check_half(y, ref, 2.0 ** -7)


@pytest.mark.parametrize("M", [1, 7, 32])
def test_residual_op_in_place_and_replayed_plan(M):
    N, K = 1037, 2048
    entry = ops.REGISTRY["skinny_gemm_residual"]
    a, w, sa, sw, r0, ref = _residual_case(F8, M, N, K, seed=60 + M)
    r = r0.clone()
    assert ops.skinny_gemm_residual(a, w, r, scale_a=sa, scale_w=sw) is r
    _check_half(r, ref, 2.0 ** -8)
    # a second call with new tensors of the same shapes replays the recorded plan into the NEW residual
    a2, _, _, _, r2, _ = _residual_case(F8, M, N, K, seed=70 + M)
    ref2 = r2.double() + (a2.double() @ w.double().t()) * 0.37 * sw.double()
    before = entry.plans.hits if entry.plans is not None else None
    kept = r.clone()
    assert ops.skinny_gemm_residual(a2, w, r2, scale_a=sa, scale_w=sw) is r2
    if before is not None:
        assert entry.plans.hits > before
    _check_half(r2, ref2, 2.0 ** -8)
    assert torch.equal(r, kept)
    out = _poisoned((M, N), torch.bfloat16)
    r3 = r0.clone()
    assert ops.skinny_gemm_residual(a, w, r3, scale_a=sa, scale_w=sw, out=out) is out
    assert torch.equal(r3, r0) and torch.equal(out, r)


def test_swiglu_op_replayed_plan():
    entry = ops.REGISTRY["skinny_gemm_swiglu"]
    inter, K = 1037, 1024
    a, w, sa, sw, ref = _gate_up_case(F8, 6, inter, K, seed=80)
    s_h = (ref.abs().max() / 300).float().reshape(1)
    ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw, scale=s_h, intermediate=inter)
    a2 = (torch.randn(6, K, device="cuda", generator=_gen(81)) * 3).to(F8)
    gate = w.view(-1, 2, 8, K)[:, 0].reshape(-1, K)[:inter]
    up = w.view(-1, 2, 8, K)[:, 1].reshape(-1, K)[:inter]
    gsc = sw.view(-1, 2, 8)[:, 0].reshape(-1)[:inter].double()
    usc = sw.view(-1, 2, 8)[:, 1].reshape(-1)[:inter].double()
    gd = (a2.double() @ gate.double().t()) * 0.37 * gsc
    ud = (a2.double() @ up.double().t()) * 0.37 * usc
    ref2 = _silu(gd) * ud
    before = entry.plans.hits if entry.plans is not None else None
    y2 = ops.skinny_gemm_swiglu(a2, w, scale_a=sa, scale_w=sw, scale=s_h, intermediate=inter)
    if before is not None:
        assert entry.plans.hits > before
    _check_fp8(y2, ref2 / s_h.double())


def test_tuning_a_residual_epilogue_never_touches_the_residual(monkeypatch):
    """The tuner times candidates over and over: in place, that must not add into the caller's residual."""
    M, N, K = 4, 1037, 2048
    a, w, sa, sw, r0, ref = _residual_case(F8, M, N, K, seed=90)

    def tuned(op, *, bucket, dtype, device, candidates, default, run, w):
        for cfg in candidates:                          # what the tuner does, minus the timing
            run(cfg, w)
        return default

    monkeypatch.setattr(G, "tuned", tuned)
    r = r0.clone()
    skinny._run_residual(skinny.UNRECORDED, a, w, r, sa, sw, None)
    _check_half(r, ref, 2.0 ** -8)


def test_fused_mlp_in_a_cuda_graph():
    """gate/up + SwiGLU + FP8, then down + residual, captured in a graph: replays give the eager bits, and the
    eager result matches float64 (down computed from the FP8 intermediate the first GEMM wrote)."""
    M, inter, H = 4, 1008, 1024                          # the down GEMM needs K = I % 16 == 0
    a, w, sa, sw, ref = _gate_up_case(F8, M, inter, H, seed=100)
    s_h = (ref.abs().max() / 300).float().reshape(1)
    wd = (torch.randn(H, inter, device="cuda", generator=_gen(101)) * 3).to(F8)
    sd = torch.rand(H, device="cuda", generator=_gen(102)) * 0.02 + 0.01
    r0 = torch.randn(M, H, device="cuda", generator=_gen(103)).to(torch.bfloat16)
    h = _poisoned((M, inter), F8)

    def step(r):
        ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw, scale=s_h, out=h)
        return ops.skinny_gemm_residual(h, wd, r, scale_a=s_h, scale_w=sd)

    r_eager = r0.clone()
    assert step(r_eager) is r_eager
    _check_fp8(h, ref / s_h.double())
    ref_r = r0.double() + (h.double() @ wd.double().t()) * s_h.double() * sd.double()
    _check_half(r_eager, ref_r, 2.0 ** -8)
    g = torch.cuda.CUDAGraph()
    r = r0.clone()
    with torch.cuda.graph(g):
        step(r)
    for _ in range(2):
        r.copy_(r0)
        h.view(torch.uint8).fill_(0xFF)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(r, r_eager)


def test_torch_compile_traces_both_fused_ops():
    M, inter, H = 3, 512, 1024
    a, w, sa, sw, _ = _gate_up_case(F8, M, inter, H, seed=110)
    s_h = torch.tensor([2.0], device="cuda")
    wd = (torch.randn(H, inter, device="cuda", generator=_gen(111)) * 3).to(F8)
    sd = torch.tensor([0.01], device="cuda")
    r0 = torch.randn(M, H, device="cuda", generator=_gen(112)).to(torch.bfloat16)

    def mlp(a, r):
        h = ops.skinny_gemm_swiglu(a, w, scale_a=sa, scale_w=sw, scale=s_h)
        ops.skinny_gemm_residual(h, wd, r, scale_a=s_h, scale_w=sd)
        return h

    r_eager = r0.clone()
    h_eager = mlp(a, r_eager)
    f = torch.compile(mlp, fullgraph=True)
    r = r0.clone()
    h = f(a, r)
    assert torch.equal(h.view(torch.uint8), h_eager.view(torch.uint8))
    assert torch.equal(r, r_eager)                       # the in-place update survives functionalization
    out = _poisoned((M, H), torch.bfloat16)
    g = torch.compile(lambda a, r, out: ops.skinny_gemm_residual(a, wd, r, scale_a=s_h, scale_w=sd, out=out),
                      fullgraph=True)
    r = r0.clone()
    g(h_eager, r, out)
    assert torch.equal(r, r0) and torch.equal(out, r_eager)


def test_errors_on_the_gpu():
    a = (torch.randn(4, 256, device="cuda") * 3).to(F8)
    w, sw = ops.prepare_gate_up(*(torch.randn(2, 40, 256, device="cuda") * 3).to(F8), torch.ones(40, device="cuda"),
                                torch.ones(40, device="cuda"))
    with pytest.raises(TypeError, match="out_dtype=.* contradicts"):
        ops.skinny_gemm_swiglu(a, w, scale_w=sw, scale=torch.ones(1, device="cuda"), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"out must have shape \(4, 40\)"):
        ops.skinny_gemm_swiglu(a, w, scale_w=sw, out=torch.empty(4, 48, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="scale_w must have"):
        ops.skinny_gemm_swiglu(a, w, scale_w=sw[:40])
