"""`python -m rocjit check`: per kernel x target tables, JSON rows, non-zero exit on failures, spills or scratch."""
import json
import os
from pathlib import Path

import pytest

from rocjit import check, toolchain
from rocjit.platform import hip

KERNELS = Path(__file__).parent / "kernels"


def _amd_targets() -> str:
    """The AMD targets this machine can build; CI (ROCJIT_REQUIRE_AMD=1) must be able to build all three."""
    targets = []
    if hip.hiprtc_usable() or toolchain.find() is not None:
        targets.append("gfx90a")
    if toolchain.find() is not None:
        targets += ["gfx942", "gfx950"]
    if len(targets) < 3 and os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
        pytest.fail("ROCJIT_REQUIRE_AMD=1 but the AMD compilers are not all installed")
    if not targets:
        pytest.skip("no AMD compiler installed (python -m rocjit toolchain install)")
    return ",".join(targets)


def test_name_expressions_from_comment_lines():
    src = ("// rocjit:check scale<float, 4>\n"
           "  //   rocjit:check   scale<__half, 8>  \n"
           "// rocjit:check scale<float, 4>\n"
           "// rocjit: check not_this\n")
    assert check.name_expressions(src) == ["scale<float, 4>", "scale<__half, 8>"]
    assert check.name_expressions("__global__ void k() {}") == []


def test_default_files_are_the_library_sources():
    files = check.default_files()
    assert files and all(f.suffix == ".hip" and f.parent.name == "kernels_src" for f in files)


def test_clean_kernels_pass_and_json_has_rows(tmp_path, capsys):
    targets = _amd_targets()
    out = tmp_path / "check.json"
    rc = check.main(["--target", targets, "--json", str(out), str(KERNELS / "amd_basics.hip")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "== amd_basics.hip" in text and "scale_float4" in text
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["targets"] == targets.split(",")
    rows = doc["rows"]
    kernels = {(r["kernel"], r["target"]) for r in rows}
    for target in targets.split(","):
        # the template instantiations named by `// rocjit:check` lines are built and reported
        assert ("scale_vec<__half, 8>", target) in kernels
        assert ("saxpy", target) in kernels
    vec = next(r for r in rows if r["kernel"] == "scale_float4")
    assert vec["ld128"] == 1 and vec["status"] == "ok"
    assert isinstance(vec["vgpr"], int) and isinstance(vec["shared_bytes"], int) and vec["registers"] is None
    assert vec["resources"]["isa"]["global_load_128"] == 1


def test_scratch_use_fails(capsys):
    targets = _amd_targets()
    assert check.main(["--target", targets, str(KERNELS / "amd_scratch.hip")]) == 1
    text = capsys.readouterr().out
    assert "FAIL: scratch" in text


def test_spilling_kernel_fails(tmp_path, capsys):
    targets = _amd_targets()
    out = tmp_path / "spill.json"
    assert check.main(["--target", targets, "--json", str(out), str(KERNELS / "amd_spill.hip")]) == 1
    doc = json.loads(out.read_text())
    assert {f["target"] for f in doc["failures"]} == set(targets.split(","))
    for row in doc["rows"]:
        assert row["resources"]["spills"]["vgpr"] > 0 and row["status"].startswith("FAIL: spills")


def test_compile_error_fails_and_is_shown(tmp_path, capsys):
    targets = _amd_targets()
    bad = tmp_path / "broken.hip"
    bad.write_text('#include <hip/hip_runtime.h>\nextern "C" __global__ void k(float* y) { y[0] = ; }\n')
    out = tmp_path / "broken.json"
    assert check.main(["--target", targets, "--json", str(out), str(bad)]) == 1
    text = capsys.readouterr().out
    assert "[FAILED]" in text and "broken.hip:2:" in text
    failures = json.loads(out.read_text())["failures"]
    assert len(failures) == len(targets.split(",")) and all("CompileError" in f["error"] for f in failures)


def test_nvidia_target(tmp_path, capsys):
    try:
        from rocjit.compilers import nvrtc
        nvrtc.version()
    except Exception as e:
        pytest.skip(f"NVRTC is not usable here: {e}")
    rc = check.main(["--target", "sm_90a", "--json", str(tmp_path / "nv.json"), str(KERNELS / "amd_scratch.hip")])
    assert rc == 1   # the dynamically indexed local array lives in local memory on NVIDIA too
    rows = json.loads((tmp_path / "nv.json").read_text())["rows"]
    assert rows[0]["target"] == "sm_90a" and rows[0]["status"].startswith("FAIL: scratch")


def test_bad_arguments():
    with pytest.raises(SystemExit):
        check.main(["--target", "gfx942,volta"])
    with pytest.raises(SystemExit):
        check.main(["no/such/file.hip"])


def test_short_names():
    assert check.short_name("void scale_vec<__half, 8>(__half const*, __half*, int, float)") == "scale_vec<__half, 8>"
    assert check.short_name("saxpy") == "saxpy"
    assert check.short_name("axpy(float, float const*, float*, int)") == "axpy"
    assert check.short_name("void k<&f>(void (*)(int), int)") == "k<&f>"
    assert check.short_name("(anonymous namespace)::k(int)") == "(anonymous namespace)::k"


def _nvrtc():
    try:
        from rocjit.compilers import nvrtc
        nvrtc.version()
    except Exception as e:
        pytest.skip(f"NVRTC is not usable here: {e}")


LONG = r"""
#include <hip/hip_runtime.h>
#ifndef SCALE
#error SCALE must be defined: python -m rocjit check -D SCALE=...
#endif
template <typename T, int A, int B>
__global__ void a_kernel_name_long_enough_to_be_cut_in_a_table(const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * T(SCALE * A + B);
}
// rocjit:check a_kernel_name_long_enough_to_be_cut_in_a_table<float, 16, 1>
// rocjit:check a_kernel_name_long_enough_to_be_cut_in_a_table<float, 16, 2>
void overloaded_helper_is_not_a_kernel();
__global__ void twin(float* y) { y[0] = 1; }
__global__ void twin(int* y) { y[0] = 1; }
"""


def test_defines_names_and_json_numbers(tmp_path, capsys):
    _nvrtc()
    src = tmp_path / "long.hip"
    src.write_text(LONG)
    assert check.main(["--target", "sm_90a", str(src)]) == 1          # SCALE undefined: the #error fires
    assert "SCALE must be defined" in capsys.readouterr().out
    out = tmp_path / "long.json"
    assert check.main(["--target", "sm_90a", "-D", "SCALE=3", "--define", "UNUSED", "--json", str(out), str(src)]) == 0
    text = capsys.readouterr().out
    # the two instantiations differ only at the end of their names: both appear whole
    for b in (1, 2):
        assert f"a_kernel_name_long_enough_to_be_cut_in_a_table<float, 16, {b}>  " in text
    doc = json.loads(out.read_text())
    assert doc["defines"] == {"SCALE": "3", "UNUSED": None}
    names = sorted(r["kernel"] for r in doc["rows"])
    assert names[:2] == [f"a_kernel_name_long_enough_to_be_cut_in_a_table<float, 16, {b}>" for b in (1, 2)]
    # overloads that would share the short name `twin` keep their parameter lists
    assert names[2:] == ["twin(float*)", "twin(int*)"]
    for row in doc["rows"]:
        assert row["target"] == "sm_90a" and row["status"] == "ok"
        for key in ("registers", "shared_bytes", "scratch_bytes", "block", "ld128", "st128", "instructions"):
            assert type(row[key]) is int, (key, row[key])
        assert all(type(v) is int for v in row["spills"].values())


def test_bad_define():
    with pytest.raises(SystemExit):
        check.main(["-D", "1BAD=2", "--target", "sm_90a", str(KERNELS / "amd_basics.hip")])
