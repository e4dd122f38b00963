"""int8 / int4 weight layouts and their float references (CPU)."""
import pytest
import torch

from rocjit.ops import int_quant as Q


def test_pack_int4_low_nibble_first_and_round_trip():
    q = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]], dtype=torch.uint8)
    p = Q.pack_int4(q)
    assert p.dtype == torch.uint8 and p.tolist() == [[0x21, 0x0F], [0x87, 0xC3]]
    r = torch.randint(0, 16, (37, 96), dtype=torch.uint8)
    assert torch.equal(Q.unpack_int4(Q.pack_int4(r)), r)


def test_pack_int4_rejects_bad_input():
    with pytest.raises(ValueError, match="0..15"):
        Q.pack_int4(torch.tensor([[16, 0]]))
    with pytest.raises(ValueError, match="K even"):
        Q.pack_int4(torch.zeros(2, 3, dtype=torch.uint8))


def test_quantize_int8_error_bound():
    torch.manual_seed(0)
    w = torch.randn(53, 320)
    q, s = Q.quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (53,) and s.dtype == torch.float32
    err = (Q.dequantize_int8(q, s) - w.double()).abs()
    assert bool((err <= s.double()[:, None] * 0.5 + 1e-7).all())          # half a step per row
    assert int(q.abs().max()) == 127


@pytest.mark.parametrize("g", [32, 64, 128])
def test_quantize_int4_error_bound(g):
    torch.manual_seed(1)
    w = torch.randn(29, 256) * 0.1 + 0.05
    p, s, z = Q.quantize_int4(w, g)
    assert p.shape == (29, 128) and s.shape == (29, 256 // g) and z.shape == s.shape and s.dtype == torch.float16
    assert bool(((z >= 0) & (z <= 15) & (z == z.round())).all())
    deq = Q.dequantize_int4(p, s, z, g)
    step = s.double().repeat_interleave(g, dim=1)
    # within half a step, plus the clamp at the group's ends (zero point is rounded)
    assert bool(((deq - w.double()).abs() <= step * 1.0 + 1e-6).all())
    rel = float((deq - w.double()).norm() / w.double().norm())
    assert rel < 0.1


def test_quantize_int4_rejects_bad_group():
    with pytest.raises(ValueError, match="group_size"):
        Q.quantize_int4(torch.randn(4, 96), 64)
    with pytest.raises(ValueError, match="group_size"):
        Q.quantize_int4(torch.randn(4, 96), 48)


def test_gemv_reference_matches_dequantized_math():
    torch.manual_seed(2)
    w = torch.randn(40, 128)
    x = torch.randn(3, 128, dtype=torch.float16)
    q, s = Q.quantize_int8(w)
    ref = Q.gemv_reference(q, x, w_scale=s)
    assert torch.allclose(ref, x.double() @ (q.double() * s.double()[:, None]).t())
    p, s4, z4 = Q.quantize_int4(w, 32)
    ref4 = Q.gemv_reference(p, x[0], w_scale=s4, w_zero=z4, group_size=32)
    assert ref4.shape == (40,)
    assert torch.allclose(ref4, Q.dequantize_int4(p, s4, z4, 32) @ x[0].double())
