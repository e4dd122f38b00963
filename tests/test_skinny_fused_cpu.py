"""Fused skinny-GEMM epilogues on a CPU: the gate/up interleave, argument errors, the host/kernel contract of every
epilogue on every path (names and parameter lists), and their builds for NVIDIA and AMD."""
import re

import pytest

torch = pytest.importorskip("torch")

import rocjit.ops as ops  # noqa: E402
from rocjit import signature  # noqa: E402
from rocjit.ops import _gemm as G  # noqa: E402

F8 = torch.float8_e4m3fn


@pytest.mark.parametrize("inter", [1, 7, 8, 13, 16, 1037])
@pytest.mark.parametrize("dt", [torch.bfloat16, F8], ids=["bf16", "fp8"])
def test_prepare_gate_up_interleaves_groups_of_eight(inter, dt):
    K = 32
    g = torch.randn(inter, K).to(dt)
    u = torch.randn(inter, K).to(dt)
    gs, us = torch.rand(inter) + 0.5, torch.tensor([0.25])
    w, s = ops.prepare_gate_up(g, u, gs, us)
    groups = -(-inter // 8)
    assert w.shape == (16 * groups, K) and w.dtype == dt and w.is_contiguous()
    assert s.shape == (16 * groups,) and s.dtype == torch.float32
    raw = w.view(torch.uint8 if dt == F8 else torch.int16)
    graw, uraw = (t.view(raw.dtype) for t in (g, u))
    for i in range(inter):
        n = 16 * (i // 8) + i % 8                    # the kernels' gate row of output i; its up row is n + 8
        assert torch.equal(raw[n], graw[i]) and torch.equal(raw[n + 8], uraw[i])
        assert s[n] == gs[i] and s[n + 8] == 0.25
    for i in range(inter, 8 * groups):               # padding: zero rows, unit scales
        n = 16 * (i // 8) + i % 8
        assert not raw[n].any() and not raw[n + 8].any() and s[n] == 1 and s[n + 8] == 1
    assert ops.prepare_gate_up(g, u)[1] is None


def test_prepare_gate_up_errors():
    g = torch.randn(16, 32).bfloat16()
    with pytest.raises(ValueError, match="gate_w and up_w must match"):
        ops.prepare_gate_up(g, g[:8])
    with pytest.raises(ValueError, match="both gate_scale and up_scale"):
        ops.prepare_gate_up(g, g, torch.ones(16))
    with pytest.raises(ValueError, match="up_scale must have 1 or I=16"):
        ops.prepare_gate_up(g, g, torch.ones(16), torch.ones(3))
    with pytest.raises(TypeError, match="gate_w must be a 2-D"):
        ops.prepare_gate_up(g[0], g)


def test_fused_ops_name_the_bad_argument():
    a = torch.randn(4, 64).bfloat16()
    w = torch.randn(48, 64).bfloat16()
    with pytest.raises(ValueError, match="w_gate_up must come from prepare_gate_up"):
        ops.skinny_gemm_swiglu(a, w[:40])
    with pytest.raises(ValueError, match=r"intermediate must be the I .* I in 17..24\), got 30"):
        ops.skinny_gemm_swiglu(a, w, intermediate=30)
    with pytest.raises(ValueError, match="intermediate must be"):
        ops.skinny_gemm_swiglu(a, w, intermediate=16)
    with pytest.raises(ValueError, match="M <= 32"):
        ops.skinny_gemm_swiglu(torch.randn(33, 64).bfloat16(), w)
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 48\)"):
        ops.skinny_gemm_residual(a, w, torch.randn(4, 47).bfloat16())
    with pytest.raises(TypeError, match="residual must have dtype float16 or bfloat16"):
        ops.skinny_gemm_residual(a, w, torch.randn(4, 48))
    with pytest.raises(TypeError, match="skinny_gemm_residual: out must have dtype bfloat16"):
        ops.skinny_gemm_residual(a, w, torch.randn(4, 48).bfloat16(), out=torch.empty(4, 48).half())
    with pytest.raises(ValueError, match="same GPU"):
        ops.skinny_gemm_residual(a, w, torch.randn(4, 48).bfloat16())


def test_residual_op_declares_its_mutation():
    entry = ops.REGISTRY["skinny_gemm_residual"]
    assert entry.mutates_args == ("residual",)
    assert "residual" in [p for p in __import__("inspect").signature(entry.function).parameters]
    assert ops.REGISTRY["skinny_gemm_swiglu"].mutates_args == ()


# ----------------------------------------------------------------------------- host / kernel contract
class _Recorder:
    """Stands in for the op's Call: records (kernel name, args) of each launch, allocates on the CPU."""

    def __init__(self):
        self.launches = []

    def launch(self, kernel, grid, block, *args, shared_mem=0):
        self.launches.append((kernel, args))

    def empty(self, shape, dtype, device):
        return torch.empty(tuple(shape), dtype=dtype, device=device)

    def const(self, obj):
        return obj

    def bind_stream(self):
        pass


def _epilogue_cases():
    bf = torch.bfloat16
    return [  # (a dtype, out dtype, ep, fmt, residual?, out_scale?)
        (F8, F8, G.ep_swiglu("e4m3fn"), "e4m3fn", False, True),
        (F8, torch.float8_e4m3fnuz, G.ep_swiglu("e4m3fnuz"), "e4m3fnuz", False, True),
        (bf, bf, G.ep_swiglu(None), None, False, False),
        (F8, bf, G.EP_RESIDUAL, None, True, False),
        (torch.float16, torch.float16, G.EP_RESIDUAL, None, True, False),
        (F8, bf, G.EP_STORE, None, False, False),
    ]


def _record_all(monkeypatch, M, N, K, inter):
    monkeypatch.setattr(G, "_kernel", lambda src, name, defines=(): name)
    monkeypatch.setattr(G, "_stream_buffers", lambda device, tiles, ws: (torch.zeros(max(tiles, 16), dtype=torch.int32),
                                                                         torch.empty(ws)))
    monkeypatch.setattr(G, "_stream_workspace", lambda device, floats: torch.empty(floats))
    rec = _Recorder()
    for adt, odt, ep, fmt, res, osc in _epilogue_cases():
        a = torch.zeros(M, K).to(adt)
        w = torch.zeros(N, K).to(adt)
        cols = inter if "swiglu" in ep else N
        out = torch.empty(M, cols, dtype=odt)
        kw = dict(ep=ep, residual=out if res else None, out_scale=torch.ones(1) if osc else None)
        sw = torch.ones(N)
        eb = a.element_size()
        for cfg in G.mma_candidates(M, N, K, 132, eb):
            G.launch_mma(a, w, out, torch.ones(1), sw, M, N, K, cfg, "sm_90a", 32, rec, **kw)
        for cfg in G.stream_candidates(M, N, K, 132, eb):
            G.launch_stream(a, w, out, torch.ones(1), sw, M, N, K, cfg, 132, rec, **kw)
        for cfg in G.portable_skinny_candidates(M, "sm_90a", swiglu="swiglu" in ep):
            G.launch_skinny_portable(a, w, out, torch.ones(1), sw, M, N, K, cfg, rec, **kw)
    return rec.launches


@pytest.mark.parametrize("M", [1, 17, 32])
def test_every_epilogue_launch_matches_its_kernel_signature(monkeypatch, M):
    """Each launch the host makes passes one argument per kernel parameter, pointers where pointers are
    declared; SwiGLU launches pass I (not the 2*I8 weight rows) as the output's columns."""
    from rocjit.compiler import kernels_src_dir
    srcs = {s: (kernels_src_dir() / s).read_text() for s in (G.SRC, G.GEMV_SRC)}
    N, K, inter = 2080, 4096, 1037
    launches = _record_all(monkeypatch, M, N, K, inter)
    kinds = set()
    for name, args in launches:
        params = signature.parse(srcs[G.GEMV_SRC if name.startswith("gemv_kernel<") else G.SRC], name)
        assert params is not None and len(params) == len(args), name
        for p, v in zip(params, args):
            if p.pointer:
                assert v is None or isinstance(v, torch.Tensor), (name, p.name)
            else:
                assert type(v) is int, (name, p.name, v)
        named = dict(zip([p.name for p in params], args))
        if "swiglu" in name:
            assert named["ldo"] == inter and named["N"] == N
        kinds.add(name.split("<")[0])
    portable = {"gemv_kernel"} if M <= G.PORTABLE_SKINNY_ROWS else set()
    assert kinds == {"skinny_gemm_kernel", "skinny_splitk_reduce", "skinny_stream_kernel"} | portable


def _check_lines(src=G.SRC):
    from rocjit.compiler import kernels_src_dir
    return re.findall(r"//\s*rocjit:check\s+(.+)", (kernels_src_dir() / src).read_text())


def test_every_epilogue_of_every_kernel_is_build_checked():
    """CI's compile and resource checks (sm_90a, gfx90a, gfx942, gfx950) see each epilogue on each kernel."""
    lines = _check_lines()
    for kernel in ("skinny_gemm_kernel", "skinny_splitk_reduce", "skinny_stream_kernel"):
        for ep in ("skinny::ep_store>", "skinny::ep_residual>", "ep_swiglu<skinny::no_quant>>",
                   "ep_swiglu<rocjit::e4m3fn>>"):
            assert any(line.startswith(kernel + "<") and line.endswith(ep) for line in lines), (kernel, ep)
    assert any("ep_swiglu<rocjit::e4m3fnuz>>" in line for line in lines)     # gfx942's format
    gemv = _check_lines(G.GEMV_SRC)                                            # skinny_gemm's M <= 2 path
    for ep in ("skinny::ep_store>", "skinny::ep_residual>", "ep_swiglu<skinny::no_quant>>", "ep_swiglu<rocjit::e4m3fn>>",
               "ep_swiglu<rocjit::e4m3fnuz>>"):
        assert any(line.startswith("gemv_kernel<") and line.endswith(ep) for line in gemv), ep


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("target", ["sm_90a", "gfx942"])
def test_host_built_names_compile(monkeypatch, target):
    """The exact name expressions the host builds for the FP8 SwiGLU path (mma, split-K reduce, stream) compile."""
    if target.startswith("sm_") and not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    if target.startswith("gfx"):
        from tests.test_ops_fused_cpu import _require_amd
        _require_amd(target)
    from rocjit.ops import _common as C
    names = list(dict.fromkeys(n for n, _ in _record_all(monkeypatch, 8, 2080, 4096, 1037)
                               if "e4m3fn>" in n and "fnuz" not in n))
    picked = [next(n for n in names if n.startswith(k)) for k in
              ("skinny_gemm_kernel", "skinny_splitk_reduce", "skinny_stream_kernel")]
    mod = C.module(G.SRC)
    for n in picked:
        co = mod.compile(target, (n,))
        assert co.binary and n in co.lowered
