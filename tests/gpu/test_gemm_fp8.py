"""Blockwise FP8 GEMM, its quantizer outputs and the FP8 Linear on the GPU, against float64 references computed
from the dequantized operands (random data, poisoned outputs, shapes that are not multiples of the tiles)."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

from rocjit import ops  # noqa: E402
from rocjit.ops import _common as C  # noqa: E402
from rocjit.ops import _gemm  # noqa: E402
from rocjit.ops import gemm_fp8 as G  # noqa: E402

FMT = C.native_fp8(0)
F8 = C.fp8_torch_dtype(FMT)


@pytest.fixture(autouse=True)
def _shipped_configs(monkeypatch):
    monkeypatch.setenv("ROCJIT_AUTOTUNE", "0")       # tests check results, not tuning (tested in test_tune)


def _deq_rows(q, s):
    """q [R, K] with scales s [R, ceil(K/128)] (1 x 128 along K) -> float64."""
    return q.double() * s.double().repeat_interleave(128, 1)[:, :q.shape[1]]


def _deq_tiles(q, s):
    return q.double() * s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:q.shape[0], :q.shape[1]]


def _operands(M, N, K, sb_rows, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16() * 3
    w = torch.randn(N, K, device="cuda", generator=g).bfloat16() * 0.1
    # non-uniform blocks so every scale matters
    x *= torch.rand(M, 1, device="cuda", generator=g).bfloat16() * 4 + 0.25
    w *= torch.rand(1, K, device="cuda", generator=g).bfloat16() * 4 + 0.25
    xq, xs = ops.quantize_fp8(x, granularity="block")
    if sb_rows:
        wq, ws = ops.quantize_fp8(w, granularity="block")
        ref_w = _deq_rows(wq, ws)
    else:
        wq, ws = ops.quantize_fp8_weight(w)
        ref_w = _deq_tiles(wq, ws)
    return xq, xs, wq, ws, _deq_rows(xq, xs) @ ref_w.t()


def _layout_args(layout, xq, xs, wq, ws):
    """The same product in each layout; T / N operands given as views of K-major memory or as real
    (row-major) copies, so both the in-place and the copying paths run."""
    if layout == "NT":
        return xq, xs, wq, ws
    if layout == "NN":
        return xq, xs, wq.t().contiguous(), ws.t().contiguous()          # b [K, N] row-major: copied K-major
    return xq.t(), xs.t(), wq.t(), ws.t()                                 # views of K-major memory: in place


def _need_sm90a(kernel: str) -> str:
    """This device's target; the test is skipped where it is not sm_90a (the wgmma / TMA kernels run there only)."""
    target = _gemm._device(0)[0]
    if not G.is_sm90a(target):
        pytest.skip(f"the {kernel} kernel runs on sm_90a only (this device: {target})")
    return target


def _close(got, ref, od):
    got = got.double()
    assert torch.isfinite(got).all()
    tol = (1.5e-2 if od == torch.bfloat16 else 2e-3) * ref.abs() + 2e-3 * ref.abs().max()
    bad = (got - ref).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} wrong, worst {(got - ref).abs().max().item():.4g}"


CASES = [  # M, N, K: EVEN_K; K tail (K % 128 != 0, K % 16 == 0); K % 16 != 0 (padded copy); decode rows
    (200, 136, 384), (77, 300, 208), (130, 72, 200), (1, 264, 256), (320, 520, 1024)]


@pytest.mark.parametrize("M, N, K", CASES)
@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
def test_layouts_against_float64(M, N, K, layout):
    sb_rows = layout == "TN"                # wgrad: B is an activation with 1 x 128 scales
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=M + N + K)
    a, sa, b, sb = _layout_args(layout, xq, xs, wq, ws)
    od = torch.float32 if layout == "NN" else torch.bfloat16
    out = torch.full((M, N), float("nan"), device="cuda", dtype=od)
    got = ops.gemm_fp8_blockwise(a, sa, b, sb, layout=layout, out_dtype=od, out=out)
    assert got is out
    _close(out, ref, od)


@pytest.mark.parametrize("od", [torch.bfloat16, torch.float32])
def test_transposed_store_epilogue(od):
    xq, xs, wq, ws, ref = _operands(100, 150, 256, False, seed=3)
    out = torch.full((150, 100), float("nan"), device="cuda", dtype=od)
    ops.gemm_fp8_blockwise(xq, xs, wq, ws, out_dtype=od, trans_c=True, out=out)
    _close(out, ref.t(), od)
    _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws, out_dtype=od, trans_c=True), ref.t(), od)


def test_every_tile_config_with_tails():
    M, N, K = 150, 200, 336
    xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=5)
    target = G._device_check(xq)
    sa, sb = G._strided(xs), G._strided(ws)
    cands = G.candidates(target, G._smem_limit(0))
    assert len([c for c in cands if "kernel" not in c]) == 4
    for cfg in cands:
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        G._launch(cfg, out, xq.view(torch.uint8), wq.view(torch.uint8), sa, sb, M, N, K, False, False)
        _close(out, ref, torch.bfloat16)


# the wgmma kernels (sm_90a; cp.async-fed and TMA-fed): M / N tails, K tails (K % 128 != 0; K % 16 != 0 through
# the padded copy), more K blocks than ring stages, per-row B scales (wgrad), the transposed store, fp32 / bf16 /
# fp16 out, more tiles than multiprocessors (the TMA kernel's persistent blocks walk several), more than 32 K blocks
# (the TMA kernel reads B scales in groups of 32: a second group, partial, with a K tail; one of a single block),
# every config
SM90_CASES = [(200, 136, 384, False, False), (77, 300, 208, True, False), (257, 264, 1024, False, True),
              (130, 520, 200, True, True), (384, 256, 2048, False, False),
              (2100, 2100, 384, False, False), (2100, 1900, 256, True, True),   # more tiles than multiprocessors
              (300, 200, 4800, False, False), (136, 264, 4224, True, True)]      # 38 and 33 K blocks


@pytest.mark.parametrize("od", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("M, N, K, sb_rows, trans_c", SM90_CASES)
def test_wgmma_kernel_every_config_against_float64(M, N, K, sb_rows, trans_c, od):
    target = _need_sm90a("wgmma")
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=M * 7 + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa, sb = G._strided(xs), G._strided(ws)
    wg = [c for c in G.candidates(target, G._smem_limit(0), sm90=True) if c.get("kernel")]
    assert len([c for c in wg if c["kernel"] == "sm90"]) >= 3
    assert len([c for c in wg if c["kernel"] == "tma"]) == len(G._TMA_TILES) + len(G._TMA_KWG_TILES)
    for cfg in wg:
        out = torch.full((N, M) if trans_c else (M, N), float("nan"), device="cuda", dtype=od)
        G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c)
        _close(out, ref.t() if trans_c else ref, torch.bfloat16 if od == torch.float16 else od)


# split-K of the TMA kernel: each tile's K blocks cut into ranges whose starts are not multiples of the 32-block groups
# the B scales are read in (65 K blocks in 3 ranges: 21, 22, 22; in 2: 32, 33), a K tail, N / M tails, per-row B
# scales, the transposed store, every TMA tile (clusters and two-slab tiles included); the sum kernel's 8-wide path
# (outputs of a multiple of 8 elements: bf16, fp16, fp32) and its one-wide path (77 x 300)
@pytest.mark.parametrize("M, N, K, sb_rows, trans_c, od", [(130, 264, 8320, False, False, torch.bfloat16),
                                                           (77, 300, 8300, True, True, torch.float32),
                                                           (200, 136, 1000, True, False, torch.float16),
                                                           (136, 200, 3000, False, False, torch.float32)])
def test_tma_kernel_split_k_against_float64(M, N, K, sb_rows, trans_c, od):
    target = _need_sm90a("TMA")
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=M + N + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa, sb = G._strided(xs), G._strided(ws)
    tma = [c for c in G.candidates(target, G._smem_limit(0), sm90=True) if c.get("kernel") == "tma"]
    for cfg in tma:
        for splits in (2, 3, 7):
            out = torch.full((N, M) if trans_c else (M, N), float("nan"), device="cuda", dtype=od)
            G._launch(dict(cfg, splits=splits), out, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c)
            _close(out, ref.t() if trans_c else ref, torch.bfloat16 if od == torch.float16 else od)


def test_split_k_through_the_op_and_a_graph():
    """128 x 264 x 2048 has 3 tiles of 128 x 128: the op's default is split-K (autotuning off here), eagerly, on the
    plan's replay and replayed from a CUDA graph, each against the float64 reference."""
    target = _need_sm90a("TMA")
    M, N, K = 128, 264, 2048
    xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=11)
    sms = _gemm._device(0)[2]
    cands = G.candidates(target, G._smem_limit(0))
    cands += G.split_candidates(M, N, K, sms, cands)
    assert G.default_config(M, N, sms, cands).get("splits", 1) > 1
    for _ in range(2):                                  # the full path, then the plan's replay
        _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws), ref, torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            got = ops.gemm_fp8_blockwise(xq, xs, wq, ws)
    got.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _close(got, ref, torch.bfloat16)


# Tail split of the TMA kernel: the tiles of the grid's whole rounds run whole, the last round's are cut into K ranges
# (one BM x BN partial slab each) and summed by gemm_fp8_tail_sum. Every one-block TMA tile; shapes whose last round
# is partly full (and, at 2300 x 1790 on 256 x 128 tiles, fewer tiles than multiprocessors: every tile split), M / N /
# K tails, per-row B scales, the transposed store, fp32 out; then the 192 x 128 tile's launches in a CUDA graph.
@pytest.mark.parametrize("M, N, K, sb_rows, trans_c, od", [(2400, 1800, 1100, False, False, torch.bfloat16),
                                                           (2300, 1790, 2100, True, True, torch.float32)])
def test_tma_kernel_tail_split_against_float64(M, N, K, sb_rows, trans_c, od):
    target = _need_sm90a("TMA")
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=M + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa, sb = G._strided(xs), G._strided(ws)
    want = ref.t() if trans_c else ref
    cmp_dtype = torch.bfloat16 if od == torch.float16 else od
    tma = [c for c in G.candidates(target, G._smem_limit(0), sm90=True)
           if c.get("kernel") == "tma" and c["cluster"] == 1]
    assert len(tma) >= 4
    for cfg in tma:
        for tail in (2, 3):
            out = torch.full((N, M) if trans_c else (M, N), float("nan"), device="cuda", dtype=od)
            G._launch(dict(cfg, tail=tail), out, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c)
            _close(out, want, cmp_dtype)
    cfg = dict(next(c for c in tma if c["bm"] == 192), tail=3)
    out = torch.full((N, M) if trans_c else (M, N), float("nan"), device="cuda", dtype=od)
    G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c)      # compiled outside the capture
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _close(out, want, cmp_dtype)


# The op's built-in default (autotuning off, no shipped entry for the shape) takes the 192 x 128 tile's tail-split
# twin where its ranges are long: 2400 x 1800 is 195 tiles (63 in the last round of 132), K = 4000 is 32 K blocks in
# 2 ranges of 16 (a K tail in the last). NT and TN (per-row B scales), through the op, against float64.
@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_default_config_takes_the_tail_split_twin(layout):
    target = _need_sm90a("TMA")
    M, N, K = 2400, 1800, 4000
    sb_rows = layout == "TN"
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=11)
    tma = [c for c in G.candidates(target, G._smem_limit(0)) if c.get("kernel") == "tma"]
    twins = [c for c in G.tail_candidates(M, N, K, _gemm._device(0)[2], tma) if c["bm"] == 192]
    if not twins or C.ceil_div(C.ceil_div(K, 128), twins[0]["tail"]) < G.TAIL_DEFAULT_KBLOCKS:
        pytest.skip("this device's multiprocessor count gives the shape no long-range tail twin")
    a, sa, b, sb = _layout_args(layout, xq, xs, wq, ws)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    assert G.config_for(out, a_km, b_km, G._strided(xs), G._strided(ws), M, N, K, sb_rows, False, target) == twins[0]
    got = ops.gemm_fp8_blockwise(a, sa, b, sb, layout=layout, out=out)
    assert got is out
    _close(out, ref, torch.bfloat16)


# The op's built-in default for products of few tiles and K of at most NARROW_MAX_KBLOCKS blocks: the unsplit
# 128 x 64 tile where its tiles fit one round (136 x 4000: 2 x 63 = 126 tiles, K = 2000 a K tail), else its twin in the
# fewest K ranges (200 x 2100 x 6200: 66 tiles in 2 ranges, as many units as 22 tiles of 128 x 192 in 6); NT and TN,
# through the op, against float64. (Shapes whose tuning buckets have no shipped entry: the built-in rule is tested.)
@pytest.mark.parametrize("layout", ["NT", "TN"])
@pytest.mark.parametrize("M, N, K, splits", [(136, 4000, 2000, 1), (200, 2100, 6200, 2)])
def test_default_config_takes_the_narrow_tile_for_few_tiles(layout, M, N, K, splits):
    cfg = _default_config_through_the_op(layout, M, N, K, seed=M + N)
    assert (cfg["kernel"], cfg["bm"], cfg["bn"], cfg.get("splits", 1)) == ("tma", 128, 64, splits)


def _default_config_through_the_op(layout, M, N, K, seed):
    """The config the op's built-in default takes for an M x N x K product in `layout` (autotuning is off in this
    file), once the op has computed it into a poisoned `out` and matched the float64 reference. The shapes of its
    callers are chosen for 132 multiprocessors (skipped elsewhere)."""
    target = _need_sm90a("TMA")
    if _gemm._device(0)[2] != 132:
        pytest.skip("the shapes are chosen for 132 multiprocessors")
    sb_rows = layout == "TN"
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=seed)
    a, sa, b, sb = _layout_args(layout, xq, xs, wq, ws)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    cfg = G.config_for(out, a_km, b_km, G._strided(xs), G._strided(ws), M, N, K, sb_rows, False, target)
    got = ops.gemm_fp8_blockwise(a, sa, b, sb, layout=layout, out=out)
    assert got is out
    _close(out, ref, torch.bfloat16)
    return cfg


# At most 64 rows the op's built-in default runs 64-row TMA tiles (two math warpgroups taking turns over the K
# blocks, the twins of the rule's one-warpgroup choices): 50 x 1800 x 9000 (71 K
# blocks: the most work units) on 64 x 128 in 8 K ranges (15 tiles; 120 units against 116 for 64 x 64 in 4),
# 40 x 5000 x 1000 on 64 x 64 unsplit (79 tiles; 64 x 128 in 2 ranges: 80 units); K tails, N tails, rows past M; NT
# and TN, through the op, against float64. (Shapes whose tuning buckets, exact and power-of-two, have no shipped
# entry: the built-in rule is tested.)
@pytest.mark.parametrize("layout", ["NT", "TN"])
@pytest.mark.parametrize("M, N, K, bn, splits", [(50, 1800, 9000, 128, 8), (40, 5000, 1000, 64, 1)])
def test_default_config_takes_a_64_row_tile_for_at_most_64_rows(layout, M, N, K, bn, splits):
    cfg = _default_config_through_the_op(layout, M, N, K, seed=M + N + K)
    assert (cfg["kernel"], cfg["bm"], cfg["bn"], cfg.get("splits", 1), cfg.get("kwg")) == ("tma", 64, bn, splits, 2)


def _kb_major(s, offset=0):
    """s [R, KB]'s values in memory laid out [KB, R] (R contiguous), starting `offset` floats into a buffer."""
    buf = torch.full((s.numel() + offset,), float("nan"), device=s.device, dtype=s.dtype)
    v = buf[offset:].view(s.shape[1], s.shape[0])
    v.copy_(s.t())
    return v.t()


# per-row B scales with contiguous columns (quantize_fp8_dual(transpose_col=True)'s layout) reach the TMA kernel's
# ring by one bulk copy per stage; N % 4 != 0 or a base not 16-byte aligned is first copied into that layout.
# N tails, a cluster's second tile past N (N = 300 with 256-column pairs), several tiles per block.
@pytest.mark.parametrize("M, N, K, offset, trans_c", [(77, 300, 208, 0, False), (130, 520, 1024, 0, True),
                                                      (2100, 1900, 384, 0, False), (77, 302, 208, 0, False),
                                                      (200, 264, 256, 1, True)])
def test_tma_kernel_column_contiguous_row_scales(M, N, K, offset, trans_c):
    target = _need_sm90a("TMA")
    xq, xs, wq, ws, ref = _operands(M, N, K, True, seed=N + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa, sb = G._strided(xs), G._strided(_kb_major(ws, offset))
    assert sb[1:] == (1, N)
    tma = [c for c in G.candidates(target, G._smem_limit(0), sm90=True) if c.get("kernel") == "tma"]
    assert tma
    for cfg in tma:
        out = torch.full((N, M) if trans_c else (M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, True, trans_c)
        _close(out, ref.t() if trans_c else ref, torch.bfloat16)


# the A scales reach the TMA kernel's ring by one bulk copy per stage from M-major memory (quantize_fp8_dual's s_row
# layout), used in place; row-major scales, M % 4 != 0 and a base not 16-byte aligned are first copied into it.
# M tails inside a tile, rows past M in the last tile, several tiles per block, both kinds of B scales.
@pytest.mark.parametrize("M, N, K, offset, layout_in", [(200, 264, 384, 0, "m_major"), (77, 300, 208, 0, "m_major"),
                                                        (2100, 1900, 384, 0, "m_major"), (520, 136, 256, 1, "m_major"),
                                                        (300, 520, 1024, 0, "row_major")])
@pytest.mark.parametrize("sb_rows", [False, True])
def test_tma_kernel_m_major_a_scales(M, N, K, offset, layout_in, sb_rows):
    target = _need_sm90a("TMA")
    xq, xs, wq, ws, ref = _operands(M, N, K, sb_rows, seed=M + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa = G._strided(_kb_major(xs, offset) if layout_in == "m_major" else xs)
    sb = G._strided(_kb_major(ws) if sb_rows else ws)
    in_place = layout_in == "m_major" and M % 4 == 0 and offset % 4 == 0
    assert (G._k_block_rows(sa, M, K) is sa) == in_place
    tma = [c for c in G.candidates(target, G._smem_limit(0), sm90=True) if c.get("kernel") == "tma"]
    for cfg in tma:
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, sb_rows, False)
        _close(out, ref, torch.bfloat16)


def test_dual_quantizer_row_scales_feed_the_gemm_in_place():
    """quantize_fp8_dual's s_row is M-major (strides (1, M)) and the op takes it as it is."""
    M, N, K = 264, 392, 640
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16() * (torch.rand(M, 1, device="cuda", generator=g)
                                                                    .bfloat16() * 4 + 0.25)
    w = torch.randn(N, K, device="cuda", generator=g).bfloat16() * 0.1
    xq, xs, _, _ = ops.quantize_fp8_dual(x)
    assert xs.shape == (M, -(-K // 128)) and xs.stride() == (1, M)
    xq2, xs2 = ops.quantize_fp8(x, granularity="block")               # the same values, row-major
    assert torch.equal(xq.view(torch.uint8), xq2.view(torch.uint8)) and torch.equal(xs, xs2)
    wq, ws = ops.quantize_fp8_weight(w)
    ref = _deq_rows(xq, xs) @ _deq_tiles(wq, ws).t()
    _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws), ref, torch.bfloat16)
    _close(ops.gemm_fp8_blockwise(xq, xs2, wq, ws), ref, torch.bfloat16)


@pytest.mark.parametrize("layout", ["NT", "NN", "TN"])
def test_repeated_calls_replay_the_tma_kernel_and_stay_exact(layout):
    """The TMA kernel's repeated calls are eager plan replays: its tensor maps made again for each call's operands
    (Call.derive), the scales and operands given as transposed views passed as their pointers (Call.alias), each
    replay exact on new data at new addresses; a scale in another layout, a misaligned operand and a changed shape
    take the full path (the last with its named error)."""
    _need_sm90a("TMA")
    M, N, K = 384, 520, 1024
    entry = ops.REGISTRY["gemm_fp8_blockwise"]

    def case(seed):
        xq, xs, wq, ws, ref = _operands(M, N, K, layout == "TN", seed=seed)
        if layout == "NT":
            return (xq, xs, wq, ws), ref
        if layout == "NN":                      # dgrad's b: [K, N] as a view of K-major memory, its scales likewise
            return (xq, xs, wq.t(), ws.t()), ref
        # wgrad's layouts: K-major operands given as [K, M] / [K, N] views, column-contiguous B scales
        return (xq.t(), xs.t(), wq.t(), _kb_major(ws).t()), ref

    entry.clear_plans()
    hits = lambda: entry.plans.hits if entry.plans is not None else 0  # noqa: E731 (counts every call so far)
    try:
        args, ref = case(1)
        _close(ops.gemm_fp8_blockwise(*args, layout=layout), ref, torch.bfloat16)
        assert any(k.startswith("gemm_fp8_blockwise_tma") for k, *_ in entry.last_plan), entry.last_plan
        first = hits()
        for i, seed in enumerate((2, 3)):       # the same key with new tensors: replays, new data read
            args, ref = case(seed)
            _close(ops.gemm_fp8_blockwise(*args, layout=layout), ref, torch.bfloat16)
            assert hits() == first + i + 1
        a, sa, b, sb = args
        if layout != "TN":                      # a scale given in another layout: a new key, the same product
            _close(ops.gemm_fp8_blockwise(a, sa.t().contiguous().t(), b, sb, layout=layout), ref, torch.bfloat16)
        # an operand 16 bytes off its allocation's start is still aligned; one byte off is not (the copying path)
        buf = torch.empty(a.numel() + 1, dtype=torch.uint8, device="cuda")
        shifted = buf[1:].view(a.dtype).view(a.shape) if layout != "TN" else \
            buf[1:].view(a.dtype).view(a.shape[::-1]).t()
        shifted.copy_(a)
        before = hits()
        _close(ops.gemm_fp8_blockwise(shifted, sa, b, sb, layout=layout), ref, torch.bfloat16)
        assert hits() == before
        short = b[:, :-16] if layout == "NT" else b[:-16]
        with pytest.raises(ValueError, match="K differ"):   # a changed shape: the full path and its named error
            ops.gemm_fp8_blockwise(a, sa, short, sb, layout=layout)
    finally:
        entry.clear_plans()


def test_unsplit_tma_plan_replays_on_another_stream():
    """A product the TMA kernel computes in one launch (1536 x 1536: more 128 x 128 tiles than half the GPU, so no
    split-K twin) keeps no per-stream state (its unread workspace argument is the device's dummy), so its plan
    replays on another stream too, exact there on new data against float64."""
    _need_sm90a("TMA")
    M, N, K = 1536, 1536, 512
    entry = ops.REGISTRY["gemm_fp8_blockwise"]
    entry.clear_plans()
    try:
        xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=5)
        _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws, layout="NT"), ref, torch.bfloat16)
        names = [k for k, *_ in entry.last_plan]
        assert any(k.startswith("gemm_fp8_blockwise_tma") for k in names), names
        assert not any(k.startswith("gemm_fp8_splitk_sum") for k in names), names
        before = entry.plans.hits
        xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=6)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = ops.gemm_fp8_blockwise(xq, xs, wq, ws, layout="NT")
        torch.cuda.current_stream().wait_stream(side)
        assert entry.plans.hits == before + 1
        _close(y, ref, torch.bfloat16)
    finally:
        entry.clear_plans()


def test_split_k_replays_sum_each_calls_partials():
    """A product split along K (two launches: the TMA kernel into the stream's workspace, then the sum in split
    order) replays both, exact on new data every call."""
    _need_sm90a("TMA")
    M, N, K = 64, 2112, 7168
    entry = ops.REGISTRY["gemm_fp8_blockwise"]
    entry.clear_plans()
    try:
        first = None
        for seed in range(3):
            xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=seed + 40)
            _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws), ref, torch.bfloat16)
            first = entry.plans.hits if first is None else first     # (hits count every call so far)
        names = [k for k, *_ in entry.last_plan]
        if not any(k.startswith("gemm_fp8_splitk_sum") for k in names):
            pytest.skip(f"this device's config for {M} x {N} x {K} is not split: {names}")
        assert entry.plans.hits == first + 2
    finally:
        entry.clear_plans()


# the decode kernel (rocjit.ops.skinny's matrix-core kernel with blockwise scales; NVIDIA sm_89+, M <= 32): M across the activation
# tiles (1, 8, 9, 16, 17, 32), N not a multiple of its 64 / 128-row tiles or of 128 (a scale block cut short), K
# tails (K % 128 != 0; K % 16 != 0 through the padded copy), more chunks than ring stages and tiles shared by blocks
# (stream-K fix-up), every config, bf16 / fp32 / fp16 out
DECODE_CASES = [(1, 264, 256), (8, 200, 208), (9, 1000, 200), (16, 2112, 7168), (17, 136, 1040), (32, 520, 4096),
                (3, 7000, 2048)]


def _decode_target():
    target = _gemm._device(0)[0]
    if not G.decode_candidates(target, 1, 256, 256, 1, False, False):
        pytest.skip(f"the decode kernel runs on NVIDIA sm_89+ only (this device: {target})")
    return target


@pytest.mark.parametrize("od", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("M, N, K", DECODE_CASES)
def test_decode_kernel_every_config_against_float64(M, N, K, od):
    target = _decode_target()
    xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=M * 13 + N + K)
    a_km, b_km = G._kmajor(xq, K)[0], G._kmajor(wq, K)[0]
    sa, sb = G._strided(xs), G._strided(ws)
    cands = G.decode_candidates(target, M, N, K, _gemm._device(0)[2], False, False)
    assert len(cands) >= 4 and all(c["kernel"] == "skinny_mma" for c in cands)
    for cfg in cands:
        out = torch.full((M, N), float("nan"), device="cuda", dtype=od)
        G._launch(cfg, out, a_km, b_km, sa, sb, M, N, K, False, False)
        _close(out, ref, torch.bfloat16 if od == torch.float16 else od)


def test_decode_kernel_is_the_op_default_and_takes_any_scale_strides():
    """M <= 32 on sm_90+: the op runs the decode kernel (shipped defaults or its own), with scales given row-major,
    as M-major / K-major views (strides passed through), in repeated calls (plan replays) with new data; trans_c,
    per-row B scales and M = 33 keep the other kernels."""
    target = _decode_target()
    sms = _gemm._device(0)[2]
    M, N, K = 4, 2112, 7168
    u8 = dict(device="cuda", dtype=torch.uint8)
    picked = G.config_for(torch.empty(M, N, device="cuda", dtype=torch.bfloat16), torch.empty(M, K, **u8),
                          torch.empty(N, K, **u8), None, None, M, N, K, False, False, target)
    assert picked.get("kernel") == "skinny_mma"
    assert not G.decode_candidates(target, M, N, K, sms, False, True)      # transposed store
    assert not G.decode_candidates(target, M, N, K, sms, True, False)      # per-row B scales
    assert not G.decode_candidates(target, 33, N, K, sms, False, False)
    for seed in (1, 2, 3):                   # the second and third calls replay the first one's plan
        xq, xs, wq, ws, ref = _operands(M, N, K, False, seed=seed)
        _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws), ref, torch.bfloat16)
    _close(ops.gemm_fp8_blockwise(xq, xs.t().contiguous().t(), wq, ws), ref, torch.bfloat16)   # M-major a scales
    _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws.t().contiguous().t()), ref, torch.bfloat16)   # K-block-major b
    _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws, trans_c=True), ref.t(), torch.bfloat16)


def test_decode_kernel_in_a_cuda_graph():
    """Captured at M = 5 and replayed on new operands copied into the captured inputs: the float64 product of the
    new operands each time (the stream kernel's tickets reset themselves between replays)."""
    _decode_target()
    M, N, K = 5, 1000, 3000
    xq, xs, wq, ws, _ = _operands(M, N, K, False, seed=21)
    ops.gemm_fp8_blockwise(xq, xs, wq, ws)                      # compile and plan outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = ops.gemm_fp8_blockwise(xq, xs, wq, ws)
    torch.cuda.current_stream().wait_stream(s)
    for seed in (22, 23, 24):
        nx, nxs, nw, nws, ref = _operands(M, N, K, False, seed=seed)
        for dst, src in ((xq, nx), (xs, nxs), (wq, nw), (ws, nws)):
            dst.copy_(src)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _close(y, ref, torch.bfloat16)


def test_wgmma_kernel_is_the_default_for_prefill_shapes(monkeypatch):
    target = _need_sm90a("wgmma")
    monkeypatch.delenv("ROCJIT_GEMM_FP8_SM90", raising=False)         # on by default on sm_90a
    cands = G.candidates(target, G._smem_limit(0))
    assert G.default_config(4096, 4096, _gemm._device(0)[2], cands).get("kernel") == "tma"
    xq, xs, wq, ws, ref = _operands(1000, 1100, 640, False, seed=11)
    out = torch.full((1000, 1100), float("nan"), device="cuda", dtype=torch.float32)
    _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws, out=out, out_dtype=torch.float32), ref, torch.float32)


def test_cublaslt_scale_layout_and_repeat_calls():
    xq, xs, wq, ws, ref = _operands(256, 256, 512, False, seed=7)
    xs_cm = xs.t().contiguous().t()          # cuBLASLt's (M, K/128) with strides (1, M)
    for _ in range(3):                       # the second call replays a plan (contiguous scales only)
        _close(ops.gemm_fp8_blockwise(xq, xs, wq, ws), ref, torch.bfloat16)
    _close(ops.gemm_fp8_blockwise(xq, xs_cm, wq, ws), ref, torch.bfloat16)


def test_wrong_fp8_format_is_refused():
    other = torch.float8_e4m3fnuz if F8 == torch.float8_e4m3fn else torch.float8_e4m3fn
    xq, xs, wq, ws, _ = _operands(32, 32, 128, False)
    with pytest.raises(TypeError, match="multiplies"):
        ops.gemm_fp8_blockwise(xq.view(torch.uint8).view(other), xs, wq.view(torch.uint8).view(other), ws)


@pytest.mark.parametrize("M, K", [(300, 264), (256, 384)])
def test_quantizer_transposed_outputs_match(M, K):
    x = torch.randn(M, K, device="cuda").bfloat16()
    q_row, s_row, q_col, s_col = ops.quantize_fp8_dual(x)
    r_row, r_srow, q_colT, s_colT = ops.quantize_fp8_dual(x, transpose_col=True)
    assert torch.equal(q_row.view(torch.uint8), r_row.view(torch.uint8)) and torch.equal(s_row, r_srow)
    assert s_row.stride() == (1, M) and r_srow.stride() == (1, M)   # M-major: the GEMM's bulk-copied A scales
    assert q_colT.shape == (K, M) and s_colT.shape == (K, -(-M // 128))
    assert torch.equal(q_colT.view(torch.uint8), q_col.view(torch.uint8).t())
    assert torch.equal(s_colT, s_col.t())
    assert s_colT.stride() == (1, K)           # its columns contiguous: the wgrad GEMM's bulk-copied B scales
    q, s = ops.quantize_fp8_weight(x)
    q2, s2, q_t = ops.quantize_fp8_weight(x, transposed=True)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    assert torch.equal(q_t.view(torch.uint8), q.view(torch.uint8).t())


def test_fp8_linear_forward_backward_against_float64():
    from rocjit.nn import FP8Linear
    T, D, F = 200, 264, 136
    torch.manual_seed(0)
    layer = FP8Linear(D, F, bias=True, device="cuda")
    x = (torch.randn(2, T // 2, D, device="cuda") * 2).bfloat16().requires_grad_()
    y = layer(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x2, g2, w = x.detach().reshape(T, D), gy.reshape(T, F), layer.weight.detach()
    # float64 references from the operands as the recipe quantizes them
    xq, xs, xc, xcs = ops.quantize_fp8_dual(x2)
    wq, ws = ops.quantize_fp8_weight(w)
    gq, gs, gc, gcs = ops.quantize_fp8_dual(g2)
    col = lambda q, s: q.double() * s.double().repeat_interleave(128, 0)[:q.shape[0]]  # noqa: E731
    y_ref = _deq_rows(xq, xs) @ _deq_tiles(wq, ws).t() + layer.bias.double()
    gx_ref = _deq_rows(gq, gs) @ _deq_tiles(wq, ws)
    gw_ref = col(gc, gcs).t() @ col(xc, xcs)
    _close(y.reshape(T, F), y_ref, torch.bfloat16)
    _close(x.grad.reshape(T, D), gx_ref, torch.bfloat16)
    _close(layer.weight.grad, gw_ref, torch.bfloat16)
    torch.testing.assert_close(layer.bias.grad.float(), g2.float().sum(0), rtol=1e-2, atol=1e-2)
    # and against the unquantized float64 product: the FP8 recipe's error stays small
    exact = x2.double() @ w.double().t()
    assert ((y.reshape(T, F).double() - layer.bias.double() - exact).norm() / exact.norm()).item() < 0.08


@pytest.mark.parametrize("mode", ["no_grad", "frozen_weight", "frozen_input"])
def test_fp8_linear_inference_and_frozen_layers(mode):
    """Without grad mode, or with the weight or the input taking no gradient, the layer skips the copies its
    backward would not read (rows-only quantization of x, W without its transposed copy): its output against the
    float64 product of the operands as quantized, and the gradient it does compute against its own reference."""
    from rocjit.nn import FP8Linear
    T, D, F = 200, 264, 136
    torch.manual_seed(5)
    layer = FP8Linear(D, F, bias=True, device="cuda").requires_grad_(mode != "frozen_weight")
    x = (torch.randn(T, D, device="cuda") * 2).bfloat16().requires_grad_(mode != "frozen_input")
    with torch.set_grad_enabled(mode != "no_grad"):
        y = layer(x)
    assert y.requires_grad == (mode != "no_grad")
    w = layer.weight.detach()
    xq, xs, xc, xcs = ops.quantize_fp8_dual(x.detach())
    wq, ws = ops.quantize_fp8_weight(w)
    _close(y, _deq_rows(xq, xs) @ _deq_tiles(wq, ws).t() + layer.bias.double(), torch.bfloat16)
    if mode == "no_grad":
        return
    gy = torch.randn_like(y)
    y.backward(gy)
    gq, gs, gc, gcs = ops.quantize_fp8_dual(gy)
    if mode == "frozen_weight":
        assert layer.weight.grad is None and layer.bias.grad is None
        _close(x.grad, _deq_rows(gq, gs) @ _deq_tiles(wq, ws), torch.bfloat16)
    else:
        col = lambda q, s: q.double() * s.double().repeat_interleave(128, 0)[:q.shape[0]]  # noqa: E731
        assert x.grad is None
        _close(layer.weight.grad, col(gc, gcs).t() @ col(xc, xcs), torch.bfloat16)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_fp8_mlp_inference_and_frozen_fc1(activation):
    """FP8MLP without grad mode (rows-only quantizers, the activation fused into the second one) against the
    float64 products stage by stage; then with fc1 frozen and the input not requiring grad, fc2's weight gradient
    (no pass through fc2's dgrad) against its reference."""
    from rocjit.nn import FP8MLP
    T, D, Hd, O = 200, 264, 392, 136
    torch.manual_seed(7)
    mlp = FP8MLP(D, Hd, O, bias=False, activation=activation, device="cuda")
    x = (torch.randn(T, D, device="cuda") * 2).bfloat16()
    with torch.no_grad():
        y = mlp(x)
    w1, w2 = mlp.fc1.weight.detach(), mlp.fc2.weight.detach()
    xq, xs, _, _ = ops.quantize_fp8_dual(x)
    w1q, w1s = ops.quantize_fp8_weight(w1)
    w2q, w2s = ops.quantize_fp8_weight(w2)
    z = ops.gemm_fp8_blockwise(xq, xs, w1q, w1s, layout="NT", out_dtype=torch.bfloat16)
    hq, hs, hc, hcs = ops.quantize_fp8_dual(z, activation=activation)
    _close(y, _deq_rows(hq, hs) @ _deq_tiles(w2q, w2s).t(), torch.bfloat16)
    mlp.fc1.requires_grad_(False)
    y = mlp(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    assert mlp.fc1.weight.grad is None
    gq, gs, gc, gcs = ops.quantize_fp8_dual(gy)
    col = lambda q, s: q.double() * s.double().repeat_interleave(128, 0)[:q.shape[0]]  # noqa: E731
    _close(mlp.fc2.weight.grad, col(gc, gcs).t() @ col(hc, hcs), torch.bfloat16)


def test_fp8_training_follows_the_bf16_loss_curve():
    """A 2-layer MLP regresses a fixed random teacher for 60 Adam steps. Stated tolerance: from step 10 on, the
    FP8 loss stays within 15% (+ 2% of the initial loss) of the bf16 loss, and both fall below 40% of the start."""
    from rocjit.nn import FP8Linear
    _follows_bf16(lambda ref: torch.nn.Sequential(FP8Linear.from_linear(ref[0]), torch.nn.GELU(),
                                                  FP8Linear.from_linear(ref[2])))


def _follows_bf16(make_fp8):
    """Trains a bf16 MLP (Linear, GELU, Linear) and make_fp8(that MLP) on a fixed random teacher; the FP8 curve within
    the stated tolerance of the bf16 one."""
    torch.manual_seed(1)
    D, H, T = 256, 512, 512
    teacher = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D)).cuda()
    data = [torch.randn(T, D, device="cuda") for _ in range(4)]
    targets = [teacher(d).detach() for d in data]
    ref = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D)).cuda().bfloat16()
    fp8 = make_fp8(ref)
    curves = []
    for model in (ref, fp8):
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
        losses = []
        for step in range(60):
            x, t = data[step % 4].bfloat16(), targets[step % 4]
            loss = torch.nn.functional.mse_loss(model(x).float(), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    bf, f8 = curves
    assert bf[-1] < 0.4 * bf[0] and f8[-1] < 0.4 * f8[0], (bf[::10], f8[::10])
    for i in range(10, 60):
        assert abs(f8[i] - bf[i]) <= 0.15 * bf[i] + 0.02 * bf[0], (i, bf[i], f8[i])


@pytest.mark.parametrize("activation, bias", [("gelu", True), ("gelu_tanh", True), ("silu", False), ("relu", True),
                                              ("relu", False)])
def test_fp8_mlp_forward_backward_against_float64(activation, bias):
    """FP8MLP (the activation fused into the quantizers) against float64 products of the operands as its recipe
    quantizes them: x and act(z) 1 x 128, the weights 128 x 128, the gradients 1 x 128 (and 128 x 1 for wgrad).
    Odd sizes: tokens 200 (wgrad's K tail), in 264, hidden 392, out 136. Without a bias (SiLU, ReLU) the
    activation's backward is fused into the quantizer; with one, torch's activation backward and the plain quantizer."""
    from rocjit.nn import FP8MLP
    T, D, Hd, O = 200, 264, 392, 136
    torch.manual_seed(3)
    mlp = FP8MLP(D, Hd, O, bias=bias, activation=activation, device="cuda")
    x = (torch.randn(2, T // 2, D, device="cuda") * 2).bfloat16().requires_grad_()
    y = mlp(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    x2, g2 = x.detach().reshape(T, D), gy.reshape(T, O)
    w1, w2 = mlp.fc1.weight.detach(), mlp.fc2.weight.detach()
    b1 = mlp.fc1.bias.detach().double() if bias else torch.zeros(Hd, device="cuda", dtype=torch.float64)
    b2 = mlp.fc2.bias.detach().double() if bias else torch.zeros(O, device="cuda", dtype=torch.float64)
    col = lambda q, s: q.double() * s.double().repeat_interleave(128, 0)[:q.shape[0]]  # noqa: E731
    xq, xs, xc, xcs = ops.quantize_fp8_dual(x2)
    w1q, w1s = ops.quantize_fp8_weight(w1)
    w2q, w2s, w2q_t = ops.quantize_fp8_weight(w2, transposed=True)
    # each stage against float64 from its actual inputs: the bf16 intermediates (z, the dgrad gh) made as the layer
    # makes them, each checked against its own float64 product (one bf16 ulp of z moves an fp8 code of act(z))
    z = ops.gemm_fp8_blockwise(xq, xs, w1q, w1s, layout="NT", out_dtype=torch.bfloat16)
    _close(z, _deq_rows(xq, xs) @ _deq_tiles(w1q, w1s).t(), torch.bfloat16)
    if bias:
        z.add_(mlp.fc1.bias.detach())
    hq, hs, hc, hcs = ops.quantize_fp8_dual(z, activation=activation)
    y_ref = _deq_rows(hq, hs) @ _deq_tiles(w2q, w2s).t() + b2
    _close(y.reshape(T, O), y_ref, torch.bfloat16)
    gq, gs, gc, gcs = ops.quantize_fp8_dual(g2)
    _close(mlp.fc2.weight.grad, col(gc, gcs).t() @ col(hc, hcs), torch.bfloat16)
    if bias:
        torch.testing.assert_close(mlp.fc2.bias.grad.float(), g2.float().sum(0), rtol=1e-2, atol=1e-2)
    gh = ops.gemm_fp8_blockwise(gq, gs, w2q_t.t(), w2s, layout="NN", out_dtype=torch.bfloat16)
    _close(gh, _deq_rows(gq, gs) @ _deq_tiles(w2q, w2s), torch.bfloat16)
    zq, zs, zc, zcs = ops.quantize_fp8_dual(z, activation=activation, grad=gh)
    _close(x.grad.reshape(T, D), _deq_rows(zq, zs) @ _deq_tiles(w1q, w1s), torch.bfloat16)
    _close(mlp.fc1.weight.grad, col(zc, zcs).t() @ col(xc, xcs), torch.bfloat16)
    act = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "relu": torch.relu,
           "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[activation]
    z64 = z.double().requires_grad_()
    act(z64).backward(gh.double())                 # float64 grad * act'(z)
    gb1 = z64.grad.sum(0)
    if bias:
        torch.testing.assert_close(mlp.fc1.bias.grad.double(), gb1, rtol=2e-2, atol=2e-2 * gb1.abs().max().item())
    else:
        assert mlp.fc1.bias is None and mlp.fc2.bias is None
    # and the whole block against its unquantized float64 forward: the FP8 recipe's error stays small
    exact = act(x2.double() @ w1.double().t() + b1) @ w2.double().t() + b2
    assert ((y.reshape(T, O).double() - exact).norm() / exact.norm()).item() < 0.1


def test_fp8_mlp_training_follows_the_bf16_loss_curve():
    """FP8MLP.from_sequential of the bf16 MLP, the FP8Linear test's teacher, steps and stated tolerance: from step 10
    on within 15% (+ 2% of the initial loss) of the bf16 loss, and both below 40% of the start."""
    from rocjit.nn import FP8MLP
    _follows_bf16(FP8MLP.from_sequential)
