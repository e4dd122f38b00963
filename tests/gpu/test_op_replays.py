"""Eager plans on the GPU: every replayed call computes what a float64 reference says, on fresh random inputs;
anything that changes takes the full path and its named error; per-row activation scales end to end."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

import rocjit.ops as ops  # noqa: E402
from rocjit.ops import REGISTRY  # noqa: E402
from rocjit.ops import _common as C  # noqa: E402

BF, F8 = torch.bfloat16, torch.float8_e4m3fn


def _rel(y, ref):
    y = y.double()
    assert not torch.isnan(y).any(), "an output element was left unwritten"
    return float((y - ref).norm() / ref.norm())


def _norm_ref(x, w, eps=1e-6):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _hits(name):
    p = REGISTRY[name].plans
    return p.hits if p is not None else 0


def test_rms_norm_replays_match_the_reference_every_time():
    w = torch.rand(4096, device="cuda").to(BF) + 0.5
    before = _hits("rms_norm")
    for i in range(5):
        x = torch.randn(3, 4096, device="cuda").to(BF)
        r = torch.randn(3, 4096, device="cuda").to(BF)
        r_in = r.clone()
        eps = 1e-5 * (i + 1)                               # a forwarded scalar: replayed with its new value
        y, r_out = ops.rms_norm(x, w, eps, residual=r)
        assert r_out is r
        assert _rel(r, x.double() + r_in.double()) < 1e-2
        assert _rel(y, _norm_ref(x.double() + r_in.double(), w, eps)) < 1e-2
    assert _hits("rms_norm") - before >= 3


def test_one_tensor_in_two_places_then_two_tensors():
    """rms_norm(x, w, residual=x) passes one tensor as x and as residual; recorded as a plan, a launch's reference to
    it could name only one of the two arguments, and a later call with two tensors would read one of them twice."""
    w = torch.rand(4096, device="cuda").to(BF) + 0.5
    before = _hits("rms_norm")
    for same in (True, True, False, False, True, False):
        x = torch.randn(3, 4096, device="cuda").to(BF)
        r = x if same else torch.randn(3, 4096, device="cuda").to(BF)
        s = x.double() + r.double()                        # before the call writes x + r into r
        y, r_out = ops.rms_norm(x, w, 1e-6, residual=r)
        assert _rel(r_out, s) < 1e-2
        assert _rel(y, _norm_ref(s, w)) < 1e-2
    assert _hits("rms_norm") - before >= 1                 # the two-tensor calls did replay


def test_replayed_fp8_ops_write_every_element():
    s = torch.tensor([0.05], device="cuda")
    for _ in range(4):
        g = torch.randn(5, 2 * 1000, device="cuda").to(BF)
        q = ops.swiglu(g, scale=s)
        gd, ud = g.double().chunk(2, dim=-1)
        ref = C.fp8_reference((torch.nn.functional.silu(gd) * ud / 0.05).cpu().numpy(), "e4m3fn")
        got = q.view(torch.uint8).cpu().numpy()
        assert (C.fp8_decode(got, "e4m3fn") - C.fp8_decode(ref, "e4m3fn")).__abs__().max() <= \
            0.07 * abs(C.fp8_decode(ref, "e4m3fn")).max()
        x = torch.randn(7, 300, device="cuda").to(BF)
        q, sc = ops.quantize_fp8(x, granularity="token")
        deq = q.double() * sc.double()
        assert _rel(deq, x.double()) < 0.05 and sc.shape == (7, 1)


def test_gemv_and_skinny_replay_with_new_inputs():
    W = torch.randn(3000, 4096, device="cuda").to(BF)
    Wh = torch.randn(1037, 1024, device="cuda").half()
    for _ in range(4):
        a = torch.randn(3, 4096, device="cuda").to(BF)
        assert _rel(ops.skinny_gemm(a, W), a.double() @ W.double().t()) < 1e-2
        xv = torch.randn(1024, device="cuda").half()
        assert _rel(ops.gemv(Wh, xv), Wh.double() @ xv.double()) < 1e-2
    assert _hits("skinny_gemm") >= 2 and _hits("gemv") >= 2


def test_changes_take_the_full_path_and_its_error():
    W = torch.randn(512, 1024, device="cuda").to(BF)
    a = torch.randn(2, 1024, device="cuda").to(BF)
    ops.skinny_gemm(a, W)
    ops.skinny_gemm(a, W)
    with pytest.raises(TypeError, match="a and w must share a dtype"):
        ops.skinny_gemm(a, W.half())
    with pytest.raises(ValueError, match="must be \\[N, K=1024\\]"):
        ops.skinny_gemm(a, W[:, :512].contiguous())
    with pytest.raises(ValueError, match="w must be contiguous"):
        ops.skinny_gemm(a, torch.randn(1024, 512, device="cuda").to(BF).t())
    base = torch.randn(2 * 1024 + 8, device="cuda").to(BF)
    a_odd = base[1:2049].view(2, 1024)                     # misaligned: realigned by the full path, still right
    assert _rel(ops.skinny_gemm(a_odd, W), a_odd.double() @ W.double().t()) < 1e-2
    x = torch.randn(2, 64, device="cuda").half()
    w = torch.randn(64, device="cuda").half()
    ops.rms_norm(x, w)
    ops.rms_norm(x, w)
    with pytest.raises(TypeError, match="rms_norm: weight must have dtype float16, got bfloat16"):
        ops.rms_norm(x, w.bfloat16())
    with pytest.raises(TypeError, match="rms_norm: eps must be a float"):
        ops.rms_norm(x, w, "1e-6")


def test_per_row_activation_scales_end_to_end():
    """rms_norm(quant="per_token") -> skinny_gemm(scale_a=[M]) -> swiglu(quant="per_token") -> skinny_gemm, with
    no host sync, against float64 on the dequantized operands; every M tile and split-K path."""
    torch.manual_seed(3)
    for M in (1, 5, 16, 32):
        x = torch.randn(M, 4096, device="cuda").to(BF) * torch.linspace(0.1, 10, M, device="cuda")[:, None].to(BF)
        w = torch.rand(4096, device="cuda").to(BF) + 0.5
        wgu = torch.randn(2 * 1408, 4096, device="cuda").to(F8)
        sgu = torch.rand(2 * 1408, device="cuda") * 0.01 + 0.005
        wd = torch.randn(4096, 1408, device="cuda").to(F8)
        sd = torch.rand(4096, device="cuda") * 0.01 + 0.005
        q, s = ops.rms_norm(x, w, quant="per_token")
        assert s.shape == (M, 1)
        out = torch.full((M, 2 * 1408), float("nan"), device="cuda", dtype=BF)
        gu = ops.skinny_gemm(q, wgu, scale_a=s.view(-1), scale_w=sgu, out=out)
        ref = (q.double() * s.double()) @ (wgu.double() * sgu.double()[:, None]).t()
        assert _rel(gu, ref) < 1e-2, M
        h, hs = ops.swiglu(gu, quant="per_token")
        y = ops.skinny_gemm(h, wd, scale_a=hs.view(-1), scale_w=sd)
        ref = (h.double() * hs.double()) @ (wd.double() * sd.double()[:, None]).t()
        assert _rel(y, ref) < 1e-2, M
    with pytest.raises(ValueError, match="scale_a must have 1 element .* or M per row: 5"):
        ops.skinny_gemm(q[:5].contiguous(), wgu, scale_a=torch.ones(3, device="cuda"))


def test_gemv_portable_path_with_per_row_scales():
    from rocjit.ops import _gemm as G
    M, N, K = 6, 777, 2048
    a = torch.randn(M, K, device="cuda").to(F8)
    w = torch.randn(N, K, device="cuda").to(F8)
    sa, sw = torch.rand(M, device="cuda") + 0.5, torch.rand(N, device="cuda") + 0.5
    out = torch.full((M, N), float("nan"), device="cuda", dtype=BF)
    for cfg in G.portable_candidates(M):
        out.fill_(float("nan"))
        G.launch_portable(a, "unsigned char", "gemv::w_e4m3", w, out, sw, None, 0, G.scale_modes(M, N, sa, sw), sa,
                          "float", M, N, K, cfg)
        ref = (a.double() * sa.double()[:, None]) @ (w.double() * sw.double()[:, None]).t()
        assert _rel(out, ref) < 1e-2, cfg


def test_plan_replays_under_graph_capture_and_on_another_stream():
    W = torch.randn(2304, 4096, device="cuda").to(F8)
    sw = torch.rand(2304, device="cuda") + 0.5
    a = torch.randn(8, 4096, device="cuda").to(F8)
    sa = torch.rand(8, device="cuda") + 0.5
    ref = (a.double() * sa.double()[:, None]) @ (W.double() * sw.double()[:, None]).t()
    ops.skinny_gemm(a, W, scale_a=sa, scale_w=sw)
    ops.skinny_gemm(a, W, scale_a=sa, scale_w=sw)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = ops.skinny_gemm(a, W, scale_a=sa, scale_w=sw)
    s.synchronize()
    assert _rel(y, ref) < 1e-2
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = ops.skinny_gemm(a, W, scale_a=sa, scale_w=sw)
    yg.fill_(float("nan"))
    a.copy_(torch.randn(8, 4096, device="cuda").to(F8))
    g.replay()
    torch.cuda.synchronize()
    ref = (a.double() * sa.double()[:, None]) @ (W.double() * sw.double()[:, None]).t()
    assert _rel(yg, ref) < 1e-2


@pytest.mark.parametrize("gran", ["token", "block", "tensor"])
def test_quantize_fp8_into_out_replays_and_allocates_nothing(gran):
    """out= / scale_out= receive q and s on every (replayed) call; poisoned beforehand, every element checked;
    with per-token or per-block scales the replay allocates nothing."""
    rows, K = 5, 1000                                     # K not a multiple of the 128-wide block
    shape = {"token": (rows, 1), "block": (rows, 8), "tensor": (1,)}[gran]
    q = torch.empty(rows, K, device="cuda", dtype=F8)
    s = torch.empty(shape, device="cuda", dtype=torch.float32)
    before = _hits("quantize_fp8")
    for _ in range(4):
        x = torch.randn(rows, K, device="cuda").to(BF)
        q.view(torch.uint8).fill_(0x7F)                   # NaN in e4m3fn
        s.fill_(float("nan"))
        rq, rs = ops.quantize_fp8(x, granularity=gran, out=q, scale_out=s)
        assert rq is q and rs is s
        assert not torch.isnan(s).any() and not torch.isnan(q.float()).any()
        sd = s.double()
        deq = q.double() * (sd.repeat_interleave(128, dim=1)[:, :K] if gran == "block" else sd)
        assert _rel(deq, x.double()) < 0.05
    assert _hits("quantize_fp8") - before >= 2
    if gran != "tensor":
        assert REGISTRY["quantize_fp8"].last_outputs == []
    x = torch.randn(rows, K, device="cuda").to(BF)
    with pytest.raises(ValueError, match="out must have shape"):
        ops.quantize_fp8(x, granularity=gran, out=q[:, :-1], scale_out=s)
    with pytest.raises(TypeError, match="scale_out must have dtype float32"):
        ops.quantize_fp8(x, granularity=gran, out=q, scale_out=s.half())
    with pytest.raises(ValueError, match="scale_out= has nothing to receive"):
        ops.quantize_fp8(x, scale=torch.tensor([0.1], device="cuda"), out=q, scale_out=s)


def test_replays_allocate_with_the_torch_allocator():
    from rocjit import native
    from rocjit.ops import _op
    alloc = native.torch_alloc()            # tests/conftest.py builds it before the session
    assert alloc is not None, native.torch_alloc_status()
    x = torch.randn(3, 4096, device="cuda").to(BF)
    w = torch.rand(4096, device="cuda").to(BF) + 0.5
    for _ in range(2):
        ops.rms_norm(x, w, 1e-6)
    made, kept = _op._maker(BF, x.device)
    assert isinstance(made, alloc.Empty) and kept
    before = _hits("rms_norm")
    y = ops.rms_norm(x, w, 1e-6)
    assert _hits("rms_norm") - before == 1 and y.device == x.device and y.shape == x.shape and y.dtype == BF
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("make", ["replay", "full_path"])
def test_outputs_honor_record_stream(make):
    # an output used on another stream and released there with record_stream must not be handed out again by the
    # caching allocator before that stream is done (a replay's outputs were DLPack-wrapped tensors once, on which
    # torch ignores record_stream: the block came back at once while the other stream still read it)
    x = torch.randn(2, 4096, device="cuda").to(BF)
    w = torch.rand(4096, device="cuda").to(BF) + 0.5
    for _ in range(2):
        ops.rms_norm(x, w, 1e-6)                            # recorded, then replayed
    before = _hits("rms_norm")
    if make == "full_path":
        REGISTRY["rms_norm"].clear_plans()
    y = ops.rms_norm(x, w, 1e-6)
    assert (_hits("rms_norm") - before) == (1 if make == "replay" else 0)
    ptr, shape, dtype = y.data_ptr(), y.shape, y.dtype
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)                      # the other stream still has y's reads ahead of it
        z = y.float() * 2
    y.record_stream(side)
    del y
    again = torch.empty(shape, dtype=dtype, device="cuda")
    assert again.data_ptr() != ptr, "the allocator gave out a block another stream still reads"
    torch.cuda.synchronize()
    assert torch.isfinite(z).all()


def test_small_outputs_of_a_replay_share_one_allocation_and_stay_correct():
    """quantize_fp8 per token replays make q and s from one torch allocation (rocjit's Outputs); every replay's q
    and s are checked element by element against float64, and record_stream on them holds the block back."""
    from rocjit import native
    from rocjit.ops import _op
    assert native.torch_alloc() is not None and native.allocator_registered(), native.torch_alloc_status()
    before = _hits("quantize_fp8")
    for rows in (1, 7, 33):
        for _ in range(3):
            x = torch.randn(rows, 1000, device="cuda").to(BF) * 3
            q, s = ops.quantize_fp8(x, granularity="token")
            xd = x.double()
            amax = xd.abs().amax(-1, keepdim=True)
            torch.testing.assert_close(s.double(), amax / 448.0, rtol=1e-6, atol=0)
            ref = C.fp8_decode(C.fp8_reference((xd / s.double()).cpu().numpy(), "e4m3fn"), "e4m3fn")
            got = C.fp8_decode(q.view(torch.uint8).cpu().numpy(), "e4m3fn")
            # every element within one e4m3 step (3 mantissa bits) of the float64 rounding
            assert (abs(got - ref) <= abs(ref) / 8 + 2.0 ** -9).all()
        assert q.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
        assert (s.data_ptr() - q.data_ptr()) % 256 == 0 and s.data_ptr() >= q.data_ptr() + q.numel()
    assert _hits("quantize_fp8") - before >= 6
    assert rows * 1000 + 256 <= _op.SHARE_LIMIT
    # the shared block goes back to torch's allocator only when the other stream is done with it
    ptr = q.data_ptr()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        z = s.float() * q.float()[:, :1]
    s.record_stream(side)
    q.record_stream(side)
    nbytes = q.untyped_storage().nbytes()
    del q, s
    again = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    assert again.data_ptr() != ptr, "the allocator gave out a block another stream still reads"
    torch.cuda.synchronize()
    assert torch.isfinite(z).all()


def test_outputs_come_from_torch_s_caching_allocator():
    """rocjit's Outputs take blocks straight from the allocator at::empty uses on the device: torch's caching
    allocator, which counts them (memory_allocated) and takes them back when the tensors go."""
    from rocjit import native
    alloc = native.torch_alloc()
    proto = torch.empty(0, dtype=torch.float32, device="cuda")
    make = alloc.Outputs([(proto, (1 << 20,))])
    assert make.direct
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    t, = make()
    assert torch.cuda.memory_allocated() - before >= 4 << 20
    t.fill_(2.0)
    assert float(t.sum()) == 2.0 * (1 << 20)
    del t
    assert torch.cuda.memory_allocated() == before


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_outputs_land_on_their_device_whichever_is_current():
    from rocjit import native
    alloc = native.torch_alloc()
    make = alloc.Outputs([(torch.empty(0, device="cuda:1"), (4,)), (torch.empty(0, device="cuda:1"), (2,))],
                         share_limit=1 << 20)
    with torch.cuda.device(0):
        a, b = make()
    assert a.device == b.device == torch.device("cuda:1")
    with torch.cuda.device(0):
        one, = alloc.Outputs([(torch.empty(0, device="cuda:1"), (4,))])()
    assert one.device == torch.device("cuda:1")


def test_dummy_made_during_a_capture_adds_no_kernel():
    """The 1-element tensor passed for unused pointer parameters, made at its first use while a graph is being
    captured, is made beside the capture: the graph holds the op's one kernel and no fill, and its replays match
    float64 on poisoned outputs."""
    from torch.profiler import ProfilerActivity, profile
    from rocjit.ops import _common as C
    g = torch.Generator(device="cuda").manual_seed(21)
    x = torch.randn(37, 1000, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.rand(1000, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    ops.rms_norm(x, w)                                   # compiled and loaded outside the capture
    torch.cuda.synchronize()
    ops.REGISTRY["rms_norm"].clear_plans()               # so that the capture runs the op's full path
    C.dummy_f32.cache_clear()
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        ops.rms_norm(x, w, out=out)
    torch.cuda.current_stream().wait_stream(side)
    assert C.dummy_f32.cache_info().currsize == 1        # made during the capture
    out.fill_(float("nan"))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(kernels) == 1 and "rms_norm" in kernels[0], kernels
    err = (out.double() - ref).abs() / (ref.abs() + 1e-2)
    assert not torch.isnan(out).any() and float(err.max()) < 2 ** -7


def test_tma_path_replays_with_each_calls_weight(monkeypatch):
    """skinny_tma_kernel's tensor maps are encoded for the weight's and the activations' addresses: an eager replay
    makes them again for the call's own operands (Call.derive). Calls with several weights of one shape -- as a
    model's layers make them -- and new activations each time each match float64 on their own operands, and all but
    the first are replays."""
    from rocjit.ops import _gemm as G
    from rocjit.ops import skinny
    target, _, sms = G._device(0)
    if not G.has_tma_path(target):
        pytest.skip(f"skinny_tma_kernel runs on sm_90a only (this device: {target})")
    M, N, K = 29, 1000, 2112                              # N and K not multiples of the tile
    cfg = G.tma_candidates(M, N, K, sms, 1)[0]
    real = skinny.config_for
    monkeypatch.setattr(skinny, "config_for", lambda *a, **kw: (cfg, real(*a, **kw)[1]))
    entry = REGISTRY["skinny_gemm"]
    entry.clear_plans()
    torch.manual_seed(5)
    weights = [torch.randn(N, K, device="cuda").to(F8) for _ in range(3)]
    scales = [torch.rand(N, device="cuda") * 0.01 + 0.005 for _ in weights]
    before = _hits("skinny_gemm")
    try:
        for i in range(3):
            for w, sw in zip(weights, scales):
                a = torch.randn(M, K, device="cuda").to(F8)
                sa = torch.rand(M, device="cuda") + 0.5
                y = ops.skinny_gemm(a, w, scale_a=sa, scale_w=sw)
                ref = (a.double() * sa.double()[:, None]) @ (w.double() * sw.double()[:, None]).t()
                assert _rel(y, ref) < 1e-2, i
        assert any(k.startswith("skinny_tma_kernel") for k, *_ in entry.last_plan)
        assert _hits("skinny_gemm") - before == 8
    finally:
        entry.clear_plans()


@pytest.mark.parametrize("transpose_col", [False, True])
def test_dual_quantizer_replays_return_views_of_their_own_outputs(transpose_col):
    """quantize_fp8_dual returns its scales as transposed views of its outputs (Call.view): replays make them again
    from each call's new outputs. Each replay's four outputs dequantize to x (row blocks and column blocks) and are
    bit for bit the full path's on the same x."""
    from rocjit.ops import _op
    entry = REGISTRY["quantize_fp8_dual"]
    entry.clear_plans()
    M, K = 300, 520                                    # neither a multiple of 128
    kb, mb = -(-K // 128), -(-M // 128)
    before = None
    try:
        for i in range(4):
            x = (torch.randn(M, K, device="cuda") * (torch.rand(M, 1, device="cuda") * 4 + 0.1)).to(BF)
            q_row, s_row, q_col, s_col = ops.quantize_fp8_dual(x, transpose_col=transpose_col)
            assert s_row.shape == (M, kb) and s_row.stride() == (1, M) and s_row._base is not None
            if transpose_col:
                assert q_col.shape == (K, M) and s_col.shape == (K, mb) and s_col.stride() == (1, K)
            else:
                assert q_col.shape == (M, K) and s_col.shape == (mb, K) and s_col.is_contiguous()
            rows = q_row.double() * s_row.double().repeat_interleave(128, 1)[:, :K]
            qc = q_col.t() if transpose_col else q_col
            sc = s_col.t() if transpose_col else s_col
            cols = qc.double() * sc.double().repeat_interleave(128, 0)[:M]
            assert _rel(rows, x.double()) < 0.05 and _rel(cols, x.double()) < 0.05
            full = entry.full(_op.UNRECORDED, x, transpose_col=transpose_col)
            for got, want in zip((q_row, s_row, q_col, s_col), full):
                assert got.shape == want.shape and got.stride() == want.stride()
                assert torch.equal(got.view(torch.uint8) if got.dtype == F8 else got,
                                   want.view(torch.uint8) if want.dtype == F8 else want)
            before = _hits("quantize_fp8_dual") if before is None else before
        assert _hits("quantize_fp8_dual") - before == 3
    finally:
        entry.clear_plans()
