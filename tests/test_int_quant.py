"""int8 / int4 weight layouts and their float references (CPU)."""
import numpy as np
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


def _oracle_int4(packed, scale, zero, group_size, x):
    """W x from the packed bytes, one weight at a time: nibble extraction by hand (low nibble = even k), float64
    scale and zero per group, then a plain matmul. Shares no code with int_quant."""
    pk = packed.numpy()
    sc, zr = scale.double().numpy(), zero.double().numpy()
    N, K = pk.shape[0], 2 * pk.shape[1]
    w = np.empty((N, K), np.float64)
    for n in range(N):
        for k in range(K):
            byte = int(pk[n, k // 2])
            q = byte & 0x0F if k % 2 == 0 else (byte >> 4) & 0x0F
            g = k // group_size
            w[n, k] = (q - zr[n, g]) * sc[n, g]
    return x.double().numpy() @ w.T


def _oracle_int8(q, scale, x):
    qn, sc = q.numpy(), scale.double().numpy()
    w = np.array([[float(qn[n, k]) * sc[n] for k in range(qn.shape[1])] for n in range(qn.shape[0])])
    return x.double().numpy() @ w.T


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("zero_dtype", [torch.float16, torch.float32])
def test_gemv_reference_int4_against_an_independent_oracle(g, zero_dtype):
    """Random packed bytes (every nibble value, both halves), random scales and fractional zero points: nothing
    here comes from quantize_int4, so a swapped nibble order or a wrong group index shows."""
    gen = torch.Generator().manual_seed(g)
    N, K = 11, 2 * g + 64 if g < 128 else 256
    packed = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=gen)
    scale = (torch.rand(N, K // g, generator=gen) + 0.25).to(zero_dtype)
    zero = (torch.rand(N, K // g, generator=gen) * 15).to(zero_dtype)
    for x in (torch.randn(K, generator=gen).half(), torch.randn(3, K, generator=gen).bfloat16()):
        got = Q.gemv_reference(packed, x, w_scale=scale, w_zero=zero, group_size=g)
        want = _oracle_int4(packed, scale, zero, g, x)
        assert got.dtype == torch.float64 and tuple(got.shape) == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_gemv_reference_int8_and_float_against_an_independent_oracle():
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (13, 96), dtype=torch.int8, generator=gen)
    s = torch.rand(13, generator=gen) + 0.01
    x = torch.randn(4, 96, generator=gen).half()
    np.testing.assert_allclose(Q.gemv_reference(q, x, w_scale=s).numpy(), _oracle_int8(q, s, x), rtol=1e-12, atol=1e-12)
    w = torch.randn(13, 96, generator=gen).half()
    want = np.array([[sum(float(x[b, k]) * float(w[n, k]) for k in range(96)) for n in range(13)] for b in range(4)])
    np.testing.assert_allclose(Q.gemv_reference(w, x).numpy(), want, rtol=1e-12, atol=1e-12)


def test_the_int4_oracle_sees_a_swapped_nibble_order():
    """The oracle is strict enough to catch the mistake it exists for."""
    gen = torch.Generator().manual_seed(4)
    packed = torch.randint(0, 256, (5, 32), dtype=torch.uint8, generator=gen)
    scale, zero = torch.rand(5, 2, generator=gen) + 0.5, torch.rand(5, 2, generator=gen) * 15
    x = torch.randn(64, generator=gen)
    swapped = ((packed >> 4) | (packed << 4)).to(torch.uint8)
    got = Q.gemv_reference(swapped, x, w_scale=scale, w_zero=zero, group_size=32)
    assert not np.allclose(got.numpy(), _oracle_int4(packed, scale, zero, 32, x), rtol=1e-6)


def test_quantize_int4_round_trip_through_the_oracle():
    """quantize_int4 followed by the oracle's dequantization recovers W within a step per group."""
    torch.manual_seed(2)
    w = torch.randn(7, 128)
    p, s, z = Q.quantize_int4(w, 32)
    eye = torch.eye(128, dtype=torch.float64)
    deq = _oracle_int4(p, s, z, 32, eye).T            # W e_k for every k: the dequantized matrix
    step = s.double().repeat_interleave(32, dim=1).numpy()
    assert (np.abs(deq - w.double().numpy()) <= step + 1e-6).all()
