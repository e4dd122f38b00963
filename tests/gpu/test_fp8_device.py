"""Device FP8 conversions (kernels_src/rocjit/fp8.h) bit-for-bit against the ml_dtypes reference."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

SRC = r"""
#include <hip/hip_runtime.h>
#include "rocjit/fp8.h"
using namespace rocjit;
// mode 0: packed path (hardware where the target has it), 1: software path, 2: 4-wide packed
template <class F>
__global__ void convert(unsigned char* out, float* back, const float* in, int n, int mode) {
    int i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    float v[4];
    for (int j = 0; j < 4; ++j) v[j] = i + j < n ? in[i + j] : 0.0f;
    unsigned int r;
    if (mode == 2) r = float4_to_fp8x4<F>(v[0], v[1], v[2], v[3]);
    else if (mode == 1) r = float2_to_fp8x2_soft<F>(v[0], v[1]) | (float2_to_fp8x2_soft<F>(v[2], v[3]) << 16);
    else r = float2_to_fp8x2<F>(v[0], v[1]) | (float2_to_fp8x2<F>(v[2], v[3]) << 16);
    for (int j = 0; j < 4 && i + j < n; ++j) {
        out[i + j] = (r >> (8 * j)) & 0xff;
        back[i + j] = fp8_to_float<F>((r >> (8 * j)) & 0xff);
    }
}
"""


def _inputs():
    from rocjit.ops import _common as C
    rng = np.random.default_rng(1)
    parts = []
    for fmt in ("e4m3fn", "e4m3fnuz"):
        vals = np.unique(C.fp8_decode(np.arange(256, dtype=np.uint8), fmt))
        vals = vals[np.isfinite(vals)]
        mids = (vals[1:] + vals[:-1]) / 2
        eps = np.abs(mids) * 2.0 ** -20 + 2.0 ** -30
        parts += [vals, mids, mids + eps, mids - eps]
    parts += [rng.standard_normal(1 << 20) * 100, rng.uniform(-600, 600, 1 << 18), rng.standard_normal(1 << 16) * 1e-3,
              np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 449, 464, 465, 480, 240, 247, 248, 1e-12])]
    x = np.concatenate(parts).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([x, bits])


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_device_conversion_bit_exact(fmt, mode):
    import torch
    import rocjit
    from rocjit.ops import _common as C
    k = rocjit.Module(SRC)[f"convert<rocjit::{fmt}>"]
    x = _inputs()
    n = x.size
    xt = torch.from_numpy(x).cuda()
    out = torch.full((n,), 0x55, dtype=torch.uint8, device="cuda")
    back = torch.full((n,), 7.0, dtype=torch.float32, device="cuda")
    k[(n // 4 + 256) // 256, 256](out, back, xt, n, mode)
    got = out.cpu().numpy()
    ref = C.fp8_reference(x, fmt)
    nan = np.isnan(x)
    bad = (got != ref) & ~nan
    assert not bad.any(), (x[bad][:8], got[bad][:8], ref[bad][:8])
    assert np.isnan(C.fp8_decode(got[nan], fmt)).all()
    dec = back.cpu().numpy()
    want = C.fp8_decode(got, fmt).astype(np.float32)
    assert np.array_equal(np.isnan(dec), np.isnan(want))
    assert np.array_equal(dec[~np.isnan(want)], want[~np.isnan(want)])
