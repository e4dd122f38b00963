"""AMD compilation without a GPU: hipRTC (gfx90a) and the offline clang toolchain (gfx90a, gfx942, gfx950).

Skipped only when a compiler is not installed; CI sets ROCJIT_REQUIRE_AMD=1, which turns those skips into failures.
"""
import os
from pathlib import Path

import pytest

from rocjit import codeobject, compilers, toolchain
from rocjit.compilers import hiprtc as hiprtc_compiler
from rocjit.errors import CompileError
from rocjit.platform import hip

KERNELS = Path(__file__).parent / "kernels"
BASICS = (KERNELS / "amd_basics.hip").read_text()
CLANG_TARGETS = ["gfx90a", "gfx942", "gfx950"]
TEMPLATES = ["scale_vec<float, 4>", "scale_vec<__half, 8>"]


def _missing(what: str):
    if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
        pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but {what}")
    pytest.skip(what)


@pytest.fixture
def clang(monkeypatch):
    if toolchain.find() is None:
        _missing("the offline AMD toolchain is not installed (python -m rocjit toolchain install)")
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "clang")


@pytest.fixture
def hiprtc(monkeypatch):
    usable, detail = hip.hiprtc_status()
    if not usable:
        _missing(f"hipRTC is not usable: {detail}")
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "hiprtc")


def _kernel_names(binary):
    return {k[".name"] for k in codeobject.kernel_metadata(binary)}


def compile_amd(source, target, **kw):
    """The AMD compiler rocjit picks for `target`, with the include directories it needs."""
    compiler = compilers.compiler_for(target)
    return compiler.compile(source, target=target, include_dirs=compiler.shim_dirs(), **kw)


@pytest.mark.parametrize("target", CLANG_TARGETS)
def test_clang_compiles_basics_with_templates(clang, target):
    co = compile_amd(BASICS, target=target, name_expressions=TEMPLATES, filename="amd_basics.hip")
    assert co.format == "hsaco" and co.target == target
    assert codeobject.elf_machine(co.binary)[0] == 224   # EM_AMDGPU
    assert codeobject.amdhsa_metadata(co.binary)["amdhsa.target"].endswith(target)
    assert co.lowered == {"scale_vec<float, 4>": "_Z9scale_vecIfLi4EEvPKT_PS0_if",
                          "scale_vec<__half, 8>": "_Z9scale_vecI6__halfLi8EEvPKT_PS1_if"}
    names = _kernel_names(co.binary)
    assert {"saxpy", "scale_float4", "half2_axpy", "bf16_scale", "block_sum"} <= names
    assert set(co.lowered.values()) <= names


def test_hiprtc_compiles_basics_with_templates(hiprtc):
    co = hiprtc_compiler.compile(BASICS, target="gfx90a", name_expressions=TEMPLATES, filename="amd_basics.hip")
    assert co.format == "hsaco"
    assert codeobject.amdhsa_metadata(co.binary)["amdhsa.target"].endswith("gfx90a")
    assert co.lowered["scale_vec<__half, 8>"] == "_Z9scale_vecI6__halfLi8EEvPKT_PS1_if"
    assert {"saxpy", "scale_float4", "half2_axpy", "block_sum"} <= _kernel_names(co.binary)


def test_policy_picks_hiprtc_for_gfx90a_and_clang_for_newer(monkeypatch):
    monkeypatch.delenv("ROCJIT_AMD_COMPILER", raising=False)
    if not hip.hiprtc_usable():
        _missing(f"hipRTC is not usable: {hip.hiprtc_status()[1]}")
    assert compilers.amd_compiler_name("gfx90a") == "hiprtc"
    if hiprtc_compiler.version().startswith("hiprtc 5."):   # ROCm 5.x hipRTC crashes on gfx942
        assert compilers.amd_compiler_name("gfx942") == "clang"
        assert compilers.amd_compiler_name("gfx950") == "clang"
        monkeypatch.setenv("ROCJIT_AMD_COMPILER", "hiprtc")
        with pytest.raises(CompileError, match="cannot build gfx942"):
            compilers.amd_compiler_name("gfx942")
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "clang")
    assert compilers.amd_compiler_name("gfx90a") == "clang"
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "nvcc")
    with pytest.raises(ValueError, match="ROCJIT_AMD_COMPILER"):
        compilers.amd_compiler_name("gfx90a")


SAXPY_LAYOUT = [(0, 8), (8, 8), (16, 4), (20, 4)]


@pytest.mark.parametrize("target", CLANG_TARGETS)
def test_param_layout_from_metadata_clang(clang, target):
    co = compile_amd(BASICS, target=target, name_expressions=TEMPLATES, filename="amd_basics.hip")
    assert codeobject.param_layout(co.binary, "saxpy") == SAXPY_LAYOUT
    assert codeobject.param_layout(co.binary, co.lowered["scale_vec<__half, 8>"]) == SAXPY_LAYOUT
    assert codeobject.param_layout(co.binary, "no_such_kernel") is None
    # hidden arguments (block counts, ...) follow the explicit ones in the kernarg segment and are skipped
    meta = codeobject.kernel_metadata(co.binary, "saxpy")
    assert any(a[".value_kind"].startswith("hidden_") for a in meta[".args"])


def test_param_layout_from_metadata_hiprtc(hiprtc):
    co = hiprtc_compiler.compile(BASICS, target="gfx90a", filename="amd_basics.hip")
    assert codeobject.param_layout(co.binary, "saxpy") == SAXPY_LAYOUT
    assert codeobject.param_layout(co.binary, "scale_float4") == SAXPY_LAYOUT


def test_param_layout_mixed_sizes(clang):
    src = ('#include <hip/hip_runtime.h>\n'
           'struct __attribute__((aligned(16))) Pair { float a, b, c, d; };\n'
           'extern "C" __global__ void k(char c, double d, short s, const int* p, Pair q, long long z) {}\n')
    co = compile_amd(src, target="gfx942", filename="mixed.hip")
    assert codeobject.param_layout(co.binary, "k") == [(0, 1), (8, 8), (16, 2), (24, 8), (32, 16), (48, 8)]


@pytest.mark.parametrize("compiler", ["clang", "hiprtc"])
def test_syntax_error_names_the_line(compiler, request):
    request.getfixturevalue(compiler)
    bad = BASICS.replace("if (i < n) y[i] = a * x[i] + y[i];", "if (i < n) y[i] = a * x[i] + ;")
    line = bad.splitlines().index("    if (i < n) y[i] = a * x[i] + ;") + 1
    with pytest.raises(CompileError) as info:
        compile_amd(bad, target="gfx90a", filename="broken.hip")
    text = str(info.value)
    assert f"broken.hip:{line}:" in text
    assert f">>{line:5d} |     if (i < n) y[i] = a * x[i] + ;" in text
    assert info.value.target == "gfx90a"


def test_bad_name_expression_is_a_compile_error(clang):
    with pytest.raises(CompileError, match="scale_vec<double, 4, 5>"):
        compile_amd(BASICS, target="gfx942", name_expressions=["scale_vec<double, 4, 5>"],
                              filename="amd_basics.hip")


def test_fp8_mfma_needs_gfx942(clang):
    src = (KERNELS / "amd_mfma.hip").read_text().replace("#if defined(__gfx942__) || defined(__gfx950__)", "#if 1")
    for target in ("gfx942", "gfx950"):
        assert "mfma_fp8" in _kernel_names(compile_amd(src, target=target).binary)
    with pytest.raises(CompileError):
        compile_amd(src, target="gfx90a")


def test_missing_toolchain_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("ROCJIT_TOOLCHAIN_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("ROCJIT_AMD_COMPILER", "clang")
    with pytest.raises(toolchain.ToolchainMissingError, match="python -m rocjit toolchain install"):
        compile_amd(BASICS, target="gfx942")
    status = toolchain.status()
    assert status["clang"]["installed"] is False and "toolchain install" in status["clang"]["hint"]


def test_compiler_version_names_the_compiler(clang):
    from rocjit import compiler
    compiler.compiler_version.cache_clear()
    version = compiler.compiler_version("gfx942")
    assert "clang 1:22" in version and "device-libs" in version


def test_install_is_idempotent(clang):
    messages = []
    tc = toolchain.install(log=messages.append)
    assert tc.clang.exists() and "already installed" in messages[0]
    assert toolchain.main(["path"]) == 0


def test_private_apt_state_stays_in_its_dir(tmp_path):
    opts = toolchain._apt_options(tmp_path)
    values = dict(o.split("=", 1) for o in opts[1::2])
    for key, value in values.items():
        if key.startswith("Dir::"):
            assert value.startswith(str(tmp_path)), key
    toolchain._write_apt_config(tmp_path)
    sources = (tmp_path / "sources.list").read_text()
    assert " bookworm main" in sources and "bookworm-security main" in sources and " forky main" in sources


def test_no_gpu_is_reported_not_raised():
    if hip.is_available():
        pytest.skip("an AMD GPU is visible")
    assert hip.is_available() is False
    assert hip.unavailable_reason()
    assert hip.device_count() == 0


def test_launch_calls_hip_module_launch_kernel(monkeypatch):
    import ctypes
    calls = []

    class FakeLib:
        def hipModuleLaunchKernel(self, *args):
            calls.append(args)
            return 0

    monkeypatch.setattr(hip, "_runtime_lib", lambda: FakeLib())
    params = (ctypes.c_void_p * 2)()
    fn = hip.Function(handle=None, ptr=0x1234, name="k")
    assert hip.launch(fn, (4, 2, 1), (256, 1, 1), 1024, 77, params) == 0
    assert hip.launch(fn, 3, 64, 0, None, params) == 0
    assert calls[0] == (0x1234, 4, 2, 1, 256, 1, 1, 1024, 77, ctypes.addressof(params), None)
    assert calls[1][1:9] == (3, 1, 1, 64, 1, 1, 0, 0)
