"""Weight quantization helpers producing the layouts rocjit.ops.gemv reads, with float references.

int8: symmetric per row.     W ~= q * scale[n],                      q in [-127, 127]
int4: asymmetric per group.  W ~= (q - zero[n, g]) * scale[n, g],     q in [0, 15], g = k // group_size
      packed two per byte, low nibble first: byte j of a row = q[2j] | q[2j + 1] << 4.

All functions take and return torch tensors on any device (CPU included).
"""
from __future__ import annotations


def pack_int4(q):
    """[N, K] integers in 0..15 -> [N, K/2] uint8, low nibble = even k."""
    import torch
    if q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4: expected [N, K] with K even, got shape {tuple(q.shape)}")
    qi = q.to(torch.int32)
    if bool(((qi < 0) | (qi > 15)).any()):
        raise ValueError("pack_int4: values must lie in 0..15")
    return (qi[:, 0::2] | (qi[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed):
    """[N, K/2] uint8 -> [N, K] uint8 in 0..15 (inverse of pack_int4)."""
    import torch
    p = packed.to(torch.int32)
    q = torch.stack((p & 0xF, p >> 4), dim=-1)
    return q.reshape(packed.shape[0], -1).to(torch.uint8)


def quantize_int8(w, *, scale_dtype=None):
    """(q int8 [N, K], scale [N]) with scale = max|w[n]| / 127 (float32 unless scale_dtype is given)."""
    import torch
    if w.dim() != 2:
        raise ValueError(f"quantize_int8: expected [N, K], got shape {tuple(w.shape)}")
    wf = w.to(torch.float32)
    scale = wf.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    if scale_dtype is not None:
        scale = scale.to(scale_dtype)
    q = torch.round(wf / scale.to(torch.float32)[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w, group_size: int = 128, *, scale_dtype=None):
    """(packed uint8 [N, K/2], scale [N, K/G], zero [N, K/G]): per group, scale = (max - min) / 15 and an
    integer zero point in 0..15, q = clamp(round(w / scale) + zero, 0, 15). scale/zero dtype: float16
    unless scale_dtype is given (they are read per 32 weights, so small types save bandwidth)."""
    import torch
    if w.dim() != 2:
        raise ValueError(f"quantize_int4: expected [N, K], got shape {tuple(w.shape)}")
    N, K = w.shape
    if group_size not in (32, 64, 128) or K % group_size:
        raise ValueError(f"quantize_int4: group_size must be 32, 64 or 128 and divide K={K}, got {group_size}")
    sdt = scale_dtype or torch.float16
    g = w.to(torch.float32).reshape(N, K // group_size, group_size)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    scale = ((hi - lo) / 15.0).clamp_min(1e-8).to(sdt)
    s32 = scale.to(torch.float32)
    zero = torch.round(-lo / s32).clamp_(0, 15).to(sdt)
    q = torch.round(g / s32[..., None]) + zero.to(torch.float32)[..., None]
    q = q.clamp_(0, 15).to(torch.uint8).reshape(N, K)
    return pack_int4(q), scale, zero


def dequantize_int8(q, scale):
    """float64 [N, K] = q * scale[n]."""
    import torch
    return q.to(torch.float64) * scale.to(torch.float64)[:, None]


def dequantize_int4(packed, scale, zero, group_size: int):
    """float64 [N, K] = (q - zero[n, k // G]) * scale[n, k // G]."""
    import torch
    q = unpack_int4(packed).to(torch.float64)
    s = scale.to(torch.float64).repeat_interleave(group_size, dim=1)
    z = zero.to(torch.float64).repeat_interleave(group_size, dim=1)
    return (q - z) * s


def gemv_reference(w, x, *, w_scale=None, w_zero=None, group_size=None):
    """float64 W x for every weight format gemv accepts (x [K] or [B, K]); the tests' oracle."""
    import torch
    if w.dtype == torch.int8:
        wd = dequantize_int8(w, w_scale)
    elif w.dtype == torch.uint8:
        wd = dequantize_int4(w, w_scale, w_zero, group_size)
    else:
        wd = w.to(torch.float64)
    return x.to(torch.float64) @ wd.t()
