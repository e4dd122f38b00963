"""Skinny GEMM on the GPU against float64 references: every candidate config, the op, errors, graphs."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from rocjit.ops import _gemm as G  # noqa: E402
from rocjit.ops import skinny  # noqa: E402

F8 = torch.float8_e4m3fn


def _case(dt, M, N, K, per_channel=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    if dt == F8:
        a8, w8 = (a * 3).to(F8), (w * 3).to(F8)
        sa = torch.tensor([0.37], device="cuda")
        sw = torch.rand(N if per_channel else 1, device="cuda", generator=g) + 0.5
        ref = (a8.double() @ w8.double().t()) * 0.37 * sw.double()[None, :]
        return a8, w8, sa, sw, ref, torch.bfloat16, 1e-2
    a, w = a.to(dt), w.to(dt)
    ref = a.double() @ w.double().t()
    # fp32 accumulation, one rounding to the output dtype (2^-8 bf16, 2^-11 f16), relative Frobenius
    return a, w, None, None, ref, dt, (4e-3 if dt == torch.bfloat16 else 1e-3)


def _rel(y, ref):
    assert not torch.isnan(y).any(), "output left unwritten (poison visible)"
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, F8], ids=["bf16", "f16", "fp8"])
@pytest.mark.parametrize("M", [1, 2, 3, 8, 13, 17, 32])
@pytest.mark.parametrize("K", [256, 6656, 16384])
def test_every_config_matches_reference(dt, M, K):
    N = 1037                                     # not a multiple of any tile
    a, w, sa, sw, ref, od, tol = _case(dt, M, N, K, seed=M * 7 + K)
    target, _, sms = skinny._device(0)
    wave = 32 if target.startswith("sm_") else 64
    cfgs = skinny.mma_candidates(M, N, K, sms, a.element_size(), target) if skinny.has_matrix_path(target, dt == F8) else []
    if cfgs and skinny.has_stream_path(target):
        cfgs += skinny.stream_candidates(M, N, K, sms, a.element_size())
    if cfgs and skinny.has_tma_path(target):
        cfgs += skinny.tma_candidates(M, N, K, sms, a.element_size())
    if cfgs and skinny.has_wgmma_path(target):
        cfgs += skinny.wgmma_candidates(M, N, K, sms, a.element_size())
    cfgs += skinny.portable_candidates(M)[:1] + G.portable_skinny_candidates(M, target)
    for cfg in cfgs:
        out = torch.full((M, N), float("nan"), dtype=od, device="cuda")
        if cfg["path"] == "mma":
            skinny.launch_mma(a, w, out, sa, sw, M, N, K, cfg, target, wave)
        elif cfg["path"] == "stream":
            skinny.launch_stream(a, w, out, sa, sw, M, N, K, cfg, sms)
        elif cfg["path"] == "tma":
            skinny.launch_tma(a, w, out, sa, sw, M, N, K, cfg, sms)
        elif cfg["path"] == "wgmma":
            skinny.launch_wgmma(a, w, out, sa, sw, M, N, K, cfg)
        else:
            G.launch_skinny_portable(a, w, out, sa, sw, M, N, K, cfg)
        assert _rel(out, ref) < tol, cfg
    y = skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw)
    assert y.dtype == od and y.shape == (M, N)
    assert _rel(y, ref) < tol
    out = torch.full((M, N), float("nan"), dtype=od, device="cuda")
    assert skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw, out=out) is out
    assert _rel(out, ref) < tol


def test_fp8_per_tensor_scale_and_out_dtypes():
    a, w, sa, sw, ref, _, tol = _case(F8, 5, 300, 512, per_channel=False)
    for od in (torch.bfloat16, torch.float16, torch.float32):
        out = torch.full((5, 300), float("nan"), dtype=od, device="cuda")
        y = skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw, out_dtype=od, out=out)
        assert y is out and _rel(y, ref) < tol


@pytest.mark.parametrize("M", [1, 2])
def test_portable_rows_with_per_row_activation_scales(M):
    """skinny_gemm's M <= 2 configs on gemv.hip's kernel with one activation scale per row (per-token FP8) and
    per-channel weight scales, odd N and a K tail past the 16-byte chunks' last full unroll."""
    target, _, _ = skinny._device(0)
    cfgs = G.portable_skinny_candidates(M, target)
    if not cfgs:
        pytest.skip("the portable rows are skinny_gemm candidates on NVIDIA only")
    N, K = 1037, 4096 + 48
    g = torch.Generator(device="cuda").manual_seed(M)
    a = (torch.randn(M, K, device="cuda", generator=g) * 3).to(F8)
    w = (torch.randn(N, K, device="cuda", generator=g) * 3).to(F8)
    sa = torch.rand(M, device="cuda", generator=g) + 0.5
    sw = torch.rand(N, device="cuda", generator=g) + 0.5
    ref = (a.double() * sa.double()[:, None]) @ (w.double() * sw.double()[:, None]).t()
    for cfg in cfgs:
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        G.launch_skinny_portable(a, w, out, sa, sw, M, N, K, cfg)
        assert _rel(out, ref) < 1e-2, cfg
    assert _rel(skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw), ref) < 1e-2


def test_deterministic_split_k():
    a, w, sa, sw, ref, od, tol = _case(F8, 4, 2304, 16384)
    target, _, sms = skinny._device(0)
    cfg = {"path": "mma", "mt": 1, "warps_k": 8, "unroll": 2, "splits": 8}
    outs = []
    for _ in range(3):
        out = torch.full((4, 2304), float("nan"), dtype=od, device="cuda")
        skinny.launch_mma(a, w, out, sa, sw, 4, 2304, 16384, cfg, target, 32)
        outs.append(out)
    assert _rel(outs[0], ref) < tol
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize(("path", "M"), [("stream", 1), ("stream", 17), ("tma", 17), ("tma", 32)])
def test_stream_kernels_deterministic_across_launches_and_graph_replays(M, path):
    """The stream-K kernels (stream, tma): their fix-up sums partials in block order, and the tickets reset
    themselves, so launches and graph replays give identical bits."""
    target, _, sms = skinny._device(0)
    if not (skinny.has_stream_path(target) if path == "stream" else skinny.has_tma_path(target)):
        pytest.skip(f"the {path} kernel needs sm_90 (stream) / sm_90a (tma)")
    a, w, sa, sw, ref, od, tol = _case(F8, M, 2304 + 40, 16384 + 64)
    cands = skinny.stream_candidates if path == "stream" else skinny.tma_candidates
    launch = skinny.launch_stream if path == "stream" else skinny.launch_tma
    cfgs = cands(M, 2344, 16448, sms, 1)
    assert cfgs
    for cfg in cfgs:
        outs = []
        for _ in range(3):
            out = torch.full((M, 2344), float("nan"), dtype=od, device="cuda")
            launch(a, w, out, sa, sw, M, 2344, 16448, cfg, sms)
            outs.append(out)
        assert _rel(outs[0], ref) < tol, cfg
        assert all(torch.equal(outs[0], o) for o in outs[1:]), cfg
        g = torch.cuda.CUDAGraph()
        out = torch.empty_like(outs[0])
        with torch.cuda.graph(g):
            launch(a, w, out, sa, sw, M, 2344, 16448, cfg, sms)
        for _ in range(3):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, outs[0]), cfg


@pytest.mark.parametrize("M", [17, 32])
def test_tma_kernel_every_kind_of_stream_k_range(M):
    """skinny_tma_kernel over grids that cut its 19 tiles x 33 chunks every way: one block (all tiles in turn), 7
    (ranges starting and ending mid-tile), 19 (whole tiles: no fix-up), 38 (a block whose range ends on a tile
    boundary after a shared first segment), 64 (tiles shared by four blocks, middle ones owning neither end) and
    300 (more blocks than multiprocessors, tiles shared by up to 15), each against float64 and twice bit-identical;
    then one multiplying warpgroup (37 tiles of 64 rows, whose fix-up loads four blocks' partials at a time where
    two warpgroups load two) on 100 and 300 blocks (tiles shared by 3 - 4 and by up to 9)."""
    target, _, sms = skinny._device(0)
    if not skinny.has_tma_path(target):
        pytest.skip("skinny_tma_kernel needs sm_90a")
    N, K = 2344, 16448
    a, w, sa, sw, ref, od, tol = _case(F8, M, N, K)
    base = {"path": "tma", "slabs": 1, "wg": 2, "kb": 4}
    assert -(-N // 128) == 19 and -(-K // 512) == 33
    for wg, blocks in [(2, b) for b in (1, 7, 19, 38, 64, 300)] + [(1, 100), (1, 300)]:
        cfg = dict(base, wg=wg, blocks=blocks)
        outs = []
        for _ in range(2):
            out = torch.full((M, N), float("nan"), dtype=od, device="cuda")
            skinny.launch_tma(a, w, out, sa, sw, M, N, K, cfg, sms)
            outs.append(out)
        assert _rel(outs[0], ref) < tol, cfg
        assert torch.equal(outs[0], outs[1]), cfg


def test_misaligned_operands():
    """a at an odd offset is realigned (right answer, no fault); a misaligned w is an error naming it."""
    g = torch.Generator(device="cuda").manual_seed(11)
    M, N, K = 3, 300, 1024
    base = torch.randn(M * K + 1, device="cuda", generator=g).to(torch.bfloat16)
    a = base[1:].view(M, K)
    w = torch.randn(N, K, device="cuda", generator=g).to(torch.bfloat16)
    assert a.data_ptr() % 16
    ref = a.double() @ w.double().T
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert skinny.skinny_gemm(a, w, out=out) is out
    assert _rel(out, ref) < 4e-3                   # bf16 output: one rounding, as in _case
    wbase = torch.empty(N * K + 8, dtype=w.dtype, device="cuda")
    wm = wbase[1:N * K + 1].view(N, K)
    wm.copy_(w)
    with pytest.raises(ValueError, match="w's data pointer"):
        skinny.skinny_gemm(a, wm)
    torch.cuda.synchronize()


def test_graph_capture_replays():
    a, w, sa, sw, ref, od, tol = _case(torch.bfloat16, 3, 777, 1024)
    y = skinny.skinny_gemm(a, w)              # tuned outside capture
    g = torch.cuda.CUDAGraph()
    out = torch.empty_like(y)
    with torch.cuda.graph(g):
        skinny.skinny_gemm(a, w, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert _rel(out, ref) < tol                    # the float64 reference, not only the eager result
    assert torch.equal(out, y)                     # ... and the same configuration as eager, so the same bits


def test_errors_name_the_problem():
    a = torch.randn(33, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="M <= 32.*general GEMM"):
        skinny.skinny_gemm(a, w)
    with pytest.raises(ValueError, match="multiple of 16"):
        skinny.skinny_gemm(a[:4, :200], w[:, :200].contiguous())
    with pytest.raises(TypeError, match="share a dtype"):
        skinny.skinny_gemm(a[:4], w.half())
    with pytest.raises(ValueError, match="w must be"):
        skinny.skinny_gemm(a[:4], torch.randn(64, 128, device="cuda", dtype=torch.bfloat16))
    a8, w8 = a[:4].to(F8), w.to(F8)
    with pytest.raises(TypeError, match="scale_a must be a float32"):
        skinny.skinny_gemm(a8, w8, scale_a=torch.ones(1, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="scale_w must have"):
        skinny.skinny_gemm(a8, w8, scale_w=torch.ones(3, device="cuda"))


def test_cupy_inputs_give_cupy_output():
    cupy = pytest.importorskip("cupy")
    a, w, _, _, ref, _, tol = _case(torch.float16, 2, 100, 256)
    y = skinny.skinny_gemm(cupy.from_dlpack(a), cupy.from_dlpack(w))
    assert isinstance(y, cupy.ndarray)
    assert _rel(torch.from_dlpack(y), ref) < tol


def test_torch_compile_traces_custom_op():
    a, w, _, _, ref, _, tol = _case(torch.bfloat16, 4, 256, 512)
    f = torch.compile(lambda a, w: skinny.skinny_gemm(a, w) * 2, fullgraph=True)
    assert _rel(f(a, w) / 2, ref) < tol


@pytest.mark.parametrize("path", ["stream", "tma"])
def test_captured_launches_that_take_tickets_add_no_kernel(monkeypatch, path):
    """Launches with a stream-K fix-up take zeroed tickets of their own when captured. They are zeroed beside the
    capture: the graph holds one kernel per launch and no fill, for more launches than one pool holds (the
    pool is made small here so that the capture has to make new ones), and every replay matches the
    float64 reference (the tickets stay zero from replay to replay)."""
    from torch.profiler import ProfilerActivity, profile
    from rocjit.ops import _gemm as G
    target, _, sms = skinny._device(0)
    if not (skinny.has_stream_path(target) if path == "stream" else skinny.has_tma_path(target)):
        pytest.skip(f"the {path} kernel needs sm_90 / sm_90a")
    M, N, K = (3, 2344, 16448) if path == "stream" else (20, 2344, 4160)
    a, w, sa, sw, ref, od, tol = _case(F8, M, N, K)
    cands = skinny.stream_candidates(M, N, K, sms, 1) if path == "stream" else skinny.tma_candidates(M, N, K, sms, 1)
    cfg = [c for c in cands if "blocks" not in c][0]          # the full grid: tiles split between blocks
    launch = skinny.launch_stream if path == "stream" else skinny.launch_tma
    monkeypatch.setattr(G, "_capture_tickets", {})
    monkeypatch.setattr(G, "_graph_tickets", [])
    monkeypatch.setattr(G, "_TICKET_POOL", G._TICKET_SLOT * 2)
    launches = 5
    outs = [torch.full((M, N), float("nan"), dtype=od, device="cuda") for _ in range(launches)]
    launch(a, w, outs[0], sa, sw, M, N, K, cfg, sms)          # compiled and loaded outside the capture
    torch.cuda.synchronize()
    for o in outs:
        o.fill_(float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(g, stream=side):
        for o in outs:
            launch(a, w, o, sa, sw, M, N, K, cfg, sms)
    torch.cuda.current_stream().wait_stream(side)
    assert len(G._graph_tickets) >= 2                         # pools made during the capture
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(kernels) == launches, kernels
    assert all("skinny_" in k for k in kernels), kernels
    for rep in range(3):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for i, o in enumerate(outs):
            assert _rel(o, ref) < tol, (rep, i)


def test_stream_state_made_inside_cudagraph_trees(monkeypatch):
    """The stream kernel's per-stream tickets and workspace first made inside torch.compile's cudagraph warm-up
    (whose allocations go to the graph's pool) stay out of that pool, and the replays match the reference."""
    from rocjit.ops import _gemm as G
    target, _, sms = skinny._device(0)
    if not skinny.has_stream_path(target):
        pytest.skip("streamed kernel needs sm_90+")
    M, N, K = 3, 2344, 16448
    a, w, sa, sw, ref, od, tol = _case(F8, M, N, K)
    cfg = skinny.stream_candidates(M, N, K, sms, 1)[0]
    real = skinny.config_for

    def forced(*args):
        run = real(*args)[1]
        return cfg, run
    monkeypatch.setattr(skinny, "config_for", forced)
    monkeypatch.setattr(G, "_stream_state", {})
    monkeypatch.setattr(G, "_capture_tickets", {})
    torch._dynamo.reset()
    f = torch.compile(lambda a: skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw) * 1, fullgraph=True,
                      mode="reduce-overhead")
    for i in range(4):
        got = f(a).clone()
        assert _rel(got, ref) < tol, i
    eager = skinny.skinny_gemm(a, w, scale_a=sa, scale_w=sw)
    assert _rel(eager, ref) < tol
    assert _rel(f(a), ref) < tol
    torch._dynamo.reset()
