"""The skinny GEMM's weight stream on a CPU: every load hint of rocjit/stream.h and the programmatic-dependent-launch
hooks build for NVIDIA and AMD, the MINB launch-bounds argument reaches the kernel name, and the H100's shipped
configs are candidates of their shapes (so they are used, not silently replaced by the built-in default)."""
import itertools
import re

import pytest

torch = pytest.importorskip("torch")

from rocjit import tune  # noqa: E402
from rocjit.kernel import Module  # noqa: E402
from rocjit.ops import _gemm as G  # noqa: E402
from tests.test_pdl_cpu import _functions_sass  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"
FP8_NAME = "skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 8, 2, 0, 0, skinny::ep_store>"
STREAM_NAME = "skinny_stream_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 4, 512, 6, 2, skinny::ep_store>"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("hint", [0, 1, 2, 3, 4])
def test_every_weight_load_hint_builds_for_hopper(hint):
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    defines = {"SKINNY_W_HINT": str(hint), "SKINNY_STREAM_PF": str((0, 128, 256, 0, 256)[hint])}
    co = Module("skinny_gemm.hip", defines=defines).compile("sm_90a", (FP8_NAME, STREAM_NAME))
    assert co.binary and FP8_NAME in co.lowered and STREAM_NAME in co.lowered


@pytest.mark.parametrize("hint", [None, 2])
def test_no_read_of_the_kernel_aheads_output_before_the_grid_dependency_wait(hint):
    """Under programmatic dependent launch a kernel may start while the one ahead still writes its inputs: before
    griddepcontrol.wait (SASS ACQBULK) the skinny GEMMs may load only weights (no-L1-allocate loads, .NA) and
    prefetch. Activation and scale loads through the read-only path (ld.global.nc) were once scheduled above the
    wait in the pipelined build -- a race with the kernel ahead that isolated tests cannot see (tests/test_pdl_cpu.py
    checks every PDL source's checked builds for read-only loads there; this checks more skinny builds, stricter)."""
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    names = [f"skinny_gemm_kernel<skinny::{e}, {o}, {mt}, {nt}, {wk}, {un}, 0, {pipe}, {ep}>"
             for (e, o, ep), (mt, wk, un), nt, pipe in itertools.product(
                 (("bf16_t", "__hip_bfloat16", "skinny::ep_store"), ("e4m3_t", "__hip_bfloat16", "skinny::ep_residual"),
                  ("e4m3_t", "unsigned char", "skinny::ep_swiglu<rocjit::e4m3fn>")),
                 ((1, 4, 2), (2, 4, 2), (1, 4, 4), (2, 8, 2)), (1, 2), (0, 1))
             if not (pipe and mt * nt > 2)]
    names += ["skinny_gemm_blockwise_kernel<__hip_bfloat16, 1, 1, 8, 2, 0>",
              "skinny_gemm_blockwise_kernel<float, 2, 4, 4, 2, 0>"]
    defines = {} if hint is None else {"SKINNY_W_HINT": str(hint)}
    co = Module("skinny_gemm.hip", defines=defines).compile("sm_90a", tuple(names))
    sass = _functions_sass(co.binary)
    assert set(co.lowered[n] for n in names) <= set(sass)
    for n in names:
        lines = sass[co.lowered[n]]
        wait = next(i for i, line in enumerate(lines) if "ACQBULK" in line)
        early = [line.strip() for line in lines[:wait] if "LDG" in line and ".NA" not in line]
        assert not early, (n, early[:4])


@pytest.mark.parametrize("target", ["sm_90a", "sm_89", "gfx942", "gfx950"])
def test_programmatic_launch_hooks_build_everywhere(target):
    """griddepcontrol and the early L2 prefetch on sm_90+, nothing before sm_90 and on AMD (no equivalent there)."""
    if target.startswith("sm_") and not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    if target.startswith("gfx"):
        from tests.test_ops_fused_cpu import _require_amd
        _require_amd(target)
    names = [FP8_NAME.replace(", 1, 1, 8, 2, 0, 0, skinny::ep_store>", ", 1, 4, 4, 2, 0, 0, skinny::ep_residual>")]
    assert names[0] != FP8_NAME
    if target == "sm_90a":
        names.append(STREAM_NAME)
    co = Module("skinny_gemm.hip").compile(target, tuple(names))
    assert co.binary and all(n in co.lowered for n in names)


def _sass_ops(lines, op):
    return sum(1 for line in lines if re.search(rf"\*/\s+(@!?U?P\w+\s+)?{op}[.\s]", line))


def test_fp8_multiplies_on_hopper_without_ptxas_expansion():
    """sm_90a has no FP8 mma.sync: ptxas expands each e4m3 m16n8k32 into conversions, two f16 HMMAs into
    temporaries and four fp32 adds. The skinny FP8 builds widen each chunk themselves and accumulate in place, so
    they have the f16 build's fp32 adds (only the warps' reduction and the epilogue) and no more conversions than
    the expansion. -DSKINNY_PTXAS_FP8 (the expansion) must show the extra adds, or this test could not tell the two
    apart."""
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    fp8, f16 = (f"skinny_gemm_kernel<skinny::{e}, {o}, 1, 4, 4, 2, 4, 0, skinny::ep_store>"
                for e, o in (("e4m3_t", "__hip_bfloat16"), ("f16_t", "__half")))
    co = Module("skinny_gemm.hip").compile("sm_90a", (fp8, f16))
    old = Module("skinny_gemm.hip", defines={"SKINNY_PTXAS_FP8": "1"}).compile("sm_90a", (fp8,))
    sass, sass_old = _functions_sass(co.binary), _functions_sass(old.binary)
    new_f8, new_16, old_f8 = sass[co.lowered[fp8]], sass[co.lowered[f16]], sass_old[old.lowered[fp8]]
    # twice the f16 build's HMMAs (a 16-byte chunk holds 16 FP8 values of K against 8 f16), as many as ptxas's
    assert _sass_ops(new_f8, "HMMA") == 2 * _sass_ops(new_16, "HMMA") == _sass_ops(old_f8, "HMMA") > 0
    assert _sass_ops(new_f8, "FADD") == _sass_ops(new_16, "FADD")
    assert _sass_ops(old_f8, "FADD") >= _sass_ops(new_f8, "FADD") + 2 * _sass_ops(new_f8, "HMMA")
    assert 0 < _sass_ops(new_f8, "F2FP") <= _sass_ops(old_f8, "F2FP")


def _launch_names(monkeypatch, launches):
    """(kernel name, defines) that launch_mma asks for, for each (cfg, target) in `launches`: a [1, 256] x [64, 256]
    FP8 product, nothing launched."""
    seen = []
    monkeypatch.setattr(G, "_kernel", lambda src, name, defines=(): seen.append((name, defines)) or name)

    class Rec:
        def launch(self, *a, **k):
            pass

    a = torch.zeros(1, 256).to(torch.float8_e4m3fn)
    w = torch.zeros(64, 256).to(torch.float8_e4m3fn)
    out = torch.empty(1, 64, dtype=torch.bfloat16)
    for cfg, target in launches:
        G.launch_mma(a, w, out, None, None, 1, 64, 256, cfg, target, 32 if target.startswith("sm_") else 64, Rec())
    return seen


def test_minb_reaches_the_kernel_name_on_nvidia_only(monkeypatch):
    cfg = {"path": "mma", "mt": 1, "warps_k": 4, "unroll": 2, "splits": 1, "minb": 6}
    plain = {k: v for k, v in cfg.items() if k != "minb"}
    seen = _launch_names(monkeypatch, [(cfg, "sm_90a"), (cfg, "gfx942"), (plain, "sm_90a")])
    assert [n.split(", ")[6] for n, _ in seen] == ["6", "0", "0"]


@pytest.mark.parametrize("M,N,K,dtype", [(1, 13312, 16384, "float8_e4m3fn"), (1, 16384, 6656, "float8_e4m3fn"),
                                         (1, 28672, 4096, "float8_e4m3fn"), (1, 4096, 4096, "float8_e4m3fn"),
                                         (1, 13312, 16384, "bfloat16"), (16, 16384, 6656, "float8_e4m3fn"),
                                         (32, 13312, 16384, "float8_e4m3fn")])
def test_h100_shipped_skinny_configs_are_candidates(M, N, K, dtype):
    eb = 1 if dtype.startswith("float8") else 2
    cands = G.stream_candidates(M, N, K, 132, eb) + G.mma_candidates(M, N, K, 132, eb, "sm_90a")
    bucket = tune.bucket(m=M, n=N, k=K)
    rec = tune.shipped_defaults().get("|".join(("skinny_gemm", bucket, dtype, H100)))
    assert rec is not None, bucket
    builtin = {"path": "none"}
    assert tune.default_config("skinny_gemm", bucket, dtype, H100, cands, builtin) == rec["config"]


def test_wide_launch_bounds_are_a_candidate_only_above_8_rows_on_nvidia():
    """(1, 4, 2) with MINB 4 is timed for 9..32 activation rows on NVIDIA; AMD and fewer rows keep the plain set."""
    for M in (9, 16, 17, 32):
        cands = G.mma_candidates(M, 13312, 16384, 132, 1, "sm_90a")
        wide = [c for c in cands if "minb" in c]
        assert wide and all(c["minb"] == G.WIDE_MINB and (c["mt"], c["warps_k"], c["unroll"]) == G.WIDE_MINB_SHAPE
                            for c in wide)
        assert sorted(map(str, [{k: v for k, v in c.items() if k != "minb"} for c in wide])) == \
            sorted(map(str, [c for c in cands if "minb" not in c and (c["mt"], c["warps_k"], c["unroll"]) ==
                             G.WIDE_MINB_SHAPE]))
        assert not any("minb" in c for c in G.mma_candidates(M, 13312, 16384, 304, 1, "gfx942"))
    assert not any("minb" in c for c in G.mma_candidates(8, 13312, 16384, 132, 1, "sm_90a"))


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_pipelined_twins_up_to_8_rows(target):
    """Every plain config of at most PIPE_MAX_SPLITS splits has a pipelined twin up to PIPE_MAX_ROWS activation rows
    (on every target: it is the same source), none above; the blockwise kernel (no second register set) gets none."""
    for M in (1, 8):
        cands = G.mma_candidates(M, 13312, 16384, 132, 1, target)
        plain = [c for c in cands if "pipe" not in c and "hint" not in c and "minb" not in c]
        piped = [c for c in cands if c.get("pipe") and "hint" not in c]
        assert piped == [dict(c, pipe=1) for c in plain if c["splits"] <= G.PIPE_MAX_SPLITS] and piped
        assert all(c["splits"] <= G.PIPE_MAX_SPLITS for c in cands if c.get("pipe"))
        assert not any("pipe" in c for c in G.mma_blockwise_candidates(M, 7168, 16384, 132, target))
    assert not any("pipe" in c for c in G.mma_candidates(9, 13312, 16384, 132, 1, target))


def test_pipe_reaches_the_kernel_name(monkeypatch):
    cfg = {"path": "mma", "mt": 1, "warps_k": 4, "unroll": 2, "splits": 1}
    seen = _launch_names(monkeypatch, [(dict(cfg, pipe=1), "sm_90a"), (cfg, "gfx942")])
    assert [n.split(", ")[7] for n, _ in seen] == ["1", "0"]


def test_load_hint_is_a_tuning_dimension_only_for_small_weights_on_nvidia():
    """Weights of SMALL_WEIGHT_BYTES or more always stream with the kernel's default hint (the one that keeps its
    speed inside a model); smaller ones are also timed with ALT_HINT; AMD has one load kind, so no duplicates."""
    small = G.mma_candidates(1, 2304, 16384, 132, 1, "sm_90a")          # 37.7 MB of FP8
    plain = [c for c in small if "hint" not in c]
    assert plain and [dict(c, hint=G.ALT_HINT) for c in plain] == [c for c in small if "hint" in c]
    assert plain == G.mma_candidates(1, 2304, 16384, 132, 1)             # no target: no hint variants
    assert not any("hint" in c for c in G.mma_candidates(1, 28672, 4096, 132, 2, "sm_90a"))     # 235 MB
    assert not any("hint" in c for c in G.mma_candidates(1, 2304, 16384, 304, 1, "gfx942"))


def test_a_configs_hint_compiles_its_own_module(monkeypatch):
    cfg = {"path": "mma", "mt": 1, "warps_k": 4, "unroll": 2, "splits": 1}
    seen = _launch_names(monkeypatch, [(cfg, "sm_90a"), (dict(cfg, hint=2), "sm_90a")])
    assert seen[0][1] == () and seen[1][1] == (("SKINNY_W_HINT", "2"),) and seen[0][0] == seen[1][0]
    from rocjit.ops import _common as C
    assert C.module(G.SRC, seen[1][1]).defines == {"SKINNY_W_HINT": "2"} and C.module(G.SRC).defines == {}


def test_tma_path_candidates_and_opt_in(monkeypatch):
    """skinny_tma_kernel: sm_90a only, configs only above 4 rows, each with a ring of >= 2 stages that fits the
    H100's shared memory, and timed by the tuner unless ROCJIT_SKINNY_TMA=0."""
    assert G.has_tma_path("sm_90a") and not G.has_tma_path("sm_90") and not G.has_tma_path("gfx942")
    assert G.tma_candidates(4, 13312, 16384, 132, 1) == []
    for M in (5, 8, 9, 16, 17, 32):
        cands = G.tma_candidates(M, 13312, 16384, 132, 1)
        assert cands and all(c["path"] == "tma" for c in cands)
        for c in cands:
            stages = G.tma_stages(M, c)
            rows = 64 * c["slabs"] * c["wg"]
            assert stages >= 2 and 1024 + stages * (c["kb"] * 128 + 4) * (rows + G.tma_rows(M)) + 16 * stages <= 227 * 1024
            assert rows % G.TMA_BOX_ROWS == 0
    monkeypatch.delenv("ROCJIT_SKINNY_TMA", raising=False)
    assert G.tma_enabled()
    monkeypatch.setenv("ROCJIT_SKINNY_TMA", "0")
    assert not G.tma_enabled()


def test_wgmma_path_candidates_and_opt_in(monkeypatch):
    """skinny_wgmma_kernel: sm_90a only, configs from 9 activation rows (none below), without the shapes that need
    over 200 registers at 32 rows, and timed by the tuner only with ROCJIT_SKINNY_WGMMA=1."""
    assert G.has_wgmma_path("sm_90a") and not G.has_wgmma_path("sm_90") and not G.has_wgmma_path("gfx942")
    assert G.wgmma_candidates(8, 13312, 16384, 132, 1) == []
    for M in (9, 16, 17, 32):
        cands = G.wgmma_candidates(M, 13312, 16384, 132, 1)
        assert cands and all(c["path"] == "wgmma" for c in cands)
        assert {c["splits"] for c in cands} >= {1, 2}
        if M > 16:
            assert not any(c["wg"] > 1 and (c["kb"] > 1 or c["slabs"] > 1) for c in cands)
    monkeypatch.delenv("ROCJIT_SKINNY_WGMMA", raising=False)
    assert not G.wgmma_enabled()
    monkeypatch.setenv("ROCJIT_SKINNY_WGMMA", "1")
    assert G.wgmma_enabled()


def _recording_call(launched: list):
    """A stand-in for an op's Call that records each launch (kernel, grid, block, arguments) in `launched` and hands
    constants and derived arguments back unevaluated."""
    class Call:
        def launch(self, k, grid, block, *args, **kw):
            launched.append((k, grid, block, args))

        def const(self, t):
            return t

        def derive(self, fn, t):
            return b"map"

        def bind_stream(self):
            pass
    return Call


def test_wgmma_launch_names_grid_and_split_k(monkeypatch):
    """launch_wgmma: the kernel for the activation rows' wgmma N, 64 * slabs rows per block, K steps of kb * 128
    bytes split over grid.y (the reduce kernel after it when split), one warpgroup of 128 threads per wg."""
    import torch
    launched = []
    Call = _recording_call(launched)
    monkeypatch.setattr(G, "_kernel", lambda src, name, defines=(): name)
    monkeypatch.setattr(G, "_stream_workspace", lambda device, n: torch.empty(n))
    a = torch.empty(20, 16384, dtype=torch.float8_e4m3fn)
    w = torch.empty(1000, 16384, dtype=torch.float8_e4m3fn)
    out = torch.empty(20, 1000, dtype=torch.bfloat16)
    G.launch_wgmma(a, w, out, None, None, 20, 1000, 16384, {"slabs": 2, "wg": 1, "kb": 2, "splits": 1}, Call())
    (k, grid, block, args), = launched
    assert k == "skinny_wgmma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 2, 1, 2, skinny::ep_store>"
    assert grid == (8, 1) and block == 128 and args[3] is None and args[-2] == 64   # 64 steps of 256 bytes
    launched.clear()
    G.launch_wgmma(a[:12], w, out[:12], None, None, 12, 1000, 16384, {"slabs": 1, "wg": 2, "kb": 1, "splits": 3},
                   Call())
    (k, grid, block, args), (r, *_) = launched
    assert k.startswith("skinny_wgmma_kernel<skinny::e4m3_t, __hip_bfloat16, 16, 1, 2, 1,")
    assert grid == (16, 3) and block == 256 and args[3] is not None and args[-2] == 43
    assert r.startswith("skinny_splitk_reduce<")


def test_tma_kernel_builds_for_hopper_with_every_epilogue():
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    names = [f"skinny_tma_kernel<skinny::{e}, {o}, 32, 1, 2, 2, 5, {ep}>"
             for e, o, ep in (("e4m3_t", "__hip_bfloat16", "skinny::ep_store"),
                              ("e4m3_t", "__hip_bfloat16", "skinny::ep_residual"),
                              ("e4m3_t", "unsigned char", "skinny::ep_swiglu<rocjit::e4m3fn>"),
                              ("bf16_t", "__hip_bfloat16", "skinny::ep_swiglu<skinny::no_quant>"))]
    co = Module("skinny_gemm.hip").compile("sm_90a", tuple(names))
    assert co.binary and all(n in co.lowered for n in names)


def test_whole_tile_grids():
    """The TMA kernel's extra candidates run a grid of 3/4 to all but one of the multiprocessors that gives every
    block the same number of whole tiles (no stream-K fix-up); none where no such grid exists."""
    assert G.whole_tile_grid(128, 132) == 128 and G.whole_tile_grid(224, 132) == 112
    assert G.whole_tile_grid(104, 132) == 104 and G.whole_tile_grid(18, 132) is None
    assert G.whole_tile_grid(132, 132) is None          # the default grid already is whole tiles
    assert G.whole_tile_grid(97, 132) is None           # a prime
    for N, K in ((16384, 6656), (13312, 16384), (28672, 4096), (2304, 16384), (2344, 16448)):
        cands = G.tma_candidates(32, N, K, 132, 1)
        plain = [c for c in cands if "blocks" not in c]
        for c in cands:
            if "blocks" in c:
                tiles = -(-N // (64 * c["slabs"] * c["wg"]))
                assert tiles % c["blocks"] == 0 and 99 <= c["blocks"] < 132
                assert {k: v for k, v in c.items() if k != "blocks"} in plain


def _fake_pools(monkeypatch):
    made = []

    def zeros(n, dtype, device):
        made.append(n)
        return torch.zeros(n, dtype=dtype)
    monkeypatch.setattr(G.C, "persistent_zeros", zeros)
    monkeypatch.setattr(G, "_capture_tickets", {})
    monkeypatch.setattr(G, "_graph_tickets", [])
    return made


class _Dev:
    index = 0


def test_capture_tickets_are_disjoint_aligned_zeroed_slices(monkeypatch):
    """Captured launches get tickets of their own: slices of a zeroed pool at 256-byte offsets, never overlapping, a new
    pool (kept for good) when the current one cannot hold the next slice, one larger than the pool size if needed."""
    made = _fake_pools(monkeypatch)
    monkeypatch.setattr(G, "_TICKET_POOL", 4 * G._TICKET_SLOT)
    spans = []
    for tiles in (1, 64, 65, 3, 200, 1000, 7):
        t = G._tickets_for_capture(_Dev(), tiles)
        assert t.numel() >= tiles and t.numel() % G._TICKET_SLOT == 0
        assert (4 * t.storage_offset()) % 256 == 0 and not t.any()
        spans.append((t.data_ptr(), t.data_ptr() + 4 * t.numel()))
    assert all(a1 <= b0 or b1 <= a0 for i, (a0, a1) in enumerate(spans) for (b0, b1) in spans[i + 1:])
    # slices 64 + 64 + 128 fill the first pool; 64; 256 (does not fit beside it); 1024 alone (a larger pool); 64
    assert made == [256, 256, 256, 1024, 256]
    assert len(G._graph_tickets) == 5 and all(p.numel() == n for p, n in zip(G._graph_tickets, made))


class _SlowPool:
    """A pool whose slicing lets other threads run in the middle (as a GIL switch may at any bytecode)."""

    def __init__(self, t):
        self.t = t

    def numel(self):
        return self.t.numel()

    def __getitem__(self, s):
        import time
        time.sleep(1e-4)
        return self.t[s]


def test_capture_tickets_from_threads_at_once_never_overlap(monkeypatch):
    """Threads capturing at the same time take slices of one pool: none is handed out twice."""
    import threading
    _fake_pools(monkeypatch)
    monkeypatch.setattr(G.C, "persistent_zeros", lambda n, dtype, device: _SlowPool(torch.zeros(n, dtype=dtype)))
    got, start = [], threading.Barrier(8)

    def take():
        start.wait()
        mine = [G._tickets_for_capture(_Dev(), 50) for _ in range(20)]
        got.extend((t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in mine)
    ths = [threading.Thread(target=take) for _ in range(8)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert len(got) == 160 and len(set(got)) == 160
    got.sort()
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(got, got[1:]))


def test_stream_buffers_grow_and_keep_what_they_replace(monkeypatch):
    """The per-stream tickets and workspace are reused while they are large enough; a larger request makes a new
    zeroed buffer (the workspace at least doubles) and keeps the old one for good, never handed out again."""
    made = []

    def zeros(n, dtype, device):
        made.append((n, dtype))
        return torch.zeros(n, dtype=dtype)
    state = [None, None]
    monkeypatch.setattr(G.C, "persistent_zeros", zeros)
    monkeypatch.setattr(G, "_stream_slot", lambda device: state)
    monkeypatch.setattr(G, "_retired", [])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    t0, w0 = G._stream_buffers(_Dev(), 10, 100)
    assert made == [(4096, torch.int32), (100, torch.float32)] and G._retired == []
    t1, w1 = G._stream_buffers(_Dev(), 4096, 100)
    assert t1 is t0 and w1 is w0 and len(made) == 2
    w2 = G._stream_workspace(_Dev(), 150)
    assert made[-1] == (200, torch.float32) and w2 is not w0 and G._retired == [w0]
    t3, w3 = G._stream_buffers(_Dev(), 5000, 500)
    assert made[-2:] == [(5000, torch.int32), (500, torch.float32)] and w3 is not w2
    assert G._retired == [w0, t0, w2] and state == [t3, w3]


def test_tma_kernel_copies_its_operands_by_tma_and_its_weights_evict_first():
    """skinny_tma_kernel's sm_90a SASS (cuobjdump, which prints each instruction's encoding): a chunk of KB = 4 boxes
    of 128 rows is 4 activation copies and 4 x 4 weight copies (32-row boxes), 20 UTMALDG, and no 16-byte cp.async
    (LDGSTS.128: the activations' old path; the scales' 4-byte ones stay). With the default weight hint (4) the 16
    weight copies carry an L2 cache policy: their encoding differs from the 4 activation copies', which match the
    plain copies of a build with hint 2, where all 20 are alike."""
    import importlib
    import subprocess
    import tempfile
    from collections import Counter
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    tool = importlib.import_module("rocjit.inspect")._nvidia_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not installed")
    name = "skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 2, 4, 2, skinny::ep_store>"
    enc = {}
    for hint in (None, "2"):
        co = Module("skinny_gemm.hip", defines={"SKINNY_W_HINT": hint} if hint else {}).compile("sm_90a", (name,))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(co.binary)
            f.flush()
            lines = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout.splitlines()
        assert not [s for s in lines if "LDGSTS" in s and ".128" in s], hint
        enc[hint] = Counter(lines[i + 1].strip() for i, s in enumerate(lines) if "UTMALDG" in s)
    (plain, n), = enc["2"].items()
    assert n == 20
    assert enc[None][plain] == 4 and sum(enc[None].values()) == 20 and len(enc[None]) == 2


def test_tensor_map_functions_are_shared_per_geometry_and_remember_addresses(monkeypatch):
    """tensor_map_fn: one function per geometry (so an eager plan's replays and every call of a shape share it), which
    encodes a map once per address and keeps the last 64 (a decode step's activations return to the same few
    addresses); a map is the driver's encoding of (address, geometry) and nothing else."""
    from rocjit.platform import cuda
    encoded = []

    def fake(address, inner, rows, ld, box_inner, box_rows):
        encoded.append(address)
        return b"%d %d %d %d %d %d" % (address, inner, rows, ld, box_inner, box_rows)

    monkeypatch.setattr(cuda, "tensor_map_2d", fake)
    G.tensor_map_fn.cache_clear()
    try:
        fn = G.tensor_map_fn(6656, 32, 6656, 32)
        assert G.tensor_map_fn(6656, 32, 6656, 32) is fn and G.tensor_map_fn(6656, 17, 6656, 32) is not fn
        assert fn(1 << 20) == b"1048576 6656 32 6656 128 32" and fn(1 << 20) is fn(1 << 20)
        assert encoded == [1 << 20]
        for i in range(64):                                  # 64 more addresses push the first one out
            fn((2 << 20) + 256 * i)
        fn(1 << 20)
        assert len(encoded) == 66 and encoded[-1] == 1 << 20
    finally:
        G.tensor_map_fn.cache_clear()


def test_tma_split_k_launch(monkeypatch):
    """launch_tma with cfg["splits"]: one block per (tile, split) and the split count as the kernel's last argument,
    the splits' raw sums in the stream's workspace ([splits, M, N]) and skinny_splitk_reduce after it; without it, the
    stream-K grid (at most one block per multiprocessor) and 0 there. tma_candidates offers splits only where the
    (tile, split) blocks fit in one wave."""
    import torch
    launched = []
    Call = _recording_call(launched)
    monkeypatch.setattr(G, "_kernel", lambda src, name, defines=(): name)
    monkeypatch.setattr(G, "_stream_buffers", lambda device, tiles, n: (torch.zeros(4096, dtype=torch.int32),
                                                                        torch.empty(n)))
    a = torch.empty(32, 16384, dtype=torch.float8_e4m3fn)
    w = torch.empty(2304, 16384, dtype=torch.float8_e4m3fn)
    out = torch.empty(32, 2304, dtype=torch.bfloat16)
    cfg = {"path": "tma", "slabs": 1, "wg": 1, "kb": 4}
    G.launch_tma(a, w, out, None, None, 32, 2304, 16384, dict(cfg, splits=3), 132, Call())
    (k, grid, block, args), (r, rgrid, rblock, rargs) = launched
    assert k.startswith("skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 1, 4,")
    assert grid == 36 * 3 and block == 256 and args[-1] == 3 and args[4].numel() == 3 * 32 * 2304
    assert r == "skinny_splitk_reduce<__hip_bfloat16, skinny::ep_store>" and rargs[0] is args[4] and rargs[-2] == 3
    launched.clear()
    G.launch_tma(a, w, out, None, None, 32, 2304, 16384, cfg, 132, Call())
    (k, grid, block, args), = launched
    assert grid == 132 and args[-1] == 0
    assert {c.get("splits") for c in G.tma_candidates(32, 2304, 16384, 132, 1)} >= {None, 2, 3}
    assert all(-(-2304 // (64 * c["slabs"] * c["wg"])) * c["splits"] <= 132
               for c in G.tma_candidates(32, 2304, 16384, 132, 1) if "splits" in c)
    assert not any("splits" in c for c in G.tma_candidates(32, 13312, 16384, 132, 1))


def test_tma_stream_k_with_the_reduce_kernel(monkeypatch):
    """launch_tma with cfg["reduce"]: the stream-K grid, splits argument -1 (raw sums, no fix-up), a workspace of one
    [M, N] slab for each of the most blocks that share a tile, then skinny_streamk_reduce with the tile geometry
    and grid it needs to find each output's blocks. streamk_slabs agrees with counting owners chunk by chunk.
    tma_candidates offers the twin wherever tiles are shared (not where every block owns whole tiles)."""
    import torch
    launched = []
    Call = _recording_call(launched)
    monkeypatch.setattr(G, "_kernel", lambda src, name, defines=(): name)
    monkeypatch.setattr(G, "_stream_buffers", lambda device, tiles, n: (torch.zeros(4096, dtype=torch.int32),
                                                                        torch.empty(n)))
    for total, nk, blocks in ((18 * 64, 64, 132), (104 * 32, 32, 132), (9 * 33, 33, 132), (7, 7, 3), (40, 4, 7)):
        owners = [((f + 1) * blocks - 1) // total for f in range(total)]
        assert all(b * total // blocks <= f < (b + 1) * total // blocks for f, b in enumerate(owners))
        want = max(len(set(owners[t:t + nk])) for t in range(0, total, nk))
        assert G.streamk_slabs(total, nk, blocks) == want, (total, nk, blocks)
    a = torch.empty(32, 16384, dtype=torch.bfloat16)
    w = torch.empty(2304, 16384, dtype=torch.bfloat16)
    out = torch.empty(32, 2304, dtype=torch.bfloat16)
    G.launch_tma(a, w, out, None, None, 32, 2304, 16384, {"path": "tma", "slabs": 1, "wg": 2, "kb": 2, "reduce": 1},
                 132, Call())
    (k, grid, block, args), (r, rgrid, rblock, rargs) = launched
    slabs = G.streamk_slabs(18 * 128, 128, 132)              # 18 tiles of 128 rows, 128 chunks of 256 bytes each
    assert k.startswith("skinny_tma_kernel<skinny::bf16_t, __hip_bfloat16, 32, 1, 2, 2,") and grid == 132
    assert args[-1] == -1 and args[4].numel() == slabs * 32 * 2304 and slabs == 8
    assert r == "skinny_streamk_reduce<__hip_bfloat16, skinny::ep_store>" and rargs[0] is args[4]
    assert rargs[-3:] == (128, 128, 132) and rgrid * rblock >= 32 * 2304
    assert G.launches({"path": "tma", "reduce": 1}) == 2
    cands = G.tma_candidates(32, 2304, 16384, 132, 2)
    assert any(c.get("reduce") for c in cands)
    assert not any(c.get("reduce") and (c.get("splits") or c.get("blocks")) for c in cands)
