"""GEMV on the GPU against float64 references: fp16/bf16/int8/int4, every candidate config, the op."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from rocjit.ops import matvec as G  # noqa: E402
from rocjit.ops import int_quant as Q  # noqa: E402
from rocjit.ops import skinny  # noqa: E402


def _weights(kind, xdt, N, K, g):
    w = torch.randn(N, K, device="cuda", generator=g)
    if kind == "float":
        return w.to(xdt), {}, (4e-3 if xdt == torch.bfloat16 else 1e-3)
    if kind == "i8":
        q, s = Q.quantize_int8(w, scale_dtype=xdt)
        return q, {"w_scale": s}, 5e-3
    gs = int(kind[3:].rstrip("z"))
    p, s, z = Q.quantize_int4(w, gs, scale_dtype=torch.float32 if gs == 64 else xdt)
    if kind.endswith("z"):      # fractional zero points (as some formats store them): used exactly, not rounded
        z = (z.float() + torch.rand(z.shape, device=z.device, generator=g) - 0.5).to(z.dtype)
        assert (z.float() != z.float().round()).float().mean() > 0.9
    return p, {"w_scale": s, "w_zero": z, "group_size": gs}, 5e-3


def _rel(y, ref):
    assert not torch.isnan(y).any(), "output left unwritten (poison visible)"
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("xdt", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", ["float", "i8", "i4g32", "i4g64", "i4g128", "i4g64z"])
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("K", [256, 6656, 16384])
def test_every_config_matches_reference(xdt, kind, B, K):
    N = 1037
    g = torch.Generator(device="cuda").manual_seed(B * 131 + K)
    w, kw, tol = _weights(kind, xdt, N, K, g)
    x = torch.randn(B, K, device="cuda", generator=g).to(xdt)
    ref = Q.gemv_reference(w, x, **kw)
    target, _, sms = skinny._device(0)
    k = {"float": "f16" if xdt == torch.float16 else "bf16", "i8": "i8"}.get(kind, "i4")
    cands, _ = G._candidates(k, B, N, K, target, sms)
    for cfg in cands:
        out = torch.full((B, N), float("nan"), dtype=xdt, device="cuda")
        G.run_config(cfg, k, x, w, out, kw.get("w_scale"), kw.get("w_zero"), kw.get("group_size"), target, sms)
        assert _rel(out, ref) < tol, cfg
    y = G.gemv(w, x if B > 1 else x[0], **kw)
    assert y.shape == ((B, N) if B > 1 else (N,)) and y.dtype == xdt
    assert _rel(y.view(B, N), ref) < tol


@pytest.mark.parametrize("kind", ["float", "i4g128"])
def test_misaligned_operands(kind):
    """x at an odd offset is realigned (right answer, no fault); a misaligned w or out= is an error naming it."""
    g = torch.Generator(device="cuda").manual_seed(9)
    N, K = 300, 1024
    w, kw, tol = _weights(kind, torch.float16, N, K, g)
    base = torch.randn(K + 1, device="cuda", generator=g).half()
    x = base[1:]                                   # contiguous, data pointer 2 bytes past an aligned one
    assert x.data_ptr() % 16
    ref = Q.gemv_reference(w, x[None], **kw)[0]
    assert _rel(G.gemv(w, x, **kw)[None], ref[None]) < tol
    wbase = torch.empty(w.numel() + 8, dtype=w.dtype, device="cuda")
    wm = wbase[1:w.numel() + 1].view(w.shape)
    wm.copy_(w)
    with pytest.raises(ValueError, match="w's data pointer"):
        G.gemv(wm, x, **kw)
    obase = torch.empty(N + 1, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="out's data pointer"):
        G.gemv(w, x, out=obase[1:], **kw)
    torch.cuda.synchronize()


def test_out_argument_and_graph_capture():
    g = torch.Generator(device="cuda").manual_seed(5)
    p, s, z = Q.quantize_int4(torch.randn(500, 1024, device="cuda", generator=g), 128)
    x = torch.randn(1024, device="cuda", generator=g).half()
    y = G.gemv(p, x, w_scale=s, w_zero=z, group_size=128)
    out = torch.full_like(y, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        G.gemv(p, x, w_scale=s, w_zero=z, group_size=128, out=out)
    graph.replay()
    torch.cuda.synchronize()
    ref = Q.gemv_reference(p, x, w_scale=s, w_zero=z, group_size=128)
    assert _rel(out, ref) < 5e-3                   # the float64 reference, not only the eager result
    assert _rel(y, ref) < 5e-3 and torch.equal(out, y)


def test_errors_name_the_problem():
    x = torch.randn(256, device="cuda", dtype=torch.float16)
    w = torch.randn(64, 256, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="B=9"):
        G.gemv(w, torch.randn(9, 256, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match="x's dtype"):
        G.gemv(w.bfloat16(), x)
    with pytest.raises(ValueError, match="w_scale"):
        G.gemv(w.to(torch.int8), x)
    q = torch.randint(0, 255, (64, 128), device="cuda", dtype=torch.uint8)
    with pytest.raises(ValueError, match="group_size"):
        G.gemv(q, x, w_scale=torch.ones(64, 4, device="cuda"), w_zero=torch.ones(64, 4, device="cuda"), group_size=48)
    with pytest.raises(ValueError, match="w_zero"):
        G.gemv(q, x, w_scale=torch.ones(64, 2, device="cuda"), group_size=128)
    with pytest.raises(ValueError, match="multiple of 16"):
        G.gemv(w[:, :200].contiguous(), x[:200])


def test_numpy_inputs_give_numpy_output():
    np = pytest.importorskip("numpy")
    w = np.random.randn(70, 128).astype(np.float16)
    x = np.random.randn(128).astype(np.float16)
    y = G.gemv(w, x)
    assert isinstance(y, np.ndarray) and y.shape == (70,)
    ref = w.astype(np.float64) @ x.astype(np.float64)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-3
