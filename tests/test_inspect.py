"""rocjit.inspect: resources, occupancy and ISA statistics read from code objects (no GPU)."""
import os
from pathlib import Path

import pytest

import rocjit
from rocjit import toolchain
from rocjit.inspect import (KernelResources, Report, amd_occupancy, inspect, nvidia_occupancy, resources,
                            summary_row)
from rocjit.platform import Compiled

KERNELS = Path(__file__).parent / "kernels"


def _need_toolchain():
    if toolchain.find() is None:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail("ROCJIT_REQUIRE_AMD=1 but the offline AMD toolchain is not installed")
        pytest.skip("the offline AMD toolchain is not installed (python -m rocjit toolchain install)")


@pytest.fixture
def clang(monkeypatch):
    _need_toolchain()
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "clang")


def _amd(name: str, target: str, **kw) -> Compiled:
    from rocjit import compilers
    compiler = compilers.compiler_for(target)
    return compiler.compile((KERNELS / name).read_text(), target=target, filename=name,
                            include_dirs=compiler.shim_dirs(), **kw)


def _by_name(rows):
    return {r.name: r for r in rows}


# ---------------------------------------------------------------- occupancy models

def test_amd_occupancy_vgpr_granule_and_wave_cap():
    # the MI300X guide's example: 170 VGPRs are allocated as 176 -> 2 waves per SIMD (3 * 176 > 512)
    assert amd_occupancy("gfx942", 170, 20, 0, 256)["waves_per_eu_by_registers"] == 2
    assert amd_occupancy("gfx942", 72, 20, 0, 256)["waves_per_eu_by_registers"] == 7   # 512 // 72
    assert amd_occupancy("gfx942", 73, 20, 0, 256)["waves_per_eu_by_registers"] == 6   # 73 -> 80
    assert amd_occupancy("gfx942", 512, 20, 0, 256)["waves_per_eu_by_registers"] == 1
    few = amd_occupancy("gfx942", 8, 20, 0, 256)
    assert few["waves_per_eu_by_registers"] == 8 and few["limited_by"] == "waves"
    assert amd_occupancy("gfx90a", 64, 102, 0, 256)["waves_per_eu_by_registers"] == 7   # SGPR limit


def test_amd_occupancy_lds_per_cu_differs_on_gfx950():
    on_942 = amd_occupancy("gfx942", 32, 20, 64 * 1024, 256)
    on_950 = amd_occupancy("gfx950", 32, 20, 64 * 1024, 256)
    assert on_942["workgroups_per_cu"] == 1 and on_942["limited_by"] == "lds"
    assert on_950["workgroups_per_cu"] == 2
    assert on_942["waves_per_eu"] == 1.0     # one 4-wave workgroup per CU: one wave per SIMD
    # workgroups per CU from registers: 8 waves/EU * 4 SIMDs / 16 waves per 1024-thread block
    assert amd_occupancy("gfx942", 32, 20, 0, 1024)["workgroups_per_cu"] == 2
    assert amd_occupancy("gfx1100", 32, 20, 0, 256) is None


def test_nvidia_occupancy_sm90():
    # 40 registers: 1280 per warp -> 51 warps of registers -> one 32-warp block
    r = nvidia_occupancy("sm_90a", 40, 0, 1024)
    assert r["blocks_per_sm"] == 1 and r["limited_by"] == "registers"
    r = nvidia_occupancy("sm_90a", 32, 0, 256)
    assert r["blocks_per_sm"] == 8 and r["warps_per_sm"] == 64 and r["occupancy"] == 1.0
    # 100 KB of shared memory (+1 KB reserved per block) -> two blocks in 228 KB
    r = nvidia_occupancy("sm_90", 32, 100 * 1024, 128)
    assert r["blocks_per_sm"] == 2 and r["limited_by"] == "shared"
    assert nvidia_occupancy("sm_90", 32, 0, 32)["blocks_per_sm"] == 32     # the per-SM block cap
    assert nvidia_occupancy("sm_75", 32, 0, 128) is None


# ---------------------------------------------------------------- AMD code objects

@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
def test_amd_float4_kernel_shows_128_bit_loads(clang, target):
    co = _amd("amd_basics.hip", target, name_expressions=["scale_vec<float, 4>"])
    rows = _by_name(resources(co))
    vec = rows["scale_float4"]
    assert vec.vendor == "amd" and vec.target == target
    assert vec.isa["global_load_128"] >= 1 and vec.isa["global_store_128"] >= 1
    assert "global_load_dwordx4" in vec.isa["variants"] or "global_load_b128" in vec.isa["variants"]
    assert vec.max_threads == 256 and vec.block == 256
    assert 0 < vec.vgpr < 64 and vec.sgpr > 0 and vec.agpr == 0
    assert vec.scratch_bytes == 0 and not vec.spilled
    assert vec.occupancy["waves_per_eu"] == 8
    assert rows["saxpy"].isa["global_load_128"] == 0
    # static LDS of block_sum: 4 floats; its wave reduction shows up as LDS / DPP traffic
    assert rows["block_sum"].shared_bytes == 16
    assert rows["block_sum"].isa["lds"] >= 1
    assert rows["_Z9scale_vecIfLi4EEvPKT_PS0_if"].display_name.startswith("void scale_vec<float, 4>")


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_amd_mfma_kernel_shows_matrix_instructions(clang, target):
    rows = _by_name(resources(_amd("amd_mfma.hip", target)))
    assert rows["mfma_f32"].isa["matrix"] >= 1
    fp8 = rows["mfma_fp8"].isa
    assert fp8["matrix"] >= 1
    assert any(op.startswith("v_mfma_f32_16x16x32_fp8_fp8") for op in fp8["variants"])


def test_amd_scratch_kernel_reports_scratch(clang):
    r = resources(_amd("amd_scratch.hip", "gfx942"))[0]
    assert r.scratch_bytes >= 2048 * 4
    assert r.uses_scratch
    assert r.isa["scratch"] >= 1


def test_amd_hiprtc_code_object(monkeypatch):
    from rocjit.platform import hip
    if not hip.hiprtc_usable():
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but hipRTC is not usable: {hip.hiprtc_status()[1]}")
        pytest.skip(f"hipRTC is not usable: {hip.hiprtc_status()[1]}")
    from rocjit.compilers import hiprtc
    co = hiprtc.compile((KERNELS / "amd_mfma.hip").read_text(), target="gfx90a", filename="amd_mfma.hip")
    r = resources(co, "mfma_f32")[0]
    assert r.target == "gfx90a" and r.vgpr > 0
    if toolchain.find() is not None:
        assert r.isa["matrix"] >= 1


def test_amd_without_objdump_reports_none(clang, monkeypatch):
    co = _amd("amd_basics.hip", "gfx942")
    monkeypatch.setattr("rocjit.inspect._amd_objdump", lambda: None)
    r = _by_name(resources(co))["saxpy"]
    assert r.isa is None and r.vgpr is not None
    assert any("llvm-objdump" in n for n in r.notes)
    assert summary_row(r)["ld128"] == "?"


# ---------------------------------------------------------------- NVIDIA code objects

NV_SOURCE = r'''
extern "C" __global__ void __launch_bounds__(256) copy4(const float4* x, float4* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void local_array(const float* x, float* y, int n, int k) {
    float a[512];
    for (int i = 0; i < 512; ++i) a[i] = x[i * n + threadIdx.x];
    y[threadIdx.x] = a[k];
}
extern "C" __global__ void staged(const float* x, float* y) {
    __shared__ float s[1000];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[999 - threadIdx.x];
}
'''


@pytest.fixture(scope="module")
def cubin():
    try:
        from rocjit.compilers import nvrtc
        return nvrtc.compile(NV_SOURCE, target="sm_90a", options=["-Xptxas=-v"], include_dirs=(), filename="nv.cu")
    except Exception as e:   # cuda-bindings / NVRTC missing
        pytest.skip(f"NVRTC is not usable here: {e}")


def test_nvidia_resources(cubin):
    from rocjit.inspect import _nvidia_tool
    if _nvidia_tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
    rows = _by_name(resources(cubin))
    copy4 = rows["copy4"]
    assert copy4.vendor == "nvidia" and copy4.target == "sm_90a"
    assert copy4.registers > 0 and copy4.max_threads == 256
    assert copy4.isa["global_load_128"] == 1 and copy4.isa["global_store_128"] == 1
    assert copy4.spills == {"stores": 0, "loads": 0}
    assert copy4.occupancy["blocks_per_sm"] == 8
    local = rows["local_array"]
    assert local.scratch_bytes >= 2048 and local.uses_scratch and local.isa["local"] >= 1
    assert rows["staged"].shared_bytes == 4000    # the user's bytes, not the 1 KB sm_90 reservation
    assert rows["staged"].isa["lds"] >= 2


# ---------------------------------------------------------------- the inspect() entry point

class _FakeKernel:
    """What rocjit's Kernel exposes to inspect: its code object and mangled name."""

    def __init__(self, co, mangled):
        self.code_object, self.mangled_name = co, mangled


def test_inspect_entry_points(clang):
    co = _amd("amd_basics.hip", "gfx942", name_expressions=["scale_vec<__half, 8>"])
    report = rocjit.inspect(co)
    assert isinstance(report, Report) and len(report) >= 6
    one = rocjit.inspect(_FakeKernel(co, co.lowered["scale_vec<__half, 8>"]), block=128)
    assert len(one) == 1 and one[0].block == 128
    assert "scale_vec<__half, 8>" in str(one) and "waves/EU" in str(one)
    assert len(inspect(co.binary)) == len(report)
    by_expr = resources(co, "scale_vec<__half, 8>")
    assert len(by_expr) == 1 and isinstance(by_expr[0], KernelResources)
    with pytest.raises(KeyError):
        resources(co, "nope")
    import rocjit.inspect as module   # the module itself stays callable
    assert len(module(co)) == len(report)


def test_inspect_rejects_ptx():
    with pytest.raises(ValueError, match="ptx"):
        resources(Compiled(b"//ptx", "ptx", "compute_90"))


def test_amd_instruction_count_excludes_alignment_padding():
    import importlib
    ins = importlib.import_module("rocjit.inspect")
    ops = ["s_load_dword", "v_add_u32", "s_endpgm", "s_nop", "s_nop", "s_code_end"]
    assert ins._strip_padding(ops) == ops[:3]
    assert ins._strip_padding(["s_nop"]) == ["s_nop"]
