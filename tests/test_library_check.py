"""`python -m rocjit check` over the whole kernel library, every target: what CI proves about AMD."""
import json
import os

import pytest

from rocjit import check, toolchain
from rocjit.platform import hip

TARGETS = ("sm_90a", "gfx90a", "gfx942", "gfx950")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if toolchain.find() is None or not hip.hiprtc_usable():
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail("ROCJIT_REQUIRE_AMD=1 but hipRTC or the offline clang toolchain is missing")
        pytest.skip("AMD compilers not installed (python -m rocjit toolchain install)")
    out = tmp_path_factory.mktemp("check") / "check.json"
    rc = check.main(["--target", ",".join(TARGETS), "--json", str(out)])
    doc = json.loads(out.read_text())
    return rc, doc


def test_every_library_kernel_builds_clean_for_every_target(report):
    rc, doc = report
    assert doc["failures"] == [] and rc == 0
    bad = [(r["file"], r["kernel"][:60], r["target"], r["status"]) for r in doc["rows"] if r["status"] != "ok"]
    assert not bad
    files = {f.name for f in check.default_files()}
    for f in files:                        # every file contributes kernels on every target
        for t in TARGETS:
            assert any(r["file"] == f and r["target"] == t for r in doc["rows"]), (f, t)


def test_fused_kernels_use_128_bit_global_loads_everywhere(report):
    _, doc = report
    for f in ("rms_norm.hip", "swiglu.hip", "quant_fp8.hip"):
        for t in TARGETS:
            rows = [r for r in doc["rows"] if r["file"] == f and r["target"] == t]
            assert any(int(r["ld128"]) > 0 for r in rows), (f, t)


def test_skinny_gemm_uses_matrix_cores_on_mi300_and_mi355(report):
    _, doc = report
    for t in ("gfx942", "gfx950", "sm_90a"):
        rows = [r for r in doc["rows"] if r["file"] == "skinny_gemm.hip" and r["target"] == t]
        assert any(int(r["matrix"]) > 0 for r in rows), t


def test_library_builds_for_ada_and_the_non_fp8_kernels_for_ampere(tmp_path):
    """NVRTC alone (no AMD toolchain needed): every checked kernel builds for sm_89 (L40S, RTX 4090), and the
    skinny GEMM's bf16 / fp16 kernels for sm_80 (A100: its FP8 products take the portable kernel)."""
    out = tmp_path / "sm89.json"
    rc = check.main(["--target", "sm_89", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["failures"] == [] and doc["rows"]
    src = check.default_files()[0].parent / "skinny_gemm.hip"
    # FP8 instances name e4m3 in their arguments; skinny_gemm_blockwise_kernel takes FP8 operands by definition
    # (gemm_fp8_blockwise's decode path, sm_89+) and names no element type
    names = [n for n in check.name_expressions(src.read_text()) if "e4m3" not in n and "blockwise" not in n]
    assert len(names) >= 4
    co = check._direct_compile(src, "sm_80", [], names)
    assert co.binary
